# -*- coding: utf-8 -*-
"""The speed gate's measurement: rounds of closed-loop load, then the statistical verdict.

A round is one batch of ``requests_per_round`` requests at one concurrency level through the
benchmark's load client (bench/runner.py ``run_batch``: the same client, the same metrics). Each
round gives one throughput sample; the known-good's rounds are measured just before it is
stopped (``measure_speed`` without a baseline), the candidate's after it passed the quality
probe (with the known-good's result as ``baseline``). Inconclusive levels get ``step`` more
rounds until they conclude, ``max_rounds`` is reached or the next step would overrun
``budget_seconds``; plugins/module_utils/speed.py judges.

Imported by the sglang_speed_gate module (AnsiballZ ships it): stdlib only, no ansible import.
"""

from __future__ import annotations

import time

from ansible_collections.ddtree.fleet.plugins.module_utils import speed
from ansible_collections.ddtree.fleet.plugins.module_utils.bench.runner import (
    MAX_ERROR_MESSAGES, ConnectionPool, expand_workload, level_metrics, parse_base_url, percentile, request_metrics,
    run_batch, workload_hash)

# What must match between the known-good's measurement and the candidate's for a comparison.
SAME_WORKLOAD_KEYS = ("workload_hash", "max_new_tokens", "requests_per_worker", "warmup")


def requests_per_round(concurrency: int, per_worker: int) -> int:
    """Requests of one round at ``concurrency``: ``per_worker`` waves of ``concurrency`` requests, so
    that every level keeps its workers busy."""
    return max(1, int(per_worker)) * int(concurrency)


class Meter:
    """Rounds at each concurrency level against one server, accumulated across calls."""

    def __init__(self, base_url: str, workload: dict, levels, api_key=None, max_new_tokens=None,
                 per_worker: int = 2, warmup=None, timeout: float = 120.0, tag: str = "gate"):
        self.target = parse_base_url(base_url)
        self.workload = workload
        self.levels = [int(c) for c in levels]
        self.api_key = api_key
        self.max_new_tokens = max_new_tokens
        self.per_worker = int(per_worker)
        self.warmup = warmup
        self.timeout = float(timeout)
        self.tag = tag
        self.samples = {c: [] for c in self.levels}     # output tokens/s per round
        self.ttft = {c: [] for c in self.levels}        # seconds, every successful request
        self.itl = {c: [] for c in self.levels}
        self.failed = {c: 0 for c in self.levels}
        self.sent = {c: 0 for c in self.levels}
        self.errors = {c: [] for c in self.levels}
        self.pools = {}
        self.round_seconds = []

    async def _warm(self, c: int) -> None:
        w = c if self.warmup is None else int(self.warmup)
        self.pools[c] = ConnectionPool(self.target)
        if w:
            bodies = expand_workload(self.workload, w, "%s-warmup-c%d" % (self.tag, c), self.max_new_tokens)
            await run_batch(self.target, bodies, c, self.api_key, self.timeout, pool=self.pools[c])

    async def run(self, rounds: int, levels=None, deadline=None) -> bool:
        """``rounds`` more rounds of each of ``levels`` (default all), levels interleaved per round
        so that a slow drift of the host spreads over every level alike. No round starts after
        ``deadline`` (perf_counter seconds); returns False when it cut the rounds short."""
        levels = self.levels if levels is None else [int(c) for c in levels]
        for c in levels:
            if c not in self.pools:
                await self._warm(c)
        for _ in range(int(rounds)):
            if deadline is not None and time.perf_counter() >= deadline:
                return False
            t0 = time.perf_counter()
            for c in levels:
                n = requests_per_round(c, self.per_worker)
                k = len(self.samples[c])
                bodies = expand_workload(self.workload, n, "%s-c%d-r%d" % (self.tag, c, k), self.max_new_tokens)
                records, dur = await run_batch(self.target, bodies, c, self.api_key, self.timeout,
                                               pool=self.pools[c])
                m = level_metrics(records, dur, concurrency=c)
                self.sent[c] += n
                self.failed[c] += m["failed"]
                self.errors[c] = (self.errors[c] + m["error_messages"])[:MAX_ERROR_MESSAGES]
                ok = [request_metrics(r) for r in records if not r.get("error")]
                self.ttft[c].extend(x["ttft"] for x in ok)
                self.itl[c].extend(g for x in ok for g in x["itl"])
                if m["completed"]:
                    self.samples[c].append(m["output_throughput"])
            self.round_seconds.append(time.perf_counter() - t0)
        return True

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools = {}

    def level(self, c: int) -> dict:
        """What the report keeps of one level: the round samples and the latency percentiles."""
        ms = lambda xs, p: round(percentile(xs, p) * 1000.0, 2)   # noqa: E731
        s = self.samples[c]
        return {"concurrency": c, "rounds": [round(x, 3) for x in s],
                "tokens_per_s": round(percentile(s, 50), 2) if s else None,
                "ttft_p50_ms": ms(self.ttft[c], 50), "ttft_p99_ms": ms(self.ttft[c], 99),
                "itl_p50_ms": ms(self.itl[c], 50), "itl_p99_ms": ms(self.itl[c], 99),
                "requests": self.sent[c], "failed": self.failed[c], "errors": list(self.errors[c])}

    def identity(self) -> dict:
        return {"workload_hash": workload_hash(self.workload), "max_new_tokens": self.max_new_tokens,
                "requests_per_worker": self.per_worker, "warmup": self.warmup}


def comparable(baseline: dict, identity: dict, levels) -> list:
    """Why the known-good's measurement cannot be compared with this one (empty: it can)."""
    why = []
    for key in SAME_WORKLOAD_KEYS:
        if baseline.get(key) != identity.get(key):
            why.append("%s differs (known-good %r, candidate %r)" % (key, baseline.get(key), identity.get(key)))
    have = {int(lv["concurrency"]) for lv in baseline.get("levels") or [] if len(lv.get("rounds") or []) >= 2}
    missing = [c for c in levels if c not in have]
    if missing:
        why.append("the known-good has fewer than 2 rounds at concurrency %s" % ", ".join(map(str, missing)))
    return why


async def measure_speed(base_url: str, workload: dict, levels, rounds: int, api_key=None,
                        max_new_tokens=None, per_worker: int = 2, warmup=None, timeout: float = 120.0,
                        baseline=None, max_rounds: int = 0, step: int = 0, max_slowdown: float = 0.05,
                        min_gain: float = 0.0, confidence: float = 0.95, budget_seconds: float = 0.0) -> dict:
    """Measure (no ``baseline``) or gate (with the known-good's result as ``baseline``).

    Returns {verdict: measured|pass|fail|inconclusive, reasons, levels, seconds, looks, ...}."""
    t0 = time.perf_counter()
    rounds = int(rounds)
    max_rounds = max(rounds, int(max_rounds or rounds))
    step = int(step or rounds)
    looks = 1 + -(-(max_rounds - rounds) // step) if baseline is not None else 0
    meter = Meter(base_url, workload, levels, api_key, max_new_tokens, per_worker, warmup, timeout,
                  tag="gate" if baseline is not None else "known-good")
    out = dict(meter.identity(), verdict="measured", reasons=[], looks=looks, max_rounds=max_rounds,
               budget_seconds=budget_seconds, max_slowdown=max_slowdown, min_gain=min_gain,
               confidence=confidence)
    if baseline is not None:
        why = comparable(baseline, meter.identity(), meter.levels)
        if why:
            out.update(verdict="inconclusive", levels=[], seconds=0.0,
                       reasons=["the known-good's speed was measured differently: " + "; ".join(why)])
            return out
    base_by_c = {int(lv["concurrency"]): lv for lv in (baseline or {}).get("levels") or []}
    decisions = {}
    deadline = t0 + budget_seconds if budget_seconds else None
    try:
        pending = list(meter.levels)
        todo = rounds
        while pending:
            complete = await meter.run(todo, pending, deadline)
            if baseline is None or any(meter.failed[c] for c in pending):
                break
            for c in pending:
                if meter.samples[c]:
                    decisions[c] = speed.decide(meter.samples[c], base_by_c[c]["rounds"], max_slowdown,
                                                min_gain, confidence, looks)
            pending = [c for c in pending if decisions.get(c, {}).get("verdict") == "inconclusive"]
            if not pending:
                break
            done = len(meter.samples[pending[0]])
            if not complete:
                out["reasons"].append("sampling stopped after %d rounds: the %.0f s budget is spent"
                                      % (done, budget_seconds))
                break
            todo = min(step, max_rounds - done)
            if todo <= 0:
                break
            per_round = sum(meter.round_seconds) / len(meter.round_seconds)
            if deadline is not None and time.perf_counter() + todo * per_round > deadline:
                out["reasons"].append("sampling stopped at %d rounds: %d more would overrun the %.0f s budget"
                                      % (done, todo, budget_seconds))
                break
    finally:
        meter.close()
    levels_out = []
    for c in meter.levels:
        lv = meter.level(c)
        if lv["failed"]:
            lv.update(verdict="fail", reason="%d of %d requests failed under load at concurrency %d: %s"
                      % (lv["failed"], lv["requests"], c, "; ".join(lv["errors"][:2])))
        elif baseline is not None and c in decisions:
            d = decisions[c]
            lv.update(verdict=d["verdict"], reason=d["reason"], ratio=d["ratio"], ratio_low=d["low"],
                      ratio_high=d["high"], bound=d["bound"], interval_confidence=d["confidence"],
                      baseline_tokens_per_s=base_by_c[c].get("tokens_per_s"))
        elif baseline is not None:
            lv.update(verdict="inconclusive", reason="no round of concurrency %d completed" % c)
        levels_out.append(lv)
    out["levels"] = levels_out
    out["seconds"] = round(time.perf_counter() - t0, 2)
    if baseline is None:
        failed = [lv for lv in levels_out if lv.get("verdict") == "fail"]
        out["verdict"] = "fail" if failed else "measured"
        out["reasons"] = [lv["reason"] for lv in failed] + out["reasons"]
        return out
    out["verdict"] = speed.overall(levels_out)
    out["reasons"] = ["concurrency %d: %s" % (lv["concurrency"], lv["reason"]) for lv in levels_out
                      if lv["verdict"] != "pass"] + out["reasons"]
    return out
