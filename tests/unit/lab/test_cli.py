"""The stand-in's command line must accept and reject exactly what real sglang 0.5.23 does."""

import json
from pathlib import Path

import pytest

from sglang_lab_standin import cli

SHARED_JSON = Path("/work/shared/data/sglang-0.5.23-cli.json")
PKG_JSON = Path(cli.__file__).with_name(cli.CLI_JSON_NAME)

GOOD = ("--model-path x --speculative-algorithm DDTREE --cuda-graph-backend-decode disabled "
        "--cuda-graph-max-bs-decode 48 --mem-fraction-static 0.85 --tp-size 2 "
        "--attention-backend triton").split()


def test_real_flags_accepted_and_typed():
    a = cli.parse_args(GOOD)
    assert a.model_path == "x"
    assert a.speculative_algorithm == "DDTREE"
    assert a.cuda_graph_backend_decode == "disabled"
    assert a.cuda_graph_max_bs_decode == 48
    assert a.mem_fraction_static == pytest.approx(0.85)
    assert a.tp_size == 2
    assert a.attention_backend == "triton"
    assert a.port == 30000 and a.host == "127.0.0.1"


@pytest.mark.parametrize("argv, message", [
    (["--model-path", "x", "--cuda-graph-max-bs", "48"], "ambiguous option"),
    (["--model-path", "x", "--cuda-graph-bs", "8"], "ambiguous option"),
    (["--model-path", "x", "--speculative-draft", "d"], "ambiguous option"),
    (["--model-path", "x", "--enable-spec-v2"], "unrecognized arguments"),
    (["--model-path", "x", "--mamba-scheduler-strategy", "x"], "unrecognized arguments"),
    (["--model-path", "x", "--disable-piecewise-cuda-graph"], "unrecognized arguments"),
    (["--model-path", "x", "--cuda-graph-backend-decode", "nope"], "invalid choice"),
    (["--model-path", "x", "--tp-size", "two"], "invalid int value"),
    (["--model-path", "x", "--mem-fraction-static", "lots"], "invalid float value"),
])
def test_rejected_like_the_real_parser(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_unambiguous_abbreviation_is_accepted():
    a = cli.parse_args(["--model-path", "x", "--cuda-graph-max-bs-dec", "16"])
    assert a.cuda_graph_max_bs_decode == 16


def test_action_count_matches_json():
    doc = json.loads(PKG_JSON.read_text())
    assert len(cli.build_parser()._actions) == len(doc["actions"]) == 532


def test_package_json_is_the_shared_copy():
    if not SHARED_JSON.exists():
        pytest.skip("shared data not present")
    assert json.loads(PKG_JSON.read_text()) == json.loads(SHARED_JSON.read_text())


def test_every_flag_of_the_json_is_in_the_parser():
    doc = json.loads(PKG_JSON.read_text())
    known = set(cli.build_parser()._option_string_actions)
    missing = [f for a in doc["actions"] for f in a["flags"] if f not in known]
    assert missing == []


def test_nargs_kinds():
    a = cli.parse_args(["--model-path", "x", "--cuda-graph-bs-decode", "1", "2", "4",
                        "--uvicorn-access-log-exclude-prefixes",
                        "--model-checksum",
                        "--no-enable-tf32-matmul",
                        "--lora-paths", "a=/p", '{"lora_name": "b", "lora_path": "/q"}',
                        "--log-requests-level", "3"])
    assert a.cuda_graph_bs_decode == [1, 2, 4]
    assert a.uvicorn_access_log_exclude_prefixes == []
    assert a.model_checksum is None
    assert a.enable_tf32_matmul is False
    assert a.lora_paths == ["a=/p", {"lora_name": "b", "lora_path": "/q"}]
    assert a.log_requests_level == 3


def test_deprecated_flags_still_parse(capsys):
    a = cli.parse_args(["--model-path", "x", "--disable-cuda-graph"])
    assert a.disable_cuda_graph is True
    assert "deprecated" in capsys.readouterr().err


def test_fork_flag_only_when_source_has_it():
    with pytest.raises(SystemExit):
        cli.parse_args(["--model-path", "x", cli.DDTREE_FORK_FLAG])
    a = cli.parse_args(["--model-path", "x", cli.DDTREE_FORK_FLAG], extra_flags=[cli.DDTREE_FORK_FLAG])
    assert a.speculative_dflash_enable_ddtree is True


def test_budget_flag_only_when_source_defines_the_field(capsys):
    """--speculative-ddtree-budget exists only in a source that defines speculative_ddtree_budget
    (patch 0004): without it the parser refuses it like any unknown flag (exit 2)."""
    argv = ["--model-path", "x", "--speculative-algorithm", "DDTREE", cli.DDTREE_BUDGET_FLAG, "24"]
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert f"unrecognized arguments: {cli.DDTREE_BUDGET_FLAG} 24" in capsys.readouterr().err
    a = cli.parse_args(argv, extra_flags=[cli.DDTREE_BUDGET_FLAG])
    assert a.speculative_ddtree_budget == 24
    assert cli.parse_args(["--model-path", "x"], extra_flags=[cli.DDTREE_BUDGET_FLAG]).speculative_ddtree_budget is None
    # Optional[int]: a non-integer is argparse's own error; an out-of-range int is the server's (physics).
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--model-path", "x", cli.DDTREE_BUDGET_FLAG, "many"], extra_flags=[cli.DDTREE_BUDGET_FLAG])
    assert exc.value.code == 2 and "invalid int value: 'many'" in capsys.readouterr().err
    assert cli.parse_args(["--model-path", "x", cli.DDTREE_BUDGET_FLAG, "-3"],
                          extra_flags=[cli.DDTREE_BUDGET_FLAG]).speculative_ddtree_budget == -3
    both = cli.parse_args(["--model-path", "x", cli.DDTREE_FORK_FLAG, cli.DDTREE_BUDGET_FLAG, "8"],
                          extra_flags=[cli.DDTREE_FORK_FLAG, cli.DDTREE_BUDGET_FLAG])
    assert both.speculative_dflash_enable_ddtree is True and both.speculative_ddtree_budget == 8


def test_page_size_is_an_int_like_the_real_field():
    assert cli.parse_args(["--model-path", "x", "--page-size", "16"]).page_size == 16


# --config FILE: merged like 0.5.23's ConfigArgumentMerger (config first, the command line wins).
def test_config_file_options_are_merged_and_the_command_line_wins(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text('---\n# comment\napi-key: "s3cret"\ntp-size: 2\nenable-metrics: true\n'
                 "trust-remote-code: false\nhost: '0.0.0.0'\n")
    a = cli.parse_args(["--model-path", "x", "--config", str(f), "--tp-size", "4"])
    assert a.api_key == "s3cret" and a.tp_size == 4 and a.enable_metrics is True
    assert a.trust_remote_code is False and a.host == "0.0.0.0"


def test_config_keys_spelled_with_underscores_are_unrecognized_like_the_real_merger(tmp_path, capsys):
    """0.5.23 turns each key into --<key> as written: `api_key:` becomes --api_key, which no flag is."""
    f = tmp_path / "c.yaml"
    f.write_text('api_key: "s3cret"\n')
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--model-path", "x", "--config", str(f)])
    assert exc.value.code == 2 and "unrecognized arguments: --api_key s3cret" in capsys.readouterr().err


@pytest.mark.parametrize("name, text, message", [
    ("c.json", "{}", "Config file must be YAML format, got: .json"),
    ("missing.yaml", None, "Config file not found"),
    ("list.yaml", "- a\n- b\n", "dictionary at root level"),
    ("bad.yaml", 'api_key: "unterminated\n', "bad quoted string"),
])
def test_config_file_errors_like_the_real_merger(tmp_path, name, text, message):
    f = tmp_path / name
    if text is not None:
        f.write_text(text)
    with pytest.raises(ValueError, match=message):
        cli.parse_args(["--model-path", "x", "--config", str(f)])


def test_one_config_file_only(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("tp_size: 2\n")
    with pytest.raises(ValueError, match="Multiple config files"):
        cli.parse_args(["--config", str(f), "--model-path", "x", "--config", str(f)])
    with pytest.raises(ValueError, match="No config file specified"):
        cli.parse_args(["--model-path", "x", "--config"])
