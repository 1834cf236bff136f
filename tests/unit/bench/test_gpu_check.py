"""ddtree-gpu-check end to end on CPU: the same code a GPU host runs (launch the target alone,
probe it, launch DDTREE, probe it against the target, print the parity table), with the lab
stand-in as the server module (`--module sglang_lab_standin`): parity and the speed ratio, a
lossless violation, and a DDTREE server that does not start."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench_testlib import DFLASH_FILES, REPO, STANDIN_SRC, _fake_host
from fleet_testlib import free_port

GPU_CHECK = REPO / "bin" / "ddtree-gpu-check"


def gpu_check(tmp_path: Path, *extra: str, ddtree_files=DFLASH_FILES, env_extra=None):
    smi, pkg = _fake_host(tmp_path, ddtree_files)
    for d in ("target", "draft"):
        (tmp_path / d).mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_LAB_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update({"PYTHONPATH": str(STANDIN_SRC), "DDTREE_LAB_NVIDIA_SMI": str(smi),
                "DDTREE_LAB_SGLANG_DIR": str(pkg), "DDTREE_LAB_STARTUP_SECONDS": "0.1",
                "DDTREE_LAB_WARMUP_SECONDS": "0.1", "DDTREE_LAB_RATE_SCALE": "4",
                "DDTREE_LAB_RATE_JITTER": "0", "DDTREE_LAB_COLD_REQUESTS": "0", **(env_extra or {})})
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(GPU_CHECK), "--python", sys.executable, "--module", "sglang_lab_standin",
                          "--model-path", str(tmp_path / "target"), "--draft-model-path", str(tmp_path / "draft"),
                          "--port", str(free_port()), "--start-timeout", "60", "--out", str(out), *extra],
                         env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    result = json.loads((out / "gpu-check.json").read_text()) if (out / "gpu-check.json").exists() else None
    return run, result, out


def test_ddtree_in_parity_with_its_target_and_faster(tmp_path):
    run, result, out = gpu_check(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert result["verdict"] == "parity"
    target, ddtree = result["argv"]["target"], result["argv"]["ddtree"]
    assert "--speculative-algorithm" not in target and "--enable-deterministic-inference" in target
    assert ddtree[ddtree.index("--speculative-algorithm") + 1] == "DDTREE"
    assert ddtree[ddtree.index("--speculative-draft-model-path") + 1] == str(tmp_path / "draft")
    assert "--enable-deterministic-inference" in ddtree
    names = [r["prompt"] for r in result["rows"]]
    assert names == ["arith", "capital", "primes", "code", "freeform"]
    assert all(r["parity"] == "identical" and r["basis"] == "token_ids" for r in result["rows"])
    # the stand-in's physics: DDTREE 148.8 against the target alone at 46 tokens/s (3.2x). Per-prompt
    # rates include the time to the first token, and the unit stage's four workers on two cores slow
    # either server at times (2.25 and 3.48 were measured in CI runs): the claim is only that a ratio
    # is reported and DDTREE is the faster; its value is the benchmark's business, not this test's.
    assert result["speed_ratio"] > 1.0
    assert "| freeform |" in run.stdout and "identical" in run.stdout and "ddtree-gpu-check: parity" in run.stdout
    assert (out / "target-server.log").stat().st_size > 0 and (out / "ddtree-server.log").stat().st_size > 0


def test_a_verifier_that_leaves_the_targets_tokens_fails(tmp_path):
    run, result, _ = gpu_check(tmp_path, "--no-deterministic",
                               env_extra={"DDTREE_LAB_FAULT": "lossless_violation", "DDTREE_LAB_FAULT_ONLY": "DDTREE"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert result["verdict"] == "violation"
    assert "--enable-deterministic-inference" not in result["argv"]["ddtree"]
    rows = {r["prompt"]: r for r in result["rows"]}
    assert rows["freeform"]["parity"] == "violation" and rows["freeform"]["first_diff"] is not None
    assert rows["arith"]["parity"] == "identical"
    assert "| freeform |" in run.stdout and "violation" in run.stdout


def test_a_ddtree_server_that_does_not_start_is_named_with_its_log(tmp_path):
    # sglang without the patch series: DDTREE is no algorithm it knows
    run, result, _ = gpu_check(tmp_path, ddtree_files=())
    assert run.returncode == 2, run.stdout + run.stderr
    assert result["verdict"] == "did_not_start" and result["target"]["verdict"] == "pass"
    assert "the ddtree server exited with status 1 before it was healthy" in run.stderr
    assert "Unknown speculative algorithm name: DDTREE" in run.stderr


def test_bad_input_is_refused_before_any_server_starts(tmp_path):
    run, result, out = gpu_check(tmp_path, "--budget", "2000")
    assert run.returncode == 2 and "--budget must be 0 (the server's default) or 1..1023, got 2000" in run.stderr
    assert result is None and not out.exists()
