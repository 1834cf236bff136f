"""Lab integration tests: the real playbooks against the systemd-nspawn lab (ct129, ct200).

Side by side: with pytest-xdist (tests/run_all.sh runs them after ``labctl up --slots K``) worker
gw<k> owns lab slot k, its own ct129 + ct200 (labkit.py); how tests are grouped and ordered
across the workers is in tests/integration/conftest.py.

Every test here carries the ``lab`` marker. Without a running lab (``make lab-up``) they are
skipped with the reason; with CI=true a missing lab is an error instead, because tests/run_all.sh
brings the lab up and seeds it first. Each test module leaves both hosts in the seeded state
(known-good NEXTN, no quarantine records): the ``lab_seeded`` fixture below checks at every
module's end and brings a changed host back (labkit.ensure_seeded: ``labctl reset`` to the
snapshot lab/seed.sh took right after seeding, a few seconds; lab_seed.yml where there is none).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import labkit  # noqa: E402

HERE = Path(__file__).resolve().parent


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: needs the running ddtree lab (make lab-up); run as root")
    config.addinivalue_line("markers", "fault_case(name): a row of the fault matrix table "
                                       "(printed at the end and written to artifacts/fault-matrix.md)")


# ------------------------------------------------------------------ the fault matrix table

FAULT_ROWS: dict[str, dict] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Carry the case name on the report (user_properties travel from an xdist worker to the
    controller, where pytest_runtest_logreport builds the table)."""
    outcome = yield
    marker = item.get_closest_marker("fault_case")
    if marker is not None:
        outcome.get_result().user_properties.append(("fault_case", marker.args[0]))


def pytest_runtest_logreport(report):
    props = dict(report.user_properties)
    name = props.get("fault_case")
    if name is None:
        return
    row = FAULT_ROWS.setdefault(name, {"case": name, "result": "not run", "seconds": 0.0, "end_state": ""})
    row["seconds"] += report.duration
    if report.when == "call" or report.failed or report.skipped:
        if row["result"] in ("not run", "pass") or report.failed:
            row["result"] = "PASS" if report.passed else ("SKIP" if report.skipped else "FAIL")
        row["end_state"] = str(props.get("end_state", "")) if report.passed else (
            report.longreprtext.strip().splitlines()[-1][:160] if report.longreprtext else "")


def fault_table() -> str:
    lines = ["| case | result | seconds | end state |", "|---|---|---:|---|"]
    for row in FAULT_ROWS.values():
        lines.append(f"| {row['case']} | {row['result']} | {row['seconds']:.1f} | {row['end_state']} |")
    passed = sum(r["result"] == "PASS" for r in FAULT_ROWS.values())
    lines.append(f"\n{passed} of {len(FAULT_ROWS)} fault cases passed.")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter):
    if not FAULT_ROWS:
        return
    table = fault_table()
    terminalreporter.section("fault matrix")
    terminalreporter.write_line(table)
    labkit.ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (labkit.ARTIFACTS / "fault-matrix.md").write_text("# Fault matrix (lab)\n\n" + table + "\n")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.lab)


def _lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the lab tests must run as root (ip netns exec, the lab's ssh key)"
    if not labkit.HOSTS_JSON.is_file():
        return f"{labkit.HOSTS_JSON} is missing: the lab is not up (run `make lab-up`)"
    if not (labkit.VENV_BIN / "ansible-playbook").exists():
        return f"{labkit.VENV_BIN}/ansible-playbook is missing (run `make venv`)"
    if shutil.which("ssh") is None or shutil.which("ip") is None:
        return "ssh or ip (iproute2) is not installed"
    hosts = labkit.lab_hosts()
    missing = [h for h in labkit.LAB_HOSTS if h not in hosts]
    if missing:
        return f"{labkit.HOSTS_JSON} does not list {missing}"
    for name in labkit.LAB_HOSTS:
        try:
            res = subprocess.run(labkit.ssh_argv(name, "true", connect_timeout=5), capture_output=True,
                                 text=True, timeout=20)
        except subprocess.TimeoutExpired:
            return f"{name} ({hosts[name]['address']}) did not answer ssh within 20s: the lab is not up"
        if res.returncode != 0:
            return f"{name} ({hosts[name]['address']}) is unreachable over ssh: {res.stderr.strip()[:200]}"
        if subprocess.run(["ip", "netns", "pids", labkit.netns(name)], capture_output=True).returncode != 0:
            return f"network namespace {labkit.netns(name)} is missing"
    return None


@pytest.fixture(scope="session")
def lab():
    """The running lab, in the seeded state; skips (or fails under CI=true) when it is not up."""
    why = _lab_unavailable()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"lab integration tests cannot run under CI: {why}", pytrace=False)
        pytest.skip(f"lab not available: {why}")
    labkit.ensure_seeded("session start")
    return labkit.lab_hosts()


@pytest.fixture(scope="module", autouse=True)
def lab_seeded(lab):
    """Each module starts and ends with both hosts seeded and no quarantine records left."""
    yield lab
    labkit.ensure_seeded("end of module")
