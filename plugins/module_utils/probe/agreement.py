# -*- coding: utf-8 -*-
"""Lossless agreement: does a candidate's greedy output follow its baseline's? (stdlib only)

Speculative decoding is lossless: with greedy sampling NEXTN, DFLASH and DDTREE on the same target
model must emit the target's own tokens.  A verifier bug (a wrongly accepted draft token, a wrong
tree mask, the wrong hidden states) writes fluent text that leaves the target's at the first wrong
token.  Two correct servers may still part at a *near tie*: where the target's two best tokens are
almost equally likely, kernel numerics decide, and after that the texts legitimately differ.

``compare(baseline, candidate, rule)`` judges one prompt from two probe results (``output``,
``output_ids``, ``top_margins``: per output position, the baseline's top-1 minus top-2 logprob in
nats, from SGLang's ``output_top_logprobs``):

- ``identical``: same token ids (or, without ids, the same text);
- ``near_tie``: the first different token sits where the baseline's top-2 margin is below
  ``near_tie_margin``: numerics, not a bug (a warning);
- ``violation``: it sits before token ``tokens`` where the baseline was confident (or where its
  margin is unknown): a lossless violation, the candidate fails;
- ``late``: a confident divergence at or after token ``tokens``: a warning, but more than
  ``max_late`` such prompts fail the candidate too.

``judge(entries, rule)`` turns the per-prompt entries into fail reasons and warnings;
``rule['mode']`` ``warn`` reports violations as warnings only, ``off`` skips the comparison.
Used by probe/run (the gate's module and ``ddtree-probe probe``): one rule everywhere.
"""

from __future__ import annotations

import math

MODES = ("fail", "warn", "off")
DEFAULT_MODE = "fail"
# Divergence at a confident position before this output token fails the candidate.
DEFAULT_TOKENS = 64
# A baseline top-1 minus top-2 logprob below this (nats) is a near tie: numerics may flip it.
DEFAULT_NEAR_TIE_MARGIN = 0.5
# More than this many prompts with a confident divergence after DEFAULT_TOKENS fail as well.
DEFAULT_MAX_LATE = 1
# Characters of each continuation shown from the first difference on (and of context before it).
CONTINUATION_CHARS = 60
CONTEXT_CHARS = 30

IDENTICAL, NEAR_TIE, VIOLATION, LATE = "identical", "near_tie", "violation", "late"


def default_rule() -> dict:
    return {"mode": DEFAULT_MODE, "tokens": DEFAULT_TOKENS,
            "near_tie_margin": DEFAULT_NEAR_TIE_MARGIN, "max_late": DEFAULT_MAX_LATE}


def make_rule(mode=None, tokens=None, near_tie_margin=None, max_late=None) -> dict:
    """A rule from optional knobs (None = default); raises ValueError naming a bad knob."""
    rule = default_rule()
    if mode is not None:
        if mode not in MODES:
            raise ValueError("agreement must be one of %s, got %r" % (", ".join(MODES), mode))
        rule["mode"] = mode
    for key, val, low in (("tokens", tokens, 1), ("max_late", max_late, 0)):
        if val is not None:
            if isinstance(val, bool) or int(val) != val or int(val) < low:
                raise ValueError("agreement %s must be an integer >= %d, got %r" % (key, low, val))
            rule[key] = int(val)
    if near_tie_margin is not None:
        if isinstance(near_tie_margin, bool) or not float(near_tie_margin) >= 0:
            raise ValueError("near_tie_margin must be a number >= 0, got %r" % (near_tie_margin,))
        rule["near_tie_margin"] = float(near_tie_margin)
    return rule


def margins_from_top_logprobs(top) -> list:
    """Per position, top-1 minus top-2 logprob (nats) from ``output_top_logprobs``.

    Each position is a list of ``[logprob, token_id, text-or-null]`` triples; a position with
    fewer than two finite logprobs gives None.
    """
    out = []
    for pos in top if isinstance(top, list) else []:
        lps = []
        for cand in pos if isinstance(pos, list) else []:
            if isinstance(cand, (list, tuple)) and cand and isinstance(cand[0], (int, float)) \
                    and not isinstance(cand[0], bool) and math.isfinite(cand[0]):
                lps.append(float(cand[0]))
        lps.sort(reverse=True)
        out.append(round(lps[0] - lps[1], 4) if len(lps) >= 2 else None)
    return out


def _ids(result):
    ids = result.get("output_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        return ids
    return None


def _text(result):
    out = result.get("output")
    if out is None:
        out = result.get("excerpt", "")
    return out or ""


def _first_diff(a, b):
    """Index of the first difference of two sequences, None when they are equal."""
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    return None if (i == len(a) and i == len(b)) else i


def compare(baseline: dict, candidate: dict, rule: dict = None) -> dict:
    """Judge one prompt: the entry for the report (see the module docstring)."""
    rule = rule or default_rule()
    b_text, c_text = _text(baseline), _text(candidate)
    b_ids, c_ids = _ids(baseline), _ids(candidate)
    char = _first_diff(b_text, c_text)
    k = _first_diff(b_ids, c_ids) if b_ids and c_ids else None
    if k is None and char is not None:
        b_ids = c_ids = None          # same ids, other text (or no ids): judge the text
    entry = {"status": IDENTICAL, "basis": "token_ids" if b_ids and c_ids else "text"}
    if k is None and char is None:
        return entry
    if k is None:
        # Token index estimated from the baseline's own text/token ratio.
        total = baseline.get("completion_tokens") or 0
        k = int(char * total / len(b_text)) if total and b_text else char
        entry["token_index_estimated"] = True
    margins = baseline.get("top_margins") if isinstance(baseline.get("top_margins"), list) else []
    # An estimated index cannot name the position's margin: unknown, judged as confident.
    margin = margins[k] if k < len(margins) and not entry.get("token_index_estimated") else None
    entry["token_index"] = k
    entry["baseline_margin"] = margin
    if b_ids and c_ids:
        entry["baseline_token_id"] = b_ids[k] if k < len(b_ids) else None
        entry["candidate_token_id"] = c_ids[k] if k < len(c_ids) else None
    if char is None:            # same text, different ids (a tokenization difference)
        char = min(len(b_text), len(c_text))
    entry["char_index"] = char
    entry["context"] = b_text[max(0, char - CONTEXT_CHARS):char]
    entry["baseline_continuation"] = b_text[char:char + CONTINUATION_CHARS]
    entry["candidate_continuation"] = c_text[char:char + CONTINUATION_CHARS]
    if margin is not None and margin < rule["near_tie_margin"]:
        entry["status"] = NEAR_TIE
    elif k < rule["tokens"]:
        entry["status"] = VIOLATION
    else:
        entry["status"] = LATE
    return entry


def describe(name: str, entry: dict, rule: dict) -> str:
    """One line for reasons and warnings: where, the margin, both continuations."""
    margin = entry.get("baseline_margin")
    if margin is None:
        where = "the baseline's top-2 margin there is unknown"
    elif entry["status"] == NEAR_TIE:
        where = "a near tie of the baseline (top-2 margin %.3g < %g nats)" % (
            margin, rule["near_tie_margin"])
    else:
        where = "the baseline was confident (top-2 margin %.3g >= %g nats)" % (
            margin, rule["near_tie_margin"])
    return "%s: diverges from the baseline at token %s%s, where %s: baseline %r, candidate %r" % (
        name, entry.get("token_index"), " (estimated from text)" if entry.get(
            "token_index_estimated") else "", where, entry.get("baseline_continuation", ""),
        entry.get("candidate_continuation", ""))


def judge(named_entries, rule: dict = None):
    """``[(name, entry)]`` -> ``(fail_reasons, warnings)`` under ``rule``."""
    rule = rule or default_rule()
    fails, warns = [], []
    if rule["mode"] == "off":
        return fails, warns
    violations = fails if rule["mode"] == "fail" else warns
    late = [(n, e) for n, e in named_entries if e.get("status") == LATE]
    for name, entry in named_entries:
        status = entry.get("status")
        if status == NEAR_TIE:
            warns.append("near_tie: " + describe(name, entry, rule))
        elif status == VIOLATION:
            violations.append("lossless_violation: %s (before token %d)" % (
                describe(name, entry, rule), rule["tokens"]))
        elif status == LATE:
            warns.append("late_divergence: " + describe(name, entry, rule))
    if len(late) > rule["max_late"]:
        violations.append(
            "lossless_violation: %d prompts diverge from the baseline at confident positions (%s), "
            "more than %d allowed after token %d"
            % (len(late), ", ".join(n for n, _ in late), rule["max_late"], rule["tokens"]))
    return fails, warns
