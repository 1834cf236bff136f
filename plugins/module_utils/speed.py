# -*- coding: utf-8 -*-
# ddtree-fleet: the speed gate's statistics - is the candidate slower than the known-good?
#
# Used by plugins/modules/sglang_speed_gate.py (on the host, stdlib only) and by the unit tests;
# pure logic. A sample is one round's output throughput (tokens/s of a closed-loop batch at one
# concurrency level). The known-good's rounds are measured just before it is stopped, the
# candidate's after it passed the quality probe: two independent samples, not pairs.
#
# The comparison is on log throughput, so the shift is a ratio. Its estimate is the
# Hodges-Lehmann estimator (the median of every candidate/known-good ratio of rounds) and its
# interval comes from the Mann-Whitney rank test's exact null distribution (normal approximation
# for large samples): distribution-free, robust to the odd slow round, and an interval with a
# stated confidence instead of a bare p-value. The verdict is an equivalence-style decision on
# that interval:
#   fail          the whole interval is below 1 - max_slowdown (statistically slower than the
#                 tolerance), or below 1 + min_gain when a gain is required;
#   pass          the whole interval is at or above that bound;
#   inconclusive  the interval straddles it (too few or too noisy rounds): sample more, and when
#                 the bound on rounds is reached, keep the known-good (fail safe).
# Looking again after more rounds is a new test: the confidence is split over the allowed looks
# (Bonferroni), so extending the sampling does not inflate the error rates.

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

# Exact Mann-Whitney distribution up to this many rounds in total (m + n); above, the normal
# approximation (its error is far below the noise of a throughput round there).
EXACT_LIMIT = 40


@lru_cache(maxsize=None)
def _u_counts(m: int, n: int) -> tuple:
    """Number of orderings of m candidate and n known-good rounds with U = 0 .. m*n
    (U = how many (candidate, known-good) pairs the candidate wins)."""
    if m == 0 or n == 0:
        return (1,)
    # The largest of the m + n values is either a candidate round (it beats all n known-good
    # rounds: U shifts by n) or a known-good round (it beats no candidate).
    with_c = _u_counts(m - 1, n)
    with_b = _u_counts(m, n - 1)
    out = [0] * (m * n + 1)
    for u, c in enumerate(with_c):
        out[u + n] += c
    for u, c in enumerate(with_b):
        out[u] += c
    return tuple(out)


def critical_rank(m: int, n: int, alpha: float) -> int:
    """The largest k with P(U <= k - 1) <= alpha / 2 under the null (0: no interval exists at
    this confidence with so few rounds). The two-sided 1 - alpha interval of the shift is
    [d_(k), d_(mn - k + 1)] over the sorted m*n pairwise differences (1-based)."""
    if m < 1 or n < 1:
        return 0
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1), got %r" % (alpha,))
    if m + n <= EXACT_LIMIT:
        counts = _u_counts(m, n)
        total = math.comb(m + n, m)
        cum, k = 0, 0
        for u, c in enumerate(counts):
            cum += c
            if cum / total > alpha / 2:
                break
            k = u + 1
        return k
    mu = m * n / 2.0
    sigma = math.sqrt(m * n * (m + n + 1) / 12.0)
    z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    return max(0, int(math.floor(mu - z * sigma + 0.5)))


def shift_interval(candidate, baseline, confidence: float) -> dict:
    """Hodges-Lehmann ratio of candidate to known-good throughput with its confidence interval.

    Returns {ratio, low, high} (low/high None when the rounds are too few for the confidence)."""
    cand = [float(x) for x in candidate]
    base = [float(x) for x in baseline]
    if not cand or not base:
        raise ValueError("both samples need at least one round")
    if min(cand + base) <= 0:
        raise ValueError("throughput samples must be > 0")
    diffs = sorted(math.log(c) - math.log(b) for c in cand for b in base)
    mid = len(diffs) // 2
    est = diffs[mid] if len(diffs) % 2 else (diffs[mid - 1] + diffs[mid]) / 2.0
    k = critical_rank(len(cand), len(base), 1.0 - confidence)
    if k < 1:
        return {"ratio": math.exp(est), "low": None, "high": None}
    return {"ratio": math.exp(est), "low": math.exp(diffs[k - 1]), "high": math.exp(diffs[len(diffs) - k])}


def rounds_needed(confidence: float, looks: int = 1) -> int:
    """The fewest rounds per side (equal sizes) for which an interval exists at all."""
    alpha = (1.0 - confidence) / max(1, looks)
    for n in range(2, EXACT_LIMIT // 2 + 1):
        if critical_rank(n, n, alpha) >= 1:
            return n
    return EXACT_LIMIT // 2


def decide(candidate, baseline, max_slowdown: float, min_gain: float = 0.0,
           confidence: float = 0.95, looks: int = 1) -> dict:
    """The verdict of one concurrency level.

    ``looks``: how many times this comparison may be made in one gate (the sequential extension);
    the interval of each look has confidence 1 - (1 - confidence) / looks.
    Returns {verdict, ratio, low, high, bound, confidence, reason}."""
    if not 0.0 <= max_slowdown < 1.0:
        raise ValueError("max_slowdown must be in [0, 1), got %r" % (max_slowdown,))
    if min_gain < 0.0:
        raise ValueError("min_gain must be >= 0, got %r" % (min_gain,))
    if not 0.5 <= confidence < 1.0:
        raise ValueError("confidence must be in [0.5, 1), got %r" % (confidence,))
    per_look = 1.0 - (1.0 - confidence) / max(1, int(looks))
    iv = shift_interval(candidate, baseline, per_look)
    bound = 1.0 + min_gain if min_gain > 0 else 1.0 - max_slowdown
    what = ("the required gain (ratio %.3f)" % bound if min_gain > 0
            else "the tolerance (ratio %.3f, max slowdown %.1f%%)" % (bound, 100 * max_slowdown))
    out = {"ratio": round(iv["ratio"], 4), "low": None, "high": None, "bound": round(bound, 4),
           "confidence": round(per_look, 4), "candidate_rounds": len(candidate),
           "baseline_rounds": len(baseline)}
    if iv["low"] is None:
        out.update(verdict="inconclusive",
                   reason="%d candidate and %d known-good rounds are too few for a %.1f%% interval"
                          % (len(candidate), len(baseline), 100 * per_look))
        return out
    out.update(low=round(iv["low"], 4), high=round(iv["high"], 4))
    text = "ratio %.3f [%.3f, %.3f] at %.1f%%" % (iv["ratio"], iv["low"], iv["high"], 100 * per_look)
    if iv["high"] < bound:
        out.update(verdict="fail", reason="%s: slower than %s" % (text, what))
    elif iv["low"] >= bound:
        out.update(verdict="pass", reason="%s: not below %s" % (text, what))
    else:
        out.update(verdict="inconclusive", reason="%s: the interval straddles %s" % (text, what))
    return out


def overall(levels) -> str:
    """fail if any level fails, inconclusive if any is, else pass (no levels: inconclusive)."""
    verdicts = [lv["verdict"] for lv in levels]
    if not verdicts:
        return "inconclusive"
    if "fail" in verdicts:
        return "fail"
    if "inconclusive" in verdicts:
        return "inconclusive"
    return "pass"
