"""The incident under ansible-runner, the engine AWX runs every job with (docs/awx.md).

`ansible-runner run` from a private data directory, with the repository as the project and the
lab inventory, runs `deploy_ddtree.yml -l ct129` as a job template would. Its artifacts (rc,
status, job events) must tell the same outcome as the plain `ansible-playbook` run of
test_lab_03_incident.py: exit 2, ct129 failed once after one rescue, the known-good NEXTN unit
back and the DDTREE configuration quarantined.
"""

from __future__ import annotations

import json
import subprocess
import time

import labkit
import pytest

HOST = "ct129"


@pytest.fixture(scope="module")
def job(lab, tmp_path_factory):
    pdd = tmp_path_factory.mktemp("runner")
    (pdd / "env").mkdir()
    pre = {"live": labkit.sha256(HOST, labkit.UNIT, labkit.ENV_FILE), "kg": labkit.known_good(HOST)}
    assert pre["kg"]["meta"]["algorithm"] == "NEXTN", pre["kg"]
    argv = [str(labkit.VENV_BIN / "ansible-runner"), "run", str(pdd), "--ident", "incident",
            "--project-dir", str(labkit.REPO), "-p", "deploy_ddtree.yml",
            "--inventory", str(labkit.INVENTORY), "--limit", HOST]
    t0 = time.monotonic()
    with labkit.run_log(argv).open("w") as log:
        proc = subprocess.run(argv, cwd=labkit.REPO, env=labkit.ansible_env(), stdin=subprocess.DEVNULL,
                              stdout=log, stderr=subprocess.STDOUT, text=True, timeout=900, check=False)
    artifacts = pdd / "artifacts" / "incident"
    events = [json.loads(p.read_text()) for p in sorted((artifacts / "job_events").glob("*.json"),
                                                        key=lambda p: int(p.name.split("-", 1)[0]))]
    print(f"\n[runner] ansible-runner run ... deploy_ddtree.yml --limit {HOST}: rc {proc.returncode} "
          f"in {time.monotonic() - t0:.1f}s, {len(events)} events")
    return {"pre": pre, "proc": proc, "artifacts": artifacts, "events": events}


def test_runner_status_and_rc_are_the_playbooks(job):
    artifacts = job["artifacts"]
    assert job["proc"].returncode == 2, (artifacts / "stdout").read_text()[-3000:]
    assert (artifacts / "rc").read_text().strip() == "2"
    assert (artifacts / "status").read_text().strip() == "failed"


def test_events_name_the_failed_host_and_the_rescue(job):
    events = job["events"]
    stats = [e for e in events if e["event"] == "playbook_on_stats"]
    assert len(stats) == 1, [e["event"] for e in events][-10:]
    data = stats[0]["event_data"]
    assert data["failures"] == {HOST: 1} and data["rescued"] == {HOST: 1}, data
    assert not data.get("dark"), data
    failed = [e for e in events if e["event"] == "runner_on_failed" and not e["event_data"].get("ignore_errors")]
    assert [e["event_data"]["task"] for e in failed][-1] == ("Fail the hosts whose change failed, or that a deploy leaves off their declared "
                                                          "configuration (counts against the failure budget)")
    msg = failed[-1]["event_data"]["res"]["msg"]
    assert "ct129: the DDTREE change failed" in msg and "quarantined" in msg, msg
    # the gate ran, then the restore handlers (their events carry the role that ran them)
    roles = [e["event_data"].get("role") for e in events if e["event"] == "runner_on_ok"]
    assert "quality_gate" in roles and "known_good" in roles, sorted(set(filter(None, roles)))


def test_host_is_back_on_known_good_and_quarantined(job):
    pre = job["pre"]
    assert labkit.sha256(HOST, labkit.UNIT, labkit.ENV_FILE) == pre["live"]
    assert labkit.known_good(HOST)["link"] == pre["kg"]["link"]
    assert labkit.service(HOST)["ActiveState"] == "active"
    quarantined = labkit.quarantine_files(HOST)
    assert len(quarantined) == 1, quarantined
    record = labkit.read_json(HOST, f"{labkit.STATE_DIR}/quarantine/{quarantined[0]}")
    assert record["algorithm"] == "DDTREE", record
