"""Metric definitions of ddtree_bench with hand-computed timings (no server)."""

import asyncio
import copy
import json

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.bench import runner as db
from bench_testlib import WORKLOAD_V1

approx = pytest.approx

# A: 6 tokens, chunks at 0.5 (1 token), 0.6 (+1), 0.8 (+3), 0.9 (+0, ignored), 1.1 (+1)
REC_A = {"start": 0.0, "chunks": [[0.5, 1], [0.6, 2], [0.8, 5], [0.9, 5], [1.1, 6]],
         "end": 1.15, "prompt_tokens": 10, "output_tokens": 6, "accept_length": 3.0,
         "error": None}
# B: 4 tokens, two chunks of 2
REC_B = {"start": 0.2, "chunks": [[0.4, 2], [0.7, 4]], "end": 0.75, "prompt_tokens": 20,
         "output_tokens": 4, "accept_length": 5.0, "error": None}
REC_ERR = {"start": 0.1, "chunks": [], "end": 0.2, "prompt_tokens": 0, "output_tokens": 0,
           "accept_length": None, "error": "HTTP 500: boom"}


# ---- percentiles: numpy 'linear' definition -------------------------------------------------

def test_percentile_linear_interpolation():
    xs = [4, 1, 3, 2]                       # sorted 1 2 3 4, rank = p/100 * 3
    assert db.percentile(xs, 50) == approx(2.5)
    assert db.percentile(xs, 90) == approx(3.7)
    assert db.percentile(xs, 99) == approx(3.97)
    assert db.percentile(xs, 0) == 1 and db.percentile(xs, 100) == 4
    assert db.percentile([7.0], 99) == 7.0
    assert db.percentile([], 50) == 0.0     # bench_serving: np.percentile(xs or 0, p)
    with pytest.raises(ValueError):
        db.percentile(xs, 101)


def test_mean_and_population_std():
    assert db.mean([1, 2, 3, 4]) == 2.5
    assert db.std([2, 4, 4, 4, 5, 5, 7, 9]) == approx(2.0)   # ddof=0
    assert db.mean([]) == 0.0 and db.std([]) == 0.0


# ---- one request -----------------------------------------------------------------------------

def test_request_metrics_ttft_tpot_itl():
    m = db.request_metrics(REC_A)
    assert m["ttft"] == approx(0.5)
    assert m["latency"] == approx(1.15)
    assert m["output_len"] == 6
    assert m["tpot"] == approx((1.15 - 0.5) / 5)
    # a 3-token chunk spreads its 0.2 s gap evenly; the +0 chunk does not reset the clock
    assert m["itl"] == approx([0.1, 0.2 / 3, 0.2 / 3, 0.2 / 3, 0.3])
    assert len(m["itl"]) == 6 - 1   # first chunk's tokens have no ITL


def test_request_metrics_single_token_has_no_tpot():
    m = db.request_metrics({"start": 0.0, "chunks": [[0.25, 1]], "end": 0.3, "output_tokens": 1})
    assert m["ttft"] == approx(0.25) and m["tpot"] is None and m["itl"] == []


# ---- one level -----------------------------------------------------------------------------

def test_level_metrics_hand_computed():
    m = db.level_metrics([REC_A, REC_B, REC_ERR], 2.0, concurrency=2)
    assert m["concurrency"] == 2
    assert (m["completed"], m["errors"], m["failed"], m["num_requests"]) == (2, 1, 1, 3)
    assert m["error_messages"] == ["HTTP 500: boom"]
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 10
    assert m["request_throughput"] == approx(1.0)
    assert m["input_throughput"] == approx(15.0)
    assert m["output_throughput"] == approx(5.0)
    assert m["total_throughput"] == approx(20.0) == m["total_token_throughput"]
    # TTFT 500, 200 ms
    assert m["mean_ttft_ms"] == approx(350) and m["median_ttft_ms"] == approx(350)
    assert m["std_ttft_ms"] == approx(150)
    assert m["p90_ttft_ms"] == approx(470) and m["p99_ttft_ms"] == approx(497)
    # TPOT 130, 116.67 ms
    assert m["mean_tpot_ms"] == approx((130 + 350 / 3) / 2)
    # ITL sorted: 66.67 x3, 100, 150, 150, 300 (n=7, rank = p/100 * 6)
    assert m["median_itl_ms"] == approx(100)
    assert m["p90_itl_ms"] == approx(150 + 0.4 * 150)
    assert m["p99_itl_ms"] == approx(150 + 0.94 * 150)
    assert m["max_itl_ms"] == approx(300)
    assert m["mean_itl_ms"] == approx(900 / 7)
    # E2E 1150, 550 ms
    assert m["median_e2e_latency_ms"] == approx(850)
    assert m["p90_e2e_latency_ms"] == approx(1090)
    assert m["p99_e2e_latency_ms"] == approx(1144)
    assert m["mean_concurrency"] == approx(1.7 / 2.0)
    # per-second peaks: bucket 0 holds 5 tokens of A and 3 of B; both requests in flight
    assert m["max_output_tokens_per_s"] == 8 and m["max_concurrent_requests"] == 2
    # accept length: mean of meta_info values unless /server_info gives one
    assert m["accept_length"] == approx(4.0) and m["accept_length_source"] == "meta_info"
    m2 = db.level_metrics([REC_A, REC_B], 2.0, accept_length=4.2)
    assert m2["accept_length"] == 4.2 and m2["accept_length_source"] == "server_info"


def test_level_metrics_all_failed_and_bad_duration():
    m = db.level_metrics([REC_ERR, REC_ERR], 1.0)
    assert m["completed"] == 0 and m["errors"] == 2 and m["output_throughput"] == 0
    assert m["median_ttft_ms"] == 0.0 and m["accept_length"] is None
    with pytest.raises(ValueError):
        db.level_metrics([REC_A], 0)


# ---- workload ------------------------------------------------------------------------------

# Pinned: changing workload-v1.json must come with a new version file, not an edit.
WORKLOAD_V1_SHA256 = "b4748a7e2238f6434f84abbcff680e1fe7d94bfe9aa4377bb582ac77cc760cd4"


def test_workload_v1_is_valid_and_hash_pinned():
    w = db.load_workload(str(WORKLOAD_V1))
    assert w["version"] == "ddtree-bench-workload-v1"
    kinds = {r["kind"] for r in w["requests"]}
    assert kinds == {"short", "long"}
    assert all(r["max_new_tokens"] == 256 for r in w["requests"])
    assert len({r["id"] for r in w["requests"]}) == len(w["requests"])
    assert db.workload_hash(w) == WORKLOAD_V1_SHA256


def test_workload_hash_is_canonical():
    w = db.load_workload(str(WORKLOAD_V1))
    shuffled = json.loads(json.dumps(w, indent=7, sort_keys=True))
    shuffled = dict(reversed(list(shuffled.items())))
    assert db.workload_hash(shuffled) == db.workload_hash(w)
    changed = copy.deepcopy(w)
    changed["requests"][0]["max_new_tokens"] += 1
    assert db.workload_hash(changed) != db.workload_hash(w)


@pytest.mark.parametrize("bad", [[], {"version": "v"}, {"version": "", "requests": [{}]},
                                 {"version": "v", "requests": [{"prompt": "x"}]},
                                 {"version": "v", "requests": [{"prompt": "x", "max_new_tokens": 0}]}])
def test_workload_validation(bad):
    with pytest.raises(db.BenchError):
        db.validate_workload(bad)


def test_expand_workload_payload():
    w = {"version": "v", "requests": [{"prompt": "a", "max_new_tokens": 5},
                                      {"prompt": "b", "max_new_tokens": 7}]}
    bodies = [json.loads(b) for b in db.expand_workload(w, 3, "c1")]
    assert [b["text"] for b in bodies] == ["[c1-0] a", "[c1-1] b", "[c1-2] a"]
    assert bodies[1]["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 7,
                                            "ignore_eos": True}
    assert all(b["stream"] is True for b in bodies)
    plain = json.loads(db.expand_workload(w, 1, "x", max_new_tokens_override=3,
                                          unique_prefix=False)[0])
    assert plain["text"] == "a" and plain["sampling_params"]["max_new_tokens"] == 3


# ---- wire parsing --------------------------------------------------------------------------

# (The framing itself, ddtree_http's BodyDecoder, is tested in tests/unit/http/test_http.py.)

def _sse(obj) -> bytes:
    data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(n, text="x", **meta):
    return {"text": text * n, "meta_info": {"completion_tokens": n, "prompt_tokens": 9, **meta}}


@pytest.mark.parametrize("parse", ["last", "every"])
def test_consume_stream_one_chunk_per_read(parse):
    reads = [_sse(_event(1)),
             _sse(_event(2)) + _sse(_event(3)),            # two events in one read
             _sse(_event(4, spec_accept_length=3.1)) + _sse(b"[DONE]") + b"0\r\n\r\n"]
    times = iter([1.0, 2.0, 4.0, 9.0])

    async def go():
        reader = asyncio.StreamReader()
        for r in reads:
            reader.feed_data(r)
        reader.feed_eof()
        rec = {"start": 0.0, "chunks": [], "end": 0.0, "prompt_tokens": 0, "output_tokens": 0,
               "accept_length": None, "error": None}
        # one read() returns everything buffered, so feed reads one at a time instead
        chunks = list(reads)

        class OneByOne:
            async def read(self, n):
                return chunks.pop(0) if chunks else b""
        clean = await db._consume_stream(OneByOne(), {"transfer-encoding": "chunked"}, rec,
                                         lambda: next(times), parse)
        return rec, clean

    rec, clean = asyncio.run(go())
    assert clean is True and rec["error"] is None
    assert rec["chunks"] == [(1.0, 1), (2.0, 3), (4.0, 4)]
    assert rec["output_tokens"] == 4 and rec["prompt_tokens"] == 9
    assert rec["accept_length"] == 3.1 and rec["end"] == 4.0
    m = db.request_metrics(rec)
    assert m["itl"] == approx([0.5, 0.5, 2.0])     # the 2-token chunk: 1 s over 2 tokens


def test_consume_stream_errors():
    async def feed(reads):
        chunks = list(reads)

        class R:
            async def read(self, n):
                return chunks.pop(0) if chunks else b""
        rec = {"start": 0.0, "chunks": [], "end": 0.0, "prompt_tokens": 0, "output_tokens": 0,
               "accept_length": None, "error": None}
        await db._consume_stream(R(), {"transfer-encoding": "chunked"}, rec, lambda: 1.0)
        return rec

    cut = asyncio.run(feed([_sse(_event(1)), _sse(_event(2))]))       # connection drops
    assert "without [DONE]" in cut["error"] and cut["output_tokens"] == 2
    err = asyncio.run(feed([_sse({"error": {"message": "scheduler died"}})]))
    assert err["error"] == "server error in stream: scheduler died"
    empty = asyncio.run(feed([_sse(b"[DONE]") + b"0\r\n\r\n"]))
    assert empty["error"] == "no tokens streamed"


def test_parse_base_url_bad_is_bench_error():
    t = db.parse_base_url("http://127.0.0.1:30000/prefix/")
    assert (t["host"], t["port"], t["prefix"], t["host_header"]) == \
        ("127.0.0.1", 30000, "/prefix", "127.0.0.1:30000")
    for bad in ("ftp://x", "127.0.0.1:30000", "http://h:99999"):
        with pytest.raises(db.BenchError, match="url must be http"):
            db.parse_base_url(bad)


def test_consume_stream_content_length_is_reusable():
    """Without chunking the body's end is its Content-Length: the connection can be reused."""
    body = (b"data: " + json.dumps(_event(2)).encode() + b"\n\n" + b"data: [DONE]\n\n")
    reads = [body[:10], body[10:]]

    class R:
        async def read(self, n):
            return reads.pop(0) if reads else b""
    rec = {"start": 0.0, "chunks": [], "end": 0.0, "prompt_tokens": 0, "output_tokens": 0,
           "accept_length": None, "error": None}
    clean = asyncio.run(db._consume_stream(R(), {"content-length": str(len(body))}, rec,
                                           lambda: 1.0))
    assert clean is True and rec["error"] is None and rec["output_tokens"] == 2
    reads[:] = [body]
    rec.update(chunks=[], output_tokens=0)
    cut = asyncio.run(db._consume_stream(R(), {"content-length": str(len(body) + 5)}, rec,
                                         lambda: 1.0))
    assert cut is False                           # closed before the announced length


def test_consume_stream_malformed_chunk_raises():
    reads = [b"zz\r\ndata: {}\r\n"]

    class R:
        async def read(self, n):
            return reads.pop(0) if reads else b""
    rec = {"start": 0.0, "chunks": [], "end": 0.0, "prompt_tokens": 0, "output_tokens": 0,
           "accept_length": None, "error": None}
    with pytest.raises(ValueError, match="malformed chunk size"):
        asyncio.run(db._consume_stream(R(), {"transfer-encoding": "chunked"}, rec, lambda: 1.0))


# ---- one event per scheduler step: one token, or several (speculative decoding) ------------

def _stream_reads(step, n_tokens, tok_s, *, counts=True, spec_final=3.4):
    """One read per scheduler step: the prefill token at t=0.5, then `step` tokens per step
    at `tok_s` tokens/s; spec_* only in the finished event (as SGLang)."""
    reads, times, done, t = [], [], 0, 0.5
    while done < n_tokens:
        k = 1 if done == 0 else min(step, n_tokens - done)
        if done:
            t += k / tok_s
        done += k
        meta = {"prompt_tokens": 9, "finish_reason": None}
        if counts:
            meta["completion_tokens"] = done
        ev = {"text": "w" * done, "output_ids": list(range(1, done + 1)), "meta_info": meta}
        if done == n_tokens:
            meta["finish_reason"] = {"type": "length", "length": n_tokens}
            if spec_final is not None:
                meta.update(spec_accept_length=spec_final, spec_verify_ct=3)
        data = _sse(ev) + (_sse(b"[DONE]") + b"0\r\n\r\n" if done == n_tokens else b"")
        reads.append(data)
        times.append(t)
    return reads, times


def _consume(reads, times, parse):
    async def go():
        chunks, clock = list(reads), iter(times + [times[-1]])

        class OneByOne:
            async def read(self, n):
                return chunks.pop(0) if chunks else b""
        rec = {"start": 0.0, "chunks": [], "end": 0.0, "prompt_tokens": 0, "output_tokens": 0,
               "accept_length": None, "error": None}
        await db._consume_stream(OneByOne(), {"transfer-encoding": "chunked"}, rec,
                                 lambda: next(clock), parse)
        return rec
    return asyncio.run(go())


@pytest.mark.parametrize("parse", ["last", "every"])
@pytest.mark.parametrize("counts", [True, False])     # False: only cumulative output_ids
@pytest.mark.parametrize("step", [1, 4])
def test_figures_are_per_token_whatever_the_step(parse, counts, step):
    reads, times = _stream_reads(step, 21, 50.0, counts=counts)
    rec = _consume(reads, times, parse)
    assert rec["error"] is None and rec["output_tokens"] == 21
    assert rec["accept_length"] == 3.4                     # from the finished event
    m = db.request_metrics(rec)
    assert m["ttft"] == approx(0.5) and m["output_len"] == 21
    # one ITL entry per token after the first (not per event), each 1/50 s
    assert len(m["itl"]) == 20 and m["itl"] == approx([0.02] * 20)
    assert m["tpot"] == approx(0.02)
    lv = db.level_metrics([rec], duration_s=rec["end"])
    assert lv["total_output_tokens"] == 21 and lv["mean_itl_ms"] == approx(20.0)
    assert lv["accept_length"] == 3.4 and lv["accept_length_source"] == "meta_info"


def test_no_spec_fields_no_accept_length():
    reads, times = _stream_reads(1, 5, 50.0, spec_final=None)
    rec = _consume(reads, times, "last")
    assert rec["accept_length"] is None and rec["output_tokens"] == 5
