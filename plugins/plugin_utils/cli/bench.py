"""ddtree-bench: serving benchmark for SGLang's streaming /generate, bench_serving metrics.

  ddtree-bench run --url http://127.0.0.1:30000 [--api-key KEY] [--workload FILE]
                   [--concurrency 1,4,16,48] [--requests-per-level N] [--warmup N]
                   [--candidate NAME] [--out results.json]
      Runs every concurrency level (warm-up first, not measured) and prints the results
      JSON (also written to --out).  Exit 0 = ok, 1 = the candidate failed (the JSON says
      why), 2 = bad usage.  The API key may also come from $DDTREE_BENCH_API_KEY; it is
      never printed or written.

  ddtree-bench report results1.json [results2.json ...] --out-dir DIR [--baseline NEXTN]
      Writes DIR/report.md (candidate x concurrency table with the ratio of output
      throughput to the baseline) and DIR/throughput.png (needs matplotlib).

`run` needs only python3; definitions of every number are in docs/benchmark.md.
"""

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys

# The collection's root (plugins/plugin_utils/cli/ is three levels down).
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", ".."))

from ansible_collections.ddtree.fleet.plugins.module_utils.bench import runner as db
from ansible_collections.ddtree.fleet.plugins.plugin_utils import bench_report as report

DEFAULT_WORKLOAD = os.path.join(ROOT, "roles", "benchmark", "files", "workload-v1.json")
ENV_API_KEY = "DDTREE_BENCH_API_KEY"


def parse_levels(text):
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad concurrency list {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return levels


def local_gpu():
    """GPUs of this host from nvidia-smi, or {} when there is none."""
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total",
                               "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    if proc.returncode != 0:
        return {}
    rows = [[p.strip() for p in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) >= 3]
    if not rows:
        return {}
    name, cap, mem = rows[0][:3]
    gpu = {"name": name, "count": len(rows), "compute_cap": cap}
    try:
        major, _, minor = cap.partition(".")
        gpu["arch"] = f"sm{int(major)}{int(minor or 0)}"
        gpu["memory_mib"] = int(float(mem))
    except ValueError:
        pass
    return gpu


def parse_gpu(text):
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {"name": text}
    return value if isinstance(value, dict) else {"name": str(value)}


def cmd_run(args):
    api_key = args.api_key or os.environ.get(ENV_API_KEY) or None
    try:
        workload = db.load_workload(args.workload)
        db.parse_base_url(args.url)
    except db.BenchError as exc:
        print(f"ddtree-bench: {exc}", file=sys.stderr)
        return 2
    log = (lambda msg: print(f"ddtree-bench: {msg}", file=sys.stderr, flush=True)) \
        if not args.quiet else None
    result = {
        "schema": db.SCHEMA_VERSION,
        "candidate": args.candidate,
        "host": args.host_label or socket.gethostname(),
        "url": args.url,
        "gpu": parse_gpu(args.gpu) if args.gpu else local_gpu(),
        "versions": {"ddtree_bench": str(db.SCHEMA_VERSION), "python": platform.python_version()},
        "flags": [],
        "workload": {"version": workload["version"], "hash": db.workload_hash(workload),
                     "requests": len(workload["requests"])},
        "settings": {"concurrency": args.concurrency,
                     "requests_per_level": args.requests_per_level,
                     "warmup": args.warmup, "max_new_tokens_override": args.max_new_tokens,
                     "unique_prefix": not args.no_unique_prefix, "timeout_s": args.timeout,
                     "keep_alive": not args.no_keep_alive, "tcp_quickack": args.tcp_quickack,
                     "temperature": 0.0, "ignore_eos": True, "stream": True},
        "levels": [],
        "status": "failed",
        "evidence": None,
    }
    if args.max_new_tokens:
        result["workload"]["max_new_tokens_override"] = args.max_new_tokens

    async def go():
        try:
            status, info = db.get_json(args.url, "/server_info", api_key, 15.0,
                                       user_agent=db.USER_AGENT)
        except Exception as exc:  # noqa: BLE001 - any failure to reach the server is evidence
            return {"status": "failed", "levels": [],
                    "evidence": {"reason": f"server unreachable: {db._error_text(exc)}"}}
        if status == 200 and isinstance(info, dict):
            if info.get("version"):
                result["versions"]["sglang"] = str(info["version"])
            result["flags"] = db.flags_from_server_info(info)
            if not result["candidate"]:
                result["candidate"] = db.candidate_from_server_info(info)
        elif status in (401, 403):
            return {"status": "failed", "levels": [],
                    "evidence": {"reason": f"/server_info answered {status}: API key refused"}}
        return await db.run_benchmark(
            args.url, workload, args.concurrency, args.requests_per_level, args.warmup,
            api_key=api_key, timeout=args.timeout, max_new_tokens=args.max_new_tokens,
            pause_s=args.pause, unique_prefix=not args.no_unique_prefix,
            keep_alive=not args.no_keep_alive, quickack=args.tcp_quickack, log=log)

    outcome = asyncio.run(go())
    result["candidate"] = result["candidate"] or "unknown"
    result.update(outcome)
    text = json.dumps(result, indent=2, sort_keys=False)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    if not args.quiet:
        print(text)
    return 0 if result["status"] == "ok" else 1


def cmd_report(args):
    results = []
    for path in args.results:
        try:
            with open(path, "r", encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            print(f"ddtree-bench: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(data, dict):
            print(f"ddtree-bench: {path} is not a results object", file=sys.stderr)
            return 2
        results.append(data)
    baseline = report.pick_baseline(results, args.baseline)
    os.makedirs(args.out_dir, exist_ok=True)
    md = os.path.join(args.out_dir, "report.md")
    with open(md, "w", encoding="utf-8") as fh:
        fh.write(report.render_report(results, baseline))
    png = os.path.join(args.out_dir, "throughput.png")
    try:
        report.plot(results, png, baseline)
    except ImportError as exc:
        print(f"ddtree-bench: no plot ({exc}); report.md written", file=sys.stderr)
        print(md)
        return 1
    print(md)
    print(png)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="ddtree-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="benchmark one server")
    r.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:30000")
    r.add_argument("--api-key", help=f"Bearer token (or ${ENV_API_KEY})")
    r.add_argument("--workload", default=DEFAULT_WORKLOAD)
    r.add_argument("--concurrency", type=parse_levels, default=list(db.DEFAULT_CONCURRENCY))
    r.add_argument("--requests-per-level", type=int, default=None,
                   help="measured requests per level (default 4 x concurrency, at least 8)")
    r.add_argument("--warmup", type=int, default=None,
                   help="unmeasured warm-up requests per level (default = concurrency)")
    r.add_argument("--max-new-tokens", type=int, default=None,
                   help="override every request's output length (recorded in the results)")
    r.add_argument("--timeout", type=float, default=db.DEFAULT_REQUEST_TIMEOUT,
                   help="seconds allowed per request")
    r.add_argument("--pause", type=float, default=1.0, help="seconds between warm-up and run")
    r.add_argument("--no-keep-alive", action="store_true",
                   help="a new connection per request (bench_serving style)")
    r.add_argument("--tcp-quickack", action="store_true",
                   help="set TCP_QUICKACK after every read (Linux; for servers without "
                        "TCP_NODELAY, see docs/benchmark.md)")
    r.add_argument("--no-unique-prefix", action="store_true",
                   help="send the prompts verbatim (prefix-cache hits between requests)")
    r.add_argument("--candidate", help="label (default: from /server_info speculative_algorithm)")
    r.add_argument("--host-label", help="host name to record (default: this host)")
    r.add_argument("--gpu", help="GPU description, JSON object or name (default: nvidia-smi)")
    r.add_argument("--out", help="write the results JSON here")
    r.add_argument("--quiet", action="store_true", help="no progress and no JSON on stdout")
    r.set_defaults(func=cmd_run)
    rep = sub.add_parser("report", help="markdown table and PNG from results files")
    rep.add_argument("results", nargs="+")
    rep.add_argument("--out-dir", required=True)
    rep.add_argument("--baseline", default=None, help="candidate for the ratio (default NEXTN)")
    rep.set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    if getattr(args, "requests_per_level", None) is not None and args.requests_per_level < 1:
        p.error("--requests-per-level must be >= 1")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
