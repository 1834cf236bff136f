"""report.md / throughput.png from synthetic results (no server)."""

import json

from ansible_collections.ddtree.fleet.plugins.module_utils.bench import runner as db
from ansible_collections.ddtree.fleet.plugins.plugin_utils import bench_report as br
from bench_testlib import run_bench


def _level(c, tp, **kw):
    lv = {"concurrency": c, "completed": 8, "num_requests": 8, "errors": 0, "error_messages": [],
          "output_throughput": tp, "request_throughput": tp / 256, "median_ttft_ms": 50.0,
          "p90_ttft_ms": 60.0, "p99_ttft_ms": 70.0, "median_itl_ms": 8.0, "p90_itl_ms": 9.0,
          "p99_itl_ms": 12.0, "median_e2e_latency_ms": 2100.0, "accept_length": 3.1}
    lv.update(kw)
    return lv


def _res(name, levels, status="ok", evidence=None):
    return {"candidate": name, "host": "gpu-7", "gpu": {"name": "RTX PRO 6000", "count": 1,
                                                        "arch": "sm120"},
            "versions": {"sglang": "0.5.23"}, "flags": ["--speculative-algorithm " + name],
            "workload": {"version": "ddtree-bench-workload-v1", "hash": "ab" * 32},
            "levels": levels, "status": status, "evidence": evidence}


NEXTN = _res("NEXTN", [_level(1, 96.0), _level(4, 340.0)])
DFLASH = _res("DFLASH", [_level(1, 120.0, accept_length=4.2), _level(4, 425.0, errors=1,
                                                                       error_messages=["HTTP 503: x"])])
DDTREE = _res("DDTREE", [], "failed", {"reason": "health check never passed",
                                       "errors": ["ValueError: Unknown speculative algorithm"]})


def test_ratios_against_baseline():
    r = br.throughput_ratios([NEXTN, DFLASH, DDTREE], "NEXTN")
    assert r[("NEXTN", 1)] == 1.0
    assert r[("DFLASH", 1)] == 120.0 / 96.0 and r[("DFLASH", 4)] == 425.0 / 340.0
    assert ("DDTREE", 1) not in r


def test_render_report_table_and_failures():
    md = br.render_report([DFLASH, NEXTN, DDTREE])
    assert "Baseline for the ratio column: NEXTN" in md
    assert "| Candidate | Concurrency | Output tok/s | vs NEXTN | Req/s | TTFT p50 ms |" in md
    assert "| DFLASH | 1 | 120.0 | 1.25x | 0.47 | 50.0 | 60.0 | 70.0 | 8.00 | 9.00 | 12.00 | " \
           "2,100.0 | 4.20 | 0/8 |" in md
    assert "| DFLASH | 4 | 425.0 | 1.25x |" in md and "| 1/8 |" in md
    assert "| DDTREE | – | **FAILED**: health check never passed: ValueError: Unknown" in md
    assert "DFLASH at concurrency 4: 1 failed request(s): HTTP 503: x" in md
    assert "gpu-7" in md and "RTX PRO 6000 (sm120)" in md
    # no numbers for the failed candidate
    assert not any(line.startswith("| DDTREE | 1") for line in md.splitlines())


def test_render_report_missing_baseline_and_mixed_workloads():
    other = dict(DFLASH, workload={"version": "ddtree-bench-workload-v2", "hash": "cd" * 32})
    md = br.render_report([other, DDTREE], baseline="NEXTN")
    assert "Baseline NEXTN has no successful result" in md
    assert "| DFLASH | 1 | 120.0 | n/a |" in md
    assert br.render_report([DFLASH, other]).count("different workloads") == 1


def test_report_cli_writes_md_and_png(tmp_path):
    files = []
    for r in (NEXTN, DFLASH, DDTREE):
        f = tmp_path / f"{r['candidate']}.json"
        f.write_text(json.dumps(r))
        files.append(str(f))
    out = tmp_path / "out"
    p = run_bench("report", *files, "--out-dir", str(out), "--baseline", "DFLASH")
    assert p.returncode == 0, p.stderr
    assert "| vs DFLASH |" in (out / "report.md").read_text()
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    assert run_bench("report", str(bad), "--out-dir", str(out)).returncode == 2


def test_gpu_label_reads_gpu_facts_and_cli_shapes():
    facts = {"count": 8, "names": ["NVIDIA RTX PRO 6000 Blackwell Workstation Edition"] * 8, "arch": "sm120"}
    assert br.gpu_label(facts) == "8x NVIDIA RTX PRO 6000 Blackwell Workstation Edition (sm120)"
    assert br.gpu_label({"name": "NVIDIA RTX A6000", "count": 1}) == "NVIDIA RTX A6000"
    assert br.gpu_label({}) == "unknown GPU"


def test_flags_from_server_info_keep_the_listed_arguments_only():
    info = {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 48,
            "speculative_draft_model_path": "/srv/models/draft", "tp_size": 1,
            "disable_cuda_graph": False, "enable_metrics": True,
            "api_key": "sk-canary", "admin_api_key": "sk-admin",
            "launch_command": "python -m sglang.launch_server --api-key sk-canary"}
    flags = db.flags_from_server_info(info)
    assert flags == ["--speculative-algorithm DDTREE", "--speculative-ddtree-budget 48",
                     "--speculative-draft-model-path /srv/models/draft", "--tp-size 1"]
    assert "sk-" not in json.dumps(flags)
    assert db.candidate_from_server_info(info) == "DDTREE"
    assert db.candidate_from_server_info({"speculative_algorithm": "DFLASH",
                                          "speculative_dflash_enable_ddtree": True}) == "DDTREE"
    assert db.candidate_from_server_info({"speculative_algorithm": None}) == "NONE"
    assert db.flags_from_server_info("not a dict") == [] and db.candidate_from_server_info(None) is None
