#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: probe an SGLang server's real generation quality."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_probe
short_description: Gate an SGLang deployment on real generation quality
description:
  - Streams known-answer prompts through C(/generate) (or C(/v1/completions)) and judges the
    answers, because C(/health) answers 200 even when the server emits C(!!!!!!!!) at 0.06 tokens/s.
  - Measures time to first token, inter-chunk gaps and tokens/s, and gives up within seconds when
    no token arrives for O(stall_timeout), the first token takes longer than O(ttft_timeout), or
    the rate after O(rate_window_s) is far below O(min_tokens_per_s).
  - Judges the text for degenerate output (character/word runs, phrase loops, special-token
    and byte-marker leaks, U+FFFD, empty output, token id 0 runs) and wrong known answers.
  - Reads C(/server_info) for C(avg_spec_accept_length); optionally compares with a
    O(baseline) report (first divergence per prompt, speed ratio).
  - Stops after the first prompt that shows the server is broken and lists the prompts not run.
  - Read-only, in check mode too; always C(changed=false). A bad verdict fails the task only
    with O(fail_on).
  - The action plugin of the same name judges the output of every prompt that passed again on the
    controller, with the project venv's libraries (ftfy, wordfreq, pycld2); a prompt found
    degenerate or wrong there fails RV(verdict) as on the host, and O(fail_on) applies to it.
version_added: "1.0.0"
author:
  - ddtree-fleet maintainers (!UNKNOWN)
options:
  url:
    description:
      - Base URL of the server, for example C(http://127.0.0.1:30000). Required, here or in
        O(settings).
    type: str
  settings:
    description:
      - Options shared by every probe of a deployment, as one mapping of this module's options
        (the quality_gate role passes C(quality_gate_probe_settings)). The action plugin puts them
        under the options the task gives itself, and leaves out an empty C(api_key). The module
        alone refuses it.
    type: dict
  api_key:
    description:
      - "API key sent as C(Authorization: Bearer KEY). Never returned or logged."
    type: str
  endpoint:
    description: Which endpoint to stream from.
    type: str
    choices: [generate, completions]
    default: generate
  model:
    description:
      - Model name for O(endpoint=completions). Default is the first entry of C(/v1/models).
    type: str
  prompts:
    description:
      - Prompts to send. Each item has C(prompt), and optionally C(name), C(expect) (a regex the
        whole stripped answer must match; a trailing period is tolerated) and C(max_tokens).
      - Default is the five built-in known-answer prompts (the same as
        C(roles/quality_gate/files/default_prompts.json)).
    type: list
    elements: dict
  min_tokens_per_s:
    description:
      - Decode speed floor for answers of at least 8 tokens. C(0) disables the speed check.
    type: float
    default: 5.0
  stall_timeout:
    description: Seconds without a new token (after the first) before the server is failed.
    type: float
    default: 5.0
  ttft_timeout:
    description: Seconds to wait for the first token.
    type: float
    default: 8.0
  rate_window_s:
    description:
      - After this many seconds of streaming, a rate below 25% of O(min_tokens_per_s) fails
        the server at once.
    type: float
    default: 3.0
  request_timeout:
    description: Upper bound for one whole generation request, in seconds.
    type: float
    default: 120.0
  min_accept_length:
    description:
      - Minimum speculative accept length (token-weighted mean of per-request
        C(spec_accept_length), else C(/server_info) C(avg_spec_accept_length)).
      - Unset means not checked.
    type: float
  baseline:
    description:
      - A previous report (the RV(report) of this module or of C(ddtree-probe probe)) taken from
        the known-good service with the same prompts. Each greedy output is compared with the
        baseline's, token by token (O(agreement)); known-answer prompts must still pass their own
        C(expect) (see O(prompts)).
    type: dict
  min_speed_ratio:
    description:
      - Fail when the median per-prompt tokens/s ratio (this run / O(baseline)) is below this.
    type: float
  agreement:
    description:
      - With O(baseline), what a greedy output that leaves the baseline's tokens does.
        Speculative decoding is lossless, so a divergence where the baseline was confident
        (top-2 logprob margin at least O(near_tie_margin)) before token O(agreement_tokens) is a
        lossless violation; a divergence at a near tie is numerics and only warns.
      - C(fail) fails the verdict on a violation, C(warn) reports it as a warning, C(off) skips
        the comparison.
    type: str
    choices: [fail, warn, "off"]
    default: fail
  agreement_tokens:
    description:
      - Output token index before which a confident divergence fails; later ones warn, unless
        more than O(max_late_divergences) prompts diverge confidently.
    type: int
    default: 64
  near_tie_margin:
    description:
      - Baseline top-1 minus top-2 logprob (nats) below which a divergence is a near tie.
    type: float
    default: 0.5
  max_late_divergences:
    description: Prompts allowed to diverge confidently at or after O(agreement_tokens).
    type: int
    default: 1
  top_logprobs:
    description:
      - Alternatives per output token asked of C(/generate) (C(return_logprob),
        C(top_logprobs_num)); the report keeps each position's top-2 margin so that a later
        comparison against it can tell near ties. 0 asks for none (every divergence then counts
        as confident).
    type: int
    default: 2
  fail_on:
    description:
      - Verdicts that fail the task. Empty (the default) never fails it because of a verdict.
    type: list
    elements: str
    choices: [fail, inconclusive]
    default: []
attributes:
  check_mode:
    support: full
    description: Read-only; it probes in check mode too.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
  action:
    support: full
    description:
      - Has an action plugin of the same name. It runs the module on the host, then judges the
        text of the prompts that passed again on the controller (C(report.text_judges.controller)
        lists the judges used, C(report.text_judges.controller_failed) what they failed).
notes:
  - Needs only python3 on the target; the probe talks HTTP with the standard library.
"""

EXAMPLES = r"""
- name: Probe the freshly started candidate
  sglang_probe:
    url: "http://127.0.0.1:30000"
    api_key: "{{ sglang_api_key }}"
    min_tokens_per_s: 10
  register: probe
  check_mode: false

- name: The options every probe of a deployment shares, given once (merged by the action plugin)
  sglang_probe:
    settings: "{{ quality_gate_probe_settings }}"
    agreement: warn
  register: probe

- name: Fail the host unless the probe passed
  ansible.builtin.assert:
    that: probe.passed
    fail_msg: "quality gate {{ probe.verdict }}: {{ probe.reasons | join('; ') }}"

- name: Compare with the known-good service and fail on anything but pass
  sglang_probe:
    url: "http://127.0.0.1:30001"
    baseline: "{{ baseline_probe.report }}"
    min_speed_ratio: 0.7
    min_accept_length: 1.5
    fail_on: [fail, inconclusive]

- name: Custom known-answer prompt through the OpenAI endpoint
  sglang_probe:
    url: "http://127.0.0.1:30000"
    endpoint: completions
    prompts:
      - name: arith
        prompt: "What is 2 + 2? Answer with a number only."
        expect: "4\\.?"
        max_tokens: 8
"""

RETURN = r"""
verdict:
  description: C(pass), C(fail) (the server is broken) or C(inconclusive) (could not measure).
  returned: always
  type: str
  sample: fail
passed:
  description: True only when RV(verdict) is C(pass).
  returned: always
  type: bool
  sample: false
reasons:
  description: Why the verdict is not C(pass), prefixed by the prompt name.
  returned: always
  type: list
  elements: str
  sample: ["arith: stall: no token for 5.0 s after 1 tokens"]
detection_seconds:
  description: Seconds from the start of the probe to the verdict.
  returned: always
  type: float
  sample: 5.01
report:
  description:
    - The full probe report (verdict, reasons, detection_seconds, started_at, url, endpoint,
      per-prompt results with excerpt, output, output_ids, top_margins, ttft_s, tokens_per_s,
      completion_tokens, spec_accept_length, the server_info subset, the thresholds, and the
      baseline comparison, with per prompt the agreement status (identical, near_tie, violation,
      late), the token index and baseline margin where the outputs part, and both
      continuations).
    - Never contains the API key. Can be passed as O(baseline) to a later run.
  returned: always
  type: dict
  sample:
    verdict: pass
    passed: true
    reasons: []
    prompts:
      - name: arith
        excerpt: "4"
        verdict: pass
        tokens_per_s: null
        ttft_s: 0.041
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.fleet.plugins.module_utils.probe.run import ProbeError, run_probe


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str"),
            settings=dict(type="dict", no_log=True),
            api_key=dict(type="str", no_log=True),
            endpoint=dict(type="str", default="generate", choices=["generate", "completions"]),
            model=dict(type="str"),
            prompts=dict(type="list", elements="dict"),
            min_tokens_per_s=dict(type="float", default=5.0, no_log=False),
            stall_timeout=dict(type="float", default=5.0),
            ttft_timeout=dict(type="float", default=8.0),
            rate_window_s=dict(type="float", default=3.0),
            request_timeout=dict(type="float", default=120.0),
            min_accept_length=dict(type="float"),
            baseline=dict(type="dict"),
            min_speed_ratio=dict(type="float"),
            agreement=dict(type="str", default="fail", choices=["fail", "warn", "off"]),
            agreement_tokens=dict(type="int", default=64, no_log=False),
            near_tie_margin=dict(type="float", default=0.5),
            max_late_divergences=dict(type="int", default=1),
            top_logprobs=dict(type="int", default=2),
            fail_on=dict(type="list", elements="str", default=[],
                         choices=["fail", "inconclusive"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["settings"] is not None:
        module.fail_json(msg="settings is merged by the sglang_probe action plugin "
                             "(action_plugins/); without it, pass the options themselves")
    if not p["url"]:
        module.fail_json(msg="url is required (or in settings, through the action plugin)")
    same_name = ("api_key", "endpoint", "model", "min_tokens_per_s", "stall_timeout",
                 "ttft_timeout", "rate_window_s", "request_timeout", "min_accept_length",
                 "baseline", "min_speed_ratio", "top_logprobs")      # run_probe's keywords
    try:
        report = run_probe(p["url"], p["prompts"], **{k: p[k] for k in same_name},
                           agreement=dict(mode=p["agreement"], tokens=p["agreement_tokens"],
                                          near_tie_margin=p["near_tie_margin"],
                                          max_late=p["max_late_divergences"]))
    except (ProbeError, ValueError) as exc:
        module.fail_json(msg="sglang_probe cannot run: %s" % exc, changed=False,
                         verdict="inconclusive", passed=False, reasons=[str(exc)])

    result = dict(changed=False, verdict=report["verdict"], passed=report["passed"],
                  reasons=report["reasons"], detection_seconds=report["detection_seconds"],
                  report=report)
    if report["verdict"] in (p["fail_on"] or []):
        module.fail_json(msg="quality probe of %s: %s (%s)" % (
            report["url"], report["verdict"], "; ".join(report["reasons"][:3]) or "no reason"),
            **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
