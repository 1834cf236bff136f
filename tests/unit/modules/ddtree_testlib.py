"""Constants and helpers shared by the ddtree-fleet module tests (imported by conftest and tests)."""

from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

from fleet_testlib import write_fake_nvidia_smi  # noqa: F401  (the modules' tests import it from here)

REPO = Path(__file__).resolve().parents[3]
COLLECTIONS = REPO / "collections"
LIBRARY = REPO / "plugins" / "modules"
FILTERS = REPO / "plugins" / "filter"
MAKE_MODELS = REPO / "lab" / "mirror" / "make_models.py"


class ModuleExit(Exception):
    """Raised instead of exit_json / fail_json; ``result`` holds the kwargs."""

    def __init__(self, result, failed):
        super().__init__(result.get("msg", ""))
        self.result = result
        self.failed = failed


A6000_QUERY = "NVIDIA RTX A6000, 8.6, 49140, 1, 570.86.15\nNVIDIA RTX A6000, 8.6, 49140, 1, 570.86.15\n"
A6000_LIST = (
    "GPU 0: NVIDIA RTX A6000 (UUID: GPU-a6000000-0000-4000-8000-000000000000)\n"
    "GPU 1: NVIDIA RTX A6000 (UUID: GPU-a6000000-0000-4000-8000-000000000001)\n"
)
PRO6000_NAME = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
PRO6000_QUERY = "".join("%s, 12.0, 97887, 0, 575.57.08\n" % PRO6000_NAME for _ in range(8))
PRO6000_LIST = "".join(
    "GPU %d: %s (UUID: GPU-b1ac0000-0000-4000-8000-00000000000%d)\n" % (i, PRO6000_NAME, i) for i in range(8)
)


def model_dir(outdir, summary, repo_id):
    for model in summary["models"]:
        if model["repo_id"] == repo_id:
            return Path(outdir) / model["path"]
    raise KeyError(repo_id)


def ansible_env(tmp_path):
    """Hermetic environment for a real Ansible run: no repo ansible.cfg, state under tmp_path."""
    cfg = Path(tmp_path) / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_CONFIG=str(cfg),
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote-tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
    )
    return env


def ansible_bin(name):
    """Path of an Ansible CLI next to the running interpreter (the venv), else the bare name."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def run_adhoc(tmp_path, module, args, check=True):
    """Run ``ansible localhost -m module -a args``; return (rc, status, result dict or None, raw output)."""
    if "." not in module:
        module = "ddtree.fleet." + module
    cmd = [ansible_bin("ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m", module, "-a", args]
    if check:
        cmd.append("--check")
    proc = subprocess.run(
        cmd, env=ansible_env(tmp_path), cwd=str(tmp_path), capture_output=True, text=True, timeout=120
    )
    raw = proc.stdout + proc.stderr
    marker = proc.stdout.find("localhost | ")
    if marker < 0 or " => " not in proc.stdout[marker:]:
        return proc.returncode, None, None, raw
    head, body = proc.stdout[marker:].split(" => ", 1)
    result, _end = json.JSONDecoder().raw_decode(body.strip())
    return proc.returncode, head.split(" | ", 1)[1].strip(), result, raw


def write_safetensors(path, tensors, metadata=None, pad=0, corrupt=None):
    """Write a small safetensors file: tensors = {name: (shape, dtype_size)} (zero data)."""
    header = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * count]}
        offset += 2 * count
    if corrupt:
        corrupt(header)
    raw = json.dumps(header).encode() + b" " * pad
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return path
