"""The DDTREE patch series against the REAL sglang 0.5.23 wheel.

The part of the wheel that matters is unpacked into tmp_path (never the shared copy): every
``sglang/srt`` module that mentions DFLASH (which includes every file the patches touch) plus
``sglang/__init__.py``; unpacking all 6,400 files per test made the suite slow on a busy box. The series is applied through
plugins/module_utils/patch/series.py and once through the Ansible module (ansible-playbook, local
connection), then checked statically (ast) and semantically without torch: the
SpeculativeAlgorithm class and spec_need_hidden_states are cut out of the patched sources with
ast and executed against stubs.

DDTREE_SGLANG_WHEEL overrides the wheel path; the tests skip only when that file is absent.
"""

from __future__ import annotations

import __future__

import ast
import json
import os
import shutil
import subprocess
import sys
import types
import typing
import zipfile
from enum import Enum, auto
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCH_DIR = REPO / "roles" / "sglang" / "files" / "patches"
DEFAULT_WHEEL = "/var/cache/ddtree-lab/wheels/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
WHEEL = Path(os.environ.get("DDTREE_SGLANG_WHEEL", DEFAULT_WHEEL))

from ansible_collections.ddtree.fleet.plugins.module_utils.patch import series as ddtree_patch  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not WHEEL.is_file(), reason="sglang wheel not found at %s (set DDTREE_SGLANG_WHEEL)" % WHEEL),
    pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed (apt-get install patch)"),
]

# The lab detector: the source is "fully patched" when each of these mentions DDTREE.
DETECTOR_FILES = [
    "sglang/srt/speculative/spec_info.py",
    "sglang/srt/speculative/spec_utils.py",
    "sglang/srt/arg_groups/validation_hook.py",
    "sglang/srt/arg_groups/kv_cache_hook.py",
    "sglang/srt/arg_groups/speculative_hook.py",
    "sglang/srt/arg_groups/lora_hook.py",
    "sglang/srt/mem_cache/kv_cache_configurator.py",
]

# Name comparisons with DFLASH that deliberately stay DFLASH-only (documented in 0002's header):
# unified memory (tree verify is not page-granular) and block verification (a chain check).
DELIBERATE_DFLASH_ONLY = sorted(
    [
        ("sglang/srt/arg_groups/kv_cache_hook.py", "handle_unified_memory_pool"),
        ("sglang/srt/arg_groups/kv_cache_hook.py", "handle_unified_memory_pool"),
        ("sglang/srt/arg_groups/speculative_hook.py", "handle_speculative_decoding"),
    ]
)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def series():
    names = ddtree_patch.parse_series((PATCH_DIR / "series").read_text())
    return [str(PATCH_DIR / n) for n in names], ddtree_patch.parse_sha256sums((PATCH_DIR / "SHA256SUMS").read_text())


def patch_targets(patches):
    touched = []
    for path in patches:
        touched += [f for f in ddtree_patch.patch_targets(Path(path).read_text()) if f not in touched]
    return touched


def created_files(patches):
    """Files the patches create (``--- /dev/null``), e.g. 0003's ddtree_tree.py."""
    created = set()
    for path in patches:
        lines = Path(path).read_text().splitlines()
        for old, new in zip(lines, lines[1:]):
            if old.startswith("--- /dev/null") and new.startswith("+++ b/"):
                created.add(new[len("+++ b/") :].split("\t", 1)[0].strip())
    return created


@pytest.fixture(scope="module")
def members():
    """Wheel members to unpack: sglang/__init__.py, every srt module naming DFLASH, every patch target."""
    patches, _sums = series()
    with zipfile.ZipFile(WHEEL) as wheel:
        names = set(wheel.namelist())
        wanted = {n for n in names if n.startswith("sglang/srt/") and n.endswith(".py") and b"DFLASH" in wheel.read(n)}
    targets = patch_targets(patches)
    new = created_files(patches)
    assert not [t for t in targets if t not in names and t not in new], "the patches target files missing from the wheel"
    assert not [t for t in new if t in names], "a patch creates a file the wheel already has"
    return sorted(wanted | (set(targets) - new) | {"sglang/__init__.py"})


def unpack(dest, members):
    dest.mkdir(parents=True)
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extractall(dest, members=members)
    return dest


@pytest.fixture
def site(tmp_path, members):
    return unpack(tmp_path / "site-packages", members)


def mentions_ddtree(site_dir):
    return {rel: "DDTREE" in (site_dir / rel).read_text(encoding="utf-8") for rel in DETECTOR_FILES}


def litter(site_dir, rels):
    found = []
    for rel in rels:
        directory = (site_dir / rel).parent
        found += [str(p) for p in directory.iterdir() if p.suffix in (".orig", ".rej")]
    return found


def _is_dflash_operand(node):
    if isinstance(node, ast.Constant) and node.value == "DFLASH":
        return True
    if isinstance(node, ast.Attribute):
        if node.attr == "DFLASH":
            return True
        if node.attr == "name" and isinstance(node.value, ast.Attribute) and node.value.attr == "DFLASH":
            return True
    return False


def _contains_dflash(node):
    if _is_dflash_operand(node):
        return True
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_is_dflash_operand(e) for e in node.elts)


def _mentions(node, word):
    return any(
        (isinstance(sub, ast.Constant) and sub.value == word) or (isinstance(sub, ast.Attribute) and sub.attr == word)
        for sub in ast.walk(node)
    )


def dflash_name_sites(site_dir):
    """Every comparison with DFLASH by name / enum member, and every algorithm list holding it.

    Returns [(relpath, enclosing function, lineno, mentions DDTREE)].
    """
    found = []
    srt = site_dir / "sglang" / "srt"
    for path in sorted(srt.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if "DFLASH" not in source:
            continue
        rel = str(path.relative_to(site_dir))

        def visit(node, func):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                func = node.name
            if isinstance(node, ast.Compare) and any(_contains_dflash(x) for x in [node.left, *node.comparators]):
                found.append((rel, func, node.lineno, _mentions(node, "DDTREE")))
                return
            if (
                isinstance(node, (ast.Tuple, ast.List, ast.Set))
                and len(node.elts) >= 2
                and any(_is_dflash_operand(e) for e in node.elts)
            ):
                found.append((rel, func, node.lineno, _mentions(node, "DDTREE")))
            for child in ast.iter_child_nodes(node):
                visit(child, func)

        visit(ast.parse(source, rel), "<module>")
    return found


def _cut(path, kind, name):
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), str(path))
    for node in tree.body:
        if isinstance(node, kind) and node.name == name:
            module = ast.Module(body=[node], type_ignores=[])
            return compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    raise AssertionError("%s not found in %s" % (name, path))


class StubSglang:
    """sys.modules stubs for the lazy imports inside SpeculativeAlgorithm's methods."""

    def __init__(self, monkeypatch):
        self.calls = []
        worker = types.ModuleType("sglang.srt.speculative.dflash_worker_v2")

        class DFlashWorkerV2:
            pass

        worker.DFlashWorkerV2 = DFlashWorkerV2
        self.dflash_worker = DFlashWorkerV2

        ddtree_worker = types.ModuleType("sglang.srt.speculative.ddtree_worker_v2")

        class DDTreeWorkerV2(DFlashWorkerV2):
            pass

        ddtree_worker.DDTreeWorkerV2 = DDTreeWorkerV2
        self.ddtree_worker = DDTreeWorkerV2

        platforms = types.ModuleType("sglang.srt.platforms")
        platforms.current_platform = types.SimpleNamespace(is_out_of_tree=lambda: False)

        ragged = types.ModuleType("sglang.srt.speculative.ragged_verify")
        ragged.read_ragged_verify_mode = lambda: None

        hook = types.ModuleType("sglang.srt.arg_groups.speculative_hook")
        for handler in ("dflash", "dspark", "eagle_family", "frozen_kv_mtp", "ngram", "uno"):
            setattr(hook, "_handle_" + handler, self._recorder(handler))

        for module in (worker, ddtree_worker, platforms, ragged, hook):
            monkeypatch.setitem(sys.modules, module.__name__, module)

    def _recorder(self, handler):
        def record(server_args):
            self.calls.append(handler)

        return record


def load_spec_algorithm(site_dir):
    """Execute the patched SpeculativeAlgorithm class on its own (no torch, no sglang import)."""
    path = site_dir / "sglang" / "srt" / "speculative" / "spec_info.py"
    namespace = {
        "__name__": "spec_info_under_test",
        "Enum": Enum,
        "auto": auto,
        "Optional": typing.Optional,
        "Union": typing.Union,
        "Callable": typing.Callable,
        "Type": typing.Type,
        "_RESERVED_ALIASES": frozenset({"NEXTN"}),
        "_get_registered_spec": lambda name: None,
        "_register_algorithm": lambda *a, **k: None,
        "CustomSpecAlgo": object,
        "resolving_view": lambda server_args: server_args,
    }
    exec(_cut(path, ast.ClassDef, "SpeculativeAlgorithm"), namespace)
    return namespace["SpeculativeAlgorithm"]


def spec_need_hidden_states(site_dir, algorithm):
    """Run the patched spec_utils.spec_need_hidden_states with a stubbed get_spec()."""
    path = site_dir / "sglang" / "srt" / "speculative" / "spec_utils.py"
    spec = types.SimpleNamespace(speculative_algorithm=algorithm, enable_multi_layer_eagle=False)
    namespace = {"__name__": "spec_utils_under_test", "get_spec": lambda: spec}
    exec(_cut(path, ast.FunctionDef, "spec_need_hidden_states"), namespace)
    return namespace["spec_need_hidden_states"]()


def aux_capture_methods(site_dir):
    path = site_dir / "sglang" / "srt" / "arg_groups" / "validation_hook.py"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_AUX_HIDDEN_STATE_CAPTURE_METHODS" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("_AUX_HIDDEN_STATE_CAPTURE_METHODS not found")


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------


def test_unpatched_wheel_rejects_ddtree(site):
    algo = load_spec_algorithm(site)
    with pytest.raises(ValueError, match="Unknown speculative algorithm name: DDTREE"):
        algo.from_string("DDTREE")
    assert algo.from_string("dflash").is_dflash_family()
    assert not any(mentions_ddtree(site).values())


def test_full_series_applies_cleanly_and_is_idempotent(site, monkeypatch):
    patches, sums = series()
    touched = patch_targets(patches)

    result = ddtree_patch.ensure_patchset(str(site), patches, sums, expect={DETECTOR_FILES[0]: ["DDTREE = auto()"]})
    assert result["changed"] is True
    assert result["applied"] == [Path(p).name for p in patches]
    assert result["already_applied"] == []
    assert sorted(result["files"]) == sorted(touched)
    assert set(DETECTOR_FILES) <= set(touched)
    assert litter(site, touched) == []
    created = created_files(patches)
    assert created == {"sglang/srt/speculative/ddtree_tree.py", "sglang/srt/speculative/ddtree_worker_v2.py"}
    assert all((site / rel).is_file() for rel in created)

    stamp = json.loads((site / "sglang" / ".ddtree-patchset.json").read_text())
    assert (
        stamp["fingerprint"]
        == result["fingerprint"]
        == ddtree_patch.patchset_fingerprint([(Path(p).name, sums[Path(p).name]) for p in patches])
    )

    before = {rel: (site / rel).read_bytes() for rel in touched}
    again = ddtree_patch.ensure_patchset(str(site), patches, sums)
    assert again["changed"] is False
    assert again["applied"] == [] and again["files"] == []
    assert again["already_applied"] == [Path(p).name for p in patches]
    assert {rel: (site / rel).read_bytes() for rel in touched} == before

    for rel in touched:  # every patched file still parses
        ast.parse((site / rel).read_text(encoding="utf-8"), rel)

    assert mentions_ddtree(site) == {rel: True for rel in DETECTOR_FILES}

    # Every by-name DFLASH site accepts DDTREE, except the deliberate refusals.
    sites = dflash_name_sites(site)
    missing = sorted((rel, func) for rel, func, _line, has in sites if not has)
    assert missing == DELIBERATE_DFLASH_ONLY, missing
    assert len(sites) >= 20

    # Semantics, without torch.
    stubs = StubSglang(monkeypatch)
    algo_cls = load_spec_algorithm(site)
    ddtree = algo_cls.from_string("DDTREE")
    assert ddtree is algo_cls.from_string("ddtree") is algo_cls.DDTREE
    assert ddtree.is_dflash() and ddtree.is_dflash_family()
    assert ddtree.supports_target_verify_for_draft()
    assert ddtree.supports_mixed_chunk()
    assert not ddtree.is_dspark() and not ddtree.is_eagle() and not ddtree.is_none()
    # 0004: DDTREE gets the tree-verify worker, DFLASH keeps its own
    assert ddtree.create_worker(types.SimpleNamespace()) is stubs.ddtree_worker
    assert algo_cls.DFLASH.create_worker(types.SimpleNamespace()) is stubs.dflash_worker
    ddtree.handle_server_args(types.SimpleNamespace())
    assert stubs.calls == ["dflash"]
    # Existing members keep their values (DDTREE appended after NONE).
    assert [m.name for m in algo_cls][-2:] == ["NONE", "DDTREE"]
    assert algo_cls.DFLASH.value == 1 and not algo_cls.EAGLE.is_dflash()

    assert spec_need_hidden_states(site, "DDTREE") is False
    assert spec_need_hidden_states(site, "DFLASH") is False
    assert spec_need_hidden_states(site, "EAGLE3") is True
    assert "DDTREE" in aux_capture_methods(site)


def test_0001_alone_is_the_half_patched_state(site, monkeypatch):
    patches, sums = series()
    first = ddtree_patch.ensure_patchset(str(site), patches[:1], sums)
    assert first["applied"] == [Path(patches[0]).name]
    assert first["files"] == ["sglang/srt/speculative/spec_info.py"]

    mentions = mentions_ddtree(site)
    assert mentions["sglang/srt/speculative/spec_info.py"] is True
    assert sum(mentions.values()) == 1, mentions  # the other six do not mention DDTREE yet

    stubs = StubSglang(monkeypatch)
    algo_cls = load_spec_algorithm(site)
    ddtree = algo_cls.from_string("DDTREE")  # the name is known now ...
    assert ddtree is algo_cls.DDTREE
    assert ddtree.create_worker(types.SimpleNamespace()) is stubs.dflash_worker
    ddtree.handle_server_args(types.SimpleNamespace())
    assert stubs.calls == ["dflash"]
    assert not ddtree.is_dflash() and not ddtree.is_dflash_family()  # ... but not DFLASH-family
    # The incident: hidden-state handling treats DDTREE like a plain algorithm.
    assert spec_need_hidden_states(site, "DDTREE") is True
    assert "DDTREE" not in aux_capture_methods(site)

    # The full series on top applies 0002 only.
    rest = ddtree_patch.ensure_patchset(str(site), patches, sums)
    assert rest["already_applied"] == [Path(patches[0]).name]
    assert rest["applied"] == [Path(p).name for p in patches[1:]]
    assert mentions_ddtree(site) == {rel: True for rel in DETECTOR_FILES}


def test_conflict_on_the_wheel_leaves_it_untouched(site):
    """A hand edit where 0002 needs its context: nothing is applied, 0001 included."""
    patches, sums = series()
    utils = site / "sglang" / "srt" / "speculative" / "spec_utils.py"
    original = utils.read_text(encoding="utf-8")
    edited = original.replace(
        'if spec.speculative_algorithm in ("STANDALONE", "DFLASH", "DSPARK"):',
        'if spec.speculative_algorithm in ("STANDALONE", "DFLASH", "DSPARK", "LOCAL"):',
    )
    assert edited != original
    utils.write_text(edited, encoding="utf-8")
    spec_info_before = (site / DETECTOR_FILES[0]).read_bytes()

    with pytest.raises(ddtree_patch.PatchConflictError) as info:
        ddtree_patch.ensure_patchset(str(site), patches, sums)
    assert info.value.patch == "0002-ddtree-dflash-family.patch"
    assert "spec_utils.py" in info.value.output
    assert (site / DETECTOR_FILES[0]).read_bytes() == spec_info_before
    assert utils.read_text(encoding="utf-8") == edited
    assert not (site / "sglang" / ".ddtree-patchset.json").exists()


def test_through_the_ansible_module(tmp_path, members):
    site_dir = unpack(tmp_path / "venv" / "site-packages", members)
    patches, sums = series()
    expected_fp = ddtree_patch.patchset_fingerprint([(Path(p).name, sums[Path(p).name]) for p in patches])
    spec_info = site_dir / "sglang" / "srt" / "speculative" / "spec_info.py"
    playbook = tmp_path / "patch.yml"
    playbook.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "vars": {
                        "site": str(site_dir),
                        "patch_files": patches,
                        # What role sglang does: the series planned by the filter (strict parsers).
                        "plan": "{{ lookup('ansible.builtin.file', '%s') | ddtree.fleet.patch_plan("
                                "lookup('ansible.builtin.file', '%s'), %s, [], '%s') }}"
                        % (PATCH_DIR / "series", PATCH_DIR / "SHA256SUMS", [Path(p).name for p in patches], PATCH_DIR),
                        "sums": "{{ plan | items2dict(key_name='name', value_name='sha256') }}",
                        "names": "{{ plan | map(attribute='name') | list }}",
                    },
                    "tasks": [
                        {
                            "name": "check mode",
                            "ddtree.fleet.sglang_patch": {
                                "site_packages": "{{ site }}",
                                "patches": "{{ patch_files }}",
                                "checksums": "{{ sums }}",
                            },
                            "check_mode": True,
                            "diff": True,
                            "register": "dry",
                        },
                        {
                            "name": "read spec_info",
                            "ansible.builtin.slurp": {"src": str(spec_info)},
                            "register": "src0",
                        },
                        {
                            "name": "check mode changed nothing",
                            "ansible.builtin.assert": {
                                "that": [
                                    "dry is changed",
                                    "dry.applied == names",
                                    "'DDTREE' not in (src0.content | b64decode)",
                                    "dry.fingerprint == (plan | ddtree.fleet.patchset_fingerprint)",
                                ]
                            },
                        },
                        {
                            "name": "apply",
                            "ddtree.fleet.sglang_patch": {
                                "site_packages": "{{ site }}",
                                "patches": "{{ patch_files }}",
                                "checksums": "{{ sums }}",
                                "expect": {"sglang/srt/speculative/spec_utils.py": ['"DDTREE"']},
                            },
                            "register": "first",
                        },
                        {
                            "name": "apply again",
                            "ddtree.fleet.sglang_patch": {
                                "site_packages": "{{ site }}",
                                "patches": "{{ patch_files }}",
                                "checksums": "{{ sums }}",
                            },
                            "register": "second",
                        },
                        {
                            "name": "results",
                            "ansible.builtin.copy": {
                                "content": "{{ {'dry': dry, 'first': first, 'second': second} | to_json }}",
                                "dest": str(tmp_path / "results.json"),
                            },
                        },
                    ],
                }
            ]
        )
    )
    home = tmp_path / "ansible-home"
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(cfg),
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_REMOTE_TEMP=str(home / "remote"),
        ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_DEPRECATION_WARNINGS="0",
    )
    playbook_bin = Path(sys.executable).parent / "ansible-playbook"
    proc = subprocess.run(
        [
            str(playbook_bin),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter=%s" % sys.executable,
            str(playbook),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    results = json.loads((tmp_path / "results.json").read_text())
    dry, first, second = results["dry"], results["first"], results["second"]
    assert [d["prepared"].splitlines()[0] for d in dry["diff"]] == ["# " + Path(p).name for p in patches]
    assert first["changed"] is True and first["applied"] == [Path(p).name for p in patches]
    assert first["fingerprint"] == expected_fp
    assert second["changed"] is False and second["already_applied"] == first["applied"]
    assert second["stamp"] == first["stamp"]
    assert json.loads((site_dir / "sglang" / ".ddtree-patchset.json").read_text())["fingerprint"] == expected_fp
    assert mentions_ddtree(site_dir) == {rel: True for rel in DETECTOR_FILES}
