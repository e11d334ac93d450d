"""rmqtool: read, write, verify, repair and rebuild Apache RocketMQ broker store directories offline."""

import time as _time

__version__ = "0.1.0"
STARTED = _time.perf_counter()      # the command's start: the times it reports count from here
