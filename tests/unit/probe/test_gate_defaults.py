"""One behaviour everywhere: `ddtree-probe probe` judges with the quality gate's defaults."""

from pathlib import Path

import yaml

from ansible_collections.ddtree.fleet.plugins.module_utils.probe import agreement as ag
from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as dp
from probe_testlib import REPO as _REPO

REPO = Path(_REPO)


def _gate_defaults():
    return yaml.safe_load((REPO / "roles" / "quality_gate" / "defaults" / "main.yml").read_text())


def test_cli_floors_are_the_gates():
    gate = _gate_defaults()
    for key, value in dp.GATE_DEFAULTS.items():
        assert gate["quality_gate_" + key] == value, key


def test_agreement_rule_is_the_gates_and_the_modules():
    gate = _gate_defaults()
    rule = ag.default_rule()
    assert gate["quality_gate_agreement"] == rule["mode"]
    assert gate["quality_gate_agreement_tokens"] == rule["tokens"]
    assert gate["quality_gate_near_tie_margin"] == rule["near_tie_margin"]
    assert gate["quality_gate_max_late_divergences"] == rule["max_late"]
    doc = yaml.safe_load((REPO / "plugins" / "modules" / "sglang_probe.py").read_text()
                         .split('DOCUMENTATION = r"""')[1].split('"""')[0])["options"]
    assert doc["agreement"]["default"] == rule["mode"]
    assert doc["agreement_tokens"]["default"] == rule["tokens"]
    assert doc["near_tie_margin"]["default"] == rule["near_tie_margin"]
    assert doc["max_late_divergences"]["default"] == rule["max_late"]
    assert doc["top_logprobs"]["default"] == dp.DEFAULT_TOP_LOGPROBS
