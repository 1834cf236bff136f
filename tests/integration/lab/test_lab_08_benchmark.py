"""benchmark.yml: NEXTN vs DFLASH vs DDTREE through the deploy roles and gate, then known-good.

Acceptance on the lab: on ct200 all three files are written and DDTREE/DFLASH output throughput
at concurrency 1 matches the lab physics (1.24) within 5 %; on ct129 DDTREE is reported failed
with evidence, and both hosts end on their known-good NEXTN unit, probed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import labkit


@pytest.fixture(scope="module")
def bench(lab):
    kg_before = {h: labkit.sha256(h, labkit.UNIT)[labkit.UNIT] for h in labkit.LAB_HOSTS}
    run = labkit.run_playbook("benchmark.yml", "-l", "ct129,ct200", "-e", '{"benchmark_concurrency": [1, 4]}',
                              "-e", "benchmark_requests_per_level=8", "-e", "benchmark_max_new_tokens=96",
                              timeout=1500)
    labkit.record_timing("benchmark ct129+ct200 (3 candidates, c=1,4)", play_wall=run.seconds)
    return run, kg_before


def newest(host: str) -> Path:
    runs = sorted((labkit.ARTIFACTS / "benchmark" / host).iterdir())
    return runs[-1]


def test_benchmark_play_succeeds_and_writes_three_files(bench):
    run, _ = bench
    assert run.rc == 0, run
    for host in labkit.LAB_HOSTS:
        d = newest(host)
        for name in ("results.json", "report.md", "throughput.png"):
            assert (d / name).is_file() and (d / name).stat().st_size > 0, d / name
        assert (d / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def level(result: dict, c: int) -> dict:
    return next(lv for lv in result["levels"] if lv["max_concurrency"] == c)


def test_ddtree_over_dflash_matches_the_lab_physics_on_ct200(bench):
    results = {r["candidate"]: r for r in json.loads((newest("ct200") / "results.json").read_text())["results"]}
    assert {k: v["status"] for k, v in results.items()} == {"NEXTN": "ok", "DFLASH": "ok", "DDTREE": "ok"}
    ratio = level(results["DDTREE"], 1)["output_throughput"] / level(results["DFLASH"], 1)["output_throughput"]
    labkit.record_timing("benchmark ct200 DDTREE/DFLASH at c=1", ratio=f"{ratio:.3f}")
    assert ratio == pytest.approx(1.24, rel=0.05)
    assert results["DDTREE"]["workload"]["hash"] and results["DDTREE"]["gpu"]["arch"] == "sm120"
    report = (newest("ct200") / "report.md").read_text()
    assert "DDTREE" in report and "NEXTN" in report


def test_ct129_ddtree_fails_with_evidence_and_hosts_end_on_known_good(bench):
    _, kg_before = bench
    results = {r["candidate"]: r for r in json.loads((newest("ct129") / "results.json").read_text())["results"]}
    assert results["DDTREE"]["status"] == "failed"
    assert results["NEXTN"]["status"] == "ok" and results["DFLASH"]["status"] == "ok"
    evidence = Path(results["DDTREE"]["evidence"]["path"])
    assert "!!!!" in (evidence / "probe-report.json").read_text()
    assert "FAILED" in (newest("ct129") / "report.md").read_text().upper()
    for host in labkit.LAB_HOSTS:
        assert labkit.sha256(host, labkit.UNIT)[labkit.UNIT] == kg_before[host]
        assert labkit.service(host)["ActiveState"] == "active"
        rc, report, _ = labkit.probe(host)
        assert rc == 0, report
        assert json.loads((newest(host) / "results.json").read_text())["restored_probe"] == "pass"
    assert not labkit.quarantine_files("ct129")  # a benchmark quarantines nothing
