"""How the integration tests share the machine when pytest-xdist runs them side by side.

tests/run_all.sh runs ``pytest -n K --dist loadgroup --no-loadscope-reorder tests/integration``
after ``labctl up --slots K``: worker gw<k> owns lab slot k (tests/integration/lab/labkit.py).

* Every test module is one xdist group, so its module-scoped fixtures (a deploy, a booted
  fleet) run once, on one worker, and its tests run in order there. Modules in SPREAD share
  nothing between their tests but function-scoped fixtures: their tests go one by one to
  whichever worker is free (the fault matrix: 18 cases of one to two minutes each).
* Groups start longest first (SLOW_FIRST, from artifacts/test-times.md), so the long ones
  overlap with everything else instead of running alone at the end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SLOW_FIRST = [
    "test_lab_12_secrets.py", "test_molecule.py::deploy", "test_lab_08_benchmark.py", "test_lab_06_drift.py",
    "test_lab_03_incident.py", "test_bad_input_matrix.py", "test_lab_09_drift_timer.py",
    "test_molecule.py::default", "test_lab_04_ct129_failures.py", "test_lab_05_ct200_ddtree.py",
    "test_lab_07_rollout.py", "test_lab_10_interrupted.py", "test_lab_02_preflight.py",
    "test_lab_01_basics.py", "test_patch_wheel.py",
]
SPREAD = {"test_lab_11_fault_matrix.py"}


def group_of(item: pytest.Item) -> str | None:
    """The item's xdist group: its module, or module::scenario for the molecule scenarios."""
    module = Path(str(item.fspath)).name
    if module in SPREAD:
        return None
    marker = item.get_closest_marker("scenario_group")
    return f"{module}::{marker.args[0]}" if marker else module


def pytest_configure(config):
    config.addinivalue_line("markers", "scenario_group(name): own xdist group for this test "
                                       "(tests/integration/conftest.py)")


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    order = {id(item): n for n, item in enumerate(items)}
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda i: (rank.get(group_of(i) or "", len(rank)), order[id(i)]))
