"""The stand-in end to end on 127.0.0.1: start-up, endpoints, auth, streaming, physics, faults."""

import json
import math
import signal
import statistics
import threading
import time

import pytest
import requests

from standin_testlib import port_open, wait_for

KNOWN = {
    "What is 2 + 2? Answer with a number only.": "4",
    "What is the capital of France? Answer in one word.": "Paris.",
    "The capital city of France is": " Paris.",
    "List the first five prime numbers, separated by commas.": "2, 3, 5, 7, 11",
}
KEY = "lab-secret-key-123"


def sse_events(resp):
    out = []
    for line in resp.iter_lines(decode_unicode=True):
        if line:
            assert line.startswith("data: "), line
            out.append(line[len("data: "):])
    return out


@pytest.fixture
def nextn(launch):
    s = launch(["--speculative-algorithm", "NEXTN", "--enable-metrics", "--served-model-name", "lab27"],
               api_key=KEY)
    return s.wait_ready()


def test_startup_port_closed_then_503_then_200(launch):
    s = launch(["--speculative-algorithm", "DFLASH"], startup=1.2, warmup=1.0)
    wait_for(lambda: "Load weight begin" in s.log, 5)
    assert not port_open(s.port)
    wait_for(lambda: port_open(s.port), 5)
    for path in ("/health", "/health_generate", "/ready"):
        assert requests.get(s.base + path, timeout=2).status_code == 503
    s.wait_ready(5)
    for path in ("/health", "/health_generate", "/ready"):
        assert requests.get(s.base + path, timeout=2).status_code == 200
    log = s.log
    order = ["server_args={'model_path': '/models/lab-27b'", "Load weight begin. avail mem=",
             "Load weight end.", "Capture cuda graph begin. This can take up to several minutes.",
             "Capture cuda graph end.", f"INFO:     Uvicorn running on http://127.0.0.1:{s.port} (Press CTRL+C to quit)",
             "The server is fired up and ready to roll!"]
    positions = [log.index(m) for m in order]
    assert positions == sorted(positions)


def test_no_cuda_graph_lines_when_disabled(launch):
    s = launch(["--cuda-graph-backend-decode", "disabled"]).wait_ready()
    assert "Capture cuda graph begin" not in s.log and "Load weight end" in s.log


def test_auth_and_endpoint_shapes(nextn):
    s, h = nextn, nextn.headers()
    # API key: health/ready/metrics exempt, everything else needs the bearer token
    for path in ("/health", "/health_generate", "/ready", "/metrics"):
        assert requests.get(s.base + path, timeout=2).status_code == 200
    for path in ("/model_info", "/server_info", "/v1/models", "/get_model_info"):
        assert requests.get(s.base + path, timeout=2).status_code == 401
        assert requests.get(s.base + path, headers={"Authorization": "Bearer wrong"}, timeout=2).status_code == 401
    r = requests.post(s.base + "/generate", json={"text": "hi"}, timeout=5)
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}

    for path in ("/model_info", "/get_model_info"):
        mi = requests.get(s.base + path, headers=h, timeout=2).json()
        assert mi["model_path"] == "/models/lab-27b" and mi["is_generation"] is True
    for path in ("/server_info", "/get_server_info"):
        si = requests.get(s.base + path, headers=h, timeout=2).json()
        assert si["version"] == "0.5.23"
        assert si["speculative_algorithm"] == "NEXTN" and si["tp_size"] == 1
        # as the real /server_info: the key in clear for whoever holds it, in two places
        assert si["api_key"] == KEY and f"--api-key {KEY}" in si["launch_command"]
        assert si["launch_command"].startswith("--model-path /models/lab-27b")
        st = si["internal_states"][0]
        assert st["avg_spec_accept_length"] == pytest.approx(3.1)
        assert st["last_gen_throughput"] > 0 and "weight" in st["memory_usage"]
    models = requests.get(s.base + "/v1/models", headers=h, timeout=2).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "lab27"
    assert requests.get(s.base + "/nope", headers=h, timeout=2).status_code == 404
    # Like sglang, only the engine's start-up line of all arguments holds the key (test_logconfig.py).
    assert [line for line in s.log.splitlines() if KEY in line] == [
        line for line in s.log.splitlines() if "] server_args={" in line]


def test_generate_shape_and_known_answers(nextn):
    s, h = nextn, nextn.headers()
    for prompt, answer in KNOWN.items():
        r = requests.post(s.base + "/generate", headers=h, timeout=10,
                          json={"text": prompt, "sampling_params": {"max_new_tokens": 32, "temperature": 0}})
        body = r.json()
        assert r.status_code == 200 and body["text"] == answer
        assert len(body["output_ids"]) == body["meta_info"]["completion_tokens"] > 0
        assert all(i > 0 for i in body["output_ids"])
        m = body["meta_info"]
        assert m["finish_reason"]["type"] == "stop"
        for k in ("id", "prompt_tokens", "cached_tokens", "e2e_latency", "spec_accept_rate",
                  "spec_accept_length", "spec_verify_ct"):
            assert k in m
    r = requests.post(s.base + "/generate", headers=h, timeout=10,
                      json={"text": "Explain why servers need health checks.", "sampling_params": {"max_new_tokens": 6}})
    assert r.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    again = requests.post(s.base + "/generate", headers=h, timeout=10,
                          json={"text": "Explain why servers need health checks.", "sampling_params": {"max_new_tokens": 6}})
    assert again.json()["text"] == r.json()["text"] and again.json()["output_ids"] == r.json()["output_ids"]


def test_generate_streaming(nextn):
    s = nextn
    with requests.post(s.base + "/generate", headers=s.headers(), stream=True, timeout=10,
                       json={"text": "List the first five prime numbers, separated by commas.", "stream": True,
                             "sampling_params": {"max_new_tokens": 64}}) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert texts[-1] == "2, 3, 5, 7, 11"
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))  # cumulative
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "stop"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    # One event per scheduler step: the prefill token, then NEXTN verify steps of ~3.1 tokens.
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == [len(c["output_ids"]) for c in chunks] and counts == sorted(set(counts))
    assert all(chunks[i + 1]["output_ids"][:len(chunks[i]["output_ids"])] == chunks[i]["output_ids"]
               for i in range(len(chunks) - 1))
    steps = [b - a for a, b in zip([0] + counts, counts)]
    assert steps[0] == 1 and all(k in (3, 4) for k in steps[1:-1]) and 1 <= steps[-1] <= 4, steps
    # spec_* only in the finished chunk; num_retractions and reasoning_tokens always.
    spec = ("spec_accept_rate", "spec_accept_length", "spec_verify_ct", "spec_num_correct_drafts",
            "spec_num_proposed_drafts")
    assert all(k not in c["meta_info"] for c in chunks[:-1] for k in spec)
    last = chunks[-1]["meta_info"]
    assert all(k in last for k in spec) and last["spec_accept_length"] == pytest.approx(3.1)
    assert last["spec_num_proposed_drafts"] == last["spec_verify_ct"] * 3     # NEXTN: 4 draft tokens
    assert all(c["meta_info"]["num_retractions"] == 0 and c["meta_info"]["reasoning_tokens"] == 0
               for c in chunks)


def _stream_steps(s, text, max_new):
    with requests.post(s.base + "/generate", headers=s.headers(), stream=True, timeout=30,
                       json={"text": text, "stream": True,
                             "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}}) as r:
        t0 = time.monotonic()
        events = []
        for line in r.iter_lines(decode_unicode=True):
            if line and line != "data: [DONE]":
                events.append((time.monotonic() - t0, json.loads(line[len("data: "):])))
    counts = [e["meta_info"]["completion_tokens"] for _, e in events]
    return [t for t, _ in events], counts


@pytest.mark.parametrize("algo, accept, rate", [(None, None, 46.0), ("DDTREE", 5.2, 120 * 1.24)])
def test_stream_granularity_and_pacing(launch, algo, accept, rate):
    """NONE: one token per event; DDTREE (sm120): ~5.2 tokens per verify step; tokens/s unchanged."""
    scale = 0.5
    s = launch(["--speculative-algorithm", algo] if algo else [],
               env={"DDTREE_LAB_RATE_SCALE": str(scale)}).wait_ready()
    times, counts = _stream_steps(s, FREEFORM, 60)
    assert counts[-1] == 60
    steps = [b - a for a, b in zip([0] + counts, counts)]
    if accept is None:
        assert steps == [1] * 60
    else:
        assert steps[0] == 1 and set(steps[1:-1]) <= {5, 6}
        assert (counts[-2] - 1) / (len(counts) - 2) == pytest.approx(accept, abs=0.3)
    measured = (counts[-1] - counts[0]) / (times[-1] - times[0])
    assert measured == pytest.approx(rate * scale, rel=0.2), (measured, steps)


def _stream_rate(s, text, max_new=30):
    times, counts = _stream_steps(s, text, max_new)
    return (counts[-1] - counts[0]) / (times[-1] - times[0])


def test_noise_cold_requests_then_jitter(launch):
    """The first DDTREE_LAB_COLD_REQUESTS client generations run at the cold factor; later ones
    scatter around the physics' rate with the configured log-normal sigma (docs/lab-physics.md)."""
    s = launch([], env={"DDTREE_LAB_RATE_SCALE": "2", "DDTREE_LAB_COLD_REQUESTS": "2",
                        "DDTREE_LAB_COLD_FACTOR": "0.5", "DDTREE_LAB_RATE_JITTER": "0.2",
                        "DDTREE_LAB_NOISE_SEED": "7"}).wait_ready()
    rates = [_stream_rate(s, f"[{i}] {FREEFORM}") for i in range(10)]
    cold, warm = rates[:2], rates[2:]
    assert max(cold) < 0.75 * statistics.median(warm), rates
    spread = statistics.pstdev([math.log(r) for r in warm])
    assert 0.05 < spread < 0.45, (spread, rates)        # sigma 0.2, 8 draws
    assert statistics.median(warm) == pytest.approx(92.0, rel=0.25), rates   # 46 x 2


def test_noise_off_is_exact(launch):
    """With jitter and cold requests off, every request runs at the same rate."""
    s = launch([], env={"DDTREE_LAB_RATE_SCALE": "2"}).wait_ready()
    rates = [_stream_rate(s, f"[{i}] {FREEFORM}") for i in range(4)]
    assert max(rates) / min(rates) < 1.1, rates


def test_noise_settings_are_checked():
    from sglang_lab_standin.faults import load_config
    with pytest.raises(ValueError, match="DDTREE_LAB_RATE_JITTER"):
        load_config({"DDTREE_LAB_RATE_JITTER": "-0.1"})
    with pytest.raises(ValueError, match="DDTREE_LAB_COLD_FACTOR"):
        load_config({"DDTREE_LAB_COLD_FACTOR": "0"})
    c = load_config({})
    assert (c.rate_jitter, c.cold_requests, c.cold_factor) == (0.03, 3, 0.75)


def test_openai_endpoints(nextn):
    s, h = nextn, nextn.headers()
    c = requests.post(s.base + "/v1/completions", headers=h, timeout=10,
                      json={"model": "lab27", "prompt": "What is 2 + 2? Answer with a number only.", "max_tokens": 8}).json()
    assert c["object"] == "text_completion" and c["choices"][0]["text"] == "4"
    assert c["choices"][0]["finish_reason"] == "stop"
    assert c["usage"]["completion_tokens"] == 1 and c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + 1
    chat = requests.post(s.base + "/v1/chat/completions", headers=h, timeout=10, json={
        "model": "lab27", "messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        "max_tokens": 16}).json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "Paris.", "reasoning_content": None,
                                             "tool_calls": None}
    assert chat["usage"]["completion_tokens"] == 2
    with requests.post(s.base + "/v1/chat/completions", headers=h, stream=True, timeout=10, json={
            "model": "lab27", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "List the first five prime numbers, separated by commas."}]}) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    assert text == "2, 3, 5, 7, 11"
    # usage counts tokens (9: "2", ",", " 3", ...), the stream has one chunk per step (fewer)
    content_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert chunks[-1]["usage"]["completion_tokens"] == 9 > len(content_chunks) >= 3
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-2]["choices"][0]["delta"] == {}
    assert len({c["id"] for c in chunks}) == 1 and len(chunks[0]["id"]) == 32   # the request id
    with requests.post(s.base + "/v1/completions", headers=h, stream=True, timeout=10, json={
            "model": "lab27", "stream": True, "prompt": "Tell me something.", "max_tokens": 4}) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    with requests.post(s.base + "/v1/completions", headers=h, stream=True, timeout=10, json={
            "model": "lab27", "stream": True, "prompt": "Tell me something.", "max_tokens": 12,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as r:
        chunks = [json.loads(e) for e in sse_events(r)[:-1]]
    steps = [c for c in chunks if c["choices"]]
    # the finish reason rides on the last step's chunk, every chunk has the running token count
    assert [c["choices"][0]["finish_reason"] for c in steps] == [None] * (len(steps) - 1) + ["length"]
    assert [c["usage"]["completion_tokens"] for c in steps][0] == 1
    assert steps[-1]["usage"]["completion_tokens"] == chunks[-1]["usage"]["completion_tokens"] == 12
    assert len(steps) < 12


def test_metrics(nextn):
    s = nextn
    requests.post(s.base + "/generate", headers=s.headers(), timeout=10, json={"text": "Hello"})
    text = requests.get(s.base + "/metrics", timeout=2).text
    for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:gen_throughput",
                 "sglang:num_running_reqs", "sglang:num_queue_reqs"):
        assert f"# TYPE {name} gauge" in text
    line = next(l for l in text.splitlines() if l.startswith("sglang:spec_accept_length{"))
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(3.1)


def test_no_metrics_without_flag_and_no_spec_fields(launch):
    s = launch().wait_ready()
    assert requests.get(s.base + "/metrics", timeout=2).status_code == 404
    m = requests.post(s.base + "/generate", json={"text": "Hello"}, timeout=10).json()["meta_info"]
    assert "spec_accept_length" not in m
    assert requests.get(s.base + "/v1/models", timeout=2).status_code == 200  # no api key -> open


def test_sigterm_exits_zero(launch):
    s = launch().wait_ready()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=3) == 0


def test_oom_exits_before_port_opens(launch):
    s = launch(["--tp-size", "2", "--mem-fraction-static", "0.95"], gpus="a6000x2", startup=0.3)
    seen_open = False
    while s.proc.poll() is None:
        seen_open = seen_open or port_open(s.port)
        time.sleep(0.02)
    assert s.proc.returncode == 1 and not seen_open
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in s.log
    assert "GPU 0 has a total capacity of 47.99 GiB" in s.log
    assert "Uvicorn running" not in s.log


def test_tp_too_large_exits(launch):
    s = launch(["--tp-size", "4", "--mem-fraction-static", "0.85"], gpus="a6000x2")
    assert s.proc.wait(timeout=10) == 1
    assert "invalid device ordinal" in s.log and "Uvicorn running" not in s.log


def test_bad_flag_exits_2(launch):
    s = launch(["--cuda-graph-max-bs", "48"])
    assert s.proc.wait(timeout=10) == 2
    assert "ambiguous option: --cuda-graph-max-bs" in s.log


def test_unknown_ddtree_aborts_before_weights(launch):
    s = launch(["--speculative-algorithm", "DDTREE"], source="unpatched")
    assert s.proc.wait(timeout=10) == 1
    assert s.log.rstrip().endswith("ValueError: Unknown speculative algorithm name: DDTREE")
    assert "Traceback (most recent call last):" in s.log and "Load weight begin" not in s.log


BUDGET_FLAG = "--speculative-ddtree-budget"


def test_ddtree_budget_is_an_unknown_flag_without_the_worker_patch(launch):
    """0001-0003 define no speculative_ddtree_budget: the real parser exits 2 on the flag."""
    s = launch(["--speculative-algorithm", "DDTREE", BUDGET_FLAG, "24"], source="ddtree_full")
    assert s.proc.wait(timeout=10) == 2
    assert f"launch_server.py: error: unrecognized arguments: {BUDGET_FLAG} 24" in s.log
    assert "Load weight begin" not in s.log


def test_ddtree_worker_refuses_a_chain_only_backend_once_the_target_is_up(launch):
    s = launch(["--speculative-algorithm", "DDTREE", "--attention-backend", "trtllm_mha"], source="ddtree_worker")
    assert s.proc.wait(timeout=10) == 1
    assert ("ValueError: DDTREE cannot run with target attention backend TRTLLMHAAttnBackend "
            "(needs --attention-backend flashinfer or triton).") in s.log
    assert "Load weight end" in s.log and "KV Cache is allocated" in s.log and "Uvicorn running" not in s.log


def test_ddtree_budget_accepted_with_the_worker_patch(launch):
    s = launch(["--speculative-algorithm", "DDTREE", BUDGET_FLAG, "24"], source="ddtree_worker").wait_ready()
    info = requests.get(s.base + "/server_info", timeout=5).json()
    assert info["speculative_ddtree_budget"] == 24 and info["speculative_algorithm"] == "DDTREE"
    assert "has no effect" not in s.log


@pytest.mark.parametrize("extra,message", [
    ([BUDGET_FLAG, "1024"], "sglang.srt.speculative.ddtree_tree.DDTreeError: --speculative-ddtree-budget must be"
                            " between 1 and 1023 (draft nodes per tree, root excluded; the verify width is"
                            " budget + 1), got 1024"),
    (["--page-size", "16"], "ValueError: DDTREE requires --page-size 1 (the accepted tree path is compacted token"
                            " by token), got 16."),
    (["--speculative-use-rejection-sampling"], "ValueError: DDTREE does not support"
                                               " --speculative-use-rejection-sampling: the tree is built from the"
                                               " draft's top-k log-probabilities, so there is no draft distribution"
                                               " per verify node."),
])
def test_ddtree_worker_refuses_bad_settings_before_weights(launch, extra, message):
    s = launch(["--speculative-algorithm", "DDTREE", *extra], source="ddtree_worker")
    assert s.proc.wait(timeout=10) == 1
    assert s.log.rstrip().endswith(message)
    assert "Traceback (most recent call last):" in s.log and "Load weight begin" not in s.log
    assert not port_open(s.port)


def test_ddtree_budget_with_another_algorithm_is_a_warning(launch):
    s = launch(["--speculative-algorithm", "NEXTN", BUDGET_FLAG, "24"], source="ddtree_worker").wait_ready()
    assert ("--speculative-ddtree-budget has no effect with speculative_algorithm=EAGLE"
            " (honored by DDTREE only).") in s.log  # the resolved name: NEXTN is an alias of EAGLE


def test_dim_mismatch_kills_process_during_warmup(launch):
    """Half-patched DDTREE dies on its first generation: the server's own warm-up request, so the
    port opens, /health says 503 (starting), and the process exits 1 without ever being healthy."""
    s = launch(["--speculative-algorithm", "DDTREE"], source="ddtree_known", warmup=0.6)
    wait_for(lambda: port_open(s.port), 5)
    assert requests.get(s.base + "/health", timeout=2).status_code == 503
    assert s.proc.wait(timeout=5) == 1
    assert ("ValueError: DFLASH target_hidden feature dim mismatch. Expected shape [N, 25600] "
            "(num_context_features=5, hidden_size=5120), but got shape=(6, 5120).") in s.log
    assert "models/dflash.py" in s.log and "Scheduler hit an exception" in s.log
    assert "arg_groups/kv_cache_hook.py" in s.log     # which files lack DDTREE
    assert "fired up" not in s.log and 'POST /generate HTTP/1.1" 200' not in s.log
    assert not port_open(s.port)


def test_dim_mismatch_with_skipped_warmup_dies_on_first_request(launch):
    s = launch(["--speculative-algorithm", "DDTREE", "--skip-server-warmup"], source="ddtree_known").wait_ready()
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(s.base + "/generate", timeout=10, json={"text": "What is 2 + 2?"})
    assert s.proc.wait(timeout=5) == 1 and "feature dim mismatch" in s.log


def test_sm86_ddtree_patched_emits_bang(launch):
    s = launch(["--speculative-algorithm", "DDTREE", "--tp-size", "2", "--mem-fraction-static", "0.85",
                "--enable-metrics"], gpus="a6000x2", source="ddtree_full",
               env={"DDTREE_LAB_RATE_SCALE": "300"}).wait_ready()
    assert requests.get(s.base + "/health", timeout=2).status_code == 200
    t0 = time.monotonic()
    body = requests.post(s.base + "/generate", timeout=20, json={
        "text": "What is 2 + 2? Answer with a number only.", "sampling_params": {"max_new_tokens": 6}}).json()
    elapsed = time.monotonic() - t0
    assert body["text"] == "!!!!!!" and body["output_ids"] == [0] * 6
    assert body["meta_info"]["finish_reason"]["type"] == "length"
    # Paced at the broken rate in verify-step bursts of 4: tokens 0-3 at once, 4-5 one step later.
    assert elapsed >= 4 / (0.057 * 300) * 0.9
    assert elapsed < 8 / (0.057 * 300)


def test_sm120_ddtree_patched_correct_and_paced(launch):
    s = launch(["--speculative-algorithm", "DDTREE"], source="ddtree_full",
               env={"DDTREE_LAB_RATE_SCALE": "0.25"}).wait_ready()
    rate = 120 * 1.24 * 0.25
    t0 = time.monotonic()
    body = requests.post(s.base + "/generate", timeout=20, json={
        "text": "Write a Python function named square that returns the square of its argument.",
        "sampling_params": {"max_new_tokens": 12}}).json()
    elapsed = time.monotonic() - t0
    assert body["text"].startswith("```python\ndef square")
    # the prefill token, then 3 verify steps (5 + 5 + 1 of 12 tokens), each worth 5.2 tokens of time
    assert elapsed >= 3 * 5.2 / rate * 0.9
    m = body["meta_info"]
    assert m["spec_accept_length"] == pytest.approx(5.2) and m["spec_accept_rate"] == pytest.approx(0.27)
    assert m["spec_verify_ct"] == 3 and m["num_retractions"] == 0 and m["reasoning_tokens"] == 0


def test_max_running_requests_queues(launch):
    s = launch(["--max-running-requests", "1", "--enable-metrics"],
               env={"DDTREE_LAB_RATE_SCALE": str(20 / 46)}).wait_ready()   # NONE on sm120: 46 tok/s -> 20
    results = []

    def go():
        t0 = time.monotonic()
        requests.post(s.base + "/generate", timeout=20, json={"text": "Tell me about queues.",
                                                              "sampling_params": {"max_new_tokens": 8}})
        results.append(time.monotonic() - t0)
    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.15)
    metrics = requests.get(s.base + "/metrics", timeout=2).text
    for t in threads:
        t.join()
    assert "sglang:num_queue_reqs{" in metrics and any(
        l.startswith("sglang:num_queue_reqs{") and l.endswith(" 1.0") for l in metrics.splitlines())
    assert max(results) >= 2 * 8 / 20 * 0.9


# ---- fault switches ---------------------------------------------------------------------------

def test_fault_http_500(launch):
    s = launch(env={"DDTREE_LAB_FAULT": "http_500"}).wait_ready()
    assert requests.post(s.base + "/generate", json={"text": "x"}, timeout=5).status_code == 500
    assert requests.post(s.base + "/v1/completions", json={"prompt": "x"}, timeout=5).status_code == 500
    assert requests.get(s.base + "/health", timeout=2).status_code == 200


def test_fault_hang_midstream(launch):
    s = launch(env={"DDTREE_LAB_FAULT": "hang_midstream"}).wait_ready()
    got = []
    with pytest.raises(requests.exceptions.ConnectionError):  # read timeout surfaces as ConnectionError
        with requests.post(s.base + "/generate", stream=True, timeout=(2, 1.0),
                           json={"text": "Tell me a story.", "stream": True,
                                 "sampling_params": {"max_new_tokens": 20}}) as r:
            for line in r.iter_lines():
                if line:
                    got.append(line)
    assert 1 <= len(got) <= 3 and b"[DONE]" not in b"".join(got)
    assert s.proc.poll() is None
    # A stuck scheduler: /health answers 503 only after SGLANG_HEALTH_CHECK_TIMEOUT (20 s here).
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(s.base + "/health", timeout=1.5)


def test_fault_hang_midstream_health_times_out_to_503(launch):
    s = launch(["--speculative-algorithm", "NEXTN"],
               env={"DDTREE_LAB_FAULT": "hang_midstream", "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}).wait_ready()
    counts = []
    with pytest.raises(requests.exceptions.ConnectionError):
        with requests.post(s.base + "/generate", stream=True, timeout=(2, 1.0),
                           json={"text": "Tell me a story.", "stream": True,
                                 "sampling_params": {"max_new_tokens": 20}}) as r:
            for line in r.iter_lines(decode_unicode=True):
                if line:
                    counts.append(json.loads(line[len("data: "):])["meta_info"]["completion_tokens"])
    assert counts == [1, 3]          # the prefill token, then a verify step cut at the hang
    t0 = time.monotonic()
    assert requests.get(s.base + "/health", timeout=5).status_code == 503
    assert time.monotonic() - t0 >= 0.9


def test_fault_crash_on_first_request(launch):
    s = launch(env={"DDTREE_LAB_FAULT": "crash_on_first_request"}).wait_ready()
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(s.base + "/generate", json={"text": "x"}, timeout=5)
    assert s.proc.wait(timeout=5) != 0


def test_fault_garbage_fast(launch):
    s = launch(env={"DDTREE_LAB_FAULT": "garbage_fast"}).wait_ready()
    body = requests.post(s.base + "/generate", timeout=10, json={
        "text": "What is 2 + 2? Answer with a number only.", "sampling_params": {"max_new_tokens": 40}}).json()
    assert body["text"] != "4" and len(body["output_ids"]) == 40
    assert body["meta_info"]["e2e_latency"] < 1.0


def test_fault_slow_text(launch):
    s = launch(env={"DDTREE_LAB_FAULT": "slow_text", "DDTREE_LAB_RATE_SCALE": "10"}).wait_ready()
    t0 = time.monotonic()
    body = requests.post(s.base + "/generate", timeout=10, json={
        "text": "What is the capital of France? Answer in one word."}).json()
    # the first token after the prefill, the second one step (1 / 5 s) later
    assert body["text"] == "Paris." and time.monotonic() - t0 >= 1 / 5 * 0.9


def test_fault_unhealthy_after(launch):
    s = launch(env={"DDTREE_LAB_FAULT": "unhealthy_after:0.6", "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}).wait_ready()
    assert requests.get(s.base + "/ready", timeout=2).status_code == 200
    time.sleep(0.7)
    # The scheduler no longer answers: /health waits out SGLANG_HEALTH_CHECK_TIMEOUT, then 503,
    # and from then on /ready says 503 too.
    t0 = time.monotonic()
    assert requests.get(s.base + "/health", timeout=5).status_code == 503
    assert 0.9 <= time.monotonic() - t0 < 3
    assert "Health check failed. Server couldn't get a response from detokenizer" in s.log
    assert requests.get(s.base + "/ready", timeout=2).status_code == 503
    assert requests.post(s.base + "/generate", json={"text": "x"}, timeout=5).status_code >= 500


def test_health_and_ready_like_the_real_server(launch):
    """GET only; 503 at once while starting; when up, a health generation checked after 1 s."""
    s = launch(["--speculative-algorithm", "NEXTN"], warmup=0.8,
               env={"DDTREE_LAB_HEALTH_WAIT_SECONDS": "1.0"})
    wait_for(lambda: port_open(s.port), 5)
    t0 = time.monotonic()
    r = requests.get(s.base + "/health", timeout=2)
    assert r.status_code == 503 and time.monotonic() - t0 < 0.5          # starting: no wait
    r = requests.get(s.base + "/ready", timeout=2)
    assert r.status_code == 503 and r.content == b""
    s.wait_ready(10)
    for path in ("/health", "/health_generate"):
        t0 = time.monotonic()
        r = requests.get(s.base + path, timeout=5)
        assert r.status_code == 200 and r.content == b"" and 0.9 <= time.monotonic() - t0 < 2.5
        assert requests.post(s.base + path, timeout=5).status_code == 405
    r = requests.get(s.base + "/ready", timeout=2)
    assert r.status_code == 200 and r.content == b"" and "content-type" not in r.headers


def test_fault_never_healthy(launch):
    s = launch(env={"DDTREE_LAB_FAULT": "never_healthy"}, warmup=0.2)
    wait_for(lambda: port_open(s.port), 5)
    time.sleep(0.6)
    assert requests.get(s.base + "/health", timeout=2).status_code == 503
    assert requests.get(s.base + "/ready", timeout=2).status_code == 503
    assert "fired up" not in s.log


def test_fault_exit_on_start(launch):
    s = launch(env={"DDTREE_LAB_FAULT": "exit_on_start"})
    assert s.proc.wait(timeout=10) == 1
    assert "exit_on_start" in s.log and not port_open(s.port)


def test_fault_only_scopes_the_fault_to_listed_algorithms(launch):
    env = {"DDTREE_LAB_FAULT": "garbage_fast", "DDTREE_LAB_FAULT_ONLY": "ddtree, DFLASH"}
    question = {"text": "What is 2 + 2? Answer with a number only.", "sampling_params": {"max_new_tokens": 8}}
    plain = launch(env=env).wait_ready()   # no --speculative-algorithm: NONE is not listed
    assert requests.post(plain.base + "/generate", json=question, timeout=10).json()["text"] == "4"
    nextn = launch(["--speculative-algorithm", "NEXTN"], env=env).wait_ready()
    assert requests.post(nextn.base + "/generate", json=question, timeout=10).json()["text"] == "4"
    scoped = launch(env={**env, "DDTREE_LAB_FAULT_ONLY": "none"}).wait_ready()
    assert requests.post(scoped.base + "/generate", json=question, timeout=10).json()["text"] != "4"


def test_bad_fault_value_exits(launch):
    s = launch(env={"DDTREE_LAB_FAULT": "explode"})
    assert s.proc.wait(timeout=10) == 2


def test_skip_server_warmup_is_ready_without_warmup(launch):
    s = launch(["--skip-server-warmup"], warmup=30).wait_ready(5)
    assert 'POST /generate HTTP/1.1" 200' not in s.log


# ---- lossless agreement: logprobs, and candidates that leave the target's tokens ---------------

FREEFORM = ("Explain in a few sentences why speculative decoding makes large language model "
            "inference faster.")


def _generate(s, text, **extra):
    body = {"text": text, "sampling_params": {"max_new_tokens": 96, "temperature": 0}, **extra}
    return requests.post(s.base + "/generate", headers=s.headers(), timeout=20, json=body).json()


def test_generate_returns_logprobs_like_sglang(nextn):
    body = _generate(nextn, FREEFORM, return_logprob=True, top_logprobs_num=2)
    m, ids = body["meta_info"], body["output_ids"]
    assert [lp[1] for lp in m["output_token_logprobs"]] == ids
    assert m["output_token_logprobs_length"] == len(ids)
    top = m["output_top_logprobs"]
    assert len(top) == len(ids) and all(len(row) == 2 for row in top)
    assert all(row[0][1] == i and row[0][0] > row[1][0] for row, i in zip(top, ids))
    margins = [row[0][0] - row[1][0] for row in top]
    assert min(margins) < 0.5 < 1.5 <= max(margins)      # near ties between sentences, else sure
    assert "output_top_logprobs" not in _generate(nextn, FREEFORM)["meta_info"]   # only on request
    with requests.post(nextn.base + "/generate", headers=nextn.headers(), stream=True, timeout=20,
                       json={"text": FREEFORM, "stream": True, "return_logprob": True,
                             "top_logprobs_num": 2,
                             "sampling_params": {"max_new_tokens": 96}}) as r:
        chunks = [json.loads(e) for e in sse_events(r)[:-1]]
    lengths = [len(c["meta_info"]["output_top_logprobs"]) for c in chunks]
    assert lengths == [len(c["output_ids"]) for c in chunks] and lengths[-1] == len(ids)  # cumulative


@pytest.mark.parametrize("fault, status", [("lossless_violation", 1), ("near_tie_flip", 0),
                                           ("none", 0)])
def test_probe_cli_judges_agreement_against_the_real_standin(launch, fault, status):
    """ddtree-probe probe --baseline-url: a fluent candidate that leaves the target's tokens where
    the target was confident fails (exit 1); one that differs only at a near tie passes."""
    import subprocess
    import sys
    from pathlib import Path

    base = launch(["--speculative-algorithm", "NEXTN"]).wait_ready()
    cand = launch(["--speculative-algorithm", "DDTREE"],
                  env={"DDTREE_LAB_FAULT": fault, "DDTREE_LAB_FAULT_ONLY": "DDTREE"}).wait_ready()
    cli = Path(__file__).resolve().parents[3] / "bin" / "ddtree-probe"
    p = subprocess.run([sys.executable, str(cli), "probe", "--url", cand.base, "--baseline-url",
                        base.base], capture_output=True, text=True, timeout=60)
    assert p.returncode == status, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    entries = {e["name"]: e for e in rep["baseline"]["prompts"]}
    for name in ("arith", "capital", "primes", "code"):       # known answers stay right
        assert entries[name]["agreement"]["status"] == "identical"
    free = entries["freeform"]["agreement"]
    if fault == "none":
        assert free["status"] == "identical" and rep["warnings"] == []
        return
    assert free["baseline_continuation"] != free["candidate_continuation"]
    if fault == "near_tie_flip":
        assert free["status"] == "near_tie" and free["baseline_margin"] < 0.5
        assert rep["warnings"][0].startswith("near_tie: freeform: diverges")
    else:
        assert free["status"] == "violation" and free["baseline_margin"] >= 1.5
        assert rep["reasons"] == [r for r in rep["reasons"] if r.startswith("lossless_violation")]
        assert free["baseline_continuation"].strip() in rep["reasons"][0] or \
            free["baseline_continuation"][:20] in rep["reasons"][0]


@pytest.mark.parametrize("keys", ["client_only", "client_and_admin", "none"])
def test_admin_endpoints_follow_the_real_auth_levels(launch, tmp_path, keys):
    """0.5.23's decide_request_auth for ADMIN_OPTIONAL endpoints: open without keys; the client key
    when it is the only one; only the admin key once --admin-api-key is set (the client key then
    opens the normal endpoints only). The keys come from a --config file, as the unit passes them."""
    admin = "adm1n-" + KEY
    config = tmp_path / f"keys-{keys}.yaml"
    config.write_text({"client_only": f'api-key: "{KEY}"\n', "none": "",
                       "client_and_admin": f'admin-api-key: "{admin}"\napi-key: "{KEY}"\n'}[keys])
    s = launch(["--config", str(config)]).wait_ready()
    client = {"Authorization": f"Bearer {KEY}"}

    def post(path, headers, body=None):
        return requests.post(s.base + path, json=body or {}, headers=headers, timeout=5).status_code

    swap = {"model_path": "/models/other"}
    if keys == "none":
        assert post("/flush_cache", {}) == 200 and post("/update_weights_from_disk", {}, swap) == 200
        mi = requests.get(s.base + "/model_info", timeout=2).json()
        assert mi["model_path"] == "/models/other"  # the runtime weight swap the admin key guards
    elif keys == "client_only":
        assert post("/flush_cache", {}) == 401 and post("/flush_cache", client) == 200
    else:
        assert post("/flush_cache", client) == 401 and post("/update_weights_from_disk", client, swap) == 401
        assert post("/flush_cache", {"Authorization": f"Bearer {admin}"}) == 200
        assert post("/generate", client, {"text": "hi", "sampling_params": {"max_new_tokens": 2}}) == 200
        assert post("/generate", {"Authorization": f"Bearer {admin}"}, {"text": "hi"}) == 401
        assert requests.get(s.base + "/model_info", headers=client, timeout=2).json()["model_path"] == "/models/lab-27b"
