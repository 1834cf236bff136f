"""ddtree-probe: gate an SGLang deployment on real generation quality.

  ddtree-probe probe --url http://127.0.0.1:30000 [--api-key KEY] [--prompts FILE]
                     [--baseline-url URL | --baseline REPORT.json] ...
      Prints the JSON report.  Exit 0 = pass, 1 = fail, 2 = cannot run / inconclusive.
      Judges as the quality gate does by default: the same floors, and with a baseline the
      same speed ratio (0.5) and lossless-agreement rule (see --help).
      The API key may also come from $DDTREE_PROBE_API_KEY; it is never printed.

  ddtree-probe assess FILE|-
      Offline triage of JSON Lines {"id", "prompt", "output", ...}: one JSON line
      per input with "verdict" ok|degenerate and "reasons".
      Exit 0 = all ok, 1 = some degenerate, 2 = bad input.

Needs only python3.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

# The collection's root (plugins/plugin_utils/cli/ is three levels down).
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", ".."))

from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as dp
from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck.judge import assess

# The quality gate's argument spec owns its floors and the agreement rule; `ddtree-probe probe`
# reads its defaults from there (under ROOT, in the checkout and in an installed collection
# alike), so the CLI judges as the gate does.
GATE_SPEC = Path(ROOT, "roles", "quality_gate", "meta", "argument_specs.yml")


def gate_defaults(path: Path = GATE_SPEC) -> dict:
    """{knob: default} of role quality_gate's main entry point, without the quality_gate_ prefix."""
    options = yaml.safe_load(path.read_text())["argument_specs"]["main"]["options"]
    return {name.removeprefix("quality_gate_"): spec["default"] for name, spec in options.items() if "default" in spec}

DEFAULT_PROMPTS_FILE = os.path.join(ROOT, "roles", "quality_gate", "files",
                                    "default_prompts.json")
ENV_API_KEY = "DDTREE_PROBE_API_KEY"
EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write("%s: error: %s\n" % (self.prog, message))
        sys.exit(EXIT_ERROR)


def _positive(v):
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % v)
    if f <= 0:
        raise argparse.ArgumentTypeError("must be > 0: %r" % v)
    return f


def _non_negative(v):
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % v)
    if f < 0:
        raise argparse.ArgumentTypeError("must be >= 0: %r" % v)
    return f


def build_parser():
    p = _Parser(prog="ddtree-probe", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    pr = sub.add_parser("probe", help="probe a live server and print the JSON report")
    pr.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    pr.add_argument("--api-key", help="API key (or env %s)" % ENV_API_KEY)
    pr.add_argument("--prompts", help="JSON list of {prompt, expect?, max_tokens?, name?}")
    pr.add_argument("--endpoint", choices=["generate", "completions"], default="generate")
    pr.add_argument("--model", help="model name for /v1/completions (default: first of /v1/models)")
    pr.add_argument("--baseline-url", help="probe this known-good server first and compare")
    pr.add_argument("--baseline", help="a saved report (JSON file) to compare with")
    gate = gate_defaults()
    pr.add_argument("--min-tokens-per-s", type=_non_negative, default=gate["min_tokens_per_s"],
                    help="floor for tokens/s (default %(default)s, as the quality gate)")
    pr.add_argument("--stall-timeout", type=_positive, default=gate["stall_timeout"],
                    help="seconds without a token before failing (default %(default)s)")
    pr.add_argument("--ttft-timeout", type=_positive, default=gate["ttft_timeout"],
                    help="seconds to the first token (default %(default)s)")
    pr.add_argument("--rate-window", type=_positive, default=gate["rate_window_s"],
                    help="seconds after which a rate far below the floor fails at once "
                         "(default %(default)s)")
    pr.add_argument("--request-timeout", type=_positive, default=dp.DEFAULT_REQUEST_TIMEOUT,
                    help="upper bound for one request, seconds (default %(default)s)")
    pr.add_argument("--min-accept-length", type=_positive,
                    help="minimum speculative accept length (default: not checked)")
    pr.add_argument("--min-speed-ratio", type=_non_negative, default=gate["min_speed_ratio"],
                    help="with a baseline: fail below this median tokens/s ratio to it "
                         "(default %(default)s, as the quality gate; 0 = not checked)")
    pr.add_argument("--agreement", choices=dp.agreement_rules.MODES, default=gate["agreement"],
                    help="with a baseline: greedy outputs must follow the baseline's tokens "
                         "(speculative decoding is lossless); fail, warn or off "
                         "(default %(default)s, as the quality gate)")
    pr.add_argument("--agreement-tokens", type=int, default=gate["agreement_tokens"],
                    help="a divergence before this output token where the baseline was "
                         "confident fails (default %(default)s)")
    pr.add_argument("--near-tie-margin", type=_non_negative, default=gate["near_tie_margin"],
                    help="baseline top-2 logprob margin (nats) below which a divergence is "
                         "numerics, not a bug (default %(default)s)")
    pr.add_argument("--max-late-divergences", type=int, default=gate["max_late_divergences"],
                    help="prompts allowed to diverge confidently after --agreement-tokens "
                         "(default %(default)s)")
    pr.add_argument("--top-logprobs", type=int, default=dp.DEFAULT_TOP_LOGPROBS,
                    help="alternatives per token asked of /generate for the margins "
                         "(default %(default)s; 0 = none, every divergence then counts as "
                         "confident)")

    asx = sub.add_parser("assess", help="judge outputs from a JSON Lines file offline")
    asx.add_argument("file", help="JSON Lines file, or - for stdin")
    return p


def cmd_probe(args):
    api_key = args.api_key or os.environ.get(ENV_API_KEY) or None
    try:
        if args.prompts:
            prompts = dp.load_prompts_file(args.prompts)
        else:
            prompts = dp.load_prompts_file(os.path.normpath(DEFAULT_PROMPTS_FILE))
        baseline = None
        if args.baseline and args.baseline_url:
            raise dp.ProbeError("give --baseline or --baseline-url, not both")
        if args.baseline:
            try:
                with open(args.baseline, encoding="utf-8") as fh:
                    baseline = json.load(fh)
            except (OSError, ValueError) as exc:
                raise dp.ProbeError("cannot read baseline report %s: %s" % (args.baseline, exc))
        common = dict(api_key=api_key, endpoint=args.endpoint, model=args.model,
                      min_tokens_per_s=args.min_tokens_per_s, stall_timeout=args.stall_timeout,
                      ttft_timeout=args.ttft_timeout, rate_window_s=args.rate_window,
                      request_timeout=args.request_timeout, top_logprobs=args.top_logprobs)
        agreement = dp.agreement_rules.make_rule(
            mode=args.agreement, tokens=args.agreement_tokens,
            near_tie_margin=args.near_tie_margin, max_late=args.max_late_divergences)
        if args.baseline_url:
            baseline = dp.run_probe(args.baseline_url, prompts, **common)
        report = dp.run_probe(args.url, prompts, min_accept_length=args.min_accept_length,
                              baseline=baseline, min_speed_ratio=args.min_speed_ratio or None,
                              agreement=agreement if baseline is not None else None, **common)
    except (dp.ProbeError, ValueError) as exc:
        msg = str(exc)
        if api_key:
            msg = msg.replace(api_key, "********")
        sys.stderr.write("ddtree-probe: %s\n" % msg)
        return EXIT_ERROR
    if args.baseline_url and baseline is not None:
        report["baseline"]["report"] = {k: baseline.get(k) for k in
                                        ("verdict", "reasons", "detection_seconds", "url")}
    report = dp.redact(report, [api_key] if api_key else [])
    sys.stdout.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    sys.stderr.write("ddtree-probe: %s %s in %.2f s%s\n" % (
        report["url"], report["verdict"].upper(), report["detection_seconds"],
        (": " + "; ".join(report["reasons"][:3])) if report["reasons"] else ""))
    return dp.verdict_exit_code(report["verdict"])


def _read_jsonl(path):
    if path == "-":
        lines = sys.stdin.read().splitlines()
    else:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError("line %d: not JSON: %s" % (n, exc))
        if not isinstance(obj, dict):
            raise ValueError("line %d: not a JSON object" % n)
        if not isinstance(obj.get("output"), str):
            raise ValueError("line %d: missing string 'output'" % n)
        if "prompt" in obj and not isinstance(obj["prompt"], (str, type(None))):
            raise ValueError("line %d: 'prompt' must be a string" % n)
        obj.setdefault("id", n)
        items.append(obj)
    return items


def cmd_assess(args):
    try:
        items = _read_jsonl(args.file)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        sys.stderr.write("ddtree-probe assess: %s\n" % exc)
        return EXIT_ERROR
    any_bad = False
    for obj in items:
        try:
            verdict, reasons = assess(obj["output"], prompt=obj.get("prompt"),
                                      expect=obj.get("expect"), output_ids=obj.get("output_ids"),
                                      finish_reason=obj.get("finish_reason"),
                                      max_tokens=obj.get("max_tokens"))
        except (TypeError, ValueError) as exc:
            sys.stderr.write("ddtree-probe assess: id %r: %s\n" % (obj.get("id"), exc))
            return EXIT_ERROR
        out = {k: v for k, v in obj.items() if k not in ("output", "output_ids")}
        out["id"] = obj["id"]
        out["verdict"] = "ok" if verdict == "ok" else "degenerate"
        out["text_verdict"] = verdict
        out["reasons"] = reasons
        any_bad = any_bad or verdict != "ok"
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
    return EXIT_FAIL if any_bad else EXIT_PASS


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.cmd == "probe":
        return cmd_probe(args)
    return cmd_assess(args)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(EXIT_ERROR)
