#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Measure an SGLang server under load, or gate it against the known-good's measurement
(logic: plugins/module_utils/bench/rounds.py and plugins/module_utils/speed.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_speed_gate
short_description: Statistical speed gate of an SGLang server under load
description:
  - Sends rounds of closed-loop load (greedy, C(ignore_eos), fixed output length) to
    C(/generate) at each concurrency level, through the benchmark's load client, after a warm-up
    that is not measured. Each round is one output-throughput sample.
  - Without O(baseline) it measures (the known-good, just before it is stopped) and returns the
    samples and latency percentiles per level, for the candidate's gate and the records.
  - With O(baseline) it gates. Per level it computes the Hodges-Lehmann ratio of candidate to known-good
    throughput and its Mann-Whitney confidence interval. V(fail) when the interval lies below
    1 - O(max_slowdown) (or below 1 + O(min_gain) when a gain is required), V(pass) when it lies
    at or above, V(inconclusive) when it straddles. Inconclusive levels get O(step) more rounds
    until they conclude, O(max_rounds) is reached or O(budget_seconds) would be overrun. The
    confidence is split over the allowed looks (Bonferroni).
  - A request that fails under load fails the level, with or without a baseline.
  - Sends load but changes nothing. In check mode it sends no request.
version_added: "1.1.0"
author:
  - ddtree-fleet maintainers (!UNKNOWN)
options:
  url:
    description: Base URL of the server.
    type: str
    required: true
  api_key:
    description: API key sent as a Bearer token.
    type: str
  workload:
    description: The workload (prompts with output lengths; the format of the benchmark's workload).
    type: dict
    required: true
  concurrency:
    description: Concurrency levels, each measured and judged on its own.
    type: list
    elements: int
    default: [1, 4]
  rounds:
    description: Rounds per level before the first verdict (and the known-good's rounds).
    type: int
    default: 8
  max_rounds:
    description: Bound on the candidate's rounds per level when it is inconclusive.
    type: int
    default: 16
  step:
    description: Rounds added per extension; default O(rounds).
    type: int
  requests_per_worker:
    description: Requests per worker and round (a round at concurrency C sends C times this).
    type: int
    default: 2
  warmup:
    description: Warm-up requests per level (not measured); default one per worker.
    type: int
  max_new_tokens:
    description: Override the workload's output length.
    type: int
  timeout:
    description: Seconds allowed per request.
    type: float
    default: 120
  baseline:
    description: The known-good's result of this module (measure mode); omit to measure.
    type: dict
  max_slowdown:
    description: Tolerated slowdown (0.05 = the candidate may be up to 5% slower).
    type: float
    default: 0.05
  min_gain:
    description: Required gain (0.1 = at least 10% faster); 0 = none required.
    type: float
    default: 0.0
  confidence:
    description: Confidence of the decision, split over the allowed looks.
    type: float
    default: 0.95
  budget_seconds:
    description: No extension starts that would end past this many seconds; 0 = no bound.
    type: float
    default: 0
attributes:
  check_mode:
    support: partial
    description: Can run in check mode, but does not measure there.
    details:
      - In check mode the module returns at once, marked C(skipped), with RV(verdict=not_run).
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
"""

EXAMPLES = r"""
- name: Measure the known-good before it is stopped
  ddtree.fleet.sglang_speed_gate:
    url: http://127.0.0.1:30000
    workload: "{{ lookup('ansible.builtin.file', 'speed_workload.json') | from_json }}"
    concurrency: [1, 4]
  register: known_good_speed

- name: Gate the candidate against it
  ddtree.fleet.sglang_speed_gate:
    url: http://127.0.0.1:30000
    workload: "{{ lookup('ansible.builtin.file', 'speed_workload.json') | from_json }}"
    concurrency: [1, 4]
    baseline: "{{ known_good_speed }}"
    max_slowdown: 0.05
  register: speed
"""

RETURN = r"""
verdict:
  description: >-
    V(measured) (no baseline), V(pass), V(fail), V(inconclusive), or V(not_run) in check mode.
  returned: always
  type: str
  sample: pass
reasons:
  description: Why a level did not pass, and why sampling stopped early.
  returned: always
  type: list
  elements: str
levels:
  description: >-
    Per level - C(concurrency), C(rounds) (tokens/s per round), C(tokens_per_s) (their median),
    C(ttft_p50_ms), C(ttft_p99_ms), C(itl_p50_ms), C(itl_p99_ms), C(requests), C(failed); when
    gating also C(verdict), C(reason), C(ratio), C(ratio_low), C(ratio_high), C(bound),
    C(interval_confidence) and C(baseline_tokens_per_s).
  returned: always
  type: list
  elements: dict
  sample: [{"concurrency": 1, "tokens_per_s": 148.2, "ratio": 1.24, "ratio_low": 1.21, "ratio_high": 1.27}]
seconds:
  description: Wall time of the measurement.
  returned: always
  type: float
looks:
  description: How many times the comparison may be made (the confidence is split over them).
  returned: always
  type: int
workload_hash:
  description: sha256 of the workload (a baseline must have the same).
  returned: always
  type: str
"""

import asyncio

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.fleet.plugins.module_utils.bench.rounds import measure_speed
from ansible_collections.ddtree.fleet.plugins.module_utils.bench.runner import BenchError, validate_workload, workload_hash


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            workload=dict(type="dict", required=True),
            concurrency=dict(type="list", elements="int", default=[1, 4]),
            rounds=dict(type="int", default=8),
            max_rounds=dict(type="int", default=16),
            step=dict(type="int"),
            requests_per_worker=dict(type="int", default=2),
            warmup=dict(type="int"),
            max_new_tokens=dict(type="int", no_log=False),
            timeout=dict(type="float", default=120.0),
            baseline=dict(type="dict"),
            max_slowdown=dict(type="float", default=0.05),
            min_gain=dict(type="float", default=0.0),
            confidence=dict(type="float", default=0.95),
            budget_seconds=dict(type="float", default=0.0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        workload = validate_workload(p["workload"])
    except BenchError as exc:
        module.fail_json(msg="workload: %s" % exc)
    checks = [("concurrency", all(c >= 1 for c in p["concurrency"]) and bool(p["concurrency"]), "a list of integers >= 1"),
              ("rounds", p["rounds"] >= 2, "an integer >= 2"),
              ("max_rounds", p["max_rounds"] >= p["rounds"], "an integer >= rounds (%d)" % p["rounds"]),
              ("step", p["step"] is None or p["step"] >= 1, "an integer >= 1"),
              ("requests_per_worker", p["requests_per_worker"] >= 1, "an integer >= 1"),
              ("max_slowdown", 0.0 <= p["max_slowdown"] < 1.0, "a number in [0, 1)"),
              ("min_gain", p["min_gain"] >= 0.0, "a number >= 0"),
              ("confidence", 0.5 <= p["confidence"] < 1.0, "a number in [0.5, 1)"),
              ("budget_seconds", p["budget_seconds"] >= 0.0, "a number >= 0")]
    for name, ok, expected in checks:
        if not ok:
            module.fail_json(msg="%s must be %s, got %r" % (name, expected, p[name]))
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, verdict="not_run", reasons=[], levels=[], seconds=0.0,
                         looks=0, workload_hash=workload_hash(workload))
    try:
        res = asyncio.run(measure_speed(
            p["url"], workload, p["concurrency"], p["rounds"], api_key=p["api_key"],
            max_new_tokens=p["max_new_tokens"], per_worker=p["requests_per_worker"], warmup=p["warmup"],
            timeout=p["timeout"], baseline=p["baseline"], max_rounds=p["max_rounds"], step=p["step"],
            max_slowdown=p["max_slowdown"], min_gain=p["min_gain"], confidence=p["confidence"],
            budget_seconds=p["budget_seconds"]))
    except (BenchError, OSError, ValueError) as exc:
        module.fail_json(msg="speed measurement of %s could not run: %s" % (p["url"], exc))
    module.exit_json(changed=False, **res)


if __name__ == "__main__":
    main()
