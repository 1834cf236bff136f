"""Shared fixtures for the ddtree-fleet module and module_utils unit tests.

* the checkout's ``collections/`` directory is on ``sys.path`` (pyproject's pythonpath), so the
  modules' ``ansible_collections.ddtree.fleet.plugins.module_utils`` imports resolve in-process
  exactly as they do inside AnsiballZ.
* ``run_module`` runs a module's ``main()`` with ``patch_module_args`` and
  exit_json/fail_json patched to raise.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from ddtree_testlib import LIBRARY, MAKE_MODELS, ModuleExit, write_fake_nvidia_smi  # noqa: E402

from ansible.module_utils import basic  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402


def _load_library(name):
    spec = importlib.util.spec_from_file_location("ddtree_library_" + name, LIBRARY / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_module(monkeypatch):
    def exit_json(self, **kwargs):
        kwargs.setdefault("changed", False)
        raise ModuleExit(kwargs, failed=False)

    def fail_json(self, msg, **kwargs):
        kwargs["msg"] = msg
        kwargs["failed"] = True
        raise ModuleExit(kwargs, failed=True)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)

    def run(name, args, check_mode=False):
        module = _load_library(name)
        args = dict(args)
        if check_mode:
            args["_ansible_check_mode"] = True
        with patch_module_args(args):
            with pytest.raises(ModuleExit) as info:
                module.main()
        return info.value

    return run


@pytest.fixture
def fake_smi(tmp_path):
    def make(query_out="", list_out="", rc=0, stderr="", name="bin"):
        return write_fake_nvidia_smi(tmp_path / name, query_out, list_out, rc, stderr)

    return make


@pytest.fixture(scope="session")
def mirror(tmp_path_factory):
    """The lab mirror generated once per session; returns (outdir, printed summary)."""
    outdir = tmp_path_factory.mktemp("mirror")
    proc = subprocess.run(
        [sys.executable, str(MAKE_MODELS), str(outdir)], capture_output=True, text=True, timeout=60, check=True
    )
    return outdir, json.loads(proc.stdout)


