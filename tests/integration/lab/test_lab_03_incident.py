"""The CT129 incident, replayed: DDTREE on 2x A6000 (sm86) is healthy but emits '!' at 0.057 tok/s.

One deploy (module fixture) feeds every assertion: the gate must catch it, the play must fail
naming ct129, evidence must land on the controller, the known-good NEXTN unit must be back byte
for byte, healthy and passing the probe, and the configuration must be quarantined. A second
deploy of the same configuration must then leave ct129 alone.
"""

from __future__ import annotations

import json
import re

import labkit
import pytest
import yaml

HOST = "ct129"


@pytest.fixture(scope="module")
def incident(lab):
    pre = {
        "live": labkit.sha256(HOST, labkit.UNIT, labkit.ENV_FILE),
        "kg": labkit.known_good(HOST),
        "evidence": labkit.evidence_dirs(HOST),
        "service": labkit.service(HOST),
    }
    assert pre["kg"]["meta"]["algorithm"] == "NEXTN", pre["kg"]
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST)
    print(f"\n[incident] deploy_ddtree.yml -l {HOST}: rc {run.rc} in {run.seconds:.1f}s")
    evidence = labkit.new_evidence_dir(HOST, pre["evidence"]) if labkit.evidence_dirs(HOST) - pre["evidence"] else None
    return {"pre": pre, "run": run, "evidence": evidence}


@pytest.fixture(scope="module")
def evidence(incident):
    assert incident["evidence"] is not None, f"no evidence directory was written:\n{incident['run']}"
    return incident["evidence"]


def _json(path):
    return json.loads(path.read_text())


def test_deploy_fails_naming_ct129(incident):
    run = incident["run"]
    assert run.rc != 0, str(run)
    recap = run.recap(HOST)
    assert recap["failed"] == 1 and recap["rescued"] == 1, recap
    fatal = " ".join(run.out[run.out.rfind("fatal: [ct129]"):].split())
    assert "fatal: [ct129]" in run.out
    assert fatal.startswith("fatal: [ct129]") and "ct129: the DDTREE change failed" in fatal, fatal[:2000]
    assert "quarantined" in fatal and "restored, healthy and probed" in fatal, fatal[:2000]


def test_evidence_shows_the_bang_bursts(evidence):
    for name in ("journal.txt", "probe-report.json", "unit.diff", "summary.json", "restored-probe-report.json"):
        assert (evidence / name).is_file(), f"{name} missing in {evidence}"
    report_text = (evidence / "probe-report.json").read_text()
    assert "!!!!" in report_text
    report = json.loads(report_text)
    assert report["verdict"] == "fail" and report["passed"] is False, report.get("reasons")
    assert any("!" in (p.get("output") or "") and set((p.get("output") or "!").strip()) == {"!"}
               for p in report["prompts"]), report["prompts"]
    summary = _json(evidence / "summary.json")
    assert summary["host"] == HOST and summary["algorithm"] == "DDTREE" and summary["verdict"] == "fail", summary
    journal = (evidence / "journal.txt").read_text()
    # The unit's logging config keeps the engine's server_args={...} line (API key in clear) out of
    # the journal, so the algorithm the candidate ran is shown by unit.diff and summary.json.
    assert "server_args=" not in journal, "the key-bearing start-up line must not reach the journal"
    assert "The server is fired up and ready to roll!" in journal, journal[-2000:]
    # ... and it covers the gate's probe of the candidate (after its start-up and warm-up request).
    ready = journal.index("The server is fired up and ready to roll!")
    assert re.search(r'"POST /(generate|v1/chat/completions|v1/completions) HTTP/1\.1"', journal[ready:]), journal[-2000:]
    diff = (evidence / "unit.diff").read_text()
    assert re.search(r"^-ExecStart=.*--speculative-algorithm NEXTN ", diff, re.M), diff
    assert re.search(r"^\+ExecStart=.*--speculative-algorithm DDTREE ", diff, re.M), diff
    # sm86's sglang_ddtree_budget (group_vars/sm86.yml), accepted by the patched source (0004).
    assert re.search(r"^\+ExecStart=.*--speculative-ddtree-budget 16 ", diff, re.M), diff


def test_known_good_restored_byte_for_byte(incident):
    pre = incident["pre"]
    assert labkit.sha256(HOST, labkit.UNIT, labkit.ENV_FILE) == pre["live"]
    kg = labkit.known_good(HOST)
    assert kg["link"] == pre["kg"]["link"], "the known-good record must not move on a failed gate"
    assert pre["live"][labkit.UNIT] == kg["unit_sha256"] and pre["live"][labkit.ENV_FILE] == kg["env_sha256"]
    svc = labkit.service(HOST)
    assert svc["ActiveState"] == "active" and svc["SubState"] == "running", svc
    assert svc["ActiveEnterTimestamp"] != pre["service"]["ActiveEnterTimestamp"], "the service was not restarted"


def test_restored_service_passes_the_probe(incident, evidence):
    rc, report, err = labkit.probe(HOST)
    assert rc == 0 and report and report["verdict"] == "pass", (rc, report and report.get("reasons"), err)
    restored = _json(evidence / "restored-probe-report.json")
    assert restored["verdict"] == "pass" and restored["passed"] is True, restored.get("reasons")


def test_configuration_is_quarantined_and_its_venv_kept(incident, evidence):
    summary = _json(evidence / "summary.json")
    fingerprint = summary["fingerprint"]
    assert fingerprint != summary["known_good_fingerprint"]
    assert labkit.quarantine_files(HOST) == [f"{fingerprint}.json"]
    record = labkit.read_json(HOST, f"{labkit.STATE_DIR}/quarantine/{fingerprint}.json")
    assert record["fingerprint"] == fingerprint and record["algorithm"] == "DDTREE", record
    assert record["evidence"] == str(evidence), record

    venv = _json(evidence / "flags.json")["venv"]
    # <version>-<patch set>-lock-<hash of the lab's lock> (role sglang, sglang_requirements_lock)
    assert re.fullmatch(r"/opt/sglang/venvs/0\.5\.23-[0-9a-f]{12}-lock-[0-9a-f]{10}", venv), venv
    stamp = labkit.read_json(HOST, f"{venv}/.ddtree-venv.json")
    defaults = yaml.safe_load((labkit.REPO / "roles" / "sglang" / "defaults" / "main.yml").read_text())
    assert [p["name"] for p in stamp["patches"]] == defaults["sglang_patches"], stamp
    assert "0004-ddtree-worker.patch" in defaults["sglang_patches"]
    labkit.ssh(HOST, f"test -x {venv}/bin/python && {venv}/bin/python -c 'import sglang_lab_standin'")


def test_report_timings(incident, evidence):
    """detection (probe report), failure -> restored and probed, whole play wall time."""
    run = incident["run"]
    failed = _json(evidence / "probe-report.json")
    restored = _json(evidence / "restored-probe-report.json")
    failed_at = labkit.parse_iso(failed["started_at"]) + failed["detection_seconds"]
    restored_at = labkit.parse_iso(restored["started_at"]) + restored["detection_seconds"]
    rollback_from_reports = restored_at - failed_at

    # The same from the play's own output, timed as each line arrived.
    gate_probe = run.first_line_at(r"^TASK \[ddtree\.fleet\.quality_gate : Probe the service \(quality gate\)\]")
    rescue = run.first_line_at(r"^TASK \[ddtree\.fleet\.known_good : Choose the evidence directory\]")
    restore = run.first_line_at(r"^RUNNING HANDLER \[ddtree\.fleet\.known_good : Restore the known-good unit\b")
    probed = run.first_line_at(r"^RUNNING HANDLER \[ddtree\.fleet\.known_good : Keep the restored service's probe report")
    measured = {
        "detection": float(failed["detection_seconds"]),
        "rollback_from_reports": float(rollback_from_reports),
        "play_wall": float(run.seconds),
    }
    if rescue is not None and probed is not None:
        measured["gate_fail_to_restored_probed"] = probed - rescue
    if restore is not None and probed is not None:
        measured["restore_to_healthy_and_probed"] = probed - restore
    if gate_probe is not None and rescue is not None:
        measured["gate_probe_to_verdict"] = rescue - gate_probe
    labkit.record_timing("ct129 incident (DDTREE on sm86)", **measured)
    assert 0 < measured["detection"] < 30, measured
    assert 0 < measured["rollback_from_reports"] < 120, measured
    assert "restore_to_healthy_and_probed" in measured, "restore handlers not seen in the play output"


@pytest.fixture(scope="module")
def rerun(incident, evidence):
    before = labkit.service(HOST)
    live = labkit.sha256(HOST, labkit.UNIT, labkit.ENV_FILE)
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST)
    print(f"\n[incident] second deploy: rc {run.rc} in {run.seconds:.1f}s")
    return {"before": before, "live": live, "run": run}


def test_second_deploy_ends_as_quarantined(rerun):
    """The host stays on known-good, nothing is retried or changed, and the exit status says the
    declared configuration was not reached (a pipeline chaining on it must not deploy on)."""
    run = rerun["run"]
    assert run.rc == 2, str(run)
    recap = run.recap(HOST)
    assert recap["changed"] == 0 and recap["failed"] == 1, recap
    flat = " ".join(run.out.split())
    assert "ct129 quarantined" in flat, run.tail(80)
    assert re.search(r"ct129: not deployed: the declared configuration \w+ is quarantined; the host "
                     r"serves its known-good \w+", flat), run.tail(80)
    ran = re.findall(r"^TASK \[(?:ddtree\.fleet\.sglang_service : Install the unit|ddtree\.fleet\.quality_gate : Probe the service)[^\]]*\] \**\n"
                     r"(?:ok|changed|fatal): \[ct129\]", run.out, re.M)
    assert not ran, f"a quarantined configuration was retried: {ran}\n{run.tail(80)}"


def test_second_deploy_did_not_restart_the_service(rerun):
    after = labkit.service(HOST)
    assert after["ActiveState"] == "active"
    assert (after["ActiveEnterTimestamp"], after["MainPID"]) == (
        rerun["before"]["ActiveEnterTimestamp"], rerun["before"]["MainPID"])
    assert labkit.sha256(HOST, labkit.UNIT, labkit.ENV_FILE) == rerun["live"]
