"""The lossless-agreement rule (plugins/module_utils/probe/agreement.py) on hand-made probe results."""

import math

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.probe import agreement as ag


def result(ids, margins=None, text=None, tokens=None):
    text = text if text is not None else "".join(" w%d" % i for i in ids)
    r = {"output": text, "output_ids": list(ids), "completion_tokens": tokens or len(ids)}
    if margins is not None:
        r["top_margins"] = list(margins)
    return r


BASE = result(range(1, 41), margins=[3.0] * 40)


def test_identical_ids_are_identical():
    assert ag.compare(BASE, result(range(1, 41)))["status"] == ag.IDENTICAL


def test_confident_early_divergence_is_a_violation_naming_both_continuations():
    cand = result(list(range(1, 11)) + [99] + list(range(12, 41)))
    e = ag.compare(BASE, cand)
    assert e["status"] == ag.VIOLATION and e["token_index"] == 10
    assert e["baseline_margin"] == 3.0
    assert e["baseline_token_id"] == 11 and e["candidate_token_id"] == 99
    # Both continuations from the first differing character on, with the context before it.
    assert e["baseline_continuation"].startswith("11 w12")
    assert e["candidate_continuation"].startswith("99 w12")
    assert e["context"].endswith(" w9 w10 w")
    fails, warns = ag.judge([("free", e)])
    assert len(fails) == 1 and not warns
    assert fails[0].startswith("lossless_violation: free: diverges from the baseline at token 10")
    assert "top-2 margin 3 >= 0.5 nats" in fails[0] and "'99 w12" in fails[0]


def test_near_tie_is_a_warning_and_its_threshold_is_a_knob():
    base = result(range(1, 41), margins=[3.0] * 10 + [0.2] + [3.0] * 29)
    cand = result(list(range(1, 11)) + [99, 98, 97])
    e = ag.compare(base, cand)
    assert e["status"] == ag.NEAR_TIE
    fails, warns = ag.judge([("free", e)])
    assert fails == [] and warns[0].startswith("near_tie: free:")
    strict = ag.make_rule(near_tie_margin=0.1)
    assert ag.compare(base, cand, strict)["status"] == ag.VIOLATION


def test_late_divergence_warns_once_and_fails_when_more_than_max_late_prompts_do():
    rule = ag.make_rule(tokens=20, max_late=1)
    cand = result(list(range(1, 31)) + [99])
    e = ag.compare(BASE, cand, rule)
    assert e["status"] == ag.LATE
    fails, warns = ag.judge([("a", e)], rule)
    assert fails == [] and warns[0].startswith("late_divergence: a:")
    fails, warns = ag.judge([("a", e), ("b", dict(e))], rule)
    assert len(fails) == 1 and "2 prompts diverge" in fails[0] and "(a, b)" in fails[0]


def test_early_stop_is_a_divergence_at_the_missing_token():
    e = ag.compare(BASE, result(range(1, 6)))
    assert e["status"] == ag.VIOLATION and e["token_index"] == 5
    assert e["candidate_token_id"] is None


def test_modes_warn_and_off():
    cand = result([99] + list(range(2, 41)))
    e = ag.compare(BASE, cand)
    assert ag.judge([("x", e)], ag.make_rule(mode="warn"))[0] == []
    assert ag.judge([("x", e)], ag.make_rule(mode="warn"))[1][0].startswith("lossless_violation")
    assert ag.judge([("x", e)], ag.make_rule(mode="off")) == ([], [])


def test_without_ids_the_text_decides_and_the_margin_is_unknown():
    base = {"output": "The cat sat on the mat.", "completion_tokens": 7, "top_margins": [0.0] * 7}
    cand = {"output": "The cat sat on a mat."}
    e = ag.compare(base, cand)
    assert e["basis"] == "text" and e["token_index_estimated"] is True
    assert e["baseline_margin"] is None and e["status"] == ag.VIOLATION
    assert e["baseline_continuation"] == "the mat." and e["candidate_continuation"] == "a mat."
    assert "margin there is unknown" in ag.judge([("t", e)])[0][0]
    assert ag.compare(base, {"output": "The cat sat on the mat."})["status"] == ag.IDENTICAL


def test_same_ids_but_other_text_is_judged_on_the_text():
    e = ag.compare(result([1, 2, 3], text="abc"), result([1, 2, 3], text="abd"))
    assert e["basis"] == "text" and e["status"] == ag.VIOLATION


def test_margins_from_top_logprobs():
    top = [[[-0.1, 5, None], [-2.1, 6, None]],
           [[-1.0, 5, "x"], [-0.5, 6, "y"], [-3.0, 7, None]],   # unsorted: top-1 is -0.5
           [[-0.1, 5, None]],                                   # one alternative only
           [[float("nan"), 5, None], [-1.0, 6, None]],          # NaN logits
           "garbage"]
    assert ag.margins_from_top_logprobs(top) == [2.0, 0.5, None, None, None]
    assert ag.margins_from_top_logprobs(None) == []
    assert not math.isnan(ag.margins_from_top_logprobs([[[-0.5, 1], [-1.5, 2]]])[0])


@pytest.mark.parametrize("kwargs, word", [
    ({"mode": "loud"}, "agreement must be one of fail, warn, off"),
    ({"tokens": 0}, "agreement tokens must be an integer >= 1"),
    ({"max_late": -1}, "agreement max_late must be an integer >= 0"),
    ({"near_tie_margin": -0.1}, "near_tie_margin must be a number >= 0"),
])
def test_bad_knobs_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ag.make_rule(**kwargs)
