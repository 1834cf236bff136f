"""The real-stack tier: the real sglang 0.5.23 and torch, the project's patch series applied, on CPU.

Run by ``make test-real`` (and tests/run_all.sh) with the interpreter of the venv that
tests/real/setup.sh installs and caches. Before any test imports sglang, this file copies the
venv's pristine ``sglang`` package into a scratch directory, applies roles/sglang/files/patches
there with the product's own code (module_utils/patch/series.py: checksums, then GNU patch, all
or nothing) and puts that directory first on ``sys.path``: every test then imports the patched
files the sglang role would install on a host. The venv itself is never modified.

No GPU exists here: ``sgl_kernel``'s compiled ops do not load, so the tests run the worker's
Python and torch code on CPU tensors, 0.5.23's Triton kernels under Triton's interpreter, and the
real argument parser on the lab mirror's configs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCH_DIR = REPO / "roles" / "sglang" / "files" / "patches"


def _series_module():
    """The product's patch logic (stdlib only), loaded from its file: this venv has no Ansible."""
    path = REPO / "plugins" / "module_utils" / "patch" / "series.py"
    spec = importlib.util.spec_from_file_location("ddtree_patch_series", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pristine_sglang() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise pytest.UsageError("tests/real needs the real sglang: run it with the venv of tests/real/setup.sh "
                                "(make test-real)")
    return Path(spec.origin).parent


def _apply_series(scratch: Path) -> list[str]:
    series = _series_module()
    names = series.parse_series((PATCH_DIR / "series").read_text())
    sums = series.parse_sha256sums((PATCH_DIR / "SHA256SUMS").read_text())
    patches = series.load_patches([str(PATCH_DIR / n) for n in names], sums)
    patch_bin = shutil.which("patch")
    if patch_bin is None:
        raise pytest.UsageError("GNU patch is not installed (apt-get install patch)")
    return series.apply_patches(patch_bin, str(scratch), patches)


def pytest_configure(config):
    if "sglang" in sys.modules:
        raise pytest.UsageError("sglang was imported before tests/real/conftest.py could patch it")
    # Triton's interpreter: the real @triton.jit kernels (0.5.23's conv and GDN verify kernels,
    # test_ddtree_hybrid_real.py) run on CPU tensors. Read when a kernel is defined, so before
    # any sglang import.
    os.environ["TRITON_INTERPRET"] = "1"
    scratch = Path(tempfile.mkdtemp(prefix="ddtree-real-sglang-"))
    config._ddtree_scratch = scratch
    shutil.copytree(_pristine_sglang(), scratch / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    config._ddtree_applied = _apply_series(scratch)
    sys.path.insert(0, str(scratch))
    import sglang  # noqa: F401  (the patched copy, from now on)

    # The lab stand-in (stdlib only), whose verdicts some tests compare with the real code's.
    sys.path.insert(0, str(REPO / "lab" / "standin" / "src"))

    where = Path(sys.modules["sglang"].__file__).resolve()
    if scratch.resolve() not in where.parents:
        raise pytest.UsageError(f"sglang imported from {where}, not from the patched copy in {scratch}")


def pytest_unconfigure(config):
    scratch = getattr(config, "_ddtree_scratch", None)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def pytest_report_header(config):
    import torch

    import sglang

    applied = ", ".join(getattr(config, "_ddtree_applied", []))
    return [f"real tier: sglang {sglang.__version__} from {Path(sglang.__file__).parent}, torch {torch.__version__}",
            f"real tier: patches applied: {applied}"]


@pytest.fixture(scope="session")
def applied_patches(pytestconfig) -> list[str]:
    return list(pytestconfig._ddtree_applied)


@pytest.fixture(scope="session")
def mirror(tmp_path_factory) -> dict[str, Path]:
    """The lab mirror's models (lab/mirror/make_models.py: the pinned target's and draft's real configs)."""
    out = tmp_path_factory.mktemp("mirror")
    subprocess.run([sys.executable, str(REPO / "lab" / "mirror" / "make_models.py"), str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    index = json.loads((out / "index.json").read_text())
    return {model["repo_id"]: out / model["path"] for model in index["models"]}

