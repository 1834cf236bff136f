"""run_probe() against a tiny SGLang-like server on 127.0.0.1."""

import json
import os
import threading

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as dp
from probe_testlib import REPO, good_answer, split_tokens

FAST = dict(stall_timeout=2.0, ttft_timeout=3.0, rate_window_s=1.0, min_tokens_per_s=5.0)


def test_good_fast_server_passes(fake_server):
    srv = fake_server()
    rep = dp.run_probe(srv.url, **FAST)
    assert rep["verdict"] == "pass", rep["reasons"]
    assert rep["passed"] is True
    assert rep["reasons"] == []
    names = [p["name"] for p in rep["prompts"]]
    assert names == ["arith", "capital", "primes", "code", "freeform"]
    arith = rep["prompts"][0]
    assert arith["excerpt"] == "4" and arith["verdict"] == "pass"
    assert arith["finish_reason"] == "stop"
    assert arith["spec_accept_length"] == pytest.approx(3.2)
    assert rep["prompts"][4]["completion_tokens"] > dp.MIN_TOKENS_FOR_RATE
    assert rep["prompts"][4]["tokens_per_s"] > 5.0
    assert rep["prompts"][4]["ttft_s"] is not None
    assert rep["server_info"]["avg_spec_accept_length"] == pytest.approx(3.1)
    assert rep["server_info"]["version"] == "0.5.23"
    assert rep["not_run"] == []
    assert rep["detection_seconds"] < 5
    # The request is what SGLang expects: greedy, no penalties, streaming.
    path, _headers, body = srv.beh.requests[0]
    assert path == "/generate"
    assert body["stream"] is True
    assert body["sampling_params"] == {"temperature": 0, "max_new_tokens": 8,
                                       "repetition_penalty": 1.0, "frequency_penalty": 0.0,
                                       "presence_penalty": 0.0}
    json.dumps(rep)  # serialisable


def test_report_never_contains_server_secret_or_api_key(fake_server):
    srv = fake_server()
    srv.beh.api_key = "sk-TOPSECRET-123"
    rep = dp.run_probe(srv.url, api_key="sk-TOPSECRET-123", **FAST)
    assert rep["verdict"] == "pass", rep["reasons"]
    dumped = json.dumps(rep)
    assert "sk-TOPSECRET-123" not in dumped
    assert "SERVER-SIDE-SECRET" not in dumped       # /server_info's api_key is not copied
    # The key was actually sent.
    assert all(h.get("Authorization") == "Bearer sk-TOPSECRET-123" for _, h, _ in srv.beh.requests)


def test_api_key_missing_is_inconclusive_with_reason(fake_server):
    srv = fake_server()
    srv.beh.api_key = "sk-right"
    rep = dp.run_probe(srv.url, **FAST)
    assert rep["verdict"] == "inconclusive"
    assert "unauthorized" in rep["reasons"][0] and "401" in rep["reasons"][0]
    assert rep["not_run"] == ["capital", "primes", "code", "freeform"]
    rep2 = dp.run_probe(srv.url, api_key="sk-wrong", **FAST)
    assert rep2["verdict"] == "inconclusive"
    assert "sk-wrong" not in json.dumps(rep2)


def test_bang_every_20s_fails_fast(fake_server, timer):
    """The incident: 200 OK, then one "!" every ~20 s (the first one too)."""
    srv = fake_server()
    srv.beh.answer = lambda p: "!" * 8
    srv.beh.first_delay = 20.0
    srv.beh.token_delay = 20.0
    with timer() as t:
        rep = dp.run_probe(srv.url)   # library defaults: stall 5 s, ttft 10 s
    assert t.elapsed < 10.0
    assert 4.5 < rep["detection_seconds"] < 10.0
    assert rep["verdict"] == "fail"
    assert rep["prompts"][0]["reasons"][0].startswith("stall: no token for 5.0 s after the "
                                                      "response headers")
    assert rep["not_run"] == ["capital", "primes", "code", "freeform"]
    assert rep["prompts"][1]["verdict"] == "not_run"


def test_bang_after_first_token_fails_fast(fake_server, timer):
    srv = fake_server()
    srv.beh.answer = lambda p: "!" * 8
    srv.beh.token_delay = 20.0     # first "!" at once, then one every 20 s
    with timer() as t:
        rep = dp.run_probe(srv.url, stall_timeout=2.0, rate_window_s=1.0)
    assert t.elapsed < 4.0
    assert rep["verdict"] == "fail"
    assert rep["prompts"][0]["completion_tokens"] == 1
    # After 1 s of streaming the rate is 0 tokens/s: the rate window ends it first.
    assert rep["prompts"][0]["reasons"][0].startswith("rate_too_low")


def test_slow_trickle_fails_on_rate_window(fake_server, timer):
    srv = fake_server()
    srv.beh.answer = lambda p: "one two three four five six seven eight nine ten " * 3
    srv.beh.token_delay = 1.0   # 1 token/s: never stalls, far below a 10 tok/s floor
    with timer() as t:
        rep = dp.run_probe(srv.url, prompts=[{"prompt": "go", "max_tokens": 40}],
                           min_tokens_per_s=10.0, stall_timeout=5.0, rate_window_s=2.0)
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("prompt1: rate_too_low")
    assert t.elapsed < 5.0


def test_crawl_on_short_answers_fails_on_cumulative_rate(fake_server, timer):
    """Each one-token answer takes 1.2 s: no single prompt looks slow, the sum does."""
    srv = fake_server()
    srv.beh.first_delay = 1.2
    with timer() as t:
        rep = dp.run_probe(srv.url, min_tokens_per_s=5.0, stall_timeout=5.0, ttft_timeout=5.0,
                           rate_window_s=2.0)
    assert rep["verdict"] == "fail"
    assert rep["prompts"][0]["verdict"] == "pass"
    assert rep["reasons"][0].startswith("capital: rate_too_low")
    assert "across prompts" in rep["reasons"][0]
    assert t.elapsed < 3.0


def test_cumulative_rate_not_judged_without_floor(fake_server):
    srv = fake_server()
    srv.beh.first_delay = 0.6
    rep = dp.run_probe(srv.url, prompts=dp.DEFAULT_PROMPTS[:3], min_tokens_per_s=0,
                       rate_window_s=1.0)
    assert rep["verdict"] == "pass", rep["reasons"]


def test_hang_mid_stream_fails_within_stall_timeout(fake_server, timer):
    srv = fake_server()
    srv.beh.mode = "hang"
    srv.beh.hang_after = 3
    with timer() as t:
        rep = dp.run_probe(srv.url, prompts=[{"prompt": "Explain in a few sentences why "
                                              "speculative decoding makes large language model "
                                              "inference faster.", "max_tokens": 96}],
                           stall_timeout=1.5, ttft_timeout=3.0, rate_window_s=10.0)
    assert rep["verdict"] == "fail"
    assert "stall" in rep["reasons"][0]
    assert rep["prompts"][0]["completion_tokens"] == 3
    assert 1.4 < t.elapsed < 1.5 + 1.0


def test_open_stream_without_tokens_stalls(fake_server, timer):
    srv = fake_server()
    srv.beh.mode = "headers_only"
    with timer() as t:
        rep = dp.run_probe(srv.url, stall_timeout=1.0, ttft_timeout=5.0)
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("arith: stall: no token for 1.0 s after the response")
    assert 0.9 < t.elapsed < 2.0


def test_open_stream_without_tokens_hits_ttft_when_shorter(fake_server, timer):
    srv = fake_server()
    srv.beh.mode = "headers_only"
    with timer() as t:
        rep = dp.run_probe(srv.url, stall_timeout=5.0, ttft_timeout=1.5)
    assert rep["reasons"][0].startswith("arith: ttft_timeout: no token within 1.5 s")
    assert 1.4 < t.elapsed < 2.5


def test_no_response_headers_hits_ttft_timeout(fake_server, timer):
    srv = fake_server()
    srv.beh.mode = "silent"
    with timer() as t:
        rep = dp.run_probe(srv.url, stall_timeout=1.0, ttft_timeout=2.0)
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("arith: ttft_timeout: no response headers within 2.0 s")
    assert 1.9 < t.elapsed < 3.0


def test_http_500_fails(fake_server):
    srv = fake_server()
    srv.beh.mode = "http500"
    rep = dp.run_probe(srv.url, **FAST)
    assert rep["verdict"] == "fail"
    assert "HTTP 500" in rep["reasons"][0]
    assert "illegal memory access" in rep["reasons"][0]
    assert rep["prompts"][0]["http_status"] == 500


def test_connection_reset_fails_with_reset_reason(fake_server):
    srv = fake_server()
    srv.beh.mode = "reset"
    rep = dp.run_probe(srv.url, **FAST)
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("arith: connection reset during generation")


def test_wrong_known_answers_fail(fake_server):
    srv = fake_server()
    srv.beh.answer = lambda p: "The answer is 5" if "2 + 2" in p else good_answer(p)
    rep = dp.run_probe(srv.url, **FAST)
    assert rep["verdict"] == "fail"
    assert rep["prompts"][0]["text_verdict"] == "wrong"
    assert rep["reasons"][0].startswith("arith: wrong: expect_mismatch")
    assert len(rep["not_run"]) == 4


def test_degenerate_output_fails(fake_server):
    srv = fake_server()
    srv.beh.answer = lambda p: "!" * 8
    rep = dp.run_probe(srv.url, **FAST)
    assert rep["verdict"] == "fail"
    assert "degenerate: char_run: '!' x 8" in rep["prompts"][0]["reasons"]


def test_token_id_zero_run_in_stream_fails(fake_server):
    """Text that looks fine but output_ids are all 0 (NaN logits) is still caught."""
    srv = fake_server()
    srv.beh.output_ids = lambda n: [0] * n
    rep = dp.run_probe(srv.url, prompts=dp.DEFAULT_PROMPTS[3:4], **FAST)
    assert rep["verdict"] == "fail"
    assert any("token_id_run: id 0" in r for r in rep["reasons"])


def test_incremental_streaming_text_is_reassembled(fake_server):
    srv = fake_server()
    srv.beh.mode = "incremental"
    rep = dp.run_probe(srv.url, **FAST)
    assert rep["verdict"] == "pass", rep["reasons"]
    assert rep["prompts"][2]["excerpt"] == "2, 3, 5, 7, 11"


def test_server_ignoring_stream_flag_still_judged(fake_server):
    srv = fake_server()
    srv.beh.mode = "nonstream"
    rep = dp.run_probe(srv.url, prompts=dp.DEFAULT_PROMPTS[:2], **FAST)
    assert rep["verdict"] == "pass", rep["reasons"]
    assert rep["prompts"][1]["excerpt"] == "Paris."
    srv.beh.answer = lambda p: "London."
    rep = dp.run_probe(srv.url, prompts=dp.DEFAULT_PROMPTS[1:2], **FAST)
    assert rep["verdict"] == "fail"


def test_nothing_listening_is_inconclusive(free_port, timer):
    with timer() as t:
        rep = dp.run_probe("http://127.0.0.1:%d" % free_port, **FAST)
    assert rep["verdict"] == "inconclusive"
    assert "unreachable" in rep["reasons"][0] and "refused" in rep["reasons"][0]
    assert rep["server_info"] is None
    assert t.elapsed < 2


def test_server_dies_between_prompts_is_fail(fake_server, monkeypatch):
    srv = fake_server()
    real = dp.probe_prompt
    calls = []

    def probe_then_kill(*a, **kw):
        res = real(*a, **kw)
        calls.append(res["name"])
        if len(calls) == 1:
            srv.close()          # the listener is gone before the second prompt
        return res

    monkeypatch.setattr(dp, "probe_prompt", probe_then_kill)
    rep = dp.run_probe(srv.url, **FAST)
    assert rep["prompts"][0]["verdict"] == "pass"
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("capital: server_went_away")
    assert rep["not_run"] == ["primes", "code", "freeform"]


def test_stream_cut_mid_body_is_fail(fake_server):
    srv = fake_server()
    srv.beh.token_delay = 0.05

    def answer(p):
        threading.Timer(0.2, srv.beh.stop.set).start()   # handler returns mid-stream
        return "word " * 60

    srv.beh.answer = answer
    rep = dp.run_probe(srv.url, prompts=[{"prompt": "x", "max_tokens": 60}], **FAST)
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("prompt1: connection_closed")


def test_completions_endpoint(fake_server):
    srv = fake_server()
    rep = dp.run_probe(srv.url, endpoint="completions", **FAST)
    assert rep["verdict"] == "pass", rep["reasons"]
    assert rep["model"] == "test-model"
    post = [r for r in srv.beh.requests if r[0] == "/v1/completions"][0]
    assert post[2]["model"] == "test-model" and post[2]["stream"] is True
    assert rep["prompts"][1]["excerpt"] == "Paris."
    assert rep["prompts"][4]["completion_tokens"] >= dp.MIN_TOKENS_FOR_RATE


def test_min_accept_length(fake_server):
    srv = fake_server()
    srv.beh.spec_accept_length = 1.01
    rep = dp.run_probe(srv.url, min_accept_length=1.5, **FAST)
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("accept_length_low: 1.01")
    srv.beh.spec_accept_length = 2.5
    assert dp.run_probe(srv.url, min_accept_length=1.5, **FAST)["verdict"] == "pass"


def _fluent_but_different(cand):
    """The candidate answers the known-answer prompts right but writes another paragraph."""
    prose = good_answer("Explain in a few sentences why speculative decoding makes large "
                        "language model inference faster.")
    changed = prose.replace("single forward pass", "single batched pass")
    cand.beh.answer = lambda p: changed if p.startswith("Explain") else good_answer(p)
    return prose


def test_fluent_but_different_candidate_fails_with_both_continuations(fake_server):
    base = fake_server()
    cand = fake_server()
    prose = _fluent_but_different(cand)
    baseline = dp.run_probe(base.url, **FAST)
    assert all(p.get("top_margins") for p in baseline["prompts"])   # logprobs were asked for
    assert base.beh.requests[0][2]["return_logprob"] is True
    assert base.beh.requests[0][2]["top_logprobs_num"] == dp.DEFAULT_TOP_LOGPROBS
    rep = dp.run_probe(cand.url, baseline=baseline, **FAST)
    assert rep["verdict"] == "fail"
    assert [r.split(":")[0] for r in rep["reasons"]] == ["lossless_violation"]
    assert "freeform: diverges from the baseline at token" in rep["reasons"][0]
    assert "confident (top-2 margin 5 >= 0.5 nats)" in rep["reasons"][0]
    entries = {e["name"]: e for e in rep["baseline"]["prompts"]}
    assert entries["arith"]["identical"] is True
    assert entries["arith"]["agreement"]["status"] == "identical"
    div = entries["freeform"]["first_divergence"]
    assert div["index"] == prose.index("single forward pass") + len("single ")
    assert "forward" in div["baseline"] and "forward" not in div["candidate"]
    assert "batched" in div["candidate"]
    agree = entries["freeform"]["agreement"]
    assert agree["status"] == "violation" and agree["basis"] == "token_ids"
    assert agree["baseline_continuation"].startswith("forward pass")
    assert agree["candidate_continuation"].startswith("batched pass")
    assert agree["baseline_margin"] == 5.0
    assert agree["baseline_token_id"] != agree["candidate_token_id"]
    assert rep["baseline"]["speed_ratio"] is not None


def test_divergence_at_a_near_tie_of_the_baseline_passes_with_a_warning(fake_server):
    base = fake_server()
    cand = fake_server()
    prose = _fluent_but_different(cand)
    # The first token that differs: the one holding the "f" of "forward".
    at = len(split_tokens(prose[:prose.index("single forward pass") + len("single f")])) - 1
    base.beh.margin = lambda prompt, i: 0.05 if i == at else 5.0
    baseline = dp.run_probe(base.url, **FAST)
    rep = dp.run_probe(cand.url, baseline=baseline, **FAST)
    assert rep["verdict"] == "pass", rep["reasons"]
    agree = {e["name"]: e for e in rep["baseline"]["prompts"]}["freeform"]["agreement"]
    assert agree["status"] == "near_tie" and agree["token_index"] == at
    assert any(w.startswith("near_tie: freeform: diverges") for w in rep["warnings"])
    # The same divergence where the baseline was confident fails; in warn mode it only warns.
    base.beh.margin = lambda prompt, i: 5.0
    baseline = dp.run_probe(base.url, **FAST)
    assert dp.run_probe(cand.url, baseline=baseline, **FAST)["verdict"] == "fail"
    warned = dp.run_probe(cand.url, baseline=baseline, agreement="warn", **FAST)
    assert warned["verdict"] == "pass"
    assert any(w.startswith("lossless_violation: freeform") for w in warned["warnings"])


def test_without_logprobs_a_divergence_counts_as_confident(fake_server):
    base = fake_server()
    cand = fake_server()
    _fluent_but_different(cand)
    base.beh.margin = lambda prompt, i: 0.01      # would be a near tie ...
    baseline = dp.run_probe(base.url, top_logprobs=0, **FAST)   # ... but was not asked for
    assert "return_logprob" not in base.beh.requests[0][2]
    assert not any(p.get("top_margins") for p in baseline["prompts"])
    rep = dp.run_probe(cand.url, baseline=baseline, **FAST)
    assert rep["verdict"] == "fail"
    assert "top-2 margin there is unknown" in rep["reasons"][0]


def test_baseline_known_answer_still_checked(fake_server):
    base = fake_server()
    cand = fake_server()
    cand.beh.answer = lambda p: "Lyon." if "France" in p else good_answer(p)
    baseline = dp.run_probe(base.url, **FAST)
    rep = dp.run_probe(cand.url, baseline=baseline, **FAST)
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("capital: wrong")


def test_speed_ratio_below_floor_fails(fake_server):
    base = fake_server()
    cand = fake_server()
    base.beh.token_delay = 0.002
    cand.beh.token_delay = 0.03   # ~15x slower, still above the absolute floor
    prompts = [{"name": "freeform", "prompt": "Explain in a few sentences why speculative "
                "decoding makes large language model inference faster.", "max_tokens": 96}]
    baseline = dp.run_probe(base.url, prompts=prompts, **FAST)
    rep = dp.run_probe(cand.url, prompts=prompts, baseline=baseline, min_speed_ratio=0.5, **FAST)
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("speed_ratio:")
    assert rep["baseline"]["speed_ratio"] < 0.5
    # The same numbers pass when the floor is lenient.
    ok = dp.compare_with_baseline(rep["prompts"], baseline, min_speed_ratio=0.01)
    assert ok[1] == []


def test_failed_baseline_only_warns():
    baseline = {"verdict": "fail", "prompts": []}
    section, fails, inconcl, warns = dp.compare_with_baseline(
        [{"name": "a", "prompt": "x", "verdict": "pass", "output": "y"}], baseline, 0.5)
    assert fails == [] and inconcl == []
    assert warns and warns[0].startswith("baseline_not_passing")


def test_first_divergence_helper():
    assert dp.first_divergence("abc", "abc") is None
    d = dp.first_divergence("hello world", "hello there")
    assert d["index"] == 6 and d["baseline"].endswith("world") and d["candidate"].endswith("there")
    assert dp.first_divergence("abc", "abcdef")["index"] == 3


def test_default_prompts_constant_matches_role_file():
    path = os.path.join(REPO, "roles", "quality_gate", "files", "default_prompts.json")
    with open(path) as fh:
        assert json.load(fh) == dp.DEFAULT_PROMPTS


@pytest.mark.parametrize("bad", [[], [{"x": 1}], [{"prompt": "a", "expect": "("}],
                                 [{"prompt": "a", "max_tokens": 0}], "nope"])
def test_bad_prompts_raise(bad):
    with pytest.raises(dp.ProbeError):
        dp.normalise_prompts(bad)


def test_bad_arguments_raise():
    with pytest.raises(dp.ProbeError):
        dp.run_probe("ftp://x", prompts=[{"prompt": "a"}])
    with pytest.raises(dp.ProbeError):
        dp.run_probe("http://127.0.0.1:1", endpoint="chat")
    with pytest.raises(dp.ProbeError):
        dp.run_probe("http://127.0.0.1:1", stall_timeout=0)


def test_url_credentials_redacted(free_port):
    rep = dp.run_probe("http://user:pw@127.0.0.1:%d" % free_port, **FAST)
    assert "pw" not in rep["url"] and rep["url"].endswith(str(free_port))


def test_one_answer_for_different_prompts_fails(fake_server):
    srv = fake_server()
    srv.beh.answer = lambda p: ("A server that ignores its prompt gives every request this one "
                                "well-formed paragraph.")
    prompts = [{"name": "cats", "prompt": "Tell me about cats."},
               {"name": "dogs", "prompt": "Tell me about dogs."}]
    rep = dp.run_probe(srv.url, prompts=prompts, **FAST)
    assert rep["verdict"] == "fail"
    assert rep["reasons"][0].startswith("same_output: cats, dogs")
    srv.beh.answer = lambda p: "Cats purr and nap." if "cats" in p else "Dogs bark and fetch."
    assert dp.run_probe(srv.url, prompts=prompts, **FAST)["verdict"] == "pass"
