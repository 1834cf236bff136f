"""Tests for plugins/modules/gpu_facts.py with fake nvidia-smi scripts (no GPU needed)."""

from __future__ import annotations

import pytest

from ddtree_testlib import (
    A6000_LIST,
    A6000_QUERY,
    PRO6000_LIST,
    PRO6000_NAME,
    PRO6000_QUERY,
    run_adhoc,
)


def test_a6000_pair(run_module, fake_smi):
    smi = fake_smi(A6000_QUERY, A6000_LIST)
    res = run_module("gpu_facts", {"nvidia_smi": str(smi)})
    assert not res.failed, res.result
    r = res.result
    assert r["changed"] is False
    gpu = r["ansible_facts"]["gpu"]
    assert gpu["count"] == 2 and gpu["arch"] == "sm86" and gpu["compute_cap"] == "8.6"
    assert gpu["memory_total_mib"] == 49140
    assert gpu["driver_version"] == "570.86.15"
    assert len(gpu["uuids"]) == 2
    assert r["gpu_count"] == 2 and r["gpu_arch"] == "sm86"
    assert r["gpu_memory_total_mib"] == 49140
    assert r["gpu_driver_version"] == "570.86.15"
    assert r["gpus"][0]["name"] == "NVIDIA RTX A6000"
    assert r["nvidia_smi"] == str(smi)
    calls = (smi.parent / "calls.log").read_text().splitlines()
    assert calls == [
        "--query-gpu=name,compute_cap,memory.total,memory.used,driver_version --format=csv,noheader,nounits",
        "-L",
    ]


def test_pro6000_x8_found_on_path_in_check_mode(run_module, fake_smi, monkeypatch):
    smi = fake_smi(PRO6000_QUERY, PRO6000_LIST)
    monkeypatch.setenv("PATH", str(smi.parent) + ":/usr/bin:/bin")
    res = run_module("gpu_facts", {}, check_mode=True)
    assert not res.failed, res.result
    r = res.result
    assert r["changed"] is False
    assert r["gpu_count"] == 8
    assert r["gpu_arch"] == "sm120"
    assert r["gpu_compute_cap"] == "12.0"
    assert r["gpu_memory_total_mib"] == 97887
    assert r["gpu_memory_total_gib"] == pytest.approx(95.59, abs=0.01)
    assert r["gpu_driver_version"] == "575.57.08"
    assert r["ansible_facts"]["gpu"]["names"] == [PRO6000_NAME] * 8
    assert r["nvidia_smi"] == str(smi)


def test_missing_binary(run_module, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    res = run_module("gpu_facts", {})
    assert res.failed
    msg = res.result["msg"]
    assert "nvidia-smi not found on" in msg and "PATH" in msg and "install the NVIDIA driver" in msg


def test_explicit_path_missing(run_module, tmp_path):
    res = run_module("gpu_facts", {"nvidia_smi": str(tmp_path / "nvidia-smi")})
    assert res.failed and "is not an executable file" in res.result["msg"]


def test_garbage_output(run_module, fake_smi):
    smi = fake_smi("this is not csv at all\n", A6000_LIST)
    res = run_module("gpu_facts", {"nvidia_smi": str(smi)})
    assert res.failed
    msg = res.result["msg"]
    assert "unexpected output from" in msg
    assert "this is not csv at all" in msg
    assert "expected 5" in msg
    assert res.result["stdout"] == "this is not csv at all\n"


def test_na_output(run_module, fake_smi):
    smi = fake_smi("NVIDIA RTX A6000, 8.6, [N/A], 1, 570.86.15\n", A6000_LIST)
    res = run_module("gpu_facts", {"nvidia_smi": str(smi)})
    assert res.failed and "[N/A]" in res.result["msg"] and "memory.total" in res.result["msg"]


def test_nonzero_exit(run_module, fake_smi):
    smi = fake_smi(
        "", "", rc=9,
        stderr="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    )
    res = run_module("gpu_facts", {"nvidia_smi": str(smi)})
    assert res.failed
    msg = res.result["msg"]
    assert "rc=9" in msg and "couldn't communicate" in msg
    assert res.result["rc"] == 9


def test_list_mismatch(run_module, fake_smi):
    smi = fake_smi(A6000_QUERY, A6000_LIST.splitlines()[0] + "\n")
    res = run_module("gpu_facts", {"nvidia_smi": str(smi)})
    assert res.failed and "lists 1 GPU(s)" in res.result["msg"] and "GPU 0: NVIDIA RTX A6000" in res.result["msg"]


def test_mixed_arch(run_module, fake_smi):
    query = "NVIDIA RTX A6000, 8.6, 49140, 1, 575.57.08\n%s, 12.0, 97887, 0, 575.57.08\n" % PRO6000_NAME
    listing = "GPU 0: NVIDIA RTX A6000 (UUID: GPU-1)\nGPU 1: %s (UUID: GPU-2)\n" % PRO6000_NAME
    smi = fake_smi(query, listing)
    res = run_module("gpu_facts", {"nvidia_smi": str(smi)})
    assert res.failed and "mixed GPU architectures" in res.result["msg"]
    res = run_module("gpu_facts", {"nvidia_smi": str(smi), "allow_mixed_arch": True})
    assert not res.failed
    assert res.result["gpu_arch"] == "sm86"
    assert res.result["ansible_facts"]["gpu"]["archs"] == ["sm86", "sm120"]


def test_through_ansible_adhoc(fake_smi, tmp_path):
    """Run the module the real way (AnsiballZ ships plugins/module_utils/gpu.py)."""
    smi = fake_smi(A6000_QUERY, A6000_LIST)
    rc, status, result, raw = run_adhoc(tmp_path, "gpu_facts", "nvidia_smi=%s" % smi)
    assert rc == 0 and status == "SUCCESS", raw
    assert result["changed"] is False
    assert result["ansible_facts"]["gpu"]["arch"] == "sm86"
    assert result["gpu_count"] == 2


def test_through_ansible_adhoc_failure(fake_smi, tmp_path):
    smi = fake_smi("garbage\n", A6000_LIST)
    rc, status, result, raw = run_adhoc(tmp_path, "gpu_facts", "nvidia_smi=%s" % smi)
    assert rc != 0 and status == "FAILED!", raw
    assert "line 1 'garbage'" in result["msg"] and "expected 5" in result["msg"]


def test_old_driver_without_compute_cap(run_module, fake_smi):
    smi = fake_smi('Field "compute_cap" is not a valid field to query.\n', A6000_LIST, rc=2)
    res = run_module("gpu_facts", {"nvidia_smi": str(smi)})
    assert res.failed and "rc=2" in res.result["msg"] and "R510" in res.result["msg"]
