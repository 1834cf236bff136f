"""Lines of the service unit template that are pure arithmetic or shell, rendered on their own."""
from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = (REPO / "roles" / "sglang_service" / "templates" / "sglang.service.j2").read_text()


def line(key: str, **values) -> str:
    raw = re.search(r"^%s=(.*)$" % re.escape(key), TEMPLATE, re.M).group(1)
    return jinja2.Template(raw, undefined=jinja2.StrictUndefined).render(**values)


@pytest.mark.parametrize("start_timeout", [60, 900, 3600])
def test_the_start_limit_window_holds_three_full_start_ups(start_timeout):
    """A model that loads for the whole start timeout and then crashes still trips the limit."""
    window = int(line("StartLimitIntervalSec", sglang_service_start_timeout=start_timeout))
    burst = int(line("StartLimitBurst"))
    restart_sec = int(line("RestartSec"))
    assert burst == 3
    assert window > burst * (start_timeout + restart_sec), window
