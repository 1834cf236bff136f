"""The probe's figures when a stream event carries one token or several (one event per
scheduler step: under speculative decoding a step adds about the accept length)."""

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as dp
from probe_testlib import KNOWN_ANSWERS, split_tokens

FREEFORM = [p for p in KNOWN_ANSWERS if p.startswith("Explain")][0]
N_TOKENS = len(split_tokens(KNOWN_ANSWERS[FREEFORM]))
ITEM = {"name": "freeform", "prompt": FREEFORM, "expect": None, "max_tokens": 200}
TOKEN_DELAY = 0.01          # 100 tokens/s, whatever the step


def _probe(srv, endpoint, **kw):
    args = dict(stall_timeout=2.0, ttft_timeout=3.0, rate_window_s=0.5, min_tokens_per_s=60.0,
                top_logprobs=0)
    args.update(kw)
    return dp.probe_prompt(srv.url, ITEM, endpoint=endpoint, **args)


@pytest.mark.parametrize("step", [1, 5])
@pytest.mark.parametrize("endpoint, counts", [
    ("generate", "meta"),              # meta_info.completion_tokens, cumulative output_ids
    ("completions", "usage"),          # stream_options.continuous_usage_stats
    ("completions", "token_ids"),      # choices[0].token_ids
    ("completions", "text"),           # nothing but the text delta
])
def test_tokens_and_rate_do_not_depend_on_the_step(fake_server, step, endpoint, counts):
    srv = fake_server()
    srv.beh.step = step
    srv.beh.token_delay = TOKEN_DELAY
    srv.beh.running_usage = counts == "usage"
    srv.beh.token_ids = counts == "token_ids"
    srv.beh.final_usage = False         # only the per-chunk figures count
    res = _probe(srv, endpoint)
    assert res["verdict"] == "pass", res["reasons"]
    if counts == "text":
        # an estimate from the text, not one token per chunk (that would be N / step)
        assert res["completion_tokens"] == pytest.approx(N_TOKENS, rel=0.35)
        rate_tol = 0.5
    else:
        assert res["completion_tokens"] == N_TOKENS
        rate_tol = 0.3
    # Against the rate the server really delivered (on a loaded machine its sleeps run long), not
    # the nominal 1 / TOKEN_DELAY: the figure must not depend on how the tokens were grouped.
    (t0, n0), (t1, n1) = srv.beh.sent[0], srv.beh.sent[-1]
    delivered = (n1 - n0) / (t1 - t0)
    assert delivered <= 1 / TOKEN_DELAY * 1.05
    assert res["tokens_per_s"] == pytest.approx(delivered, rel=rate_tol), (delivered, res)
    # the gaps are between events: step tokens' worth of time each
    assert res["max_gap_s"] >= step * TOKEN_DELAY * 0.8


def test_completions_request_asks_for_running_usage(fake_server):
    srv = fake_server()
    _probe(srv, "completions")
    body = srv.beh.requests[-1][2]
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_multi_token_steps_are_not_a_stall(fake_server):
    """Verify steps of 6 tokens every 1.2 s: slow events, but tokens keep coming within the stall
    limit (2 s), and 5 tokens/s is above a 2 tokens/s floor."""
    srv = fake_server()
    srv.beh.step = 6
    srv.beh.token_delay = 0.2
    item = dict(ITEM, max_tokens=18)
    res = dp.probe_prompt(srv.url, item, endpoint="generate", stall_timeout=2.0, ttft_timeout=3.0,
                          rate_window_s=1.0, min_tokens_per_s=2.0, top_logprobs=0)
    assert res["verdict"] == "pass", res["reasons"]
    assert res["completion_tokens"] == 18
    assert res["tokens_per_s"] == pytest.approx(5.0, rel=0.25)
    assert 1.0 <= res["max_gap_s"] < 2.0


def test_a_real_stall_is_still_a_stall(fake_server):
    srv = fake_server()
    srv.beh.step = 6
    srv.beh.token_delay = 0.5            # an event every 3 s
    res = dp.probe_prompt(srv.url, dict(ITEM, max_tokens=18), endpoint="generate", stall_timeout=2.0,
                          ttft_timeout=3.0, rate_window_s=10.0, min_tokens_per_s=0, top_logprobs=0)
    assert res["verdict"] == "fail" and res["reasons"][0].startswith("stall: no token for")
    assert res["completion_tokens"] == 6       # the first step's tokens, not 1 event


def _feed(acc, chunks):
    for c in chunks:
        acc.feed(c)
    return acc


def _gen_chunk(n, final=False, **spec):
    meta = {"completion_tokens": n, "finish_reason": {"type": "length"} if final else None}
    meta.update(spec)
    return {"text": "x" * n, "output_ids": list(range(1, n + 1)), "meta_info": meta}


def test_spec_fields_come_from_the_finished_chunk():
    acc = _feed(dp._Accumulator("generate"), [
        _gen_chunk(1, spec_accept_length=9.9, spec_verify_ct=0),
        _gen_chunk(6, spec_accept_length=8.8, spec_verify_ct=1),
        _gen_chunk(11, final=True, spec_accept_length=3.2, spec_accept_rate=0.4, spec_verify_ct=3)])
    assert (acc.spec_accept_length, acc.spec_accept_rate, acc.spec_verify_ct) == (3.2, 0.4, 3)
    assert acc.tokens == 11
    # SGLang: only the finished chunk has them
    acc = _feed(dp._Accumulator("generate"), [_gen_chunk(1), _gen_chunk(6),
                                               _gen_chunk(11, final=True, spec_accept_length=3.2)])
    assert acc.spec_accept_length == 3.2
    # only a verify count: accept length = completion tokens / verify steps
    acc = _feed(dp._Accumulator("generate"), [_gen_chunk(1), _gen_chunk(10, final=True, spec_verify_ct=4)])
    assert acc.spec_accept_length == pytest.approx(2.5)
    # no speculative decoding: nothing
    acc = _feed(dp._Accumulator("generate"), [_gen_chunk(1), _gen_chunk(4, final=True)])
    assert acc.spec_accept_length is None and acc.tokens == 4


def test_generate_text_only_chunks_count_tokens_from_the_text():
    acc = dp._Accumulator("generate")
    assert acc.feed({"text": "Hello"}) and acc.tokens == 1
    assert acc.feed({"text": "Hello, world and"}) and acc.tokens == 4
    assert acc.feed({"text": "Hello, world and more."}) and acc.tokens == 6
