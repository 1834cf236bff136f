"""ddtree-gpu-check: is DDTREE lossless and faster on this GPU host? Run it where the GPUs are.

  ddtree-gpu-check --python /opt/sglang/venvs/<venv>/bin/python \\
                   --model-path /opt/sglang/models/<target> --draft-model-path /opt/sglang/models/<draft> \\
                   [--budget 32] [--tp-size 1] [--server-arg=--mem-fraction-static=0.85 ...] [--out DIR]

Starts the patched server twice from that venv (`python -m sglang.launch_server`), one after
the other on the same GPUs: the target alone (no speculation), then DDTREE with the draft.
Each is probed greedily with the quality gate's prompts (or --prompts); the DDTREE run is
compared with the target's token by token under the gate's lossless-agreement rule. Prints a
table (per prompt: parity, first differing token and the target's margin there, tokens/s of
both and their ratio) and writes gpu-check.json and both servers' logs to --out.

Exit 0: DDTREE started and every prompt is identical (or parts only at a near tie);
1: a lossless violation, or a prompt failed; 2: a server did not start (its log's end is
printed) or bad input. --deterministic (default) adds --enable-deterministic-inference to both.
"""

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time

from ansible_collections.ddtree.fleet.plugins.module_utils import flags as ddtree_flags
from ansible_collections.ddtree.fleet.plugins.module_utils.http.client import HttpError, get_json
from ansible_collections.ddtree.fleet.plugins.module_utils.probe import parity
from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as dp
from ansible_collections.ddtree.fleet.plugins.plugin_utils.cli.probe import DEFAULT_PROMPTS_FILE, gate_defaults

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
DETERMINISTIC_FLAG = "--enable-deterministic-inference"
LOG_TAIL_LINES = 40


class StartError(Exception):
    """A server exited or did not become healthy; the message names it and its log."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write("%s: error: %s\n" % (self.prog, message))
        sys.exit(EXIT_ERROR)


def build_parser():
    p = _Parser(prog="ddtree-gpu-check", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--python", required=True, help="the patched venv's python (the fleet's /opt/sglang/venvs/<venv>/bin/python)")
    p.add_argument("--module", default="sglang.launch_server", help="module run with python -m (default %(default)s)")
    p.add_argument("--model-path", required=True, help="the target model directory")
    p.add_argument("--draft-model-path", required=True, help="the DFlash draft model directory")
    p.add_argument("--budget", type=int, default=0,
                   help="--speculative-ddtree-budget (1..%d; 0: the server's default)" % ddtree_flags.DDTREE_MAX_BUDGET)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--port", type=int, default=31000, help="loopback port of each server in turn (default %(default)s)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for both servers (repeat; write --server-arg=--flag=value)")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                   help="add %s to both servers (default on)" % DETERMINISTIC_FLAG)
    p.add_argument("--prompts", help="prompt file (default: the quality gate's prompts)")
    p.add_argument("--start-timeout", type=float, default=1800.0, help="seconds for a server to become healthy")
    p.add_argument("--out", default="gpu-check", help="directory for gpu-check.json and the server logs")
    return p


def server_argvs(args) -> dict:
    """The two command lines: the target alone, and DDTREE rendered as the fleet renders it."""
    common = list(args.server_arg) + ([DETERMINISTIC_FLAG] if args.deterministic else [])
    target = [args.python, "-m", args.module, "--model-path", args.model_path, "--host", "127.0.0.1",
              "--port", str(args.port), "--tp-size", str(args.tp_size)] + common
    ddtree = [args.python, "-m", args.module] + ddtree_flags.sglang_argv({
        "model_path": args.model_path, "algorithm": "DDTREE", "draft_path": args.draft_model_path,
        "host": "127.0.0.1", "port": args.port, "tp_size": args.tp_size, "ddtree_budget": args.budget,
        "extra_args": common})
    return {"target": target, "ddtree": ddtree}


def _tail(path, lines=LOG_TAIL_LINES):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def start(argv, log_path, url, timeout):
    """Start one server (its own process group, output to log_path) and wait for /health 200."""
    log = open(log_path, "wb")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StartError("exited with status %s before it was healthy; the end of %s:\n%s"
                             % (proc.returncode, log_path, _tail(log_path)))
        try:
            status, _ = get_json(url, "/health", timeout=30)
            if status == 200:
                return proc
        except HttpError:
            pass
        time.sleep(1.0)
    stop(proc)
    raise StartError("not healthy within %g s; the end of %s:\n%s" % (timeout, log_path, _tail(log_path)))


def stop(proc, grace=60.0):
    """SIGTERM to the server's process group (its scheduler and detokenizer too), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def gate_agreement_rule():
    """The quality gate's lossless-agreement rule (its argument spec's defaults), failing on a violation."""
    gate = gate_defaults()
    return dp.agreement_rules.make_rule(mode="fail", tokens=gate.get("agreement_tokens"),
                                        near_tie_margin=gate.get("near_tie_margin"),
                                        max_late=gate.get("max_late_divergences"))


def probe_server(name, argv, out_dir, url, args, prompts, baseline=None, rule=None):
    log_path = os.path.join(out_dir, "%s-server.log" % name)
    sys.stderr.write("ddtree-gpu-check: starting %s: %s\n" % (name, " ".join(argv)))
    t0 = time.monotonic()
    try:
        proc = start(argv, log_path, url, args.start_timeout)
    except StartError as exc:
        raise StartError("the %s server %s" % (name, exc)) from None
    started = time.monotonic() - t0
    try:
        report = dp.run_probe(url, prompts, baseline=baseline, agreement=rule)
    finally:
        stop(proc)
    sys.stderr.write("ddtree-gpu-check: %s healthy after %.1f s, probe %s\n" % (name, started, report["verdict"]))
    return report, started


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if not 0 <= args.budget <= ddtree_flags.DDTREE_MAX_BUDGET:
            raise ValueError("--budget must be 0 (the server's default) or 1..%d, got %d"
                             % (ddtree_flags.DDTREE_MAX_BUDGET, args.budget))
        for opt in ("model_path", "draft_model_path"):
            if not os.path.isdir(getattr(args, opt)):
                raise ValueError("--%s %s is not a directory" % (opt.replace("_", "-"), getattr(args, opt)))
        argvs = server_argvs(args)
        prompts = dp.load_prompts_file(args.prompts or os.path.normpath(DEFAULT_PROMPTS_FILE))
    except (ValueError, ddtree_flags.FlagError, dp.ProbeError) as exc:
        sys.stderr.write("ddtree-gpu-check: %s\n" % exc)
        return EXIT_ERROR
    os.makedirs(args.out, exist_ok=True)
    url = "http://127.0.0.1:%d" % args.port
    result = {"started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "argv": argvs, "verdict": None}
    code = EXIT_ERROR
    try:
        base, base_s = probe_server("target", argvs["target"], args.out, url, args, prompts)
        result.update(target=base, target_start_s=round(base_s, 1))
        if base["verdict"] != dp.PASS:
            raise StartError("the target alone did not pass its probe (%s): no baseline to compare with"
                             % "; ".join(base["reasons"][:3]))
        cand, cand_s = probe_server("ddtree", argvs["ddtree"], args.out, url, args, prompts, baseline=base,
                                    rule=gate_agreement_rule())
        result.update(ddtree=cand, ddtree_start_s=round(cand_s, 1))
        the_rows = parity.rows(base, cand)
        result["rows"] = the_rows
        result["verdict"] = parity.verdict(the_rows, cand)
        result["speed_ratio"] = (cand.get("baseline") or {}).get("speed_ratio")
        sys.stdout.write(parity.table(the_rows) + "\n\n")
        sys.stdout.write("%s: %s; median DDTREE/target tokens/s %s; DDTREE probe %s%s\n" % (
            "ddtree-gpu-check", result["verdict"], result["speed_ratio"], cand["verdict"],
            (": " + "; ".join(cand["reasons"][:3])) if cand["reasons"] else ""))
        code = EXIT_PASS if result["verdict"] != parity.VIOLATION and cand["verdict"] == dp.PASS else EXIT_FAIL
    except StartError as exc:
        result["verdict"] = "did_not_start"
        result["error"] = str(exc)
        sys.stderr.write("ddtree-gpu-check: %s\n" % exc)
    finally:
        with open(os.path.join(args.out, "gpu-check.json"), "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
