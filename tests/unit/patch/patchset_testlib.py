"""Helpers for the patch-set unit tests (imported by conftest.py and the tests)."""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LIBRARY = REPO / "plugins" / "modules"
FILTER_PLUGINS = REPO / "plugins" / "filter"
PATCH_DIR = REPO / "roles" / "sglang" / "files" / "patches"


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def make_patch(directory, name, changes, preamble="synthetic test patch\n\n"):
    """Write a -p1 unified diff ``name`` into ``directory``.

    ``changes`` maps a path relative to site-packages to (old_text, new_text).
    """
    chunks = [preamble]
    for rel, (old, new) in changes.items():
        diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/" + rel, "b/" + rel, n=3)
        chunks.append("".join(diff))
    path = Path(directory) / name
    path.write_text("".join(chunks))
    return path


ALGO_V0 = '''"""Synthetic stand-in for sglang/srt/speculative/spec_info.py."""


ALGORITHMS = (
    "EAGLE",
    "DFLASH",
    "NONE",
)


def is_dflash(name):
    return name == "DFLASH"


def describe(name):
    return "algorithm " + name
'''

ALGO_V1 = ALGO_V0.replace('    "NONE",\n', '    "NONE",\n    "DDTREE",\n')
ALGO_V2 = ALGO_V1.replace('return name == "DFLASH"', 'return name in ("DFLASH", "DDTREE")')

UTILS_V0 = """def need_hidden_states(name):
    # Relay hidden states through the future map?
    if name in ("STANDALONE", "DFLASH"):
        return False
    return True
"""
UTILS_V2 = UTILS_V0.replace('("STANDALONE", "DFLASH")', '("STANDALONE", "DFLASH", "DDTREE")')


class Tree:
    """A synthetic site-packages with two sglang files and a patch series."""

    def __init__(self, root):
        self.root = Path(root)
        self.site = self.root / "site-packages"
        self.patch_dir = self.root / "patches"
        self.algo = self.site / "sglang" / "srt" / "algo.py"
        self.utils = self.site / "sglang" / "srt" / "utils.py"
        self.algo.parent.mkdir(parents=True)
        self.patch_dir.mkdir()
        self.algo.write_text(ALGO_V0)
        self.utils.write_text(UTILS_V0)
        # 0001 registers the name; 0002 depends on 0001's context and widens checks.
        self.p1 = make_patch(self.patch_dir, "0001-register.patch", {"sglang/srt/algo.py": (ALGO_V0, ALGO_V1)})
        self.p2 = make_patch(
            self.patch_dir,
            "0002-family.patch",
            {"sglang/srt/algo.py": (ALGO_V1, ALGO_V2), "sglang/srt/utils.py": (UTILS_V0, UTILS_V2)},
        )
        self.patches = [str(self.p1), str(self.p2)]

    def checksums(self, paths=None):
        return {Path(p).name: sha256(p) for p in (paths or self.patches)}

    def snapshot(self):
        """Every file under site-packages -> bytes (to prove a tree is unchanged)."""
        return {str(p.relative_to(self.site)): p.read_bytes() for p in sorted(self.site.rglob("*")) if p.is_file()}

    def litter(self):
        return sorted(str(p) for p in self.site.rglob("*") if p.suffix in (".orig", ".rej") or p.name.endswith("~"))


def load_filter_plugin():
    spec = importlib.util.spec_from_file_location("ddtree_filter_plugin_under_test", FILTER_PLUGINS / "patch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_library(name):
    spec = importlib.util.spec_from_file_location("ddtree_patch_library_" + name, LIBRARY / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
