"""ddtree-bench's report: report.md and throughput.png from results files, on the controller.

Used by `bin/ddtree-bench report` (which the benchmark role runs on the controller). Kept out of
plugins/module_utils/bench/runner.py, which the sglang_bench module ships to every host: the host only
measures; rendering and plotting (matplotlib) happen here.
"""

from __future__ import annotations

import math


def fmt(v, digits: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "–"
    return f"{v:,.{digits}f}"


REPORT_COLUMNS = ("Candidate", "Concurrency", "Output tok/s", "vs {baseline}", "Req/s",
                  "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p90 ms",
                  "ITL p99 ms", "E2E p50 ms", "Accept len", "Errors")


def pick_baseline(results: list, wanted=None):
    names = [r.get("candidate") for r in results]
    if wanted:
        return wanted
    if "NEXTN" in names:
        return "NEXTN"
    return names[0] if names else None


def _ok(res: dict) -> bool:
    return res.get("status") == "ok" and bool(res.get("levels"))


def failure_reason(res: dict) -> str:
    ev = res.get("evidence")
    if isinstance(ev, dict):
        reason = ev.get("reason") or ""
        errs = ev.get("errors") or []
        if errs:
            reason = (reason + ": " if reason else "") + str(errs[0])
        return reason or "failed"
    if ev:
        return str(ev)
    return "failed (no reason recorded)"


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def throughput_ratios(results: list, baseline: str) -> dict:
    """{(candidate, concurrency): output_throughput / baseline's at that concurrency}."""
    base = next((r for r in results if r.get("candidate") == baseline and _ok(r)), None)
    base_tp = {}
    if base:
        base_tp = {lv["concurrency"]: lv.get("output_throughput") for lv in base["levels"]}
    out = {}
    for r in results:
        if not _ok(r):
            continue
        for lv in r["levels"]:
            b = base_tp.get(lv["concurrency"])
            v = lv.get("output_throughput")
            out[(r.get("candidate"), lv["concurrency"])] = (v / b) if (b and v is not None) else None
    return out


def render_report(results: list, baseline=None) -> str:
    """The markdown report: header, one row per candidate x concurrency, failures."""
    baseline = pick_baseline(results, baseline)
    ratios = throughput_ratios(results, baseline)
    hosts = sorted({str(r.get("host") or "?") for r in results})
    gpus = sorted({gpu_label(r.get("gpu")) for r in results})
    workloads = sorted({f"{(r.get('workload') or {}).get('version', '?')} "
                        f"({str((r.get('workload') or {}).get('hash', '?'))[:12]})"
                        for r in results})
    lines = ["# Serving benchmark", ""]
    lines.append(f"- Host: {', '.join(hosts)}")
    lines.append(f"- GPU: {', '.join(gpus)}")
    lines.append(f"- Workload: {', '.join(workloads)}")
    if len(workloads) > 1:
        lines.append("- **Warning: the results use different workloads; they are not comparable.**")
    lines.append(f"- Baseline for the ratio column: {baseline}")
    if not any(r.get("candidate") == baseline and _ok(r) for r in results):
        lines.append(f"- **Baseline {baseline} has no successful result: ratios are n/a.**")
    lines.append("- Metrics as in sglang bench_serving (docs/benchmark.md); "
                 "greedy, ignore_eos, fixed output lengths.")
    lines.append("")
    header = [c.format(baseline=baseline) for c in REPORT_COLUMNS]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|")
    for r in results:
        name = _md_escape(r.get("candidate") or "?")
        if not _ok(r):
            reason = _md_escape(failure_reason(r))[:300]
            cells = [name, "–", f"**FAILED**: {reason}"] + [""] * (len(header) - 3)
            lines.append("| " + " | ".join(cells) + " |")
            continue
        for lv in r["levels"]:
            c = lv["concurrency"]
            ratio = ratios.get((r.get("candidate"), c))
            if lv.get("completed", 0) == 0:
                cells = [name, str(c), "**FAILED**: every request failed"] + [""] * (len(header) - 3)
                lines.append("| " + " | ".join(cells) + " |")
                continue
            acc = lv.get("accept_length")
            cells = [name, str(c), fmt(lv.get("output_throughput")),
                     (f"{ratio:.2f}x" if ratio is not None else "n/a"),
                     fmt(lv.get("request_throughput"), 2),
                     fmt(lv.get("median_ttft_ms")), fmt(lv.get("p90_ttft_ms")),
                     fmt(lv.get("p99_ttft_ms")),
                     fmt(lv.get("median_itl_ms"), 2), fmt(lv.get("p90_itl_ms"), 2),
                     fmt(lv.get("p99_itl_ms"), 2), fmt(lv.get("median_e2e_latency_ms")),
                     fmt(acc, 2) if acc is not None else "–",
                     f"{lv.get('errors', 0)}/{lv.get('num_requests', lv.get('completed', 0))}"]
            lines.append("| " + " | ".join(cells) + " |")
    failed = [r for r in results if not _ok(r)]
    errs = [(r, lv) for r in results if _ok(r) for lv in r["levels"] if lv.get("errors")]
    if failed or errs:
        lines += ["", "## Failures and errors", ""]
        for r in failed:
            lines.append(f"- **{_md_escape(r.get('candidate'))}** failed: "
                         f"{_md_escape(failure_reason(r))}")
        for r, lv in errs:
            first = "; ".join(_md_escape(m) for m in lv.get("error_messages", [])[:2])
            lines.append(f"- {_md_escape(r.get('candidate'))} at concurrency {lv['concurrency']}: "
                         f"{lv['errors']} failed request(s): {first}")
    lines += ["", "## Candidates", ""]
    for r in results:
        versions = ", ".join(f"{k} {v}" for k, v in sorted((r.get("versions") or {}).items()))
        flags = " ".join(r.get("flags") or [])
        lines.append(f"- **{_md_escape(r.get('candidate'))}** ({r.get('status')}): "
                     f"versions: {_md_escape(versions) or '–'}; flags: `{flags or '–'}`")
    return "\n".join(lines) + "\n"


def gpu_label(gpu) -> str:
    if not gpu:
        return "unknown GPU"
    if isinstance(gpu, str):
        return gpu
    # gpu_facts (the Ansible module) reports `names`; the CLI's own nvidia-smi read gives `name`.
    name = gpu.get("name") or (gpu.get("names") or [None])[0] or "unknown GPU"
    count = gpu.get("count")
    label = f"{count}x {name}" if count and count > 1 else name
    if gpu.get("arch"):
        label += f" ({gpu['arch']})"
    return label


def plot(results, path, baseline):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    levels_seen = set()
    for r in results:
        name = str(r.get("candidate") or "?")
        if r.get("status") == "ok" and r.get("levels"):
            pts = [(lv["concurrency"], lv.get("output_throughput") or 0.0)
                   for lv in r["levels"] if lv.get("completed")]
            if not pts:
                continue
            xs, ys = zip(*pts)
            levels_seen.update(xs)
            style = "--" if name == baseline else "-"
            ax.plot(xs, ys, style, marker="o", label=name + (" (baseline)" if name == baseline else ""))
        else:
            ax.plot([], [], linestyle="none", marker="x", color="red",
                    label=f"{name}: FAILED")
    if levels_seen:
        ax.set_xscale("log", base=2)
        ticks = sorted(levels_seen)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlabel("Concurrency (requests in flight)")
    ax.set_ylabel("Output throughput (tokens/s)")
    hosts = ", ".join(sorted({str(r.get("host") or "?") for r in results}))
    gpus = ", ".join(sorted({gpu_label(r.get("gpu")) for r in results}))
    ax.set_title(f"Output tokens/s vs concurrency\nhost {hosts} - GPU {gpus}", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
