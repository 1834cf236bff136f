"""Helpers for the ddtree-bench tests: a stand-in launcher (fixture re-exported by conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from fleet_testlib import STANDIN_QUERY, free_port, write_fake_nvidia_smi

REPO = Path(__file__).resolve().parents[3]
STANDIN_SRC = REPO / "lab" / "standin" / "src"
BENCH_BIN = REPO / "bin" / "ddtree-bench"
WORKLOAD_V1 = REPO / "roles" / "benchmark" / "files" / "workload-v1.json"

PRO6000 = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 97887"
DFLASH_FILES = ("speculative/spec_info.py", "speculative/spec_utils.py",
                "arg_groups/validation_hook.py", "arg_groups/kv_cache_hook.py",
                "arg_groups/speculative_hook.py", "arg_groups/lora_hook.py",
                "mem_cache/kv_cache_configurator.py")


def _fake_host(root: Path, ddtree_files) -> tuple:
    smi = write_fake_nvidia_smi(root, query_out=PRO6000 + "\n", expect_args=STANDIN_QUERY)
    pkg = root / "sglang"
    for rel in DFLASH_FILES:
        f = pkg / "srt" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("# fake\n" + ("DDTREE = 'DDTREE'\n" if rel in ddtree_files else ""))
    return smi, pkg


class Server:
    def __init__(self, proc, port, log):
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"


@pytest.fixture
def standin(tmp_path):
    """start(args, scale=..., ddtree_files=all) -> Server, healthy."""
    procs = []

    def start(args=(), *, scale=2.0, ddtree_files=DFLASH_FILES, api_key=None, env_extra=None):
        root = tmp_path / f"host{len(procs)}"
        root.mkdir()
        smi, pkg = _fake_host(root, ddtree_files)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_LAB_")}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update({"PYTHONPATH": str(STANDIN_SRC), "DDTREE_LAB_NVIDIA_SMI": str(smi),
                    "DDTREE_LAB_SGLANG_DIR": str(pkg), "DDTREE_LAB_STARTUP_SECONDS": "0.1",
                    "DDTREE_LAB_WARMUP_SECONDS": "0.1", "DDTREE_LAB_RATE_SCALE": str(scale),
                    # exact pacing unless the test asks for the lab's noise (env_extra)
                    "DDTREE_LAB_RATE_JITTER": "0", "DDTREE_LAB_COLD_REQUESTS": "0"})
        env.update(env_extra or {})
        argv = [sys.executable, "-m", "sglang_lab_standin", "--model-path", "/models/lab-27b",
                "--host", "127.0.0.1", "--port", str(port), *args]
        if api_key:
            argv += ["--api-key", api_key]
        log = root / "standin.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=root)
        procs.append(proc)
        # /health answers only after one scheduler round trip (health_wait_seconds, 1 s as in
        # SGLang), so the poll's own timeout must be longer than that, or a loaded machine never
        # sees a 200 at all.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"stand-in exited {proc.returncode}:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        return Server(proc, port, log)
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"stand-in not healthy in 60 s:\n{log.read_text()}")

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)


def run_bench(*argv, timeout=60):
    return subprocess.run([sys.executable, str(BENCH_BIN), *argv], capture_output=True,
                          text=True, timeout=timeout)
