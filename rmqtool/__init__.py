"""rmqtool: read, write, verify, repair and rebuild Apache RocketMQ broker store directories offline."""

__version__ = "0.1.0"
