"""The lab stand-in's start-up verdicts, checked against the real patched sglang 0.5.23 on CPU.

The stand-in decides, per command line, whether the server it imitates refuses to start while
parsing and resolving its arguments, and with which last traceback line. Here the same command
lines go through the real patched parser and resolution hooks (``prepare_server_args``, then
``publish``, which runs the hooks a server runs before it loads anything), and through the
stand-in with its source state read from that same patched copy (``inspect_source``). Both must
refuse the same lines with the same message and start the others.

Each case is the fleet's own DDTREE command line for the pinned target on sm120 (rendered by
plugins/module_utils/flags.py from group_vars/sm120.yml), changed in one way. Checks that need a
GPU's facts (an attention backend's architectures, memory) are not part of this comparison, nor
is DDTREE's page-size refusal: on CPU the hybrid target needs ``--mamba-radix-cache-strategy
no_buffer``, whose own check (page size 1) fires first; tests/integration/test_ddtree_worker_patch.py
compares that message with the patched source word for word.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import yaml

from ansible_collections.ddtree.fleet.plugins.module_utils import flags
from sglang.srt import runtime_context
from sglang.srt.server_args import prepare_server_args

from realkit import CPU_ONLY, DRAFT, TARGET
from sglang_lab_standin import cli, physics  # on sys.path by conftest.py

REPO = Path(__file__).resolve().parents[2]
PRO = [physics.Gpu("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0", 97887)] * 8



def fleet_argv(mirror, algorithm="DDTREE", budget=None, extra=()):
    """flags.sglang_argv for the sm120 group's settings, as the sglang role passes them."""
    group = {**yaml.safe_load((REPO / "playbooks/group_vars/all.yml").read_text()),
             **yaml.safe_load((REPO / "playbooks/group_vars/sm120.yml").read_text())}
    return flags.sglang_argv({
        "model_path": str(mirror[TARGET]), "algorithm": algorithm, "draft_path": str(mirror[DRAFT]),
        "tp_size": group["sglang_tp_size"], "mem_fraction_static": group["sglang_mem_fraction_static"],
        "attention_backend": group["sglang_attention_backend"],
        "cuda_graph_backend": group["sglang_cuda_graph_backend"], "cuda_graph_max_bs": group["sglang_cuda_graph_max_bs"],
        "speculative": group["sglang_speculative_params"].get(algorithm, {}),
        "ddtree_budget": group["sglang_ddtree_budget"] if budget is None else budget,
        "extra_args": [*CPU_ONLY, *extra]})


def real_verdict(argv):
    """None when the real server gets past argument resolution, else its last traceback line."""
    try:
        runtime_context.publish(prepare_server_args(list(argv)), role="scheduler")
    except SystemExit as exc:
        return "exit %s" % exc.code
    except Exception as exc:  # noqa: BLE001 - any refusal, compared by its printed line
        return traceback.format_exception_only(exc)[-1].strip()
    return None


@pytest.fixture(scope="module")
def source():
    """The stand-in's reading of the patched copy every test here imports."""
    import sglang

    state = physics.inspect_source(Path(sglang.__file__).parent)
    assert state.ddtree_known and state.ddtree_budget_known and not state.files_missing_ddtree
    return state


def standin_verdict(argv, source):
    try:
        args = cli.parse_args(list(argv), extra_flags=cli.source_flags(source))
    except SystemExit as exc:
        return "exit %s" % exc.code
    behaviour = physics.decide(PRO, args, source)
    return behaviour.crash_lines[-1] if behaviour.crash_phase == "args" else None


CASES = {
    "the fleet's line": dict(),
    "budget 1": dict(budget=1),
    "budget 1023": dict(budget=1023),
    "budget 1024": dict(extra=["--speculative-ddtree-budget", "1024"], budget=0),
    "rejection sampling": dict(extra=["--speculative-use-rejection-sampling"]),
    "ReplaySSM verify ring": dict(extra=["--enable-linear-replayssm-spec"]),
    "DFLASH with a budget (a warning only)": dict(algorithm="DFLASH", extra=["--speculative-ddtree-budget", "8"]),
    "NEXTN": dict(algorithm="NEXTN"),
    "an unknown flag": dict(extra=["--speculative-ddtree-budgett", "8"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_stand_in_refuses_what_the_real_server_refuses(mirror, source, case):
    argv = fleet_argv(mirror, **CASES[case])
    real, standin = real_verdict(argv), standin_verdict(argv, source)
    assert standin == real, (case, argv)


def test_the_cases_cover_starts_and_refusals(mirror, source):
    """The comparison above can fail both ways: some lines start, some are refused."""
    verdicts = {case: real_verdict(fleet_argv(mirror, **kw)) for case, kw in CASES.items()}
    assert verdicts["the fleet's line"] is None and verdicts["NEXTN"] is None
    assert verdicts["rejection sampling"].startswith("ValueError: DDTREE does not support")
    assert verdicts["an unknown flag"] == "exit 2"
