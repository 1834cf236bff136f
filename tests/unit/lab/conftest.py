"""Fixtures for the SGLang stand-in tests: fake nvidia-smi, fake sglang source trees, launcher."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
STANDIN_SRC = REPO / "lab" / "standin" / "src"

from sglang_lab_standin import physics  # noqa: E402
from fleet_testlib import STANDIN_QUERY, write_fake_nvidia_smi  # noqa: E402
from standin_testlib import free_port, port_open, wait_for  # noqa: E402,F401  (shared with the tests)

A6000 = "NVIDIA RTX A6000, 8.6, 49140"
PRO6000 = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 97887"
GPU_PROFILES = {"a6000x2": [A6000] * 2, "pro6000x8": [PRO6000] * 8}


def write_fake_smi(directory: Path, lines) -> Path:
    """A fake nvidia-smi that insists on the exact query the stand-in makes."""
    return write_fake_nvidia_smi(directory, query_out="".join(line + "\n" for line in lines),
                                 expect_args=STANDIN_QUERY)


def write_fake_sglang(root: Path, state: str) -> Path:
    """A fake installed sglang package dir. state: unpatched | ddtree_known | ddtree_full |
    ddtree_worker (ddtree_full whose arg_groups/fields/spec.py defines speculative_ddtree_budget,
    as patch 0004 makes it) | budget_only (unpatched, but spec.py defines the budget field)."""
    pkg = root / "site-packages" / "sglang"
    full = state in ("ddtree_full", "ddtree_worker")
    for rel in physics.DDTREE_DFLASH_FILES:
        f = pkg / "srt" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        mention = full or (state == "ddtree_known" and rel == physics.SPEC_INFO_FILE)
        f.write_text("# fake sglang source\nALGOS = ['DFLASH', 'EAGLE']\n"
                     + ("DDTREE = 'DDTREE'\n" if mention else ""))
    spec = pkg / "srt" / physics.DDTREE_FLAG_FILE
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text("# fake sglang source\nclass Spec:\n    speculative_num_draft_tokens = None\n"
                    + (f"    {physics.DDTREE_BUDGET_MARKER} = None\n" if state in ("ddtree_worker", "budget_only")
                       else ""))
    (pkg / "__init__.py").write_text("raise ImportError('fake sglang must never be imported')\n")
    return pkg


@pytest.fixture
def smi(tmp_path):
    def make(profile: str) -> Path:
        d = tmp_path / f"smi-{profile}"
        d.mkdir(exist_ok=True)
        return write_fake_smi(d, GPU_PROFILES[profile])
    return make


@pytest.fixture
def sglang_tree(tmp_path):
    def make(state: str) -> Path:
        return write_fake_sglang(tmp_path / f"sg-{state}", state)
    return make


class Standin:
    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path, api_key=None):
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.base = f"http://127.0.0.1:{port}"
        self.api_key = api_key

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def headers(self):
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout: float = 15.0):
        import requests

        def ok():
            if self.proc.poll() is not None:
                raise AssertionError(f"stand-in exited {self.proc.returncode}:\n{self.log}")
            try:
                return requests.get(self.base + "/health", timeout=1).status_code == 200
            except requests.RequestException:
                return False
        wait_for(ok, timeout)
        return self


@pytest.fixture
def launch(tmp_path, smi, sglang_tree):
    procs = []

    def start(args=(), *, gpus="pro6000x8", source="ddtree_full", env=None, startup=0.2,
              warmup=0.2, port=None, api_key=None) -> Standin:
        port = port or free_port()
        log_path = tmp_path / f"standin-{port}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_LAB_")}
        full_env.update({
            "PYTHONPATH": str(STANDIN_SRC),
            "DDTREE_LAB_NVIDIA_SMI": str(smi(gpus)),
            "DDTREE_LAB_SGLANG_DIR": str(sglang_tree(source)),
            "DDTREE_LAB_STARTUP_SECONDS": str(startup),
            "DDTREE_LAB_WARMUP_SECONDS": str(warmup),
            # /health waits 1 s before it looks (as the real one); tests that do not time
            # /health itself wait less.
            "DDTREE_LAB_HEALTH_WAIT_SECONDS": "0.05",
            # Exact pacing unless a test asks for the noise (test_server.py's noise tests do).
            "DDTREE_LAB_RATE_JITTER": "0",
            "DDTREE_LAB_COLD_REQUESTS": "0",
            "PYTHONUNBUFFERED": "1",
        })
        full_env.pop("SGLANG_HEALTH_CHECK_TIMEOUT", None)
        full_env.pop("CUDA_VISIBLE_DEVICES", None)
        full_env.update(env or {})
        argv = ["--model-path", "/models/lab-27b", "--host", "127.0.0.1", "--port", str(port), *args]
        if api_key:
            argv += ["--api-key", api_key]
        fh = open(log_path, "wb")
        proc = subprocess.Popen([sys.executable, "-m", "sglang_lab_standin", *argv], env=full_env,
                                stdout=fh, stderr=subprocess.STDOUT, cwd=str(tmp_path))
        fh.close()
        procs.append(proc)
        return Standin(proc, port, log_path, api_key)

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)
