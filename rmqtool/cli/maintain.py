"""Commands of this concern register themselves on the `cli` group (see rmqtool.cli)."""
