"""The up-front input check validates one merged argument spec per host: the merge must be exact."""

import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parents[3]


def _filters():
    spec = importlib.util.spec_from_file_location("_ddtree_inputs_filters", REPO / "plugins" / "filter" / "inputs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("playbook", ["converge", "benchmark", "drift_timer"])
def test_each_playbooks_entry_points_merge_into_every_option(playbook):
    entry_points = yaml.safe_load((REPO / "roles" / "validate_inputs" / "vars" / "main.yml").read_text()
                                  )["validate_inputs_entry_points"][playbook]
    specs = {ref.split(":")[0]: yaml.safe_load((REPO / "roles" / ref.split(":")[0] / "meta" / "argument_specs.yml").read_text())
             for ref in entry_points}
    merged = _filters().spec_options(specs, entry_points)
    for ref in entry_points:
        role, entry = ref.split(":")
        for name, option in (specs[role]["argument_specs"][entry].get("options") or {}).items():
            assert merged[name] == option, f"{ref}: {name}"


def test_an_option_specified_two_ways_is_refused_naming_both():
    specs = {"a": {"argument_specs": {"main": {"options": {"x": {"type": "int"}}}}},
             "b": {"argument_specs": {"run": {"options": {"x": {"type": "str"}}, }}}}
    with pytest.raises(AnsibleFilterError, match="option x is specified differently by a:main and b:run"):
        _filters().spec_options(specs, ["a:main", "b:run"])
    same = {"a": specs["a"], "b": {"argument_specs": {"run": {"options": {"x": {"type": "int"}}}}}}
    assert _filters().spec_options(same, ["a:main", "b:run"]) == {"x": {"type": "int"}}


def test_limits_come_from_the_options_own_description_line():
    f = _filters()
    spec = {"type": "float", "description": ["Fraction of GPU memory.", "Limits: {gt: 0, lt: 1}"]}
    assert f.spec_limits(spec) == {"gt": 0, "lt": 1}
    assert f.spec_limits({"type": "int", "description": "No range."}) == {}
    problems = f.input_problems({"x": 1.5, "y": 0.5}, {"x": spec, "y": spec})
    assert problems == ["x=1.5 (number): expected a number (> 0; < 1)"]


@pytest.mark.parametrize("line, words", [
    ("Limits: gt 0", "expected a mapping"),
    ("Limits: {gt: 0, above: 3}", "unknown above"),
    ("Limits: {gt: [0}", "not a YAML mapping"),
])
def test_a_malformed_limits_line_is_refused_naming_it(line, words):
    with pytest.raises(AnsibleFilterError, match=words):
        _filters().spec_limits({"description": ["x", line]})


def test_every_limits_line_in_the_roles_parses():
    """Each role's Limits lines are well-formed, so a typo cannot turn a range check off."""
    f = _filters()
    count = 0

    def walk(options):
        nonlocal count
        for spec in (options or {}).values():
            count += bool(f.spec_limits(spec))
            walk(spec.get("options"))
    for path in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        for entry in yaml.safe_load(path.read_text())["argument_specs"].values():
            walk(entry.get("options"))
    assert count >= 90


def _drift_timer_options():
    specs = {"drift_timer": yaml.safe_load((REPO / "roles/drift_timer/meta/argument_specs.yml").read_text())}
    return _filters().spec_options(specs, ["drift_timer"])


@pytest.mark.parametrize("env, refused", [
    ({"ANSIBLE_VAULT_PASSWORD_FILE": "/root/.vault-pass", "http_proxy": "http://p:3128"}, None),
    ({"SGLANG_API_KEY": "canary-1"}, "SGLANG_API_KEY"), ({"HF_TOKEN": "hf_canary2"}, "HF_TOKEN"),
    ({"db_password": "canary-3", "PATH": "/bin"}, "db_password"), ({"bad name": "canary-4"}, "bad name"),
])
def test_drift_timer_environment_refuses_secret_names_for_its_0644_unit(env, refused):
    problems = _filters().input_problems({"drift_timer_environment": env}, _drift_timer_options())
    if refused is None:
        assert problems == []
    else:
        assert len(problems) == 1 and "key(s) %s" % refused in problems[0], problems
        assert "secrets go in drift_timer_environment_files" in problems[0]
        assert all(v not in problems[0] for v in env.values() if v.startswith(('canary', 'hf_'))), problems  # the values may be secrets


def test_known_inputs_are_every_option_default_var_and_name_the_tasks_set():
    f = _filters()
    found = f.known_inputs(REPO)
    known = set(found["names"])
    assert set(found["options"]) < known
    for path in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(path.read_text())["argument_specs"].values():
            assert set(entry.get("options") or {}) <= known, path
    # role vars, a set_fact of a playbook, a register of a role's tasks
    assert {"sglang_config_argv", "ddtree_run_id", "sglang_service_state"} <= known
    prefixes = found["prefixes"]
    assert re.match(prefixes, "sglang_service_name") and re.match(prefixes, "ddtree_hosts")
    assert not re.match(prefixes, "lab_mirror") and not re.match(prefixes, "ansible_host")


def test_an_unknown_project_variable_is_named_with_the_closest_known_ones():
    f = _filters()
    known = f.known_inputs(REPO)
    out = f.unknown_inputs(["sglang_mem_fracton_static", "sglang_port", "ddtree_my_site_thing",
                            "quality_gate_soak_secs"], known, ["ddtree_my_site_thing"])
    assert out == [
        "quality_gate_soak_secs: no role or playbook of ddtree-fleet reads this variable (a typo?); "
        "did you mean quality_gate_soak_seconds?",
        "sglang_mem_fracton_static: no role or playbook of ddtree-fleet reads this variable (a typo?); "
        "did you mean sglang_mem_fraction_static?"]
    assert "expected a documented option" in f.unknown_inputs(["ddtree_zzz"], known)[0]


def _role_options(role, entry="main"):
    specs = {role: yaml.safe_load((REPO / f"roles/{role}/meta/argument_specs.yml").read_text())}
    return _filters().spec_options(specs, [f"{role}:{entry}"])


def test_unknown_speculative_parameters_are_refused_not_dropped():
    check = _filters().input_problems
    options = _role_options("sglang")
    assert check({"sglang_speculative_params": {"NEXTN": {"num_steps": 3, "eagle_topk": 1}}}, options) == []
    problems = check({"sglang_speculative_params": {"NEXTN": {"num_step": 3}, "DDTREE": {}}}, options)
    assert len(problems) == 1 and "unknown key(s) NEXTN.num_step" in problems[0], problems


def test_the_service_user_is_never_root():
    check = _filters().input_problems
    options = _role_options("sglang_service", "change")
    assert check({"sglang_service_user": "sglang"}, options) == []
    problems = check({"sglang_service_user": "root"}, options)
    assert len(problems) == 1 and "expected a string (a user name other than root)" in problems[0], problems


@pytest.mark.parametrize("role, entry, name, value", [
    ("sglang_service", "change", "sglang_service_environment", {"OK": "1", "NCCL_DEBUG": "INFO\nSGLANG_API_KEY=x"}),
    ("sglang_service", "change", "sglang_service_environment", {"TRAILING": "value\n"}),
    ("sglang_service", "change", "sglang_service_environment", {"BAD-NAME": "1"}),
    ("drift_timer", "main", "drift_timer_environment", {"http_proxy": "http://p:3128\nExecStartPre=/bin/sh"}),
    ("sglang", "main", "sglang_hf_token", "hf_abc\nEXTRA=1"),
    ("sglang", "main", "sglang_api_key", "key-1\n"),
    ("sglang_service", "change", "sglang_service_user", "sglang\n"),
])
def test_a_newline_never_reaches_an_environment_file_or_a_unit(role, entry, name, value):
    """A newline in a value would add a variable of its own to the EnvironmentFile (or a directive to
    the drift timer's unit); Python's "$" matches before a trailing newline, so every pattern's end
    is the string's end."""
    problems = _filters().input_problems({name: value}, _role_options(role, entry))
    assert len(problems) == 1 and problems[0].startswith(name + "="), problems
    assert "SGLANG_API_KEY=x" not in problems[0] and "hf_abc" not in problems[0]   # values are not shown


def test_one_line_values_with_tabs_and_spaces_pass():
    options = _role_options("sglang_service", "change")
    assert _filters().input_problems({"sglang_service_environment": {"NCCL_DEBUG": "INFO", "X_OPTS": "a b\tc"}},
                                     options) == []
