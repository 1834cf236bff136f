"""Lab physics: what a real SGLang 0.5.23 server would do on this host with these flags.

One table, documented row by row in docs/lab-physics.md.  Everything here is a pure function
of three inputs, except the two small probes at the bottom that gather the inputs:

1. the host GPUs (``nvidia-smi --query-gpu=name,compute_cap,memory.total
   --format=csv,noheader,nounits``; env ``DDTREE_LAB_NVIDIA_SMI`` overrides the executable);
2. the parsed flags (an argparse Namespace or a plain mapping of dest -> value);
3. the installed sglang *source* state (never imported: torch is absent).

``decide(gpus, args, source)`` returns a ``Behaviour``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

GIB = 1024 ** 3

# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------

# The lab model: a 27B dense bf16 target (Qwen-style, hidden 5120).
MODEL = {
    "name": "lab-27b-bf16",
    "architecture": "Qwen3ForCausalLM",
    "model_type": "qwen3",
    "weights_gib": 54.0,            # 27e9 params x 2 bytes
    "hidden_size": 5120,
    "kv_bytes_per_token": 262144,   # 64 layers x 4 kv heads x 256 head dim x 2 (K,V) x 2 bytes
    "context_length": 262144,
    "eos_token_id": 151645,
    "vocab_size": 151936,
}

# The DFLASH draft used with DDTREE: captures 5 target layers -> 5 x 5120 features.
DFLASH_DRAFT = {"target_layer_ids": (1, 16, 31, 46, 61)}

# Memory rules.
RESERVE_BASE_GIB = 3.0             # non-static memory needed at minimum (activations, NCCL, ...)
RESERVE_PER_GRAPH_BS_GIB = 0.02    # extra per decode CUDA-graph batch size when graphs are on
AUTO_MEM_FRACTION = ((48 * 1024, 0.85), (None, 0.90))   # (max MiB inclusive, fraction)
AUTO_CUDA_GRAPH_MAX_BS = ((48 * 1024, 32), (None, 64))  # (max MiB inclusive, bs)
DEFAULT_MAX_RUNNING_REQUESTS = 64
DFLASH_MAX_RUNNING_REQUESTS = 48   # real 0.5.23: DFLASH sets 48 when unset

# Decode rates of ONE request stream in tokens/s at tp=1 with decode CUDA graphs on.
# Columns: NONE (no speculation), EAGLE (EAGLE/EAGLE3/NEXTN/FROZEN_KV_MTP), STANDALONE,
# NGRAM, DFLASH (also DSPARK, UNO).  DDTREE = DDTREE_SPEEDUP x DFLASH.
BASE_RATES = {
    "sm80": {"NONE": 26.0, "EAGLE": 44.0, "STANDALONE": 38.0, "NGRAM": 32.0, "DFLASH": 53.0},
    "sm86": {"NONE": 24.0, "EAGLE": 40.0, "STANDALONE": 34.0, "NGRAM": 30.0, "DFLASH": 48.0},
    "sm89": {"NONE": 28.0, "EAGLE": 46.0, "STANDALONE": 40.0, "NGRAM": 34.0, "DFLASH": 56.0},
    "sm90": {"NONE": 52.0, "EAGLE": 110.0, "STANDALONE": 92.0, "NGRAM": 66.0, "DFLASH": 138.0},
    "sm100": {"NONE": 60.0, "EAGLE": 128.0, "STANDALONE": 106.0, "NGRAM": 76.0, "DFLASH": 160.0},
    "sm120": {"NONE": 46.0, "EAGLE": 96.0, "STANDALONE": 80.0, "NGRAM": 58.0, "DFLASH": 120.0},
}
FALLBACK_ARCH = "sm86"
DDTREE_SPEEDUP = 1.24
CUDA_GRAPH_OFF_FACTOR = 0.7        # decode CUDA graphs disabled
TP_GAIN_PER_DOUBLING = 0.08        # rate x (1 + 0.08 * log2(tp))
BATCH_PENALTY_PER_EXTRA_REQ = 0.04  # per-stream rate / (1 + 0.04 * (running - 1))
PREFILL_TOKENS_PER_S = 8000.0      # time to first token = 0.01 s + prompt / this (x scale)

# Speculative acceptance per family: (accept length, accept rate).
ACCEPT = {
    "NONE": (None, None),
    "EAGLE": (3.1, 0.70),
    "STANDALONE": (2.6, 0.53),
    "NGRAM": (1.8, 0.27),
    "DFLASH": (4.2, 0.21),
    "DDTREE": (5.2, 0.27),
}

# Tuning curves (issue 29; docs/lab-physics.md, "Tuning curves"). Each family's rate and accept
# length above hold at its reference parameters; these move them off those. Acceptance grows and
# saturates with the draft's reach; every draft step and every verified token adds to the step
# time, the more so on smaller GPUs and, for the tree, in bigger batches. So each knob has an
# interior optimum, and it differs per architecture. Simulated: the shape is the one DDTree's paper
# and SGLang's bench_speculative report, the constants are the lab's.
DDTREE_REFERENCE_BUDGET = 32          # 0003's DEFAULT_BUDGET, the budget of the 1.24 x DFLASH figure
DDTREE_ACCEPT_MAX = 6.0               # accept length as the budget grows without bound
DDTREE_ACCEPT_SCALE = 17.46           # budget scale of the saturation: accept(32) = 5.2 = ACCEPT["DDTREE"]
DDTREE_NODE_COST = {"sm80": 0.009, "sm86": 0.012, "sm89": 0.010, "sm90": 0.004, "sm100": 0.003, "sm120": 0.005}
DDTREE_NODE_COST_PER_EXTRA_REQ = 0.15  # a tree node's verify cost x (1 + 0.15 (running - 1))
EAGLE_REFERENCE = (3, 1, 4)           # (num_steps, eagle_topk, num_draft_tokens) of the EAGLE rate
EAGLE_TOKEN_ACCEPT = 0.832            # a draft token's acceptance at topk 1: accept(3, 1, 4) = 3.10
EAGLE_DRAFT_STEP_COST = 0.12          # step time per draft step, relative to one target step
EAGLE_DRAFT_TOPK_COST = 0.3           # each draft step costs x (1 + 0.3 (topk - 1)): topk branches
EAGLE_TOPK_GAIN = 0.35                # a step's rejection chance / topk ** 0.35
EAGLE_VERIFY_TOKEN_COST = {"sm80": 0.02, "sm86": 0.025, "sm89": 0.02, "sm90": 0.008, "sm100": 0.006, "sm120": 0.01}

# DDTREE with DFLASH-family support on sm86: every verify step yields NaN logits -> token 0 "!".
BANG_ARCHES = ("sm86",)
BANG_RATE = 0.057                  # tokens/s on average (the incident's 8 tokens in 141 s)
BANG_BURST = 4                     # "!" tokens per verify step: a burst right after prefill, then ~70 s per step
BANG_ACCEPT = (1.0, 0.02)

# Algorithms the unpatched 0.5.23 source knows (SpeculativeAlgorithm members + alias NEXTN).
BUILTIN_ALGORITHMS = {
    "EAGLE": "EAGLE", "EAGLE3": "EAGLE", "NEXTN": "EAGLE", "FROZEN_KV_MTP": "EAGLE",
    "STANDALONE": "STANDALONE", "NGRAM": "NGRAM",
    "DFLASH": "DFLASH", "DSPARK": "DFLASH", "UNO": "DFLASH",
}
ALGORITHM_ALIASES = {"NEXTN": "EAGLE"}

# Files (under sglang/srt) that must all mention DDTREE for DDTREE to be treated as DFLASH.
DDTREE_DFLASH_FILES = (
    "speculative/spec_info.py",
    "speculative/spec_utils.py",
    "arg_groups/validation_hook.py",
    "arg_groups/kv_cache_hook.py",
    "arg_groups/speculative_hook.py",
    "arg_groups/lora_hook.py",
    "mem_cache/kv_cache_configurator.py",
)
SPEC_INFO_FILE = "speculative/spec_info.py"
DDTREE_FLAG_FILE = "arg_groups/fields/spec.py"
DDTREE_FLAG_MARKER = "speculative_dflash_enable_ddtree"
# The DDTree worker's node budget field (patch 0004 of the fleet's series, or a fork that has it):
# when the same file defines it, the parser accepts --speculative-ddtree-budget and DDTREE's
# start-up checks (_handle_ddtree, run inside _handle_dflash) apply.
DDTREE_BUDGET_MARKER = "speculative_ddtree_budget"
DDTREE_MAX_BUDGET = 1023
# 0004's messages, verbatim. The budget's comes from 0003's validate_budget, a DDTreeError (a
# ValueError subclass defined in sglang/srt/speculative/ddtree_tree.py): the traceback names it so.
DDTREE_BUDGET_ERROR = ("sglang.srt.speculative.ddtree_tree.DDTreeError: --speculative-ddtree-budget must be "
                       "between 1 and {max} (draft nodes per tree, root excluded; the verify width is budget + 1), "
                       "got {budget}")
DDTREE_PAGE_SIZE_ERROR = ("ValueError: DDTREE requires --page-size 1 (the accepted tree path is compacted token "
                          "by token), got {page_size}.")
DDTREE_REJECTION_ERROR = ("ValueError: DDTREE does not support --speculative-use-rejection-sampling: the tree is "
                          "built from the draft's top-k log-probabilities, so there is no draft distribution per "
                          "verify node.")
DDTREE_REPLAYSSM_ERROR = ("ValueError: DDTREE does not support --enable-linear-replayssm-spec: its verify ring "
                          "replays a linear draft chain, not a tree.")
# 0004's worker start-up check (DDTreeWorkerV2._check_ddtree_support), after the target is up. It names
# the class of the (full-attention) backend --attention-backend creates; the tree mask needs these two.
DDTREE_BACKEND_ERROR = ("ValueError: DDTREE cannot run with target attention backend {cls} (needs "
                        "--attention-backend flashinfer or triton).")
DDTREE_TREE_MASK_CLASSES = ("FlashInferAttnBackend", "TritonAttnBackend")
# --attention-backend -> the class 0.5.23's attention_registry creates for a non-MLA target.
ATTENTION_BACKEND_CLASSES = {
    "flashinfer": "FlashInferAttnBackend", "triton": "TritonAttnBackend", "fa3": "FlashAttentionBackend",
    "fa4": "FlashAttentionBackend", "trtllm_mha": "TRTLLMHAAttnBackend", "torch_native": "TorchNativeAttnBackend",
    "flex_attention": "TorchFlexAttnBackend",
}
# Logged by handle_speculative_decoding for any other (resolved) algorithm: NEXTN shows as EAGLE.
DDTREE_BUDGET_IGNORED_WARNING = ("--speculative-ddtree-budget has no effect with speculative_algorithm={algorithm} "
                                 "(honored by DDTREE only).")

# Attention backends per architecture (others are not checked).
ATTENTION_ARCHES = {
    "fa3": ("sm80", "sm86", "sm89", "sm90"),
    "trtllm_mha": ("sm90", "sm100", "sm120"),
}

# models/dflash.py project_target_hidden (0.5.23), raised on the first generation: the warm-up.
DIM_MISMATCH_MESSAGE = (
    "DFLASH target_hidden feature dim mismatch. Expected shape [N, {expected}] "
    "(num_context_features={layers}, hidden_size={hidden}), but got shape=({tokens}, {got}). "
    "This usually means the target model is capturing a different number of layer features than "
    "the draft checkpoint/config expects."
)
WARMUP_PROMPT_TOKENS = 6            # "The capital city of France is": the prefill the warm-up sends


# --------------------------------------------------------------------------------------------
# Data types
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str
    memory_mib: int

    @property
    def arch(self) -> str:
        major, _, minor = self.compute_cap.strip().partition(".")
        return f"sm{int(major)}{int(minor or 0)}"

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024.0


@dataclass(frozen=True)
class SourceState:
    """What the installed sglang source tree knows about DDTREE (files only, never imported)."""

    found: bool = True
    path: Optional[str] = None
    ddtree_known: bool = False
    files_with_ddtree: tuple = ()
    files_missing_ddtree: tuple = DDTREE_DFLASH_FILES
    ddtree_flag_known: bool = False
    ddtree_budget_known: bool = False

    @property
    def ddtree_dflash_family(self) -> bool:
        return self.ddtree_known and not self.files_missing_ddtree


@dataclass(frozen=True)
class Behaviour:
    outcome: str                          # "serve" or "crash"
    crash_phase: Optional[str] = None     # "args" | "spawn" | "load_weights" | "memory_pool" | "cuda_graph" | "spec_worker"
    crash_lines: tuple = ()               # traceback lines printed on crash (last one = the error)
    exit_code: int = 0
    algorithm: Optional[str] = None       # as given (upper case), e.g. "NEXTN", "DDTREE"
    family: str = "NONE"                  # rate/accept column: NONE, EAGLE, ..., DFLASH, DDTREE
    arch: str = FALLBACK_ARCH
    gpu_name: str = ""
    gpu_count: int = 0
    tp_size: int = 1
    gpu_memory_gib: float = 0.0
    mem_fraction_static: float = 0.0
    cuda_graph_decode: bool = True
    cuda_graph_max_bs_decode: int = 0
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS
    weights_per_gpu_gib: float = 0.0
    kv_cache_gib: float = 0.0
    token_capacity: int = 0
    graph_mem_gib: float = 0.0
    text_mode: str = "correct"            # "correct" | "bang"
    tokens_per_second: float = 0.0        # one stream, before DDTREE_LAB_RATE_SCALE
    accept_length: Optional[float] = None
    accept_rate: Optional[float] = None
    first_request_crash: Optional[str] = None   # error line that kills the process on its first
                                                # generation (the warm-up, unless it is skipped)
    warnings: tuple = ()                  # server-args WARNING lines (logger of speculative_hook)
    ddtree_budget: Optional[int] = None   # --speculative-ddtree-budget as given (None: unset)
    notes: tuple = field(default_factory=tuple)

    @property
    def serves(self) -> bool:
        return self.outcome == "serve"


# --------------------------------------------------------------------------------------------
# Pure rules
# --------------------------------------------------------------------------------------------

def _get(args: Any, name: str, default: Any = None) -> Any:
    if isinstance(args, Mapping):
        value = args.get(name, default)
    else:
        value = getattr(args, name, default)
    return default if value is None else value


def _by_memory(table, memory_mib: float):
    for limit, value in table:
        if limit is None or memory_mib <= limit:
            return value
    raise AssertionError("table must end with a None row")


def auto_mem_fraction_static(memory_mib: float) -> float:
    return _by_memory(AUTO_MEM_FRACTION, memory_mib)


def tp_factor(tp_size: int) -> float:
    return 1.0 + TP_GAIN_PER_DOUBLING * math.log2(max(1, tp_size))


def per_stream_rate(rate: float, running: int) -> float:
    """Rate of one stream while ``running`` requests decode together (mild batching penalty)."""
    return rate / (1.0 + BATCH_PENALTY_PER_EXTRA_REQ * max(0, running - 1))


def ddtree_accept_length(budget: int) -> float:
    """DDTREE's accept length with a tree of ``budget`` nodes besides the root."""
    return 1.0 + (DDTREE_ACCEPT_MAX - 1.0) * (1.0 - math.exp(-max(1, budget) / DDTREE_ACCEPT_SCALE))


def ddtree_budget_factor(budget: int, arch: str, running: int = 1) -> float:
    """DDTREE's rate at ``budget`` relative to its rate at the reference budget, with ``running``
    requests in the batch: accept length over step time, each relative to the reference's."""
    node = DDTREE_NODE_COST.get(arch, DDTREE_NODE_COST[FALLBACK_ARCH]) \
        * (1.0 + DDTREE_NODE_COST_PER_EXTRA_REQ * max(0, running - 1))

    def speed(b: int) -> float:
        return ddtree_accept_length(b) / (1.0 + node * (max(1, b) + 1))
    return speed(budget) / speed(DDTREE_REFERENCE_BUDGET)


def eagle_accept_length(steps: int, topk: int, draft_tokens: int) -> float:
    """EAGLE/NEXTN's accept length: a chain of ``steps`` draft tokens (at most draft_tokens - 1
    verified), each accepted with EAGLE_TOKEN_ACCEPT at topk 1; more candidates per step (topk)
    raise each step's acceptance, with diminishing returns."""
    p = 1.0 - (1.0 - EAGLE_TOKEN_ACCEPT) / max(1, topk) ** EAGLE_TOPK_GAIN
    depth = max(0, min(steps, draft_tokens - 1))
    return 1.0 + sum(p ** i for i in range(1, depth + 1))


def eagle_params(args: Any) -> tuple:
    """(num_steps, eagle_topk, num_draft_tokens) as 0.5.23 resolves them for the EAGLE family:
    unset ones at EAGLE_REFERENCE, and with topk 1 the draft tokens are num_steps + 1
    (speculative_hook: "adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1")."""
    steps = _get(args, "speculative_num_steps")
    topk = _get(args, "speculative_eagle_topk")
    draft = _get(args, "speculative_num_draft_tokens")
    steps = int(steps) if steps is not None else EAGLE_REFERENCE[0]
    topk = int(topk) if topk is not None else EAGLE_REFERENCE[1]
    draft = int(draft) if draft is not None else EAGLE_REFERENCE[2]
    return steps, topk, (steps + 1 if topk == 1 else draft)


def eagle_params_factor(steps: int, topk: int, draft_tokens: int, arch: str) -> float:
    """EAGLE/NEXTN's rate at these parameters relative to its rate at EAGLE_REFERENCE."""
    verify = EAGLE_VERIFY_TOKEN_COST.get(arch, EAGLE_VERIFY_TOKEN_COST[FALLBACK_ARCH])

    def speed(s: int, k: int, d: int) -> float:
        draft_step = EAGLE_DRAFT_STEP_COST * (1.0 + EAGLE_DRAFT_TOPK_COST * (max(1, k) - 1))
        return eagle_accept_length(s, k, d) / (1.0 + draft_step * s + verify * d)
    return speed(steps, topk, draft_tokens) / speed(*EAGLE_REFERENCE)


def batch_factor(b: "Behaviour", running: int) -> float:
    """What a batch of ``running`` requests does to one stream's rate beyond per_stream_rate: a
    batch larger than the biggest captured decode graph runs eagerly, and a DDTree verify grows
    with the batch (relative to the reference budget's, whose batch cost the base rate holds)."""
    factor = 1.0
    if b.cuda_graph_decode and b.cuda_graph_max_bs_decode and running > b.cuda_graph_max_bs_decode:
        factor *= CUDA_GRAPH_OFF_FACTOR
    if b.family == "DDTREE" and b.text_mode == "correct" and running > 1:
        budget = b.ddtree_budget or DDTREE_REFERENCE_BUDGET
        factor *= ddtree_budget_factor(budget, b.arch, running) / ddtree_budget_factor(budget, b.arch, 1)
    return factor


def decode_cuda_graph_enabled(args: Any) -> bool:
    if _get(args, "cuda_graph_backend_decode") == "disabled":
        return False
    return not (_get(args, "disable_cuda_graph", False) or _get(args, "disable_decode_cuda_graph", False))


def dim_mismatch_message(tokens: int = WARMUP_PROMPT_TOKENS) -> str:
    layers = len(DFLASH_DRAFT["target_layer_ids"])
    hidden = MODEL["hidden_size"]
    return DIM_MISMATCH_MESSAGE.format(got=hidden, expected=layers * hidden, layers=layers,
                                       hidden=hidden, tokens=tokens)


def _traceback(frames: Sequence[tuple], error: str) -> tuple:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines.append(f'  File "{path}", line {line}, in {func}')
        lines.append(f"    {code}")
    lines.append(error)
    return tuple(lines)


def _src(source: SourceState, rel: str) -> str:
    base = source.path or "/opt/sglang/venv/lib/python3.11/site-packages/sglang"
    return f"{base}/{rel}"


def _crash(phase: str, lines: tuple, **kw) -> Behaviour:
    return Behaviour(outcome="crash", crash_phase=phase, crash_lines=lines, exit_code=1, **kw)


def _oom_lines(source: SourceState, tried: float, total: float, free: float, where: tuple) -> tuple:
    return _traceback(
        [where],
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried:.2f} GiB. "
        f"GPU 0 has a total capacity of {total:.2f} GiB of which {free:.2f} GiB is free. "
        f"Of the allocated memory {total - free:.2f} GiB is allocated by PyTorch.",
    )


def decide(gpus: Sequence[Gpu], args: Any, source: SourceState) -> Behaviour:
    """The behaviour of a real server for these GPUs, flags and sglang source."""
    name = _get(args, "speculative_algorithm")
    algo = name.upper() if isinstance(name, str) else None
    if algo == "DFLASH" and _get(args, "speculative_dflash_enable_ddtree", False):
        algo = "DDTREE"   # fork style: DDTree tree verify inside DFLASH, all name checks pass
        fork_style = True
    else:
        fork_style = False

    # --- 1. server-args validation (before anything touches a GPU) --------------------------
    if not source.found:
        return _crash("args", _traceback(
            [("<frozen runpy>", 189, "_run_module_as_main", "mod_name, mod_spec, code = _get_module_details(mod_name, _Error)")],
            "ModuleNotFoundError: No module named 'sglang'"))
    if algo is None:
        family = "NONE"
    elif algo in BUILTIN_ALGORITHMS:
        family = BUILTIN_ALGORITHMS[algo]
    elif algo == "DDTREE" and (source.ddtree_known or fork_style):
        family = "DDTREE"
    else:
        return _crash("args", _traceback(
            [(_src(source, "srt/server_args.py"), 1071, "__post_init__", "self._handle_speculative_decoding()"),
             (_src(source, "srt/arg_groups/speculative_hook.py"), 88, "resolve_speculative",
              "algo = SpeculativeAlgorithm.from_string(cfg.speculative_algorithm)"),
             (_src(source, "srt/speculative/spec_info.py"), 65, "from_string",
              'raise ValueError(f"Unknown speculative algorithm name: {name}")')],
            f"ValueError: Unknown speculative algorithm name: {name}"), algorithm=algo)

    # 0004's checks: the warning in handle_speculative_decoding, _handle_ddtree inside _handle_dflash.
    budget = _get(args, "speculative_ddtree_budget")
    warnings = ()
    if family == "DDTREE" and source.ddtree_budget_known:
        page_size = _get(args, "page_size")
        hook = "srt/arg_groups/speculative_hook.py"
        frames = [(_src(source, "srt/server_args.py"), 277, "resolve_once", "run_resolution_pipeline(self)"),
                  (_src(source, hook), 295, "handle_speculative_decoding", "algo.handle_server_args(server_args)"),
                  (_src(source, "srt/speculative/spec_info.py"), 265, "handle_server_args",
                   "_handle_dflash(server_args)"),
                  (_src(source, hook), 342, "_handle_dflash", "_handle_ddtree(server_args)")]
        error = None
        if budget is not None and not 1 <= int(budget) <= DDTREE_MAX_BUDGET:
            error = DDTREE_BUDGET_ERROR.format(max=DDTREE_MAX_BUDGET, budget=budget)
            frames += [(_src(source, hook), 476, "_handle_ddtree", "validate_budget(budget)"),
                       (_src(source, "srt/speculative/ddtree_tree.py"), 315, "validate_budget",
                        "raise DDTreeError(")]
        elif int(page_size or 1) != 1:
            error = DDTREE_PAGE_SIZE_ERROR.format(page_size=page_size)
            frames.append((_src(source, hook), 485, "_handle_ddtree", "raise ValueError("))
        elif _get(args, "speculative_use_rejection_sampling", False):
            error = DDTREE_REJECTION_ERROR
            frames.append((_src(source, hook), 490, "_handle_ddtree", "raise ValueError("))
        elif _get(args, "enable_linear_replayssm_spec", False):
            error = DDTREE_REPLAYSSM_ERROR
            frames.append((_src(source, hook), 503, "_handle_ddtree", "raise ValueError("))
        if error:
            return _crash("args", _traceback(frames, error), algorithm=algo, family=family)
    elif budget is not None:
        warnings = (DDTREE_BUDGET_IGNORED_WARNING.format(algorithm=ALGORITHM_ALIASES.get(algo, algo)),)

    dflash_like = family in ("DFLASH", "DDTREE")
    ddtree_dflash = family == "DDTREE" and (fork_style or source.ddtree_dflash_family)

    if not gpus:
        return _crash("spawn", _traceback(
            [(_src(source, "srt/managers/scheduler.py"), 3301, "run_scheduler_process",
              "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, ...)")],
            "RuntimeError: No CUDA GPUs are available"), algorithm=algo, family=family, warnings=warnings,
            ddtree_budget=budget)
    arch = gpus[0].arch
    common = dict(algorithm=algo, family=family, arch=arch, gpu_name=gpus[0].name,
                  gpu_count=len(gpus), warnings=warnings, ddtree_budget=budget)

    for which in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        chosen = _get(args, which)
        allowed = ATTENTION_ARCHES.get(chosen) if chosen else None
        if allowed and arch not in allowed:
            if chosen == "trtllm_mha":
                msg = ("ValueError: TRTLLM MHA backend for decode is only supported on Hopper (SM90), "
                       "Blackwell (SM100) and (SM120) GPUs. Please use a different decode backend.")
            else:
                msg = (f"ValueError: FlashAttention v3 (fa3) backend is only supported on SM80-SM90 GPUs, "
                       f"got {arch} ({gpus[0].name}). Please use a different attention backend.")
            return _crash("args", _traceback(
                [(_src(source, "srt/arg_groups/attention_hook.py"), 222, "resolve_attention_backends",
                  "raise ValueError(")], msg), **common)

    # --- 2. scheduler processes, one per tp rank -------------------------------------------
    tp = int(_get(args, "tp_size", 1))
    common["tp_size"] = tp
    if tp > len(gpus):
        return _crash("spawn", _traceback(
            [(_src(source, "srt/managers/scheduler.py"), 3301, "run_scheduler_process",
              "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, ...)"),
             (_src(source, "srt/model_executor/model_runner.py"), 402, "init_torch_distributed",
              "torch.get_device_module(self.device).set_device(self.gpu_id)")],
            f"RuntimeError: CUDA error: invalid device ordinal (--tp-size {tp} needs {tp} GPUs, "
            f"this host has {len(gpus)})"), **common)

    # --- 3. memory ----------------------------------------------------------------------------
    mem_mib = min(g.memory_mib for g in gpus[:tp])
    total = mem_mib / 1024.0
    mfs = _get(args, "mem_fraction_static")
    mfs = float(mfs) if mfs is not None else auto_mem_fraction_static(mem_mib)
    graphs = decode_cuda_graph_enabled(args)
    mrr = _get(args, "max_running_requests")
    if mrr is None:
        mrr = DFLASH_MAX_RUNNING_REQUESTS if dflash_like else DEFAULT_MAX_RUNNING_REQUESTS
    mrr = int(mrr)
    max_bs = _get(args, "cuda_graph_max_bs_decode")
    max_bs = int(max_bs) if max_bs is not None else min(mrr, _by_memory(AUTO_CUDA_GRAPH_MAX_BS, mem_mib))
    weights = MODEL["weights_gib"] / tp
    static_budget = mfs * total
    reserve = (1.0 - mfs) * total
    graph_mem = RESERVE_PER_GRAPH_BS_GIB * max_bs if graphs else 0.0
    need_reserve = RESERVE_BASE_GIB + graph_mem
    common.update(gpu_memory_gib=round(total, 2), mem_fraction_static=mfs, cuda_graph_decode=graphs,
                  cuda_graph_max_bs_decode=max_bs, max_running_requests=mrr,
                  weights_per_gpu_gib=round(weights, 2))

    if weights > static_budget:
        return _crash("load_weights", _oom_lines(
            source, weights - static_budget + 0.01, total, reserve,
            (_src(source, "srt/model_loader/loader.py"), 694, "load_weights_and_postprocess",
             "model.load_weights(weights)")), **common)
    if reserve < need_reserve:
        phase = "cuda_graph" if graphs else "memory_pool"
        where = ((_src(source, "srt/model_executor/runner/decode_cuda_graph_runner.py"), 588, "capture",
                  "self.capture_one_batch_size(bs, forward)") if graphs else
                 (_src(source, "srt/mem_cache/kv_cache_configurator.py"), 471, "init_memory_pool",
                  "self.token_to_kv_pool = self._create_pool()"))
        return _crash(phase, _oom_lines(source, need_reserve - reserve + 0.5, total, reserve,
                                        where), **common)

    kv = static_budget - weights
    capacity = int(kv * GIB / (MODEL["kv_bytes_per_token"] / tp))
    common.update(kv_cache_gib=round(kv, 2), token_capacity=capacity,
                  graph_mem_gib=round(graph_mem, 2))

    # --- 3b. the speculative worker: 0004's DDTreeWorkerV2 checks the target it got ---------------
    # Only an explicit --attention-backend is modelled (the fleet always sets one; 0.5.23's automatic
    # choice is not). The pinned target is a Gated-DeltaNet hybrid, which 0004 takes: the check
    # names the hybrid backend's inner, full-attention backend.
    backend_cls = ATTENTION_BACKEND_CLASSES.get(_get(args, "attention_backend"))
    if (family == "DDTREE" and source.ddtree_budget_known and not fork_style and backend_cls is not None
            and backend_cls not in DDTREE_TREE_MASK_CLASSES):
        return _crash("spec_worker", _traceback(
            [(_src(source, "srt/managers/scheduler.py"), 1064, "maybe_init_draft_worker",
              "self.draft_worker = DraftWorkerClass(**draft_worker_kwargs)"),
             (_src(source, "srt/speculative/ddtree_worker_v2.py"), 144, "__init__", "self._check_ddtree_support()"),
             (_src(source, "srt/speculative/ddtree_worker_v2.py"), 195, "_check_ddtree_support",
              'raise ValueError("DDTREE cannot run with " + "; ".join(problems) + ".")')],
            DDTREE_BACKEND_ERROR.format(cls=backend_cls)), **common)

    # --- 4. decode behaviour --------------------------------------------------------------------
    rates = BASE_RATES.get(arch, BASE_RATES[FALLBACK_ARCH])
    modifier = (1.0 if graphs else CUDA_GRAPH_OFF_FACTOR) * tp_factor(tp)
    notes = []
    first_crash = None
    text_mode = "correct"
    if family == "DDTREE":
        tree_budget = int(budget) if budget is not None else DDTREE_REFERENCE_BUDGET
        rate = rates["DFLASH"] * DDTREE_SPEEDUP * modifier * ddtree_budget_factor(tree_budget, arch)
        accept_length, accept_rate = round(ddtree_accept_length(tree_budget), 2), ACCEPT["DDTREE"][1]
        if not ddtree_dflash:
            first_crash = "ValueError: " + dim_mismatch_message()
            notes.append("DDTREE registered but not DFLASH-family; files without DDTREE: "
                         + ", ".join(source.files_missing_ddtree))
        elif arch in BANG_ARCHES:
            text_mode = "bang"
            rate = BANG_RATE
            accept_length, accept_rate = BANG_ACCEPT
            notes.append(f"DDTREE tree verify on {arch}: NaN logits, token 0 every step")
    elif family == "EAGLE":
        steps, topk, draft = eagle_params(args)
        rate = rates[family] * modifier * eagle_params_factor(steps, topk, draft, arch)
        accept_length, accept_rate = round(eagle_accept_length(steps, topk, draft), 2), ACCEPT[family][1]
    else:
        rate = rates[family] * modifier
        accept_length, accept_rate = ACCEPT[family]
    return Behaviour(outcome="serve", text_mode=text_mode, tokens_per_second=rate,
                     accept_length=accept_length, accept_rate=accept_rate,
                     first_request_crash=first_crash, notes=tuple(notes), **common)


# --------------------------------------------------------------------------------------------
# Input probes (not pure)
# --------------------------------------------------------------------------------------------

NVIDIA_SMI_ARGS = ("--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits")


def parse_nvidia_smi(text: str) -> list:
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        name, cap, mem = parts[0], parts[1], parts[2]
        gpus.append(Gpu(name=name, compute_cap=cap, memory_mib=int(float(mem.split()[0]))))
    return gpus


def query_gpus(env: Optional[Mapping[str, str]] = None) -> list:
    """GPUs from nvidia-smi (``DDTREE_LAB_NVIDIA_SMI`` overrides), filtered by CUDA_VISIBLE_DEVICES."""
    env = os.environ if env is None else env
    exe = env.get("DDTREE_LAB_NVIDIA_SMI") or "nvidia-smi"
    try:
        proc = subprocess.run([exe, *NVIDIA_SMI_ARGS], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    gpus = parse_nvidia_smi(proc.stdout)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        picked = []
        for item in visible.split(","):
            item = item.strip()
            if item.isdigit() and int(item) < len(gpus):
                picked.append(gpus[int(item)])
        gpus = picked
    return gpus


def find_sglang_dir(env: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """The installed sglang package directory, found WITHOUT importing sglang.

    ``DDTREE_LAB_SGLANG_DIR`` may point at the package dir (containing srt/) or at its parent.
    """
    env = os.environ if env is None else env
    override = env.get("DDTREE_LAB_SGLANG_DIR")
    if override:
        p = Path(override)
        if (p / "srt").is_dir():
            return p
        if (p / "sglang" / "srt").is_dir():
            return p / "sglang"
        return None
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in"):
        return Path(spec.origin).parent
    locations = list(spec.submodule_search_locations or [])
    return Path(locations[0]) if locations else None


def _mentions(path: Path, word: str) -> bool:
    try:
        return word in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def inspect_source(pkg_dir: Optional[Path]) -> SourceState:
    if pkg_dir is None:
        return SourceState(found=False, path=None)
    srt = Path(pkg_dir) / "srt"
    with_ddtree = tuple(f for f in DDTREE_DFLASH_FILES if _mentions(srt / f, "DDTREE"))
    missing = tuple(f for f in DDTREE_DFLASH_FILES if f not in with_ddtree)
    return SourceState(
        found=True,
        path=str(pkg_dir),
        ddtree_known=SPEC_INFO_FILE in with_ddtree,
        files_with_ddtree=with_ddtree,
        files_missing_ddtree=missing,
        ddtree_flag_known=_mentions(srt / DDTREE_FLAG_FILE, DDTREE_FLAG_MARKER),
        ddtree_budget_known=_mentions(srt / DDTREE_FLAG_FILE, DDTREE_BUDGET_MARKER),
    )
