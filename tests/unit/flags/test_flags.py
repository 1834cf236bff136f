"""The SGLang command lines ddtree-fleet renders parse with the real 0.5.23 flag list.

The declared settings are merged the way Ansible merges them for the root playbooks (role
defaults < group_vars/all.yml < group_vars/<arch>.yml) for every lab host and algorithm, turned
into argv by plugins/module_utils/flags.py (the code the unit template uses), and parsed with the
parser built from the real flag list (lab/standin/.../sglang-0.5.23-cli.json).
"""
from __future__ import annotations

import re
import tempfile

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]

from ansible_collections.ddtree.fleet.plugins.filter.inputs import spec_limits  # noqa: E402
from ansible_collections.ddtree.fleet.plugins.module_utils import flags as ddtree_flags  # noqa: E402
from sglang_lab_standin import cli  # noqa: E402

LAB_HOSTS = {"ct129": "sm86", "ct200": "sm120"}
# What the unit's ExecStartPre writes before each start (a rendered argv names this file).
KEY_FILE = Path(tempfile.mkdtemp(prefix="ddtree-flags-")) / "api-key.yaml"
KEY_FILE.write_text('api-key: "unit-test-key"\n')
ALGORITHMS = ["NEXTN", "EAGLE", "DFLASH", "DDTREE"]


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def declared(arch: str, **overrides) -> dict:
    merged = {}
    merged.update(load(REPO / "roles" / "sglang" / "defaults" / "main.yml"))
    merged.update(load(REPO / "group_vars" / "all.yml"))
    merged.update(load(REPO / "group_vars" / f"{arch}.yml"))
    merged.update(overrides)
    return merged


def flag_input(v: dict) -> dict:
    """The same mapping as roles/sglang/vars/main.yml sglang_config_flag_input."""
    algo = v["sglang_speculative_algorithm"].upper()
    return {
        "model_path": "/opt/sglang/models/target", "algorithm": algo,
        "draft_path": "/opt/sglang/models/draft" if algo in ddtree_flags.DRAFT_ALGORITHMS else "",
        "ddtree_style": v["sglang_ddtree_style"], "host": v["sglang_host"], "port": v["sglang_port"],
        "tp_size": v["sglang_tp_size"], "mem_fraction_static": v["sglang_mem_fraction_static"],
        "attention_backend": v["sglang_attention_backend"],
        "draft_attention_backend": v["sglang_draft_attention_backend"],
        "cuda_graph_backend": v["sglang_cuda_graph_backend"], "cuda_graph_max_bs": v["sglang_cuda_graph_max_bs"],
        "speculative": (v.get("sglang_speculative_params") or {}).get(algo, {}),
        "ddtree_budget": v.get("sglang_ddtree_budget", 0),
        "served_model_name": v["sglang_served_model_name"], "context_length": v["sglang_context_length"],
        "max_running_requests": v["sglang_max_running_requests"], "enable_metrics": v["sglang_enable_metrics"],
        "trust_remote_code": v["sglang_trust_remote_code"], "extra_args": v["sglang_extra_args"],
        "api_key_set": True, "api_key_config": str(KEY_FILE),
    }


def vars_file_keys() -> set:
    text = (REPO / "roles" / "sglang" / "vars" / "main.yml").read_text()
    block = text.split("sglang_config_flag_input:")[1].split("\nsglang_config_argv")[0]
    return set(re.findall(r"'([a-z_]+)':", block))


def test_flag_input_mirror_matches_the_role_vars():
    # If the role passes a new key to sglang_argv, this test's mirror must learn it too.
    assert vars_file_keys() == set(flag_input(declared("sm86")))


@pytest.mark.parametrize("host,arch", sorted(LAB_HOSTS.items()))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_rendered_flags_parse_with_real_sglang(host, arch, algorithm):
    v = declared(arch, sglang_speculative_algorithm=algorithm)
    argv = ddtree_flags.sglang_argv(flag_input(v))
    # SystemExit(2) on anything real 0.5.23 rejects; DDTREE's node budget is patch 0004's flag
    # (the default patch set's), every other algorithm parses with stock 0.5.23.
    ns = cli.parse_args(argv, extra_flags=[cli.DDTREE_BUDGET_FLAG] if algorithm == "DDTREE" else [])
    if algorithm == "DDTREE":
        assert ns.speculative_ddtree_budget == v["sglang_ddtree_budget"] > 0
    else:
        assert ddtree_flags.DDTREE_BUDGET_FLAG not in argv
    assert ns.speculative_algorithm == algorithm
    assert float(ns.mem_fraction_static) == v["sglang_mem_fraction_static"]
    assert int(ns.tp_size) == v["sglang_tp_size"]
    assert ns.attention_backend == v["sglang_attention_backend"]
    assert "--cuda-graph-max-bs" not in argv and "--disable-cuda-graph" not in argv
    assert ns.cuda_graph_backend_decode == v["sglang_cuda_graph_backend"]["decode"]
    if algorithm in ddtree_flags.DRAFT_ALGORITHMS:
        assert ns.speculative_draft_model_path == "/opt/sglang/models/draft"
    # The key is read from a --config file; no argument holds it, nor even names it.
    assert argv[-2:] == ["--config", str(KEY_FILE)] and "--api-key" not in argv
    assert ns.api_key == "unit-test-key"


def test_per_architecture_values_from_the_incident():
    sm86 = ddtree_flags.sglang_argv(flag_input(declared("sm86")))
    sm120 = ddtree_flags.sglang_argv(flag_input(declared("sm120")))
    assert sm86[sm86.index("--mem-fraction-static") + 1] == "0.85"
    assert sm86[sm86.index("--tp-size") + 1] == "2"
    assert sm120[sm120.index("--attention-backend") + 1] == "triton"  # fa3 does not run on sm120
    assert sm120[sm120.index("--cuda-graph-max-bs-decode") + 1] == "48"


def test_decode_graphs_disabled_drops_max_bs():
    v = declared("sm86", sglang_cuda_graph_backend={"decode": "disabled", "prefill": "disabled"})
    argv = ddtree_flags.sglang_argv(flag_input(v))
    ns = cli.parse_args(argv, extra_flags=[cli.DDTREE_BUDGET_FLAG])
    assert ns.cuda_graph_backend_decode == "disabled" and "--cuda-graph-max-bs-decode" not in argv


def test_fork_style_emits_dflash_plus_fork_flag_which_upstream_rejects():
    v = declared("sm120", sglang_ddtree_style="flag", sglang_ddtree_budget=0)
    argv = ddtree_flags.sglang_argv(flag_input(v))
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert ddtree_flags.DDTREE_FORK_FLAG in argv
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)  # only a fork that defines the flag accepts it
    assert exc.value.code == 2
    ns = cli.parse_args(argv, extra_flags=[ddtree_flags.DDTREE_FORK_FLAG])
    assert ns.speculative_algorithm == "DFLASH"
    # The role names the same flag when it refuses this style for a PyPI source, and checks a
    # git fork's installed source for it (roles/sglang: tasks/main.yml, tasks/install.yml).
    role_vars = load(REPO / "roles" / "sglang" / "vars" / "main.yml")
    assert role_vars["sglang_config_ddtree_fork_flag"] == ddtree_flags.DDTREE_FORK_FLAG


@pytest.mark.parametrize("bad,needle", [
    ({"algorithm": "DDTREEE"}, "speculative algorithm must be one of"),
    ({"algorithm": "DDTREE", "draft_path": ""}, "needs a draft model"),
    ({"cuda_graph_backend": {"decode": "on"}}, "cuda_graph_backend.decode"),
    ({"mem_fraction_static": "0.85"}, "must be a number"),
    ({"ddtree_style": "plugin"}, "ddtree_style"),
])
def test_bad_settings_are_refused_with_the_setting_named(bad, needle):
    cfg = flag_input(declared("sm86"))
    cfg.update(bad)
    with pytest.raises(ddtree_flags.FlagError, match=needle.replace(".", r"\.")):
        ddtree_flags.sglang_argv(cfg)


def test_exec_line_quotes_only_what_needs_it():
    line = ddtree_flags.exec_line(["--model-path", "/opt/m", "--served-model-name", "my model", "--api-key", "${K}"])
    assert line == '--model-path /opt/m --served-model-name "my model" --api-key ${K}'


def test_config_fingerprint_changes_with_any_part():
    a = ddtree_flags.config_fingerprint("unit", "env")
    assert a == ddtree_flags.config_fingerprint("unit", "env") and len(a) == 16
    assert a != ddtree_flags.config_fingerprint("unit", "env2")
    assert a != ddtree_flags.config_fingerprint("unitenv", "")


def test_the_algorithm_names_are_one_list():
    # ddtree_flags holds them; the argument specs' Limits, the role's draft list and the
    # compatibility check agree.
    from ansible_collections.ddtree.fleet.plugins.module_utils import spec as ddtree_spec

    def limits(role, name):
        return spec_limits(load(REPO / "roles" / role / "meta" / "argument_specs.yml")
                           ["argument_specs"]["main"]["options"][name])
    for role, name in (("benchmark", "benchmark_candidates"), ("benchmark", "benchmark_baseline"),
                       ("sglang", "sglang_speculative_algorithm"), ("sglang", "sglang_known_good_algorithm")):
        assert tuple(limits(role, name)["choices"]) == ddtree_flags.ALGORITHMS, name
    assert tuple(limits("sglang", "sglang_speculative_params")["allowed_keys"]) == ddtree_flags.ALGORITHMS
    role_vars = load(REPO / "roles" / "sglang" / "vars" / "main.yml")
    assert tuple(role_vars["sglang_config_draft_algorithms"]) == ddtree_flags.DRAFT_ALGORITHMS
    assert ddtree_spec.ALGORITHMS == ddtree_flags.ALGORITHMS
    assert ddtree_spec.DRAFT_REQUIRED == ddtree_flags.DRAFT_ALGORITHMS


def test_the_key_file_sets_the_key_and_the_command_line_holds_none(tmp_path):
    """What the unit's ExecStartPre writes, read the way the server reads --config: the parsed
    api_key is the key; the argv the unit renders contains neither the key nor a variable for it."""
    key = "k3y-with.all~allowed+chars/=:@_"
    path = tmp_path / "api-key.yaml"
    path.write_text('api-key: "%s"\n' % key)  # the ExecStartPre's printf format
    cfg = dict(flag_input(declared("sm86")), api_key_config=str(path))
    argv = ddtree_flags.sglang_argv(cfg)
    assert not any(key in a or ddtree_flags.API_KEY_ENV in a for a in argv), argv
    budget = [cli.DDTREE_BUDGET_FLAG]  # sm86's declared DDTREE passes patch 0004's budget flag
    assert cli.parse_args(argv, extra_flags=budget).api_key == key
    assert cli.parse_args(argv[:-2], extra_flags=budget).api_key is None


def test_the_key_pattern_admits_only_what_the_key_file_quotes_safely():
    spec = yaml.safe_load((REPO / "roles/sglang/meta/argument_specs.yml").read_text())
    pattern = spec_limits(spec["argument_specs"]["main"]["options"]["sglang_api_key"])["pattern"]
    assert re.search(pattern, "Ab0._~+/=:@-") and re.search(pattern, "")
    for bad in ('a"b', "a\\b", "a b", "a\nb", "a'b", "a$b", "a%b", "a`b"):
        assert not re.search(pattern, bad), bad


@pytest.mark.parametrize("extra, owned", [
    (["--host", "0.0.0.0"], "--host"), (["--port=1"], "--port"), (["--api-key", "x"], "--api-key"),
    (["--api-k=x"], "--api-key"), (["--admin-api-key", "x"], "--admin-api-key"),
    (["--config", "/tmp/x.yaml"], "--config"), (["--mem-fraction-static", "0.9"], "--mem-fraction-static"),
    (["--log-level", "debug", "--model-path", "/x"], "--model-path"),
])
def test_extra_args_may_not_replace_a_rendered_or_secret_flag(extra, owned):
    cfg = dict(flag_input(declared("sm86")), extra_args=extra)
    with pytest.raises(ddtree_flags.FlagError, match="sglang_extra_args must not pass .*%s" % re.escape(owned)):
        ddtree_flags.sglang_argv(cfg)


def test_extra_args_that_add_a_flag_pass_through():
    cfg = dict(flag_input(declared("sm86")), extra_args=["--log-level", "debug", "--enable-metrics-for-all-schedulers"])
    argv = ddtree_flags.sglang_argv(cfg)
    assert argv[-5:-2] == ["--log-level", "debug", "--enable-metrics-for-all-schedulers"]
    cli.parse_args(argv[:-2], extra_flags=[cli.DDTREE_BUDGET_FLAG])
