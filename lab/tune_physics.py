"""The lab physics as tune's objective, without servers.

What a tune trial on a lab host would measure, computed from the stand-in's own start-up rules
and rates (lab/standin/src/sglang_lab_standin/physics.py: ``decide``, ``per_stream_rate``,
``batch_factor``): a configuration that the stand-in would refuse or crash on is a failed trial
(stage ``start``), DDTREE on sm86 (its "!!!!" text) fails the quality gate (stage ``quality``),
and any other gives one level per concurrency as the speed gate's load runner reports it: rounds of
throughput, inter-token latency and time-to-first-token percentiles. Each round is multiplied by a log-normal factor with the stand-in's default rate jitter,
seeded by the trial, so a measurement is noisy but repeatable.

Used by tests/bench/tune_search.py (the search against the exhaustive grid) and the unit tests of
plugins/module_utils/tune.py. Not a claim about real GPUs: docs/lab-physics.md lists these curves
as simulated.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from sglang_lab_standin import cli, physics
from sglang_lab_standin.physics import Gpu, SourceState

# The patched venv the fleet installs: DDTREE registered, DFLASH-family, the budget flag known.
PATCHED = SourceState(found=True, path="/opt/sglang/venv/lib/python3.11/site-packages/sglang", ddtree_known=True,
                      files_with_ddtree=physics.DDTREE_DFLASH_FILES, files_missing_ddtree=(),
                      ddtree_budget_known=True)


@dataclass(frozen=True)
class LabHost:
    name: str
    gpus: tuple
    tp_size: int
    attention_backend: str


HOSTS = {
    "sm120": LabHost("ct200", (Gpu("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0", 97887),) * 8, 1,
                     "triton"),
    "sm86": LabHost("ct129", (Gpu("NVIDIA RTX A6000", "8.6", 49140),) * 2, 2, "flashinfer"),
}
JITTER = 0.03          # the stand-in's DDTREE_LAB_RATE_JITTER default
PROMPT_TOKENS = 180    # the speed gate workload's mean prompt
ITL_P50_OVER_MEAN = 1.0
ITL_P99_OVER_MEAN = 1.3


def argv(config: dict, host: LabHost) -> list:
    """The SGLang command line the fleet's unit template renders for this configuration (the knobs
    tune moves, on the host's fixed settings)."""
    out = ["--model-path", "/srv/models/target", "--tp-size", str(host.tp_size),
           "--attention-backend", host.attention_backend,
           "--mem-fraction-static", str(config["mem_fraction_static"]),
           "--cuda-graph-max-bs-decode", str(config["cuda_graph_max_bs"]),
           "--speculative-algorithm", config["algorithm"]]
    if config["algorithm"] == "DDTREE":
        out += [cli.DDTREE_BUDGET_FLAG, str(config["ddtree_budget"])]
    if config["algorithm"] == "NEXTN":
        out += ["--speculative-num-steps", str(config["nextn_steps"]),
                "--speculative-eagle-topk", str(config["nextn_topk"]),
                "--speculative-num-draft-tokens", str(config["nextn_draft_tokens"])]
    return out


def behaviour(arch: str, config: dict) -> physics.Behaviour:
    """What the stand-in would do with this configuration on the architecture's lab host."""
    host = HOSTS[arch]
    return physics.decide(host.gpus, cli.parse_args(argv(config, host), extra_flags=[cli.DDTREE_BUDGET_FLAG]),
                          PATCHED)


def stream_rates(b: physics.Behaviour, concurrency) -> list:
    """(concurrency, requests running, one stream's tokens/s) per level, as the stand-in paces them."""
    out = []
    for c in concurrency:
        running = min(int(c), b.max_running_requests)
        out.append((int(c), running, physics.per_stream_rate(b.tokens_per_second, running)
                    * physics.batch_factor(b, running)))
    return out


def measure(arch: str, config: dict, fidelity: str, concurrency=(1, 4, 16), rounds: int = 3,
            seed: str = "") -> dict:
    """One trial's outcome: {status, stage, reason, levels: [{concurrency, rounds, itl_p50_ms, itl_p99_ms,
    ttft_p50_ms, ttft_p99_ms}]}."""
    b = behaviour(arch, config)
    if not b.serves:
        return {"status": "failed", "stage": "start", "reason": b.crash_lines[-1] if b.crash_lines else b.crash_phase,
                "levels": []}
    if b.text_mode != "correct" or b.first_request_crash:
        return {"status": "failed", "stage": "quality", "reason": "; ".join(b.notes) or "degenerate text",
                "levels": []}
    digest = hashlib.sha256(repr((arch, sorted(config.items()), fidelity, seed)).encode()).digest()
    noise = random.Random(int.from_bytes(digest[:8], "big"))
    ttft = 0.01 + PROMPT_TOKENS / physics.PREFILL_TOKENS_PER_S
    levels = []
    for c, running, stream in stream_rates(b, concurrency):
        levels.append({"concurrency": c,
                       "rounds": [round(running * stream * noise.lognormvariate(0.0, JITTER), 3)
                                  for _ in range(rounds)],
                       "itl_p50_ms": round(1000.0 / stream * ITL_P50_OVER_MEAN, 3),
                       "itl_p99_ms": round(1000.0 / stream * ITL_P99_OVER_MEAN, 3),
                       "ttft_p50_ms": round(ttft * 1000.0, 3), "ttft_p99_ms": round(ttft * 1000.0 * 1.5, 3)})
    return {"status": "ok", "stage": "", "reason": "", "levels": levels}


def true_score(arch: str, config: dict, bound_ms: float, concurrency=(1, 4, 16)):
    """The noiseless score (best throughput within a bound on the p99 inter-token latency), None
    when it fails."""
    b = behaviour(arch, config)
    if not b.serves or b.text_mode != "correct" or b.first_request_crash:
        return None
    return max([running * stream for _, running, stream in stream_rates(b, concurrency)
                if 1000.0 / stream * ITL_P99_OVER_MEAN <= bound_ms] or [0.0])
