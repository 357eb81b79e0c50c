"""Free loopback ports and readiness waits for locally started services."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now on `host` (the OS picks it; a small race remains by nature)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll `check` until it returns True; raise TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s")


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0
