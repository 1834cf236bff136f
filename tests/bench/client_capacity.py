#!/usr/bin/env python3
"""Client-capacity benchmark for ddtree-bench (not a pytest test: it prints numbers).

Question: can the stdlib asyncio client measure a fast server without becoming the
bottleneck?  It starts the lab SGLang stand-in on 127.0.0.1 with a high
DDTREE_LAB_RATE_SCALE (DDTREE on a fake RTX PRO 6000, sm120) so that the configured
aggregate output rate at the chosen concurrency is >= 5,000 tokens/s, runs the client
at that concurrency, and compares:

    configured = concurrency x physics.per_stream_rate(rate x scale, concurrency)
    measured   = output_throughput (output tokens / wall time of the level)

Both run on the same machine (2 cores here), so the client has to be lean.
Exit 1 when |measured / configured - 1| > the tolerance (5 %) in the default parse mode.

    .venv/bin/python tests/bench/client_capacity.py [--scale 2.1] [--concurrency 48]
        [--output-len 256] [--rounds 3] [--modes last,every]
"""

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STANDIN_SRC = os.path.join(REPO, "lab", "standin", "src")
sys.path.insert(0, os.path.join(REPO, "collections"))
sys.path.insert(0, STANDIN_SRC)
sys.path.insert(0, os.path.join(REPO, "tests"))

from ansible_collections.ddtree.fleet.plugins.module_utils.bench import runner as db  # noqa: E402
from sglang_lab_standin import physics  # noqa: E402
from fleet_testlib import STANDIN_QUERY, free_port, write_fake_nvidia_smi  # noqa: E402

GPU_LINE = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 97887"
ALGORITHM = "DDTREE"


def make_fakes(root):
    smi = str(write_fake_nvidia_smi(root, query_out=GPU_LINE + "\n", expect_args=STANDIN_QUERY))
    pkg = os.path.join(root, "sglang")
    for rel in physics.DDTREE_DFLASH_FILES:
        path = os.path.join(pkg, "srt", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write("DDTREE = 'DDTREE'\n")
    return smi, pkg


def configured_rate(scale, algorithm):
    """One-stream rate (tok/s) of the stand-in for this GPU/flags, after the scale."""
    gpu = physics.Gpu("RTX PRO 6000", "12.0", 97887)
    source = physics.SourceState(found=True, ddtree_known=True, files_missing_ddtree=())
    b = physics.decide([gpu], {"speculative_algorithm": algorithm, "tp_size": 1}, source)
    assert b.serves and b.text_mode == "correct", b
    return b.tokens_per_second * scale, b.max_running_requests


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def start_standin(root, port, scale, algorithm):
    smi, pkg = make_fakes(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_LAB_")}
    env.update({"PYTHONPATH": STANDIN_SRC, "DDTREE_LAB_NVIDIA_SMI": smi,
                "DDTREE_LAB_SGLANG_DIR": pkg, "DDTREE_LAB_STARTUP_SECONDS": "0.2",
                "DDTREE_LAB_WARMUP_SECONDS": "0.1", "DDTREE_LAB_RATE_SCALE": str(scale)})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    log = open(os.path.join(root, "standin.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "sglang_lab_standin", "--model-path",
                             "/models/lab-27b", "--host", "127.0.0.1", "--port", str(port),
                             "--speculative-algorithm", algorithm],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"stand-in exited {proc.returncode}; see {root}/standin.log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:  # /health itself waits ~1 s
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("stand-in never became healthy")


async def measure(url, workload, c, n, output_len, parse, keep_alive, quickack=False):
    """Warm-up (c requests, opens the connections), then n measured requests."""
    target = db.parse_base_url(url)
    pool = db.ConnectionPool(target) if keep_alive else None
    tag = f"cap-{parse}-{'ka' if keep_alive else 'close'}"
    warm = db.expand_workload(workload, c, tag + "-warm", output_len)
    await db.run_batch(target, warm, c, parse=parse, pool=pool, quickack=quickack)
    bodies = db.expand_workload(workload, n, tag, output_len)
    cpu0 = time.process_time()
    records, dur = await db.run_batch(target, bodies, c, parse=parse, pool=pool,
                                      quickack=quickack)
    cpu = time.process_time() - cpu0
    if pool is not None:
        pool.close()
    return db.level_metrics(records, dur, concurrency=c), cpu


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", default=ALGORITHM, help="--speculative-algorithm of the stand-in")
    ap.add_argument("--scale", type=float, default=2.1)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="measured requests = rounds x concurrency")
    ap.add_argument("--modes", default="last,every,last/close,last/quickack",
                    help="client modes to measure, PARSE[/close][/quickack] (close = a new "
                         "connection per request, like bench_serving; quickack = set "
                         "TCP_QUICKACK after every read); the first one decides the exit code")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--prompts", choices=("short", "long", "all"), default="short",
                    help="which workload prompts to send (default short: negligible prefill)")
    ap.add_argument("--workload", default=os.path.join(REPO, "roles", "benchmark", "files",
                                                       "workload-v1.json"))
    args = ap.parse_args(argv)

    rate, max_running = configured_rate(args.scale, args.algorithm)
    c = args.concurrency
    if c > max_running:
        raise SystemExit(f"concurrency {c} > max_running_requests {max_running}: requests would queue")
    per_stream = physics.per_stream_rate(rate, c)
    configured = per_stream * c
    workload = db.load_workload(args.workload)
    if args.prompts != "all":
        # The stand-in's prefill time (0.01 s + prompt tokens / 8000, / scale) is not part of
        # the configured decode rate; short prompts keep it to a few ms per request.
        workload = dict(workload, requests=[r for r in workload["requests"]
                                            if r.get("kind") == args.prompts])
    print(f"stand-in: {args.algorithm} on sm120, one-stream rate {rate:.1f} tok/s "
          f"(scale {args.scale}), per-stream at {c} running {per_stream:.2f} tok/s")
    print(f"configured aggregate: {c} x {per_stream:.2f} = {configured:.1f} output tok/s")
    if configured < 5000:
        print("warning: configured aggregate is below 5,000 tok/s; raise --scale")
    status = 0
    with tempfile.TemporaryDirectory(prefix="ddtree-bench-cap-") as root:
        port = free_port()
        proc = start_standin(root, port, args.scale, args.algorithm)
        try:
            url = f"http://127.0.0.1:{port}"
            for k, mode in enumerate(m.strip() for m in args.modes.split(",") if m.strip()):
                parse, *opts = mode.split("/")
                conn = "close" if "close" in opts else "keep-alive"
                srv0 = cpu_seconds(proc.pid)
                m, cpu = asyncio.run(measure(url, workload, c, args.rounds * c,
                                             args.output_len, parse, conn != "close",
                                             "quickack" in opts))
                srv = cpu_seconds(proc.pid) - srv0
                ratio = m["output_throughput"] / configured
                stream_ratio = (1000.0 / m["mean_tpot_ms"]) / per_stream if m["mean_tpot_ms"] else 0
                print(f"\n[parse={parse}, {'new connection per request' if conn == 'close' else 'keep-alive'}{', TCP_QUICKACK' if 'quickack' in opts else ''}] {m['completed']}/{m['num_requests']} ok, "
                      f"{m['total_output_tokens']} tokens in {m['duration']:.2f} s, errors {m['errors']}")
                print(f"  measured output throughput : {m['output_throughput']:.1f} tok/s")
                print(f"  configured aggregate       : {configured:.1f} tok/s")
                print(f"  ratio measured/configured  : {ratio:.4f}  ({(ratio - 1) * 100:+.2f} %)")
                print(f"  per-stream from mean TPOT  : {1000.0 / m['mean_tpot_ms']:.2f} tok/s "
                      f"(ratio {stream_ratio:.4f}); TTFT p50 {m['median_ttft_ms']:.1f} ms, "
                      f"TTFT p99 {m['p99_ttft_ms']:.1f} ms, ITL p50/p99 {m['median_itl_ms']:.2f}/{m['p99_itl_ms']:.2f} ms")
                print(f"  CPU: client {cpu:.2f} s ({cpu / m['duration'] * 100:.0f} % of a core), "
                      f"stand-in {srv:.2f} s ({srv / m['duration'] * 100:.0f} % of a core, incl. warm-up)")
                if k == 0 and (abs(ratio - 1) > args.tolerance or m["errors"]):
                    status = 1
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print("\nresult:", "PASS" if status == 0 else "FAIL",
          f"(tolerance {args.tolerance * 100:.0f} %, decided by the first mode)")
    return status


if __name__ == "__main__":
    sys.exit(main())
