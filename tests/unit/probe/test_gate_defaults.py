"""One behaviour everywhere: `ddtree-probe probe` judges with the quality gate's defaults, which
only role quality_gate's argument spec holds (the CLI reads them from it)."""

from pathlib import Path

import pytest
import yaml

from ansible_collections.ddtree.fleet.plugins.module_utils.probe import agreement as ag
from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as dp
from ansible_collections.ddtree.fleet.plugins.plugin_utils.cli import probe as cli
from probe_testlib import REPO as _REPO

REPO = Path(_REPO)
GATE_SPEC = REPO / "roles" / "quality_gate" / "meta" / "argument_specs.yml"
# CLI flag destination -> the gate's option it must take its default from.
FLAG_OF = {
    "min_tokens_per_s": "quality_gate_min_tokens_per_s",
    "stall_timeout": "quality_gate_stall_timeout",
    "ttft_timeout": "quality_gate_ttft_timeout",
    "rate_window": "quality_gate_rate_window_s",
    "min_speed_ratio": "quality_gate_min_speed_ratio",
    "agreement": "quality_gate_agreement",
    "agreement_tokens": "quality_gate_agreement_tokens",
    "near_tie_margin": "quality_gate_near_tie_margin",
    "max_late_divergences": "quality_gate_max_late_divergences",
}


def test_the_cli_reads_the_gate_spec_it_ships_with():
    assert cli.GATE_SPEC == GATE_SPEC.resolve()


def test_every_cli_floor_is_the_gates_default():
    options = yaml.safe_load(GATE_SPEC.read_text())["argument_specs"]["main"]["options"]
    args = cli.build_parser().parse_args(["probe", "--url", "http://127.0.0.1:1"])
    for dest, option in FLAG_OF.items():
        assert getattr(args, dest) == options[option]["default"], dest


def test_a_changed_gate_spec_changes_the_cli(tmp_path):
    """No copy: edit the spec and the CLI's default moves with it."""
    data = yaml.safe_load(GATE_SPEC.read_text())
    data["argument_specs"]["main"]["options"]["quality_gate_ttft_timeout"]["default"] = 12.5
    spec = tmp_path / "argument_specs.yml"
    spec.write_text(yaml.safe_dump(data))
    assert cli.gate_defaults(spec)["ttft_timeout"] == 12.5


@pytest.mark.parametrize("option, constant", [
    ("min_tokens_per_s", dp.DEFAULT_MIN_TOKENS_PER_S), ("stall_timeout", dp.DEFAULT_STALL_TIMEOUT),
    ("ttft_timeout", dp.DEFAULT_TTFT_TIMEOUT), ("rate_window_s", dp.DEFAULT_RATE_WINDOW_S),
    ("agreement", ag.DEFAULT_MODE), ("agreement_tokens", ag.DEFAULT_TOKENS),
    ("near_tie_margin", ag.DEFAULT_NEAR_TIE_MARGIN), ("max_late_divergences", ag.DEFAULT_MAX_LATE),
    ("top_logprobs", dp.DEFAULT_TOP_LOGPROBS),
])
def test_the_modules_documented_defaults_are_its_code(option, constant):
    """sglang_probe alone (ansible-doc) defaults to what run_probe does when an option is absent."""
    doc = yaml.safe_load((REPO / "plugins" / "modules" / "sglang_probe.py").read_text()
                         .split('DOCUMENTATION = r"""')[1].split('"""')[0])["options"]
    assert doc[option]["default"] == constant
