"""Fixtures for the probe tests (helpers live in probe_testlib.py)."""

import socket
import time

import pytest

from probe_testlib import FakeServer


@pytest.fixture
def fake_server():
    servers = []

    def factory():
        s = FakeServer()
        servers.append(s)
        return s

    yield factory
    for s in servers:
        s.close()


@pytest.fixture
def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def timer():
    class T:
        def __enter__(self):
            self.t0 = time.monotonic()
            return self

        def __exit__(self, *a):
            self.elapsed = time.monotonic() - self.t0

    return T
