"""The gate's time budget: the longest a probe can run before its verdict (role known_good's
watchdog must outlast it, or it restores known-good under a change still being judged)."""

import json
import time
from pathlib import Path

import pytest
import yaml

from ansible_collections.ddtree.fleet.plugins.filter.probe import probe_budget_seconds
from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as dp
from probe_testlib import REPO as _REPO

REPO = Path(_REPO)


def test_the_budget_of_the_default_prompts_from_their_limits():
    prompts = json.loads((REPO / "roles/quality_gate/files/default_prompts.json").read_text())
    options = yaml.safe_load((REPO / "roles/quality_gate/meta/argument_specs.yml").read_text())[
        "argument_specs"]["main"]["options"]
    floor, stall, ttft, window = (options[f"quality_gate_{k}"]["default"]
                                  for k in ("min_tokens_per_s", "stall_timeout", "ttft_timeout", "rate_window_s"))
    slowest = dp.EARLY_RATE_FRACTION * floor  # a stream is kept while at least this fast
    want = 2 * dp.SERVER_INFO_TIMEOUT + sum(
        min(dp.DEFAULT_REQUEST_TIMEOUT, ttft + max(window, p["max_tokens"] / slowest) + stall) for p in prompts)
    assert dp.worst_case_seconds(prompts, min_tokens_per_s=floor, stall_timeout=stall, ttft_timeout=ttft,
                                 rate_window_s=window) == pytest.approx(want)
    assert probe_budget_seconds(prompts, floor, stall, ttft, window) == int(-(-want // 1))
    # The old watchdog margin (300 s after the start-up) is shorter than a probe, its soak re-check
    # and the 60 s soak of the production defaults.
    assert 2 * want + 60 > 300


def test_the_budget_grows_with_what_slows_a_probe():
    one = [{"name": "a", "prompt": "x", "max_tokens": 64}]
    base = dp.worst_case_seconds(one)
    assert dp.worst_case_seconds(one * 2) > base
    assert dp.worst_case_seconds(one, min_tokens_per_s=1.0) > base
    assert dp.worst_case_seconds(one, ttft_timeout=30.0) > base
    # One prompt never takes longer than its request timeout.
    assert dp.worst_case_seconds(one, min_tokens_per_s=0.01) == 2 * dp.SERVER_INFO_TIMEOUT + dp.DEFAULT_REQUEST_TIMEOUT


def test_a_probe_that_streams_as_slowly_as_it_may_stays_inside_the_budget(fake_server):
    """A server just above the early-fail rate: the probe reads every token and still ends in budget."""
    srv = fake_server()
    floor = 20.0
    srv.beh.token_delay = 1.0 / (1.3 * dp.EARLY_RATE_FRACTION * floor)  # 1.3x the slowest kept stream
    srv.beh.answer = lambda prompt: "one two three four five six seven eight nine ten eleven twelve"
    prompts = [{"name": "slow", "prompt": "count", "max_tokens": 12}]
    t0 = time.monotonic()
    report = dp.run_probe(srv.url, prompts, min_tokens_per_s=floor, stall_timeout=2.0, ttft_timeout=2.0,
                          rate_window_s=1.0)
    elapsed = time.monotonic() - t0
    assert report["prompts"][0]["completion_tokens"] == 12, report["prompts"][0]  # read to the end, not cut short
    assert elapsed < dp.worst_case_seconds(prompts, min_tokens_per_s=floor, stall_timeout=2.0, ttft_timeout=2.0,
                                           rate_window_s=1.0)
