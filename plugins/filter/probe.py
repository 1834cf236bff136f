"""Jinja filters about the quality gate's probe (logic in module_utils/probe/run.py)."""
from __future__ import annotations

import math

from ansible.errors import AnsibleFilterError

from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as probe_run


def probe_budget_seconds(prompts, min_tokens_per_s=probe_run.DEFAULT_MIN_TOKENS_PER_S,
                         stall_timeout=probe_run.DEFAULT_STALL_TIMEOUT, ttft_timeout=probe_run.DEFAULT_TTFT_TIMEOUT,
                         rate_window_s=probe_run.DEFAULT_RATE_WINDOW_S):
    """Whole seconds one probe of these prompts can take at most (worst_case_seconds)."""
    try:
        return int(math.ceil(probe_run.worst_case_seconds(
            prompts, min_tokens_per_s=float(min_tokens_per_s), stall_timeout=float(stall_timeout),
            ttft_timeout=float(ttft_timeout), rate_window_s=float(rate_window_s))))
    except (probe_run.ProbeError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("probe_budget_seconds: %s" % exc) from exc


class FilterModule:
    def filters(self):
        return {"probe_budget_seconds": probe_budget_seconds}
