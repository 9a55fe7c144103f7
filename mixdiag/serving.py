"""Address checks shared by everything that serves HTTP (the dashboard, ``watch``, ``demo``)."""
from __future__ import annotations

import ipaddress

from mixdiag.errors import UserError


def check_address(host: str, port: int) -> tuple[str, int]:
    """``(host, port)`` when ``host`` is an IP address or 'localhost' and ``port`` is 1..65535; UserError otherwise."""
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise UserError(f"--port must be 1..65535, got {port}") from None
    if not 0 < port < 65536:
        raise UserError(f"--port must be 1..65535, got {port}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise UserError(f"--host must be an IP address or 'localhost', got {host!r}") from None
    return host, port
