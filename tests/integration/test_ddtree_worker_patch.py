"""Patch 0004 (the DDTree worker) against the REAL sglang 0.5.23 wheel, without a GPU.

The series is applied to the wheel's sources in tmp_path; then, with ``ast`` only (no torch):

* every file 0004 touches compiles;
* every call ddtree_worker_v2.py makes into 0.5.23 (imported functions and classes, the
  inherited DFlashWorkerV2 methods) passes arguments the real definition accepts, and gives
  every parameter that has no default;
* the attributes it reads from ``self`` exist on DFlashWorkerV2, and the ones it reads from
  run_eagle_verify's result exist on GenerationBatchResult;
* DFlashWorkerV2's hook calls ``_ddtree_verify`` with exactly its keyword parameters, with
  names that exist at that point of forward_batch_generation;
* _handle_ddtree and _verify_width, cut out of the patched sources, run against stubs: the
  refusals an operator sees, word for word (the lab stand-in repeats them).

DDTREE_SGLANG_WHEEL overrides the wheel path; the tests skip only when that file is absent.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.patch import series as ddtree_patch  # the project's strict series parser (module_utils, on the tests' path)

REPO = Path(__file__).resolve().parents[2]
PATCH_DIR = REPO / "roles" / "sglang" / "files" / "patches"
DEFAULT_WHEEL = "/var/cache/ddtree-lab/wheels/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
WHEEL = Path(os.environ.get("DDTREE_SGLANG_WHEEL", DEFAULT_WHEEL))
WORKER = "sglang/srt/speculative/ddtree_worker_v2.py"
DFLASH = "sglang/srt/speculative/dflash_worker_v2.py"
HOOK = "sglang/srt/arg_groups/speculative_hook.py"

pytestmark = [
    pytest.mark.skipif(not WHEEL.is_file(), reason="sglang wheel not found at %s (set DDTREE_SGLANG_WHEEL)" % WHEEL),
    pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed (apt-get install patch)"),
]


def _series():
    return [PATCH_DIR / name for name in ddtree_patch.parse_series((PATCH_DIR / "series").read_text())]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """sglang/ of the wheel with the whole series applied (real GNU patch)."""
    root = tmp_path_factory.mktemp("site-packages")
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extractall(root, members=[n for n in wheel.namelist() if n.startswith("sglang/") and n.endswith(".py")])
    for patch in _series():
        subprocess.run(["patch", "-p1", "-s", "-i", str(patch)], cwd=root, check=True, stdin=subprocess.DEVNULL)
    return root


def _tree(site, rel):
    return ast.parse((site / rel).read_text(encoding="utf-8"), rel)


def _module_file(site, module):
    base = site / module.replace(".", "/")
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"


def _top(tree, name):
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name]
    assert found, "%s not defined" % name
    return found[0]


def _method(cls, name):
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return found[0] if found else None


class Signature:
    """What a def accepts: positional names, keyword-only names, the ones without defaults."""

    def __init__(self, func, drop_self=False, fields=None):
        if fields is not None:  # a dataclass: its annotated fields, in order
            self.positional = [name for name, _ in fields]
            self.kwonly = []
            self.required = {name for name, has_default in fields if not has_default}
            self.varargs = self.varkw = False
            return
        a = func.args
        pos = [x.arg for x in a.posonlyargs + a.args]
        if drop_self:
            pos = pos[1:]
        n_default = len(a.defaults)
        self.positional = pos
        self.kwonly = [x.arg for x in a.kwonlyargs]
        self.required = set(pos[: len(pos) - n_default] if n_default else pos)
        self.required |= {x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None}
        self.varargs = a.vararg is not None
        self.varkw = a.kwarg is not None

    def check(self, call, what):
        npos = len(call.args)
        assert not any(isinstance(x, ast.Starred) for x in call.args), what
        names = [k.arg for k in call.keywords if k.arg is not None]
        spread = any(k.arg is None for k in call.keywords)
        if not self.varargs:
            assert npos <= len(self.positional), "%s: %d positional arguments, accepts %d" % (what, npos, len(self.positional))
        given = set(self.positional[:npos]) | set(names)
        if not self.varkw:
            unknown = set(names) - set(self.positional) - set(self.kwonly)
            assert not unknown, "%s: unknown keyword(s) %s" % (what, sorted(unknown))
        if not spread:
            missing = self.required - given
            assert not missing, "%s: missing %s" % (what, sorted(missing))
        return given


def _dataclass_fields(site, cls_node, module_tree, seen=None):
    """Annotated fields of a dataclass and its dataclass bases (same module or imported)."""
    fields = []
    for base in cls_node.bases:
        if isinstance(base, ast.Name):
            parent = next((n for n in module_tree.body if isinstance(n, ast.ClassDef) and n.name == base.id), None)
            if parent is not None and _is_dataclass(parent):
                fields += _dataclass_fields(site, parent, module_tree)
    for stmt in cls_node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            fields = [f for f in fields if f[0] != stmt.target.id]
            default = stmt.value is not None and not (
                isinstance(stmt.value, ast.Call) and getattr(stmt.value.func, "id", "") == "field" and not stmt.value.keywords
            )
            fields.append((stmt.target.id, default))
    return fields


def _is_dataclass(cls_node):
    return any(
        (isinstance(d, ast.Name) and d.id == "dataclass") or (isinstance(d, ast.Call) and getattr(d.func, "id", "") == "dataclass")
        for d in cls_node.decorator_list
    )


def _imports(tree):
    """name -> (module, original name) for every ``from sglang... import`` in the module."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang"):
            for alias in node.names:
                out[alias.asname or alias.name] = (node.module, alias.name)
    return out


def _signature_of(site, module, name):
    tree = _tree(site, str(_module_file(site, module).relative_to(site)))
    node = _top(tree, name)
    if isinstance(node, ast.FunctionDef):
        return Signature(node)
    if _is_dataclass(node):
        return Signature(None, fields=_dataclass_fields(site, node, tree))
    init = _method(node, "__init__")
    assert init is not None, "%s.%s has no __init__" % (module, name)
    return Signature(init, drop_self=True)


def _self_attrs(cls_node):
    """Attributes a class assigns on self, defines as methods/properties, or declares in its body."""
    names = set()
    for node in ast.walk(cls_node):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        names.add(sub.attr)
                if isinstance(t, ast.Name):
                    names.add(t.id)
    names |= {n.name for n in cls_node.body if isinstance(n, ast.FunctionDef)}
    return names


# ---------------------------------------------------------------------------------------------


def test_0004_files_compile(site):
    lines = (PATCH_DIR / "0004-ddtree-worker.patch").read_text().splitlines()
    touched = sorted({line[6:].split("\t")[0] for line in lines if line.startswith("+++ b/")})
    assert WORKER in touched and DFLASH in touched and HOOK in touched
    for rel in touched:
        compile((site / rel).read_text(encoding="utf-8"), rel, "exec")


def test_worker_calls_into_0_5_23_match_the_real_signatures(site):
    tree = _tree(site, WORKER)
    imports = _imports(tree)
    checked = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imports:
            module, name = imports[node.func.id]
            if name == "dataclass":
                continue
            _signature_of(site, module, name).check(node, "%s.%s" % (module, name))
            checked.add(name)
    # DDTreeVerifyInput is an EagleVerifyInput dataclass plus one field: its construction too.
    verify_cls = _top(tree, "DDTreeVerifyInput")
    eagle_tree = _tree(site, "sglang/srt/speculative/eagle_info.py")
    fields = _dataclass_fields(site, _top(eagle_tree, "EagleVerifyInput"), eagle_tree)
    fields += [(n.target.id, n.value is not None) for n in verify_cls.body if isinstance(n, ast.AnnAssign)]
    ctor = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "DDTreeVerifyInput"]
    assert len(ctor) == 1
    # ``**inputs`` is the dict _ddtree_inputs returns: its keys are field names too
    inputs = _method(_top(tree, "DDTreeWorkerV2"), "_ddtree_inputs")
    returned = [n.value for n in ast.walk(inputs) if isinstance(n, ast.Return) and isinstance(n.value, ast.Dict)]
    assert len(returned) == 1
    produced = {k.value for k in returned[0].keys}
    given = Signature(None, fields=fields).check(
        ast.Call(func=ctor[0].func, args=[], keywords=[k for k in ctor[0].keywords if k.arg] + [ast.keyword(arg=n, value=None) for n in produced]),
        "DDTreeVerifyInput",
    )
    assert given >= {f for f, _ in fields if f != "ddtree_max_depth"} - {"draft_probs", "prepared_out_cache_loc", "prepared_mrope_positions", "kv_loc_plan", "num_tokens_per_req"}
    assert {"run_eagle_verify", "build_tree", "compile_tree", "validate_budget", "is_dense_head_weight",
            "default_tree_mask_mode", "draft_tp_context"} <= checked, checked
    # the irregular-tree convention: the properties the verify path reads exist, as properties
    eagle_cls = _top(eagle_tree, "EagleVerifyInput")
    for prop in ("max_tree_depth", "tree_topk"):
        assert any(getattr(d, "id", "") == "property" for d in _method(eagle_cls, prop).decorator_list)
        assert any(getattr(d, "id", "") == "property" for d in _method(verify_cls, prop).decorator_list)


def test_inherited_methods_and_attributes_exist_on_dflash_worker(site):
    tree = _tree(site, WORKER)
    worker = _top(tree, "DDTreeWorkerV2")
    dflash = _top(_tree(site, DFLASH), "DFlashWorkerV2")
    base_attrs = _self_attrs(dflash) | {"target_worker"}  # target_worker: a BaseSpecWorker property
    own = _self_attrs(worker)
    used = set()
    for node in ast.walk(worker):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            used.add(node.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and node.func.attr not in own
        ):
            method = _method(dflash, node.func.attr)
            assert method is not None, "DFlashWorkerV2 has no method %s" % node.func.attr
            Signature(method, drop_self=True).check(node, "DFlashWorkerV2." + node.func.attr)
    missing = used - own - base_attrs
    assert not missing, "read from self but not defined by DFlashWorkerV2: %s" % sorted(missing)
    base = _tree(site, "sglang/srt/speculative/base_spec_worker.py")
    assert "target_worker" in {n.name for n in ast.walk(base) if isinstance(n, ast.FunctionDef)}

    # run_eagle_verify returns a GenerationBatchResult: the fields the worker reads and sets
    result_fields = {n.target.id for n in _top(_tree(site, "sglang/srt/managers/utils.py"), "GenerationBatchResult").body if isinstance(n, ast.AnnAssign)}
    read = {
        n.attr for n in ast.walk(worker)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "result"
    }
    assert read and read <= result_fields, read - result_fields


def test_dflash_hook_hands_over_exactly_what_ddtree_verify_takes(site):
    dflash_src = (site / DFLASH).read_text(encoding="utf-8")
    dflash = _top(ast.parse(dflash_src), "DFlashWorkerV2")
    forward = _method(dflash, "forward_batch_generation")
    hook = [
        n for n in ast.walk(forward)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "_ddtree_verify"
    ]
    assert len(hook) == 1
    target = _method(_top(_tree(site, WORKER), "DDTreeWorkerV2"), "_ddtree_verify")
    assert sorted(k.arg for k in hook[0].keywords) == sorted(x.arg for x in target.args.kwonlyargs)
    Signature(target, drop_self=True).check(hook[0], "_ddtree_verify")
    # every name handed over is bound before the hook in forward_batch_generation
    bound = {a.arg for a in forward.args.args + forward.args.kwonlyargs}
    for node in ast.walk(forward):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno < hook[0].lineno:
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                bound |= {s.id for s in ast.walk(t) if isinstance(s, ast.Name)}
    for k in hook[0].keywords:
        names = {s.id for s in ast.walk(k.value) if isinstance(s, ast.Name)}
        assert names <= bound, (k.arg, names - bound)
    # and DFLASH is untouched when the class attribute stays None
    attr = [n for n in dflash.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "ddtree_budget"]
    assert attr and isinstance(attr[0].value, ast.Constant) and attr[0].value.value is None


def test_the_budget_flag_is_a_spec_field_and_the_worker_is_chosen_for_ddtree(site):
    spec = _top(_tree(site, "sglang/srt/arg_groups/fields/spec.py"), "Spec")
    field = [n for n in spec.body if isinstance(n, ast.AnnAssign) and n.target.id == "speculative_ddtree_budget"]
    assert field and isinstance(field[0].value, ast.Constant) and field[0].value.value is None
    spec_info = (site / "sglang/srt/speculative/spec_info.py").read_text(encoding="utf-8")
    assert spec_info.index("DDTreeWorkerV2") < spec_info.index("return DFlashWorkerV2")


def _cut(site, rel, names, namespace):
    """Execute the named top-level functions of a patched file in ``namespace``."""
    tree = _tree(site, rel)
    body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.Assign)) and getattr(n, "name", None) in names]
    assert sorted(n.name for n in body) == sorted(names)
    module = ast.Module(body=body, type_ignores=[])
    exec(compile(module, rel, "exec"), namespace)
    return namespace


def _load_dd_tree(site, monkeypatch):
    """0003's ddtree_tree.py (pure stdlib), registered under its sglang name."""
    name = "sglang.srt.speculative.ddtree_tree"
    spec = importlib.util.spec_from_file_location(name, site / "sglang/srt/speculative/ddtree_tree.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def handle_ddtree(site, monkeypatch):
    _load_dd_tree(site, monkeypatch)
    resolved = {}
    ns = {
        "resolving_view": lambda server_args: server_args,
        "declare_resolution": lambda server_args, who, **kw: resolved.update(kw),
        "attn_dp_enabled_of": lambda cfg: cfg.dp_attention,
        "ServerArgs": object,
    }
    _cut(site, HOOK, ["_handle_ddtree"], ns)

    def run(**overrides):
        cfg = dict(speculative_ddtree_budget=None, page_size=1, speculative_use_rejection_sampling=False, dp_attention=False,
                   enable_linear_replayssm_spec=False)
        cfg.update(overrides)
        resolved.clear()
        ns["_handle_ddtree"](types.SimpleNamespace(**cfg))
        return dict(resolved)

    return run


def test_handle_ddtree_resolves_the_default_budget(handle_ddtree):
    assert handle_ddtree() == {"speculative_ddtree_budget": 32}
    assert handle_ddtree(speculative_ddtree_budget=1023) == {"speculative_ddtree_budget": 1023}
    assert handle_ddtree(page_size=None) == {"speculative_ddtree_budget": 32}


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"speculative_ddtree_budget": 0}, "--speculative-ddtree-budget must be between 1 and 1023 (draft nodes per tree, root excluded; the verify width is budget + 1), got 0"),
        ({"speculative_ddtree_budget": 1024}, "--speculative-ddtree-budget must be between 1 and 1023 (draft nodes per tree, root excluded; the verify width is budget + 1), got 1024"),
        ({"page_size": 16}, "DDTREE requires --page-size 1 (the accepted tree path is compacted token by token), got 16."),
        ({"speculative_use_rejection_sampling": True}, "DDTREE does not support --speculative-use-rejection-sampling: the tree is built from the draft's top-k log-probabilities, so there is no draft distribution per verify node."),
        ({"dp_attention": True}, "DDTREE does not support dp attention: an idle DP rank would run DFLASH's chain-shaped verify while the others run the tree."),
        ({"enable_linear_replayssm_spec": True}, "DDTREE does not support --enable-linear-replayssm-spec: its verify ring replays a linear draft chain, not a tree."),
    ],
)
def test_handle_ddtree_refusals_word_for_word(handle_ddtree, overrides, message):
    with pytest.raises(ValueError) as err:
        handle_ddtree(**overrides)
    assert str(err.value) == message


def test_verify_width_never_equals_the_block(site):
    ns = _cut(site, WORKER, ["_verify_width"], {})
    width = ns["_verify_width"]
    assert width(32, 16) == 33 and width(7, 16) == 8
    assert width(15, 16) == 17  # would equal the block: one padding node keeps it off DFLASH's graphs
    assert all(width(b, k) != k and width(b, k) >= b + 1 for b in range(1, 80) for k in range(2, 40))
    # every width-sized buffer covers the widest case (DDTREE's max draft-token width is budget + 2)
    sizing = (site / "sglang/srt/speculative/spec_info.py").read_text(encoding="utf-8")
    assert "return max(cfg.speculative_num_draft_tokens, budget + 2)" in sizing
    assert max(width(b, k) - b for b in range(1, 80) for k in range(2, 40)) == 2


def test_tree_mask_backends_are_real_classes_and_the_role_refuses_the_others(site):
    """The worker's backend names exist in 0.5.23, read the verify input's mask in an eager
    target verify, and are the ones the sglang role lets DDTREE use (one list, two places)."""
    import yaml

    tree = _tree(site, WORKER)
    assign = [n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "TREE_MASK_BACKENDS"]
    backends = ast.literal_eval(assign[0].value)
    # where each one's eager TARGET_VERIFY takes the mask from the verify input
    files = {
        "FlashInferAttnBackend": ("flashinfer_backend.py", 'getattr(spec_info, "custom_mask", None) is not None'),
        "TritonAttnBackend": ("triton_backend.py", "custom_mask = spec_info.custom_mask"),
    }
    assert set(backends) == set(files)
    for cls, (name, reads_mask) in files.items():
        source = (site / "sglang/srt/layers/attention" / name).read_text(encoding="utf-8")
        assert "class %s(" % cls in source
        assert reads_mask in source, (cls, reads_mask)
    role_vars = yaml.safe_load((REPO / "roles/sglang/vars/main.yml").read_text())
    assert role_vars["sglang_config_ddtree_tree_backends"] == list(backends.values())


def test_the_lab_stand_in_repeats_the_patched_server_s_refusals(site, handle_ddtree):
    """The stand-in's copies of 0004's start-up refusals and warning (lab physics rules 1a/1b)
    are what the patched source raises and logs, so the lab shows what the real server would."""
    from sglang_lab_standin import physics

    def raised(**overrides):
        with pytest.raises(ValueError) as err:
            handle_ddtree(**overrides)
        return "%s: %s" % (type(err.value).__name__, err.value)

    # the stand-in's traceback names DDTreeError by its module, as Python prints it
    assert raised(speculative_ddtree_budget=2000) == physics.DDTREE_BUDGET_ERROR.format(
        max=physics.DDTREE_MAX_BUDGET, budget=2000).replace("sglang.srt.speculative.ddtree_tree.", "")
    assert raised(page_size=16) == physics.DDTREE_PAGE_SIZE_ERROR.format(page_size=16)
    assert raised(speculative_use_rejection_sampling=True) == physics.DDTREE_REJECTION_ERROR
    assert raised(enable_linear_replayssm_spec=True) == physics.DDTREE_REPLAYSSM_ERROR
    warnings = [
        n.args[0].value for n in ast.walk(_tree(site, HOOK))
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "warning" and n.args
        and isinstance(n.args[0], ast.Constant) and "--speculative-ddtree-budget" in str(n.args[0].value)
    ]
    assert [w.replace("%s", "{algorithm}") for w in warnings] == [physics.DDTREE_BUDGET_IGNORED_WARNING]
