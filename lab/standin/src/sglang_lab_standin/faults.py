"""Lab fault switches and timing knobs, read from the environment (the lab unit's EnvironmentFile).

DDTREE_LAB_FAULT            none | hang_midstream | http_500 | crash_on_first_request |
                            garbage_fast | slow_text | unhealthy_after:SECONDS | never_healthy |
                            exit_on_start | lossless_violation[:TOKENS] | near_tie_flip
                            lossless_violation: fluent, fast and healthy, but free-form answers
                            leave the target's tokens at the first confident sentence start at
                            or after output token TOKENS (default 0), as a verifier that accepts
                            a wrong draft token would; known answers stay right.
                            near_tie_flip: free-form answers take the runner-up at the first
                            near tie of the target (what kernel numerics may do): still correct.
DDTREE_LAB_FAULT_ONLY       comma-separated --speculative-algorithm values (NONE: no speculative
                            decoding) the fault applies to; empty: every server. Lets a test break
                            the candidate (e.g. DDTREE) while the known-good NEXTN keeps working.
DDTREE_LAB_RATE_SCALE       float multiplier on every token rate (and prefill speed); default 1.0
DDTREE_LAB_RATE_JITTER     per-request noise: each request's rate is multiplied by a log-normal
                            factor with this sigma (default 0.03; 0 = none)
DDTREE_LAB_COLD_REQUESTS   the first this many client requests after start run at
                            DDTREE_LAB_COLD_FACTOR x the rate (kernel autotune, allocator and
                            cache warm-up; defaults 3 and 0.75)
DDTREE_LAB_NOISE_SEED      integer seed of the jitter (default: from the clock)
DDTREE_LAB_STARTUP_SECONDS  port stays closed this long (default 0.8)
DDTREE_LAB_WARMUP_SECONDS   warm-up after the port opens, health 503 meanwhile (default 0.4)
DDTREE_LAB_DEBUG            "1": log a "[lab] physics:" summary line at start-up
DDTREE_LAB_HEALTH_WAIT_SECONDS  /health waits this long before each check of the scheduler
                            (default 1.0: the real health_generate's asyncio.sleep(1))
SGLANG_HEALTH_CHECK_TIMEOUT /health answers 503 after this many seconds without a scheduler
                            answer (the real server's variable, default 20)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

FAULT_KINDS = ("none", "hang_midstream", "http_500", "crash_on_first_request", "garbage_fast",
               "slow_text", "unhealthy_after", "never_healthy", "exit_on_start",
               "lossless_violation", "near_tie_flip")

GARBAGE_RATE = 250.0   # tokens/s of garbage_fast (before rate scale)
SLOW_TEXT_RATE = 0.5   # tokens/s of slow_text (before rate scale)
HANG_AFTER_TOKENS = 3  # hang_midstream: tokens sent before the stream stalls forever


@dataclass(frozen=True)
class Fault:
    kind: str = "none"
    seconds: Optional[float] = None   # for unhealthy_after
    tokens: int = 0                   # for lossless_violation


def parse_fault(value: Optional[str]) -> Fault:
    text = (value or "none").strip()
    if not text:
        return Fault()
    kind, sep, arg = text.partition(":")
    kind = kind.strip().lower()
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown DDTREE_LAB_FAULT {value!r}; expected one of {', '.join(FAULT_KINDS)}")
    if kind == "unhealthy_after":
        if not sep:
            raise ValueError("DDTREE_LAB_FAULT unhealthy_after needs seconds, e.g. unhealthy_after:30")
        seconds = float(arg)
        if seconds < 0:
            raise ValueError("unhealthy_after seconds must be >= 0")
        return Fault(kind, seconds)
    if kind == "lossless_violation" and sep:
        if not arg.strip().isdigit():
            raise ValueError("DDTREE_LAB_FAULT lossless_violation takes a token index >= 0, "
                             "e.g. lossless_violation:16")
        return Fault(kind, tokens=int(arg))
    if sep:
        raise ValueError(f"DDTREE_LAB_FAULT {kind} takes no argument")
    return Fault(kind)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = float(raw)
    if value < 0:
        raise ValueError(f"{name} must be >= 0")
    return value


def parse_scope(value: Optional[str]) -> tuple:
    """DDTREE_LAB_FAULT_ONLY -> upper-cased algorithm names; () means every server."""
    return tuple(sorted({p.strip().upper() for p in (value or "").split(",") if p.strip()}))


@dataclass(frozen=True)
class LabConfig:
    fault: Fault
    rate_scale: float
    startup_seconds: float
    warmup_seconds: float
    debug: bool
    fault_only: tuple = ()
    health_wait_seconds: float = 1.0
    health_timeout_seconds: float = 20.0
    rate_jitter: float = 0.0
    cold_requests: int = 0
    cold_factor: float = 1.0
    noise_seed: Optional[int] = None

    def fault_for(self, algorithm: Optional[str]) -> Fault:
        """The fault this server has: the configured one unless DDTREE_LAB_FAULT_ONLY excludes it."""
        if self.fault_only and (algorithm or "NONE").upper() not in self.fault_only:
            return Fault()
        return self.fault


def load_config(env: Optional[Mapping[str, str]] = None) -> LabConfig:
    env = os.environ if env is None else env
    scale = _float(env, "DDTREE_LAB_RATE_SCALE", 1.0)
    if scale <= 0:
        raise ValueError("DDTREE_LAB_RATE_SCALE must be > 0")
    if _float(env, "DDTREE_LAB_COLD_FACTOR", 0.75) <= 0:
        raise ValueError("DDTREE_LAB_COLD_FACTOR must be > 0")
    return LabConfig(
        fault=parse_fault(env.get("DDTREE_LAB_FAULT")),
        rate_scale=scale,
        startup_seconds=_float(env, "DDTREE_LAB_STARTUP_SECONDS", 0.8),
        warmup_seconds=_float(env, "DDTREE_LAB_WARMUP_SECONDS", 0.4),
        debug=env.get("DDTREE_LAB_DEBUG", "") not in ("", "0", "false", "no"),
        fault_only=parse_scope(env.get("DDTREE_LAB_FAULT_ONLY")),
        health_wait_seconds=_float(env, "DDTREE_LAB_HEALTH_WAIT_SECONDS", 1.0),
        health_timeout_seconds=_float(env, "SGLANG_HEALTH_CHECK_TIMEOUT", 20.0),
        rate_jitter=_float(env, "DDTREE_LAB_RATE_JITTER", 0.03),
        cold_requests=int(_float(env, "DDTREE_LAB_COLD_REQUESTS", 3)),
        cold_factor=_float(env, "DDTREE_LAB_COLD_FACTOR", 0.75),
        noise_seed=int(env["DDTREE_LAB_NOISE_SEED"]) if env.get("DDTREE_LAB_NOISE_SEED") else None,
    )
