"""How the integration tests share the machine when pytest-xdist runs them side by side.

tests/run_all.sh runs ``pytest -n K --dist loadscope --no-loadscope-reorder tests/integration``
after ``labctl up --slots K``: worker gw<k> owns lab slot k (tests/integration/lab/labkit.py).

* Every test module is one scheduling unit (LabScheduling below), so its module-scoped fixtures
  (a deploy, a booted fleet) run once, on one worker, and its tests run in order there. Modules
  in SPREAD share nothing between their tests but function-scoped fixtures: their tests go one
  by one to whichever worker is free (the fault matrix: 18 cases of one to two minutes each;
  the two molecule scenarios).
* Units start longest first (SLOW_FIRST, from artifacts/test-times.md), so the long ones
  overlap with everything else instead of running alone at the end: a group left out of the
  list runs after every listed one, so list each new group by its measured time.
"""

from __future__ import annotations


import pytest

SLOW_FIRST = [
    "test_lab_06_drift.py", "test_lab_08_benchmark.py", "test_lab_12_secrets.py",
    "test_lab_04_ct129_failures.py", "test_molecule.py::deploy", "test_lab_07_rollout.py",
    "test_lab_05_ct200_ddtree.py", "test_lab_10_interrupted.py", "test_lab_14_slices.py",
    "test_lab_09_drift_timer.py", "test_lab_02_preflight.py", "test_lab_03_incident.py",
    "test_bad_input_matrix.py", "test_lab_13_runner.py", "test_molecule.py::default",
    "test_molecule.py::known_good", "test_molecule.py::preflight", "test_molecule.py::drift_timer",
    "test_molecule.py::host_lock", "test_lab_15_installed_collection.py",
    # The fault matrix's cases (about a minute each, spread one by one) fill the gaps the long
    # groups leave; the two groups of a few seconds come last.
    "test_lab_11_fault_matrix.py", "test_lab_01_basics.py", "test_patch_wheel.py",
]
# Modules whose tests share nothing but function-scoped fixtures: each test is its own unit.
SPREAD = {"test_lab_11_fault_matrix.py", "test_molecule.py"}


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: its module, or the test itself in a SPREAD module."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path.rsplit("/", 1)[-1] in SPREAD else path


def label_of(nodeid: str) -> str:
    """What SLOW_FIRST names: the module, and test_molecule.py::<scenario> for a scenario."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    if module == "test_molecule.py" and "[" in nodeid:
        return f"{module}::{nodeid.rsplit('[', 1)[1].rstrip(']')}"
    return module


def pytest_collection_modifyitems(config, items):
    """Longest groups first (the order xdist hands the units out in, --no-loadscope-reorder)."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda i: (rank.get(label_of(i.nodeid), len(rank)), order[id(i)]))


def pytest_xdist_make_scheduler(config, log):
    """xdist's loadscope, with our units (unit_of) instead of one unit per module or class.

    (xdist's own loadgroup, driven by xdist_group marks, does not group under pytest 9: the
    @group suffix it sets on item._nodeid never reaches the nodeids, so this takes its place.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class LabScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return LabScheduling(config, log)
