"""The timing table of `make test`: tests/conftest.py's --times-json and tests/times_report.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

import times_report  # noqa: E402


def test_times_json_records_every_test_with_its_worker(tmp_path):
    """A real pytest run with two xdist workers: the controller writes one entry per test."""
    out = tmp_path / "t.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "tests/unit/labctl/test_labctl_cli.py", "-k", "find_host or alternates",
                          "--times-json", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    ids = {t["nodeid"].split("::")[-1] for t in data["tests"]}
    assert ids == {"test_find_host_lab_fleet_and_scale_hosts", "test_find_host_from_its_record_and_from_a_fleet_file",
                   "test_up_hosts_8_alternates_architectures"}
    assert {t["worker"] for t in data["tests"]} <= {"gw0", "gw1"}
    assert all(t["outcome"] == "passed" and t["seconds"] > 0 for t in data["tests"])
    assert [t["seconds"] for t in data["tests"]] == sorted((t["seconds"] for t in data["tests"]), reverse=True)
    assert data["exitstatus"] == 0 and data["wall_seconds"] > 0


def test_report_has_stage_totals_workers_and_the_slowest_tests(tmp_path):
    d = tmp_path / "times"
    d.mkdir()
    (d / "stages.tsv").write_text("unit tests\tunit\t1000.0\t1040.5\t0\n"
                                  "lab integration\tintegration\t1100.0\t1700.0\t1\n"
                                  "lab down\tlab-down\t1700.0\t1712.0\t0\n")
    tests = [{"nodeid": f"tests/integration/t.py::test_{i}", "seconds": float(i), "outcome": "passed",
              "worker": f"gw{i % 3}"} for i in range(1, 31)]
    tests[0]["outcome"] = "failed"
    tests += [{"nodeid": f"tests/integration/test_molecule.py::test_molecule_scenario[{s}]", "seconds": sec,
               "outcome": "passed", "worker": w} for s, sec, w in (("default", 100.0, "gw1"), ("deploy", 250.0, "gw0"))]
    (d / "integration.json").write_text(json.dumps({"tests": tests}))
    (d / "unit.json").write_text(json.dumps({"tests": [{"nodeid": "tests/unit/u.py::test_u", "seconds": 0.5,
                                                         "outcome": "passed", "worker": "main"}]}))
    out = tmp_path / "test-times.md"
    assert times_report.main(["--dir", str(d), "--out", str(out), "--top", "20"]) == 0
    text = out.read_text()
    assert "| unit tests | 0:40 | 40 | 1 | 0 |" in text
    # 30 tests + 2 scenarios, sum 465 + 350 s; gw0 3+6+..+30 = 165 (+250), gw1 1+4+..+28 = 145 (+100), gw2 155.
    assert "| lab integration | 10:00 | 600 | 32 | 815 | gw0 415, gw1 245, gw2 155 | 1 |" in text
    assert "| ↳ molecule (inside the stage above) | 4:10 | 250 | 2 | 350 | gw0, gw1 | |" in text
    assert "| **total** | **11:52** | 712 | 33 |" in text
    slowest = [line for line in text.splitlines() if line.startswith("| ") and "::test_" in line]
    assert len(slowest) == 20 and "[deploy]`" in slowest[0] and "[default]`" in slowest[1]
    assert "test_30`" in slowest[2] and "test_13`" in slowest[-1]
    assert "Outcomes: failed 1, passed 32" in text
    assert "| 465 | 30 | gw0, gw1, gw2 | `tests/integration/t.py` |" in text


def test_a_stage_that_did_not_finish_is_shown(tmp_path):
    (tmp_path / "stages.tsv").write_text("lab up\tlab-up\t1000.0\t\t\n")
    text = times_report.render(times_report.read_stages(tmp_path / "stages.tsv"), {}, 20)
    assert "| lab up | 0:00 | 0 |  |  |  | did not finish |" in text


def test_cpu_busy_is_read_from_the_proc_stat_samples_of_each_stage(tmp_path):
    """run_all.sh's samples: a stage that kept both of two CPUs busy shows 100 %, an idle one 0 %;
    a stage shorter than two samples apart, or a run without samples, shows nothing."""
    (tmp_path / "stages.tsv").write_text("busy\tunit\t1000.0\t1020.0\t0\n"
                                         "idle\tlint\t1020.0\t1030.0\t0\n"
                                         "blink\treal\t1030.0\t1031.0\t0\n")
    # every 5 s: 1000 jiffies of two CPUs; busy = user + nice + system + irq + softirq + steal
    rows, busy, idle = [], 0, 0
    for k in range(0, 8):
        t = 1000.0 + 5 * k
        if t > 1020.0:
            idle += 1000
        elif k:
            busy += 1000
        rows.append(f"{t} cpu {busy // 2} {busy // 4} {busy // 4} {idle} 0 0 0 0 0 0")
    (tmp_path / "cpu.txt").write_text("# cores 2\n" + "\n".join(rows) + "\n")
    stages = times_report.read_stages(tmp_path / "stages.tsv")
    cpu = times_report.read_cpu(tmp_path / "cpu.txt")
    assert len(cpu) == 8 and cpu[0] == (1000.0, 0, 0)
    text = times_report.render(stages, {}, 20, cpu)
    assert "| busy | 0:20 | 20 |  |  |  | 0 | 100 % |" in text
    assert "| idle | 0:10 | 10 |  |  |  | 0 | 0 % |" in text
    assert "| blink | 0:01 | 1 |  |  |  | 0 |  |" in text
    assert "| **total** | **0:31** | 31 | 0 | | | | 67 % |" in text
    assert "| busy | 0:20 | 20 |  |  |  | 0 |  |" in times_report.render(stages, {}, 20)
