"""ct200 (8x RTX PRO 6000, sm120): DDTREE works there, passes the gate and is promoted; a second
deploy is a no-op; then the lab is reseeded back to the known-good NEXTN."""

from __future__ import annotations

import json
import os
import subprocess

import labkit
import pytest

HOST = "ct200"


# Old versions an earlier life of the host left behind (role retention collects them after the
# change): records naming venvs that are gone, orphan venvs with their patch sets, old revisions.
OLD = {"records": [f"/var/lib/ddtree-fleet/records/0ld{i}" for i in range(1, 4)],
       "venvs": [f"/opt/sglang/venvs/0.5.23-oldset{i}" for i in range(1, 5)],
       "patches": [f"/opt/sglang/patches/oldset{i}" for i in range(1, 5)],
       "weights": [f"/opt/sglang/models/Qwen--Qwen3.6-27B/{i:040x}" for i in range(1, 5)]}


def plant_old_versions():
    lines = ["set -eu"]
    for kind, paths in OLD.items():
        for i, path in enumerate(paths, 1):
            lines.append(f"mkdir -p {path} && head -c 4096 /dev/zero > {path}/blob")
            if kind == "records":
                lines.append(f"""printf '{{"fingerprint": "0ld{i}", "venv": "/opt/sglang/venvs/gone{i}"}}' > {path}/meta.json""")
            lines.append(f"touch -d '2026-01-0{i} 00:00' {path}")
    labkit.ssh(HOST, "\n".join(lines))


# Old controller artifacts (role retention, entry point controller, keeps 200 reports of each kind
# and 20 evidence directories per host): planted a year back, so they are the oldest there are.
OLD_REPORTS = [f"20251201T{i // 60:02d}{i % 60:02d}00Z-{i}.json" for i in range(205)]
OLD_EVIDENCE = [f"20251201T00{i:02d}00Z" for i in range(25)]


def plant_old_artifacts():
    for name in OLD_REPORTS:
        path = labkit.ARTIFACTS / "deploy" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
        os.utime(path, (1_733_000_000, 1_733_000_000))
    for name in OLD_EVIDENCE:
        path = labkit.ARTIFACTS / HOST / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "summary.json").write_text("{}\n")
        os.utime(path, (1_733_000_000, 1_733_000_000))


@pytest.fixture(scope="module")
def promoted(lab):
    pre = {"kg": labkit.known_good(HOST), "service": labkit.service(HOST)}
    assert pre["kg"]["meta"]["algorithm"] == "NEXTN", pre["kg"]
    plant_old_versions()
    plant_old_artifacts()
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST)
    print(f"\n[ct200] deploy_ddtree.yml -l {HOST}: rc {run.rc} in {run.seconds:.1f}s")
    latest = json.loads((labkit.ARTIFACTS / "deploy" / "latest.json").read_text())
    return {"pre": pre, "run": run, "report": latest["run"] + ".json"}


def test_ddtree_passes_the_gate_and_is_promoted(promoted):
    run = promoted["run"]
    assert run.rc == 0, str(run)
    recap = run.recap(HOST)
    assert recap["failed"] == 0 and recap["changed"] > 0, recap
    kg = labkit.known_good(HOST)
    assert kg["link"] != promoted["pre"]["kg"]["link"], "known-good did not move"
    assert kg["meta"]["algorithm"] == "DDTREE", kg["meta"]
    assert kg["link"] == f"records/{kg['meta']['fingerprint']}", kg
    assert kg["meta"]["gate"]["verdict"] == "pass", kg["meta"]
    live = labkit.sha256(HOST, labkit.UNIT, labkit.ENV_FILE)
    assert (live[labkit.UNIT], live[labkit.ENV_FILE]) == (kg["unit_sha256"], kg["env_sha256"])
    assert (kg["meta"]["unit_sha256"], kg["meta"]["env_sha256"]) == (kg["unit_sha256"], kg["env_sha256"])
    unit = labkit.read_text(HOST, labkit.UNIT)
    assert "--speculative-algorithm DDTREE " in unit and "--speculative-draft-model-path " in unit, unit
    # sm120's sglang_ddtree_budget (group_vars/sm120.yml), rendered for DDTREE only
    assert "--speculative-ddtree-budget 32 " in unit, unit
    assert not labkit.quarantine_files(HOST)
    labkit.record_timing("ct200 DDTREE promoted", play_wall=float(run.seconds),
                         detection=float(kg["meta"]["gate"].get("detection_seconds") or 0.0))


def test_promotion_records_its_speed_gain(promoted):
    """DDTREE against the NEXTN it replaced, under load at both levels: promoted with its gain, and
    the measurement is in the known-good record, the deploy report and the host's textfile."""
    speed = labkit.known_good(HOST)["meta"]["speed"]
    assert speed["verdict"] == "pass", speed
    assert [lv["concurrency"] for lv in speed["levels"]] == [1, 4]
    for lv in speed["levels"]:
        # docs/lab-physics.md, sm120: DDTREE 148.8 tok/s against NEXTN's 96 (1.55 at one stream)
        assert 1.0 < lv["ratio_low"] <= lv["ratio"] <= lv["ratio_high"], lv
        assert lv["tokens_per_s"] > lv["baseline_tokens_per_s"] > 0, lv
        assert lv["ttft_p99_ms"] >= lv["ttft_p50_ms"] > 0 and lv["itl_p50_ms"] > 0, lv
    assert [lv["concurrency"] for lv in speed["known_good_levels"]] == [1, 4]
    report = json.loads((labkit.ARTIFACTS / "deploy" / "latest.json").read_text())
    entry = next(e for e in report["hosts"] if e["host"] == HOST)
    assert entry["outcome"] == "promoted" and entry["speed"]["levels"] == speed["levels"], entry
    prom = (labkit.ARTIFACTS / "drift" / f"ddtree_fleet_speed_{HOST}.prom").read_text()
    assert f'ddtree_fleet_speed_ratio{{host="{HOST}",concurrency="4",bound="low"}}' in prom, prom
    assert f'ddtree_fleet_speed_verdict{{host="{HOST}",verdict="pass"}} 1.0' in prom, prom
    c1 = speed["levels"][0]
    print(f"\n[ct200] speed gate {speed['seconds']}s: c=1 {c1['tokens_per_s']} vs {c1['baseline_tokens_per_s']} tok/s, "
          f"ratio {c1['ratio']} [{c1['ratio_low']}, {c1['ratio_high']}]")
    labkit.record_timing("ct200 speed gate (DDTREE vs NEXTN)", gate=float(speed["seconds"]), ratio_c1=str(c1["ratio"]))


def test_promoted_ddtree_serves_correctly(promoted):
    svc = labkit.service(HOST)
    assert svc["ActiveState"] == "active", svc
    assert svc["ActiveEnterTimestamp"] != promoted["pre"]["service"]["ActiveEnterTimestamp"]
    rc, report, err = labkit.probe(HOST)
    assert rc == 0 and report["verdict"] == "pass", (rc, report and report.get("reasons"), err)
    assert "!!!!" not in str([p.get("output") for p in report["prompts"]])
    # DDTREE's acceptance on a working arch (docs/lab-physics.md: 5.2 vs NEXTN's 3.1).
    assert any((p.get("spec_accept_length") or 0) > 4 for p in report["prompts"]), report["prompts"]


def test_promoted_server_took_the_node_budget(promoted):
    """The venv's source defines the budget field (patch 0004), so the server parsed the flag (without
    the field it would have exited 2) and reports the value it runs with."""
    venv = labkit.known_good(HOST)["meta"]["venv"]
    labkit.ssh(HOST, f"grep -q speculative_ddtree_budget {venv}/lib/python3*/site-packages/sglang/srt/arg_groups/fields/spec.py")
    code = ("import json, urllib.request; print(json.load(urllib.request.urlopen("
            f"'{labkit.SERVICE_URL}/server_info', timeout=10))['speculative_ddtree_budget'])")
    res = subprocess.run(["ip", "netns", "exec", labkit.netns(HOST), str(labkit.VENV_BIN / "python"), "-c", code],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "32", (res.stdout, res.stderr)
    assert "has no effect" not in labkit.ssh(HOST, "journalctl -u sglang.service -b --no-pager -q").stdout


def test_old_versions_are_collected_but_never_what_a_record_needs(promoted):
    """retention_keep=2: of each kind the two newest others stay besides the known-good record, the
    declared configuration and what a kept record names; the rest went after the promotion."""
    kg = labkit.known_good(HOST)
    seeded = promoted["pre"]["kg"]
    exists = {p: labkit.ssh(HOST, f"test -d {p}", check=False).returncode == 0
              for p in [q for paths in OLD.values() for q in paths]
              + [f"/var/lib/ddtree-fleet/{seeded['link']}", f"/var/lib/ddtree-fleet/{kg['link']}",
                 kg["meta"]["venv"], kg["meta"]["model_dir"], kg["meta"]["draft_dir"], seeded["meta"]["venv"]]}
    gone = sorted(p for p, there in exists.items() if not there)
    assert gone == sorted(OLD["records"][:2] + OLD["venvs"][:2] + OLD["patches"][:2] + OLD["weights"][:2]), exists
    assert "collected 8 old version(s)" in promoted["run"].out, promoted["run"].tail()
    labkit.ssh(HOST, "rm -rf " + " ".join(p for paths in OLD.values() for p in paths))


def test_old_controller_artifacts_are_collected(promoted):
    """The run's report and the newest stay; the oldest reports beyond 200 and this host's evidence
    beyond 20 go; latest.json stays."""
    reports = sorted(p.name for p in (labkit.ARTIFACTS / "deploy").glob("*.json") if not p.name.startswith("latest"))
    assert len(reports) == 200, len(reports)
    assert (labkit.ARTIFACTS / "deploy" / "latest.json").exists()
    assert promoted["report"] in reports
    planted_left = [n for n in OLD_REPORTS if (labkit.ARTIFACTS / "deploy" / n).exists()]
    assert len(planted_left) < len(OLD_REPORTS) and OLD_REPORTS[0] not in planted_left
    evidence = [p.name for p in (labkit.ARTIFACTS / HOST).iterdir() if p.is_dir()]
    assert len(evidence) == 20, evidence
    assert "collected" in promoted["run"].out and "old report(s)" in promoted["run"].out, promoted["run"].tail()


def test_second_deploy_changes_nothing(promoted):
    before = labkit.service(HOST)
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST)
    print(f"\n[ct200] second deploy: rc {run.rc} in {run.seconds:.1f}s")
    assert run.rc == 0, str(run)
    recap = run.recap(HOST)
    assert recap["changed"] == 0 and recap["failed"] == 0, f"{recap}\n{run.tail(80)}"
    after = labkit.service(HOST)
    assert (after["ActiveEnterTimestamp"], after["MainPID"]) == (before["ActiveEnterTimestamp"], before["MainPID"])
    labkit.record_timing("ct200 DDTREE no-op redeploy", play_wall=float(run.seconds))


def test_a_slower_candidate_fails_the_speed_gate(promoted):
    """The issue's run: DFLASH without CUDA graphs replacing the promoted DDTREE is healthy, fluent
    and lossless (it passes the probe) but 44% slower: the speed gate fails it with its ratio and
    interval, and the host is back on DDTREE."""
    kg = labkit.known_good(HOST)
    before = labkit.evidence_dirs(HOST)
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST, "-e", json.dumps({
        "sglang_speculative_algorithm": "DFLASH",
        "sglang_cuda_graph_backend": {"decode": "disabled", "prefill": "disabled"}}))
    print(f"\n[ct200] slow DFLASH candidate: rc {run.rc} in {run.seconds:.1f}s")
    assert run.rc != 0, run.tail(60)
    assert "not the speed gate (fail)" in run.out and "slower than the tolerance" in run.out, run.tail(60)
    after = labkit.known_good(HOST)
    assert after["link"] == kg["link"] and after["meta"]["algorithm"] == "DDTREE"
    live = labkit.sha256(HOST, labkit.UNIT)
    assert live[labkit.UNIT] == kg["unit_sha256"], "the host is not back on the known-good unit"
    assert labkit.service(HOST)["ActiveState"] == "active"
    report = json.loads((labkit.ARTIFACTS / "deploy" / "latest.json").read_text())
    entry = next(e for e in report["hosts"] if e["host"] == HOST)
    assert entry["outcome"] != "promoted" and entry["speed"]["verdict"] == "fail", entry
    for lv in entry["speed"]["levels"]:
        assert lv["verdict"] == "fail" and lv["ratio_high"] < 0.9 and lv["ratio_low"] <= lv["ratio"], lv
    evidence = labkit.new_evidence_dir(HOST, before)
    assert json.loads((evidence / "speed.json").read_text())["verdict"] == "fail"
    c1 = entry["speed"]["levels"][0]
    labkit.record_timing("ct200 slow candidate refused by the speed gate", play_wall=float(run.seconds),
                         ratio_c1=str(c1["ratio"]))
    labkit.clear_quarantine(HOST)


def test_reseed_brings_ct200_back_to_nextn(promoted):
    run = labkit.reseed()
    print(f"\n[ct200] reseed: rc {run.rc} in {run.seconds:.1f}s")
    assert run.rc == 0, str(run)
    for host in labkit.LAB_HOSTS:
        assert labkit.seeded_problems(host) == [], host
    rc, report, err = labkit.probe(HOST)
    assert rc == 0, (rc, report and report.get("reasons"), err)
    labkit.record_timing("lab reseed (ct200 DDTREE -> NEXTN)", play_wall=float(run.seconds))
