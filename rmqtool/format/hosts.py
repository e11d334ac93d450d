"""Socket addresses as stored in records: address bytes in network order, then the port as int32."""

from __future__ import annotations

import ipaddress
from typing import NamedTuple


class Host(NamedTuple):
    address: bytes   # 4 bytes (IPv4) or 16 bytes (IPv6)
    port: int

    @property
    def ipv6(self) -> bool:
        return len(self.address) == 16

    @property
    def ip(self) -> str:
        return str(ipaddress.ip_address(self.address))

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.ipv6 else f"{self.ip}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> "Host":
        """'ip:port' or '[ipv6]:port' (a bare IPv6 address without port is not accepted)."""
        host, sep, port = text.rpartition(":")
        if not sep or not port.lstrip("-").isdigit():
            raise ValueError(f"not a host:port: {text!r}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        return cls(ipaddress.ip_address(host).packed, int(port))
