"""Helpers shared by the stand-in tests (a uniquely named module: every test dir has a conftest)."""
from __future__ import annotations

import socket
import time

from fleet_testlib import free_port  # noqa: F401  (the stand-in tests import it from here)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(pred, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
