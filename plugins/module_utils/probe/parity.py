# -*- coding: utf-8 -*-
"""Greedy parity of a speculative server against its own target without speculation (stdlib).

``ddtree-gpu-check`` (plugins/plugin_utils/cli/gpucheck.py) probes the target alone, then the
DDTREE server with that report as its baseline (probe/run.run_probe, the gate's own
comparison: probe/agreement). This module turns the candidate's report into one row per prompt
and one verdict, and renders them as a table:

- ``identical``: the same token ids (or the same text where a server sends no ids);
- ``near_tie``: the first different token sits where the target's top-2 margin is below the
  rule's ``near_tie_margin`` (kernel numerics, not the verifier);
- ``violation`` / ``late``: a confident divergence before / after the rule's ``tokens``;
- ``not_judged``: the prompt failed on either server (its reason is in the report).

The verdict is ``parity`` (every prompt identical), ``parity_with_ties`` (near ties only),
``violation`` (the probe's agreement rule failed the candidate, or a prompt was not judged).
"""

from __future__ import annotations

PARITY, PARITY_WITH_TIES, VIOLATION = "parity", "parity_with_ties", "violation"
COLUMNS = ("prompt", "tokens", "parity", "first diff", "target tok/s", "ddtree tok/s", "ratio")


def _num(value, fmt):
    return fmt % value if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def rows(baseline_report: dict, candidate_report: dict) -> list:
    """One dict per prompt of the candidate's report (its ``baseline`` section compared them)."""
    base = {p.get("name"): p for p in baseline_report.get("prompts") or [] if isinstance(p, dict)}
    section = {e.get("name"): e for e in (candidate_report.get("baseline") or {}).get("prompts") or []
               if isinstance(e, dict)}
    out = []
    for p in candidate_report.get("prompts") or []:
        name = p.get("name")
        b = base.get(name) or {}
        entry = section.get(name) or {}
        agreement = entry.get("agreement") or {}
        status = agreement.get("status") or "not_judged"
        b_rate, c_rate = b.get("tokens_per_s"), p.get("tokens_per_s")
        out.append({
            "prompt": name,
            "tokens": p.get("completion_tokens"),
            "parity": status,
            "basis": agreement.get("basis"),
            "first_diff": agreement.get("token_index"),
            "baseline_margin": agreement.get("baseline_margin"),
            "target_tokens_per_s": b_rate,
            "ddtree_tokens_per_s": c_rate,
            "ratio": (c_rate / b_rate) if b_rate and c_rate else None,
            "reasons": list(p.get("reasons") or []) + ([] if b.get("verdict") == "pass"
                                                       else ["target: " + r for r in b.get("reasons") or []]),
        })
    return out


def verdict(the_rows: list, candidate_report: dict) -> str:
    """parity | parity_with_ties | violation (see the module docstring)."""
    statuses = [r["parity"] for r in the_rows]
    failed = any("lossless_violation" in r for r in candidate_report.get("reasons") or [])
    if not statuses or failed or any(s not in ("identical", "near_tie") for s in statuses):
        return VIOLATION
    return PARITY if all(s == "identical" for s in statuses) else PARITY_WITH_TIES


def table(the_rows: list) -> str:
    """A Markdown table of the rows (numbers rounded for reading; the JSON keeps them)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---|---:|---|---:|---:|---:|---:|"]
    for r in the_rows:
        diff = "-" if r["first_diff"] is None else str(r["first_diff"])
        if r["first_diff"] is not None and r["baseline_margin"] is not None:
            diff += " (margin %.2f)" % r["baseline_margin"]
        lines.append("| %s |" % " | ".join([
            str(r["prompt"]), _num(r["tokens"], "%d"), r["parity"], diff,
            _num(r["target_tokens_per_s"], "%.1f"), _num(r["ddtree_tokens_per_s"], "%.1f"),
            _num(r["ratio"], "%.2f")]))
    return "\n".join(lines)
