#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Run the fixed benchmark workload against an SGLang server (logic: plugins/module_utils/bench/runner.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_bench
short_description: Measure an SGLang server with a fixed workload at several concurrency levels
description:
  - Sends the versioned workload (greedy, fixed output lengths) to C(/generate) with streaming, at
    each concurrency level after a warm-up that is not measured, and returns SGLang
    C(bench_serving)-style metrics per level (output and request throughput, TTFT, TPOT, ITL and
    end-to-end latency percentiles, acceptance length, errors).
  - The client is asynchronous and needs only python3 on the host.
  - Sends load but changes nothing. In check mode it only validates O(workload) and sends no
    request (see the C(check_mode) attribute).
version_added: "1.0.0"
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
    description: The workload (the content of roles/benchmark/files/workload-v1.json).
    type: dict
    required: true
  concurrency:
    description: Concurrency levels, in order.
    type: list
    elements: int
    default: [1, 4, 16, 48]
  requests_per_level:
    description: Measured requests per level; default 4 x concurrency (at least 8).
    type: int
  warmup:
    description: Warm-up requests per level (not measured); default one per worker.
    type: int
  max_new_tokens:
    description: Override the workload's output length.
    type: int
  timeout:
    description: Seconds allowed per request.
    type: float
    default: 300
  candidate:
    description: Label of the configuration under test (for the results).
    type: str
    default: ""
attributes:
  check_mode:
    support: partial
    description: Can run in check mode, but does not benchmark there.
    details:
      - In check mode the workload is validated and the module returns at once, marked
        C(skipped), with RV(status=not_run), no RV(levels) and the RV(workload) version and hash;
        the server receives no request.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
"""

EXAMPLES = r"""
- name: Benchmark the running server
  sglang_bench:
    url: http://127.0.0.1:30000
    workload: "{{ lookup('file', 'workload-v1.json') | from_json }}"
    concurrency: [1, 4, 16, 48]
    candidate: DDTREE
  register: bench
"""

RETURN = r"""
status:
  description: V(ok), V(failed) when every request of a level failed, or V(not_run) in check mode.
  returned: always
  type: str
  sample: ok
levels:
  description: Metrics per concurrency level, named as in SGLang's bench_serving (empty in check mode).
  returned: always
  type: list
  elements: dict
  sample: [{"max_concurrency": 1, "output_throughput": 148.2, "median_ttft_ms": 14.1}]
evidence:
  description: Why the run failed (reason and first error messages), or null.
  returned: always
  type: dict
workload:
  description: Version and sha256 of the workload.
  returned: always
  type: dict
  sample: {"version": "v1", "hash": "3f1c..."}
candidate:
  description: The label given.
  returned: always
  type: str
"""

import asyncio

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.fleet.plugins.module_utils.bench.runner import (BenchError, run_benchmark, validate_workload,
                                               workload_hash)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            workload=dict(type="dict", required=True),
            concurrency=dict(type="list", elements="int", default=[1, 4, 16, 48]),
            requests_per_level=dict(type="int"),
            warmup=dict(type="int"),
            max_new_tokens=dict(type="int", no_log=False),
            timeout=dict(type="float", default=300.0),
            candidate=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        workload = validate_workload(p["workload"])
    except BenchError as exc:
        module.fail_json(msg=f"workload: {exc}")
    info = {"version": workload.get("version"), "hash": workload_hash(workload)}
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, status="not_run", levels=[], evidence=None,
                         workload=info, candidate=p["candidate"])
    try:
        res = asyncio.run(run_benchmark(p["url"], workload, concurrency_levels=p["concurrency"],
                                        requests_per_level=p["requests_per_level"], warmup=p["warmup"],
                                        api_key=p["api_key"], timeout=p["timeout"],
                                        max_new_tokens=p["max_new_tokens"]))
    except (BenchError, OSError) as exc:
        module.fail_json(msg=f"benchmark of {p['url']} could not run: {exc}", workload=info)
    module.exit_json(changed=False, status=res["status"], levels=res["levels"], evidence=res["evidence"],
                     workload=info, candidate=p["candidate"])


if __name__ == "__main__":
    main()
