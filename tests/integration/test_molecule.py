"""The molecule scenarios, each a test of its own so that
pytest-xdist runs them next to the lab tests (tests/integration/conftest.py makes each scenario
its own scheduling unit). Each scenario boots its own hosts with labctl (molecule/<scenario>/fleet.json)
and runs its full test sequence (destroy, syntax, create, converge, idempotence, verify,
destroy) exactly as ``molecule test -s <scenario>`` from the repository root does; its output is
written to artifacts/logs/molecule-<scenario>.log and its tail is shown when it fails.

Every directory of molecule/ with a molecule.yml is a scenario and runs here (shared, the
create/destroy playbooks, is not one): default (lab tooling), deploy (the whole playbook) and one
per role that can be tested alone - host_lock (contended), known_good (the watchdog restores a
run that died), preflight (fake nvidia-smi) and drift_timer.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"


SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))


def test_every_role_scenario_is_there():
    assert {"default", "deploy", "host_lock", "known_good", "preflight", "drift_timer"} <= set(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario):
    if os.geteuid() != 0:
        why = "molecule's scenarios boot lab hosts with labctl: run as root"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}   # not this run's worker
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    log = REPO / "artifacts" / "logs" / f"molecule-{scenario}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log.open("w") as fh:
        res = subprocess.run([str(VENV_BIN / "molecule"), "test", "-s", scenario], cwd=REPO, env=env,
                             stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, timeout=2400)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-80:])
    assert res.returncode == 0, f"molecule test -s {scenario} exited {res.returncode} " \
                                f"after {time.monotonic() - t0:.0f}s (full log: {log}):\n{tail}"
