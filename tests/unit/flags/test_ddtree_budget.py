"""sglang_ddtree_budget end to end on the controller: the validation table's entry, the rendered
flag (DDTREE only), the names shared by the role, the renderer and the lab stand-in, which patch
of a set provides the flag, and the sglang role's up-front refusal of a source that lacks it.

The per-architecture values live in group_vars/<arch>.yml; the stand-in's side (accepting the flag
only from a source that defines the field, the worker's three start-up errors) is tested in
tests/unit/lab. The git-source check (roles/sglang/tasks/install.yml) needs an installed tree.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]

from ansible_collections.ddtree.fleet.plugins.module_utils import flags as ddtree_flags  # noqa: E402
from sglang_lab_standin import cli, physics  # noqa: E402

from test_flags import declared, flag_input  # noqa: E402

PATCH_DIR = REPO / "roles" / "sglang" / "files" / "patches"
BUILTINS_0003 = ["0001-ddtree-register-algorithm.patch", "0002-ddtree-dflash-family.patch", "0003-ddtree-tree.patch"]


def load(path: Path):
    return yaml.safe_load(path.read_text()) or {}


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def inputs_filter():
    return _load("_budget_inputs_filter", REPO / "plugins" / "filter" / "inputs.py")


def patch_filters():
    return _load("_budget_patch_filters", REPO / "plugins" / "filter" / "patch.py").FilterModule().filters()


# ---------------------------------------------------------------- the validation table

def budget_problems(value):
    spec = load(REPO / "roles" / "sglang" / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    return inputs_filter().input_problems({"sglang_ddtree_budget": value},
                                          {"sglang_ddtree_budget": spec["sglang_ddtree_budget"]})


@pytest.mark.parametrize("value", [0, 1, 32, 1023, "24", " 24 "])
def test_validation_table_takes_0_and_1_to_1023(value):
    assert budget_problems(value) == []


@pytest.mark.parametrize("value", [-1, 1024, 5000, "abc", True, 1.5, "", None, [24], {"sm120": 24}])
def test_validation_table_refuses_the_rest_naming_variable_and_range(value):
    problems = budget_problems(value)
    assert len(problems) == 1, problems
    assert problems[0].startswith("sglang_ddtree_budget=")
    assert "expected an integer (>= 0; <= 1023; 0 leaves --speculative-ddtree-budget out" in problems[0]
    assert "from 1 to 1023" in problems[0]


def test_role_default_leaves_the_flag_out():
    defaults = load(REPO / "roles" / "sglang" / "defaults" / "main.yml")
    spec = load(REPO / "roles" / "sglang" / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert defaults["sglang_ddtree_budget"] == spec["sglang_ddtree_budget"]["default"] == 0
    assert spec["sglang_ddtree_budget"]["type"] == "int"


# ---------------------------------------------------------------- the per-architecture values

ARCH_FILES = ["all", "sm86", "sm120", "sm90", "sm100"]


@pytest.mark.parametrize("name", ARCH_FILES)
def test_each_group_vars_file_sets_a_budget_said_to_be_unmeasured(name):
    path = REPO / "group_vars" / f"{name}.yml"
    value = load(path)["sglang_ddtree_budget"]
    assert isinstance(value, int) and 1 <= value <= ddtree_flags.DDTREE_MAX_BUDGET
    assert budget_problems(value) == []
    text = path.read_text().lower()
    assert "starting point" in text and "not measured" in text, f"{path}: say the value is a starting point"


def test_the_default_patch_set_provides_the_flag_the_group_vars_ask_for():
    f = patch_filters()
    defaults = load(REPO / "roles" / "sglang" / "defaults" / "main.yml")
    plan = f["patch_plan"]((PATCH_DIR / "series").read_text(), (PATCH_DIR / "SHA256SUMS").read_text(),
                                  defaults["sglang_patches"], [], str(PATCH_DIR))
    assert f["patches_adding"](plan, ddtree_flags.DDTREE_BUDGET_FILE, ddtree_flags.DDTREE_BUDGET_FIELD)


@pytest.mark.parametrize("arch,budget", [("sm86", 16), ("sm120", 32), ("sm90", 48), ("sm100", 64)])
def test_each_architecture_renders_its_own_budget(arch, budget):
    argv = argv_for(arch, sglang_speculative_algorithm="DDTREE")
    assert argv[argv.index(ddtree_flags.DDTREE_BUDGET_FLAG) + 1] == str(budget)
    assert ddtree_flags.DDTREE_BUDGET_FLAG not in argv_for(arch, sglang_speculative_algorithm="NEXTN")


# ---------------------------------------------------------------- rendering

def argv_for(arch="sm120", **overrides):
    return ddtree_flags.sglang_argv(flag_input(declared(arch, **overrides)))


def test_ddtree_renders_the_budget_and_a_source_with_the_field_parses_it():
    argv = argv_for(sglang_speculative_algorithm="DDTREE", sglang_ddtree_budget=24)
    at = argv.index(ddtree_flags.DDTREE_BUDGET_FLAG)
    assert argv[at + 1] == "24" and argv.count(ddtree_flags.DDTREE_BUDGET_FLAG) == 1
    ns = cli.parse_args(argv, extra_flags=[cli.DDTREE_BUDGET_FLAG])
    assert ns.speculative_ddtree_budget == 24 and ns.speculative_algorithm == "DDTREE"
    with pytest.raises(SystemExit) as exc:  # stock 0.5.23 (or 0001-0003): unrecognized arguments
        cli.parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize("algorithm", ["NEXTN", "EAGLE", "EAGLE3", "DFLASH"])
def test_other_algorithms_never_get_the_budget(algorithm):
    argv = argv_for(sglang_speculative_algorithm=algorithm, sglang_ddtree_budget=24)
    assert ddtree_flags.DDTREE_BUDGET_FLAG not in argv
    cli.parse_args(argv)  # stock 0.5.23 parses it


@pytest.mark.parametrize("budget", [0, None, ""])
def test_zero_or_unset_leaves_the_flag_out(budget):
    assert ddtree_flags.DDTREE_BUDGET_FLAG not in argv_for(sglang_speculative_algorithm="DDTREE", sglang_ddtree_budget=budget)


def test_flag_style_renders_it_next_to_the_fork_flag():
    argv = argv_for(sglang_speculative_algorithm="DDTREE", sglang_ddtree_style="flag", sglang_ddtree_budget=48)
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert ddtree_flags.DDTREE_FORK_FLAG in argv and argv[argv.index(ddtree_flags.DDTREE_BUDGET_FLAG) + 1] == "48"
    ns = cli.parse_args(argv, extra_flags=[cli.DDTREE_FORK_FLAG, cli.DDTREE_BUDGET_FLAG])
    assert ns.speculative_dflash_enable_ddtree is True and ns.speculative_ddtree_budget == 48


@pytest.mark.parametrize("bad", [-1, 1024, "many", True, 2.5])
def test_renderer_refuses_what_the_table_refuses(bad):
    with pytest.raises(ddtree_flags.FlagError, match="ddtree_budget must be"):
        argv_for(sglang_speculative_algorithm="DDTREE", sglang_ddtree_budget=bad)


def test_one_spelling_everywhere():
    role_vars = load(REPO / "roles" / "sglang" / "vars" / "main.yml")
    assert role_vars["sglang_config_ddtree_budget_flag"] == ddtree_flags.DDTREE_BUDGET_FLAG == cli.DDTREE_BUDGET_FLAG
    assert role_vars["sglang_config_ddtree_budget_field"] == ddtree_flags.DDTREE_BUDGET_FIELD \
        == physics.DDTREE_BUDGET_MARKER == ddtree_flags.DDTREE_BUDGET_FLAG[2:].replace("-", "_")
    assert role_vars["sglang_config_ddtree_budget_file"] == ddtree_flags.DDTREE_BUDGET_FILE \
        == "sglang/srt/" + physics.DDTREE_FLAG_FILE
    spec = load(REPO / "roles" / "sglang" / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    limits = inputs_filter().spec_limits(spec["sglang_ddtree_budget"])
    assert limits["max"] == ddtree_flags.DDTREE_MAX_BUDGET == physics.DDTREE_MAX_BUDGET == 1023


# ---------------------------------------------------------------- which patch provides the flag

def budget_patch(field_line: str = "    speculative_ddtree_budget: Optional[int] = None",
                 path: str = "sglang/srt/arg_groups/fields/spec.py") -> str:
    return (f"A test patch\n\n--- a/{path}\n+++ b/{path}\n@@ -70,3 +70,4 @@\n"
            "     speculative_dflash_block_size: int = None\n"
            f"+{field_line}\n     x = 1\n")


def test_patch_adds_looks_at_added_lines_of_the_right_file():
    logic = _load("_budget_patch_logic", REPO / "plugins" / "module_utils" / "patch" / "series.py")
    assert logic.patch_adds(budget_patch(), ddtree_flags.DDTREE_BUDGET_FILE, "speculative_ddtree_budget")
    assert not logic.patch_adds(budget_patch(path="sglang/srt/other.py"), ddtree_flags.DDTREE_BUDGET_FILE,
                                "speculative_ddtree_budget")
    removed = budget_patch().replace("+    speculative_ddtree_budget", "-    speculative_ddtree_budget")
    assert not logic.patch_adds(removed, ddtree_flags.DDTREE_BUDGET_FILE, "speculative_ddtree_budget")
    context = budget_patch().replace("+    speculative_ddtree_budget", "     speculative_ddtree_budget")
    assert not logic.patch_adds(context, ddtree_flags.DDTREE_BUDGET_FILE, "speculative_ddtree_budget")


def test_patches_adding_over_a_plan(tmp_path):
    good = tmp_path / "0099-budget.patch"
    good.write_text(budget_patch())
    other = tmp_path / "0098-other.patch"
    other.write_text(budget_patch(path="sglang/srt/other.py"))
    plan = [{"name": p.name, "src": str(p), "sha256": "0" * 64} for p in (other, good)]
    plan.append({"name": "0097-missing.patch", "src": str(tmp_path / "missing"), "sha256": "0" * 64})
    adding = patch_filters()["patches_adding"]
    assert adding(plan, ddtree_flags.DDTREE_BUDGET_FILE, ddtree_flags.DDTREE_BUDGET_FIELD) == ["0099-budget.patch"]


def test_in_the_builtin_series_only_the_worker_patch_adds_the_field():
    f = patch_filters()
    series_text = (PATCH_DIR / "series").read_text()
    names = f["patch_series"](series_text)
    plan = f["patch_plan"](series_text, (PATCH_DIR / "SHA256SUMS").read_text(), names, [], str(PATCH_DIR))
    providers = f["patches_adding"](plan, ddtree_flags.DDTREE_BUDGET_FILE, ddtree_flags.DDTREE_BUDGET_FIELD)
    assert providers == [n for n in names if n.startswith("0004-")]
    assert not set(providers) & set(BUILTINS_0003)


# ---------------------------------------------------------------- the role's up-front refusal

def recording_playbook(name: str, enter: str, on_success: str) -> str:
    """A play that enters the sglang role (``enter``: the import_role task's options) on every
    host and writes ``out_dir/<host>.json``: ``on_success`` (a Jinja dict literal) or, when the
    role fails, ``{'status': 'failed', 'msg': ...}``."""
    return f"""
- name: {name}
  hosts: all
  gather_facts: false
  tasks:
    - name: Enter the role and record the outcome
      block:
        - name: Enter the sglang role
          ansible.builtin.import_role:
{enter}
        - name: Record success
          ansible.builtin.copy:
            content: "{{{{ {on_success} | to_json }}}}"
            dest: "{{{{ out_dir }}}}/{{{{ inventory_hostname }}}}.json"
            mode: "0644"
      rescue:
        - name: Record the failure
          ansible.builtin.copy:
            content: "{{{{ {{'status': 'failed', 'msg': ansible_failed_result.msg}} | to_json }}}}"
            dest: "{{{{ out_dir }}}}/{{{{ inventory_hostname }}}}.json"
            mode: "0644"
"""


PLAYBOOK = recording_playbook(
    "Enter the sglang role's fact-free checks",
    "            name: ddtree.fleet.sglang\n            rolespec_validate: false",
    "{'status': 'ok', 'argv': sglang_config_argv}")


def run_recorded(tmp: Path, playbook: str, hosts: dict) -> dict:
    """One ansible-playbook run of ``playbook`` over ``hosts`` (all in group sm120): each
    host's recorded outcome, as written by recording_playbook."""
    (tmp / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"children": {"sm120": {"hosts": hosts}}}}))
    (tmp / "play.yml").write_text(playbook)
    out_dir = tmp / "out"
    out_dir.mkdir()
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_HOME": str(tmp / ".ansible"),
           "ANSIBLE_LOCAL_TEMP": str(tmp / "tmp")}
    run = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp / "hosts.yml"),
                          "-e", f"out_dir={out_dir}", str(tmp / "play.yml")], cwd=tmp, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    results = {}
    for name in hosts:
        path = out_dir / f"{name}.json"
        assert path.is_file(), f"{name}: no result (rc {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"
        results[name] = json.loads(path.read_text())
    return results


@pytest.fixture(scope="module")
def role_run(tmp_path_factory):
    """One ansible-playbook run on localhost: every case one host alias with its own variables."""
    tmp = tmp_path_factory.mktemp("budget-role")
    extra = tmp / "0099-budget.patch"
    extra.write_text(budget_patch())
    extra_entry = [{"path": str(extra), "sha256": hashlib.sha256(extra.read_bytes()).hexdigest()}]
    cases = {
        "no_worker_patch": {"sglang_ddtree_budget": 24, "sglang_patches": BUILTINS_0003},
        "unpatched": {"sglang_ddtree_budget": 24, "sglang_patches": []},
        "user_patch_adds_it": {"sglang_ddtree_budget": 24, "sglang_patches": BUILTINS_0003,
                               "sglang_extra_patches": extra_entry},
        "budget_0": {"sglang_ddtree_budget": 0, "sglang_patches": BUILTINS_0003},
        "nextn": {"sglang_ddtree_budget": 24, "sglang_patches": [], "sglang_speculative_algorithm": "NEXTN"},
        "git_source": {"sglang_ddtree_budget": 24, "sglang_patches": BUILTINS_0003,
                       "sglang_source": {"type": "git", "repo": "https://example.invalid/sglang.git", "version": "v1"}},
        # the worker's tree verify: flashinfer or triton (the default patch set has the worker)
        "fa3_worker": {"sglang_ddtree_budget": 24, "sglang_attention_backend": "fa3"},
        "trtllm_worker": {"sglang_ddtree_budget": 0, "sglang_attention_backend": "trtllm_mha"},
        "flashinfer_worker": {"sglang_ddtree_budget": 24, "sglang_attention_backend": "flashinfer"},
        "fa3_no_worker": {"sglang_ddtree_budget": 0, "sglang_patches": BUILTINS_0003, "sglang_attention_backend": "fa3"},
        "fa3_nextn": {"sglang_speculative_algorithm": "NEXTN", "sglang_attention_backend": "fa3"},
    }
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **v}
             for name, v in cases.items()}
    return {name: (data["status"], " ".join(data["msg"].split()) if "msg" in data else data["argv"])
            for name, data in run_recorded(tmp, PLAYBOOK, hosts).items()}


def test_role_refuses_a_pypi_patch_set_without_the_field(role_run):
    for case in ("no_worker_patch", "unpatched"):
        status, msg = role_run[case]
        assert status == "failed", (case, msg)
        assert msg.startswith(f"{case}: sglang_ddtree_budget=24 renders --speculative-ddtree-budget"), msg
        assert "from PyPI does not define and no patch of the set adds" in msg
        assert "speculative_ddtree_budget in sglang/srt/arg_groups/fields/spec.py" in msg
        assert "expected sglang_ddtree_budget=0 (the server's own budget, 32)" in msg


def test_role_names_the_builtin_patch_that_provides_it(role_run):
    names = patch_filters()["patch_series"]((PATCH_DIR / "series").read_text())
    worker = [n for n in names if n.startswith("0004-")]
    msg = role_run["no_worker_patch"][1]
    if worker:
        assert f"or sglang_patches with {worker[0]}." in msg
    else:
        assert msg.endswith("(the server's own budget, 32).")


def test_role_takes_a_set_or_source_that_can_provide_it(role_run):
    status, argv = role_run["user_patch_adds_it"]
    assert status == "ok" and argv[argv.index("--speculative-ddtree-budget") + 1] == "24"
    status, argv = role_run["git_source"]  # checked in its installed tree (tasks/install.yml)
    assert status == "ok" and "--speculative-ddtree-budget" in argv


def test_role_does_not_refuse_what_it_does_not_render(role_run):
    for case in ("budget_0", "nextn"):
        status, argv = role_run[case]
        assert status == "ok", (case, argv)
        assert "--speculative-ddtree-budget" not in argv


def test_role_refuses_ddtree_with_a_backend_the_worker_cannot_verify_a_tree_with(role_run):
    for case, backend in (("fa3_worker", "fa3"), ("trtllm_worker", "trtllm_mha")):
        status, msg = role_run[case]
        assert status == "failed", (case, msg)
        assert f"{case}: sglang_attention_backend={backend} with sglang_speculative_algorithm=DDTREE" in msg
        assert "the DDTree worker (0004-ddtree-worker.patch) verifies its tree with flashinfer or triton only" in msg
        assert msg.endswith("expected sglang_attention_backend flashinfer or triton for this host's group.")


def test_the_backend_rule_follows_the_worker_patch_and_the_algorithm(role_run):
    for case, backend in (("flashinfer_worker", "flashinfer"), ("fa3_no_worker", "fa3"), ("fa3_nextn", "fa3")):
        status, argv = role_run[case]
        assert status == "ok", (case, argv)
        assert argv[argv.index("--attention-backend") + 1] == backend


@pytest.mark.parametrize("name", ["sm86", "sm90", "sm100", "sm120"])
def test_every_group_declares_a_backend_ddtree_can_run_on(name):
    group = yaml.safe_load((REPO / "group_vars" / f"{name}.yml").read_text())
    tree_backends = yaml.safe_load((REPO / "roles/sglang/vars/main.yml").read_text())["sglang_config_ddtree_tree_backends"]
    assert group["sglang_attention_backend"] in tree_backends == ["flashinfer", "triton"]


# ---------------------------------------------------------------- a git source's installed tree

INSTALL_PLAYBOOK = recording_playbook(
    "Enter the sglang role's install checks on an already built venv",
    "            name: ddtree.fleet.sglang\n            tasks_from: install\n            rolespec_validate: false",
    "{'status': 'ok'}")
GIT = {"type": "git", "repo": "https://example.invalid/sglang.git", "version": "v1"}


@pytest.fixture(scope="module")
def install_run(tmp_path_factory):
    """tasks/install.yml against fake, already built venvs of a git source (nothing is installed)."""
    tmp = tmp_path_factory.mktemp("budget-install")
    pyver = "%d.%d" % sys.version_info[:2]
    source_id = "git-" + hashlib.sha256(f"{GIT['repo']}@{GIT['version']}".encode()).hexdigest()[:10]
    cases = {  # name: (spec.py defines the budget field, extra variables)
        "fork_with_field": (True, {}),
        "fork_without_field": (False, {}),
        "fork_without_field_budget_0": (False, {"sglang_ddtree_budget": 0}),
        "fork_without_field_nextn": (False, {"sglang_speculative_algorithm": "NEXTN"}),
    }
    hosts = {}
    for name, (has_field, extra) in cases.items():
        root = tmp / name
        venv = root / f"{source_id}-nopatch"
        spec = venv / "lib" / f"python{pyver}" / "site-packages" / ddtree_flags.DDTREE_BUDGET_FILE
        spec.parent.mkdir(parents=True)
        spec.write_text("class Spec:\n    speculative_num_draft_tokens = None\n"
                        + ("    speculative_ddtree_budget = None\n" if has_field else ""))
        (venv / ".ddtree-venv.json").write_text("{}\n")
        hosts[name] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                       "sglang_venv_root": str(root), "sglang_python": sys.executable, "sglang_source": GIT,
                       "sglang_patches": [], "sglang_ddtree_budget": 24, **extra}
    return {name: (data["status"], " ".join(data.get("msg", "").split()))
            for name, data in run_recorded(tmp, INSTALL_PLAYBOOK, hosts).items()}


def test_git_source_without_the_field_is_refused_before_the_unit_changes(install_run):
    status, msg = install_run["fork_without_field"]
    assert status == "failed", msg
    assert msg.startswith("fork_without_field: sglang_ddtree_budget=24 renders --speculative-ddtree-budget, but"
                          " sglang_source https://example.invalid/sglang.git@v1 does not define it"), msg
    assert "site-packages/sglang/srt/arg_groups/fields/spec.py" in msg
    assert "expected a source that defines it, or sglang_ddtree_budget=0 (the server's own budget, 32)." in msg
    assert msg.endswith("The service was not changed.")


def test_git_source_with_the_field_or_without_the_flag_passes(install_run):
    for case in ("fork_with_field", "fork_without_field_budget_0", "fork_without_field_nextn"):
        assert install_run[case] == ("ok", ""), (case, install_run[case])
