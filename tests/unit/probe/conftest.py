"""Fixtures for the probe tests (helpers live in probe_testlib.py)."""

import time

import fleet_testlib
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
    return fleet_testlib.free_port()


@pytest.fixture
def timer():
    class T:
        def __enter__(self):
            self.t0 = time.monotonic()
            return self

        def __exit__(self, *a):
            self.elapsed = time.monotonic() - self.t0

    return T
