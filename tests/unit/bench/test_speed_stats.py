"""The speed gate's statistics (plugins/module_utils/speed.py): exact Mann-Whitney critical ranks,
the Hodges-Lehmann ratio interval, its coverage and error rates under simulated noise, and the
verdict rules."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils import speed


def _brute_u_counts(m, n):
    """Every placement of m candidate values among m + n ranks: the U it gives."""
    counts = [0] * (m * n + 1)
    for cand in itertools.combinations(range(m + n), m):
        base = [r for r in range(m + n) if r not in cand]
        counts[sum(1 for c in cand for b in base if c > b)] += 1
    return counts


@pytest.mark.parametrize("m, n", [(1, 1), (2, 3), (4, 4), (3, 6), (5, 5)])
def test_u_distribution_matches_enumeration(m, n):
    assert list(speed._u_counts(m, n)) == _brute_u_counts(m, n)
    assert sum(speed._u_counts(m, n)) == math.comb(m + n, m)


def test_critical_ranks_match_published_tables():
    # Two-sided 0.05: the lower critical value of U (reject when U <= it) is k - 1.
    # Mann-Whitney tables: n1 = n2 = 5 -> 2, 6 -> 5, 8 -> 13, 10 -> 23; 4 x 4 has none at 0.05.
    assert speed.critical_rank(4, 4, 0.05) == 0 + 1         # P(U = 0) = 1/70 <= 0.025
    assert speed.critical_rank(5, 5, 0.05) - 1 == 2
    assert speed.critical_rank(6, 6, 0.05) - 1 == 5
    assert speed.critical_rank(8, 8, 0.05) - 1 == 13
    assert speed.critical_rank(10, 10, 0.05) - 1 == 23
    assert speed.critical_rank(3, 3, 0.05) == 0               # no 95% interval from 3 x 3
    # The normal approximation takes over above EXACT_LIMIT and stays close to the exact one.
    exact = speed.critical_rank(20, 20, 0.05)
    mu, sigma = 200.0, math.sqrt(20 * 20 * 41 / 12.0)
    assert abs(exact - (mu - 1.96 * sigma)) < 2
    assert speed.critical_rank(30, 30, 0.05) == pytest.approx(450 - 1.96 * math.sqrt(900 * 61 / 12.0), abs=1)


def test_interval_of_a_known_shift():
    base = [100.0, 102.0, 98.0, 101.0, 99.0, 100.5]
    cand = [x * 1.25 for x in base]
    iv = speed.shift_interval(cand, base, 0.95)
    assert iv["ratio"] == pytest.approx(1.25, rel=0.01)
    assert iv["low"] < 1.25 < iv["high"]
    assert iv["low"] > 1.2 and iv["high"] < 1.3


def test_interval_needs_enough_rounds():
    assert speed.shift_interval([1.0, 1.1], [1.0, 1.05], 0.95)["low"] is None
    assert speed.rounds_needed(0.95) == 4
    assert speed.rounds_needed(0.95, looks=2) == 5      # 0.025 two-sided per look
    with pytest.raises(ValueError):
        speed.shift_interval([0.0, 1.0], [1.0, 1.0], 0.95)


def _rounds(rng, level, sigma, n):
    return [level * rng.lognormvariate(0.0, sigma) for _ in range(n)]


def test_coverage_under_noise():
    """The 95% interval holds the true ratio in at least 95% of simulated gates (it is exact, so
    slightly conservative), with the lab's round noise."""
    rng = random.Random(1)
    hits = sum(1 for _ in range(600)
               if (lambda iv: iv["low"] <= 0.9 <= iv["high"])(
                   speed.shift_interval(_rounds(rng, 90.0, 0.03, 6), _rounds(rng, 100.0, 0.03, 6), 0.95)))
    assert hits / 600 >= 0.94


def _gate(rng, true, sigma, rounds=8, extra=8, tol=0.05):
    """One gate as plugins/module_utils/bench/rounds.py runs it: the known-good's rounds, the
    candidate's first rounds, then ``rounds`` more at a time while inconclusive."""
    looks = 1 + -(-extra // rounds)
    base = _rounds(rng, 100.0, sigma, rounds)
    cand = _rounds(rng, true, sigma, rounds + extra)
    n = rounds
    while True:
        d = speed.decide(cand[:n], base, tol, looks=looks)
        if d["verdict"] != "inconclusive" or n >= rounds + extra:
            return d["verdict"]
        n = min(n + rounds, rounds + extra)


def test_equal_speed_never_fails_and_passes():
    """The same configuration re-gated 400 times: with 2% round noise (the lab's rounds measure
    1-2%) and a 5% tolerance, no gate fails and at least 98% pass."""
    rng = random.Random(2)
    verdicts = [_gate(rng, 100.0, 0.02) for _ in range(400)]
    assert verdicts.count("fail") == 0
    assert verdicts.count("pass") / len(verdicts) >= 0.98


def test_ten_percent_slower_fails_with_the_same_noise():
    rng = random.Random(7)
    verdicts = [_gate(rng, 90.0, 0.02) for _ in range(400)]
    assert verdicts.count("pass") == 0
    assert verdicts.count("fail") / len(verdicts) >= 0.98


def test_a_slower_candidate_fails_with_its_ratio_and_interval():
    rng = random.Random(3)
    d = speed.decide(_rounds(rng, 54.0, 0.03, 6), _rounds(rng, 100.0, 0.03, 6), 0.05, looks=2)
    assert d["verdict"] == "fail"
    assert d["ratio"] == pytest.approx(0.54, rel=0.05)
    assert d["high"] < 0.95
    assert "slower than the tolerance" in d["reason"] and "%.3f" % d["ratio"] in d["reason"]


def test_a_small_slowdown_inside_the_tolerance_passes_or_waits():
    """2% slower with a 5% tolerance is not a failure."""
    rng = random.Random(4)
    verdicts = [speed.decide(_rounds(rng, 98.0, 0.01, 6), _rounds(rng, 100.0, 0.01, 6), 0.05)["verdict"]
                for _ in range(200)]
    assert "fail" not in verdicts and verdicts.count("pass") > 150


def test_noise_larger_than_the_tolerance_is_inconclusive():
    rng = random.Random(5)
    d = speed.decide(_rounds(rng, 97.0, 0.25, 6), _rounds(rng, 100.0, 0.25, 6), 0.05)
    assert d["verdict"] == "inconclusive" and "straddles" in d["reason"]


def test_required_gain():
    rng = random.Random(6)
    base = _rounds(rng, 100.0, 0.02, 6)
    assert speed.decide(_rounds(rng, 124.0, 0.02, 6), base, 0.05, min_gain=0.1)["verdict"] == "pass"
    d = speed.decide(_rounds(rng, 101.0, 0.02, 6), base, 0.05, min_gain=0.1)
    assert d["verdict"] == "fail" and d["bound"] == pytest.approx(1.1) and "required gain" in d["reason"]


def test_looks_split_the_confidence():
    d = speed.decide([1.0] * 6, [1.0] * 6, 0.05, confidence=0.95, looks=5)
    assert d["confidence"] == pytest.approx(0.99)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_slowdown": 1.0}, "max_slowdown"), ({"max_slowdown": -0.1}, "max_slowdown"),
    ({"max_slowdown": 0.05, "min_gain": -1}, "min_gain"),
    ({"max_slowdown": 0.05, "confidence": 1.0}, "confidence")])
def test_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        speed.decide([1.0] * 5, [1.0] * 5, **kwargs)


def test_overall():
    assert speed.overall([{"verdict": "pass"}, {"verdict": "fail"}]) == "fail"
    assert speed.overall([{"verdict": "pass"}, {"verdict": "inconclusive"}]) == "inconclusive"
    assert speed.overall([{"verdict": "pass"}, {"verdict": "pass"}]) == "pass"
    assert speed.overall([]) == "inconclusive"
