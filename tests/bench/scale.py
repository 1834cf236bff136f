#!/usr/bin/env python3
"""Scale benchmark for ddtree-fleet (not a pytest test: it prints numbers).

For each fleet size N (default 1, 4, 16) it boots N fresh lab hosts, then times

  deploy   a full deploy on fresh hosts: venv + patch set + weights + unit + /health + gate +
           promotion (deploy_ddtree.yml with the known-good algorithm, NEXTN, as lab_seed.yml
           does: every host, sm86 and sm120, ends promoted, rc 0); --deploy-repeat times;
  noop     the same command again: every host must report changed=0; --repeat times;
  drift1   one host drifted (its service stopped), then drift.yml: that host corrected, every
           other one in sync; --repeat times;
  ddtree   (with --ddtree) deploy_ddtree.yml with its default algorithm DDTREE on the seeded
           hosts: sm120 hosts promote, sm86 hosts fail the gate by design and roll back (their
           rc != 0 is expected and recorded, not an error).

and prints a table with min / median / max of T(N), the median's ratio to 1 host, and the tasks
each host went through in the no-op (from PLAY RECAP: ok + changed + skipped + failed; tasks that
run once per run count for the first host only, so the median over the hosts is the per-host
cost, free of timing noise). Results go to artifacts/scale.json (one entry per
--label, so a "before" and an "after" run sit side by side) and artifacts/scale.md.

Hosts. By default the benchmark boots a fleet of its own next to the main lab (sc01..sc16 at
10.213.100-115.x, a6000x2 / rtxpro6000x8 alternating) with `labctl up --fleet`, reaches it
through a generated inventory (a temp dir with hosts.yml and a link to inventory/lab/group_vars)
and tears it down at the end: ct129 / ct200 are never touched. --use-lab measures the default
lab instead (ct129, ct200, lab03.. of `labctl up --hosts N`, default inventory with -l): its
hosts are torn down and booted fresh for every size, and the lab is left as
`make lab-up N=<max size>` leaves it (booted and seeded).

Controller-side reports and evidence go to a temp dir (-e run_report_dir / known_good_artifacts_dir),
so concurrent users of artifacts/deploy/latest.json are not disturbed.

  .venv/bin/python tests/bench/scale.py [--sizes 1,4,16] [--repeat 3] [--deploy-repeat 1]
        [--forks 20] [--label after] [--ddtree] [--use-lab] [--keep]

Run it with nothing else running on the machine (the numbers are CPU-bound on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
LABCTL = REPO / "lab" / "labctl.py"
sys.path.insert(0, str(REPO / "tests" / "integration" / "lab"))
import labkit  # noqa: E402  (one environment for ansible-playbook, shared with the lab tests)
ARTIFACTS = REPO / "artifacts"
PROFILES = ("a6000x2", "rtxpro6000x8")
ARCH = {"a6000x2": "sm86", "rtxpro6000x8": "sm120"}


def log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def own_fleet(n: int) -> list[dict]:
    # 10.213.100-115.x: apart from the main lab (1-8), molecule (21-32), the bad-input host (51)
    # and the lab slots (62-91), so the benchmark may run while those are up.
    return [{"name": f"sc{i + 1:02d}", "index": 100 + i, "profile": PROFILES[i % 2]} for i in range(n)]


def lab_fleet(n: int) -> list[dict]:
    """The default lab's hosts of `labctl up --hosts n`: lab/fleet.json, then lab03.. alternating."""
    data = json.loads((REPO / "lab" / "fleet.json").read_text())
    hosts = [dict(h) for h in data["hosts"]]
    profiles = [h["profile"] for h in data["hosts"]]
    for i in range(len(hosts), n):
        hosts.append({"name": f"lab{i + 1:02d}", "index": i + 1, "profile": profiles[i % len(profiles)]})
    return hosts[:n]


def labctl(*args: str) -> float:
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(LABCTL), *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"labctl {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return time.monotonic() - t0


def write_fleet(path: Path, hosts: list[dict]) -> Path:
    path.write_text(json.dumps({"hosts": hosts}, indent=2) + "\n")
    return path


def write_inventory(inv_dir: Path, hosts: list[dict]) -> Path:
    """hosts.yml for the benchmark's fleet, with the lab settings through a group_vars link."""
    inv_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[dict]] = {"sm86": [], "sm120": []}
    for h in hosts:
        groups[ARCH[h["profile"]]].append(h)
    lines = ["---", "sglang_servers:", "  children:"]
    for g, members in groups.items():
        lines.append(f"    {g}:")
        if not members:
            lines.append("      hosts: {}")
            continue
        lines.append("      hosts:")
        for h in members:
            lines += [f"        {h['name']}:", f"          ansible_host: 10.213.{h['index']}.2"]
    (inv_dir / "hosts.yml").write_text("\n".join(lines) + "\n")
    link = inv_dir / "group_vars"
    if not link.exists():
        link.symlink_to(REPO / "inventory" / "lab" / "group_vars")
    return inv_dir


def ansible_env(tmp: Path) -> dict[str, str]:  # noqa: ARG001  (same signature as the callers expect)
    """labkit's environment for ansible-playbook (config, home, no colour, the venv on PATH)."""
    return labkit.ansible_env()


RECAP = re.compile(r"^(\S+)\s+:\s+(ok=.*)$", re.M)


def run_playbook(argv: list[str], env: dict, log_path: Path) -> dict:
    """Run ansible-playbook; wall time, rc, PLAY RECAP per host and the slowest tasks."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    with log_path.open("w") as fh:  # streamed: `tail -f` shows where a run is
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))
            fh.write(f"{lines[-1][0]:8.2f} {lines[-1][1]}\n")
            fh.flush()
    rc = proc.wait()
    seconds = time.monotonic() - t0
    out = "\n".join(line for _, line in lines)
    recap = {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
             for m in RECAP.finditer(out)}
    # Wall time between consecutive TASK / RUNNING HANDLER headers: where the run spends its time.
    marks = [(t, line) for t, line in lines if line.startswith(("TASK [", "RUNNING HANDLER [", "PLAY [", "PLAY RECAP"))]
    spans: dict[str, float] = {}
    for (t, line), (t_next, _) in zip(marks, marks[1:]):
        name = re.sub(r"\s*\*+$", "", line)
        spans[name] = spans.get(name, 0.0) + (t_next - t)
    slowest = sorted(spans.items(), key=lambda kv: -kv[1])[:12]
    return {"rc": rc, "seconds": round(seconds, 2), "recap": recap, "tasks": len(marks),
            "slowest": [[k, round(v, 2)] for k, v in slowest], "log": str(log_path)}


def tasks_per_host(recap: dict) -> dict:
    """Task results per host of one run (ok + changed + skipped + failed), their median and max."""
    counts = {h: sum(c.get(k, 0) for k in ("ok", "changed", "skipped", "failed")) for h, c in recap.items()}
    values = sorted(counts.values())
    return {"per_host": counts, "median": median(values) if values else 0, "max": max(values, default=0)}


def measure_size(n: int, args, tmp: Path) -> list[dict]:
    """Boot n fresh hosts, deploy (args.deploy_repeat times, fresh disks each time), then the
    no-op and the one-drifted-host drift run args.repeat times each."""
    hosts = (lab_fleet if args.use_lab else own_fleet)(n)
    names = [h["name"] for h in hosts]
    all_hosts = (lab_fleet if args.use_lab else own_fleet)(max(args.sizes))
    every = write_fleet(tmp / "fleet-all.json", all_hosts)
    env = ansible_env(tmp)
    known_good = ["-e", "sglang_speculative_algorithm=NEXTN"]
    points = []
    for rep in range(max(args.deploy_repeat, 1)):
        log(f"N={n} (deploy #{rep + 1}): fresh hosts {', '.join(names)}")
        labctl("down", "--fleet", str(every))  # fresh disks: a full deploy really installs everything
        if args.use_lab:
            boot_s = labctl("up", "--hosts", str(n))
            base = ["-l", ",".join(names)]
        else:
            boot_s = labctl("up", "--fleet", str(write_fleet(tmp / f"fleet-{n}.json", hosts)))
            base = ["-i", str(write_inventory(tmp / f"inventory-{n}", hosts))]
        log(f"N={n}: booted in {boot_s:.1f}s")
        outputs = ["-f", str(args.forks), "-e", f"run_report_dir={tmp / 'reports'}",
                   "-e", f"run_report_textfile_dir={tmp / 'reports'}", "-e", f"known_good_artifacts_dir={tmp / 'evidence'}"]
        deploy = [str(VENV_BIN / "ansible-playbook"), "deploy_ddtree.yml", *base, *outputs]
        drift = [str(VENV_BIN / "ansible-playbook"), "drift.yml", *base, *outputs]
        result = {"hosts": n, "names": names, "boot_s": round(boot_s, 1), "repeat": rep + 1}
        r = run_playbook(deploy + known_good, env, tmp / f"deploy-{n}-{rep + 1}.log")
        result["deploy"] = _judge(n, "deploy", r, names)
        points.append(result)
    last = points[-1]
    for rep in range(args.repeat):
        result = {"hosts": n, "names": names, "repeat": rep + 1}
        r = run_playbook(deploy + known_good, env, tmp / f"noop-{n}-{rep + 1}.log")
        result["noop"] = _judge(n, "noop", r, names)
        drifted = names[rep % n]
        stop = subprocess.run([str(VENV_BIN / "ansible"), *base, drifted, "-m", "ansible.builtin.systemd_service",
                               "-a", "name=sglang.service state=stopped"], cwd=REPO, env=env,
                              capture_output=True, text=True, check=False)
        r = run_playbook(drift + known_good, env, tmp / f"drift1-{n}-{rep + 1}.log")
        report = {}
        latest = tmp / "reports" / "latest.json"
        if latest.exists():
            report = {e["host"]: e["status"] for e in json.loads(latest.read_text()).get("hosts", [])}
        expected = {h: ("corrected" if h == drifted else "in_sync") for h in names}
        result["drift1"] = _judge(n, "drift1", r, names,
                                  extra=[] if stop.returncode == 0 and report == expected
                                  else [f"statuses {report}, expected {expected} (stop rc {stop.returncode})"])
        points.append(result)
    if args.ddtree:
        r = run_playbook(deploy, env, tmp / f"ddtree-{n}.log")
        report = {}
        latest = tmp / "reports" / "latest.json"
        if latest.exists():
            report = {e["host"]: e["outcome"] for e in json.loads(latest.read_text()).get("hosts", [])}
        r["outcomes"] = report
        expected = {h["name"]: ("promoted" if ARCH[h["profile"]] == "sm120" else "rolled_back") for h in hosts}
        r["ok"] = report == expected
        log(f"N={n}: ddtree {r['seconds']:7.1f}s rc={r['rc']} outcomes={report}"
            + ("" if r["ok"] else f"  PROBLEM: expected {expected} (log {r['log']})"))
        last["ddtree"] = r
    return points


def _judge(n: int, phase: str, r: dict, names: list[str], extra: list[str] | None = None) -> dict:
    changed = {h: c.get("changed", -1) for h, c in r["recap"].items()}
    r["changed"] = changed
    r["tasks_per_host"] = tasks_per_host(r["recap"])
    problems = list(extra or [])
    if r["rc"] != 0:
        problems.append(f"rc {r['rc']}")
    if sorted(r["recap"]) != sorted(names):
        problems.append(f"recap names {sorted(r['recap'])}")
    if phase == "noop" and any(c != 0 for c in changed.values()):
        problems.append(f"changed != 0: {changed}")
    r["ok"] = not problems
    log(f"N={n}: {phase:6s} {r['seconds']:7.1f}s rc={r['rc']} changed={sum(max(c, 0) for c in changed.values())}"
        f" tasks/host median {r['tasks_per_host']['median']} max {r['tasks_per_host']['max']}"
        + (f"  PROBLEM: {'; '.join(problems)} (log {r['log']})" if problems else ""))
    return r


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def summarise(points: list[dict], phases: list[str]) -> dict:
    """Per size and phase: the median wall time over the repeats, its spread, T(N)/T(1)."""
    table: dict[str, dict] = {}
    for n in sorted({p["hosts"] for p in points}):
        row = {}
        for ph in phases:
            ts = [p[ph]["seconds"] for p in points if p["hosts"] == n and ph in p]
            if ts:
                row[ph] = {"median_s": round(median(ts), 1), "min_s": min(ts), "max_s": max(ts), "runs": len(ts),
                           "tasks_per_host": median([p[ph]["tasks_per_host"]["median"] for p in points
                                                     if p["hosts"] == n and ph in p and "tasks_per_host" in p[ph]] or [0])}
        table[str(n)] = row
    first = table.get("1", {})
    for row in table.values():
        for ph, cell in row.items():
            if ph in first:
                cell["ratio_to_1"] = round(cell["median_s"] / first[ph]["median_s"], 2)
    return table


def render_md(data: dict) -> str:
    out = ["# ddtree-fleet scale benchmark", "",
           f"Machine: {data['machine']}. Reproduce: `.venv/bin/python tests/bench/scale.py` (see its --help).", ""]
    for label, run in data["runs"].items():
        phases = run["phases"]
        out += [f"## {label} ({run['when']}, forks {run['forks']}, {run['mode']})", "",
                "| hosts | " + " | ".join(f"{ph} s (T/T1)" for ph in phases) + " |",
                "|---|" + "---|" * len(phases)]
        for n, row in run["table"].items():
            cells = []
            for ph in phases:
                c = row.get(ph)
                ratio = f" ({c['ratio_to_1']:.2f}x)" if c and "ratio_to_1" in c else ""
                cells.append(f"{c['median_s']:.1f}{ratio}"
                             + (f" [{c['min_s']:.0f}-{c['max_s']:.0f}, {c['runs']} runs]" if c['runs'] > 1 else "")
                             + f", {c['tasks_per_host']:g} tasks/host"
                             if c else "-")
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        if run.get("note"):
            out += ["", run["note"]]
        out.append("")
    return "\n".join(out)


def machine() -> str:
    mem = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) // 1024 // 1024
    return f"{os.cpu_count()} cores, {mem} GiB RAM"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,4,16", help="fleet sizes, comma-separated (max 16)")
    ap.add_argument("--repeat", type=int, default=3, help="no-op and drift runs per size (min/median/max reported)")
    ap.add_argument("--deploy-repeat", type=int, default=1,
                    help="deploys from fresh hosts per size (each boots fresh disks; default 1)")
    ap.add_argument("--forks", type=int, default=20, help="ansible-playbook -f (default 20)")
    ap.add_argument("--label", default="run", help="name of this measurement in artifacts/scale.json (e.g. before, after)")
    ap.add_argument("--note", default="", help="free text stored with the measurement (e.g. what ran concurrently)")
    ap.add_argument("--ddtree", action="store_true", help="also time the DDTREE deploy on the seeded hosts")
    ap.add_argument("--use-lab", action="store_true",
                    help="measure the default lab (ct129, ct200, lab03..) instead of an own fleet sc01..sc16")
    ap.add_argument("--keep", action="store_true", help="leave the hosts of the last size running")
    ap.add_argument("--out", type=Path, default=ARTIFACTS, help="where scale.json and scale.md go")
    args = ap.parse_args()
    args.sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    if not args.sizes or args.sizes[0] < 1 or args.sizes[-1] > (8 if args.use_lab else 16):
        ap.error("--sizes: between 1 and 16 hosts (8 with --use-lab)")
    if os.geteuid() != 0:
        ap.error("run as root (labctl boots the hosts)")
    tmp = Path(tempfile.mkdtemp(prefix="ddtree-scale-"))
    log(f"work dir {tmp} (playbook logs, generated fleet and inventory)")
    points: list[dict] = []
    every = write_fleet(tmp / "fleet-all.json", (lab_fleet if args.use_lab else own_fleet)(args.sizes[-1]))
    try:
        for n in args.sizes:
            points.extend(measure_size(n, args, tmp))
            (tmp / "points.json").write_text(json.dumps(points, indent=2) + "\n")  # partial results
    finally:
        if args.use_lab:
            log(f"leaving the lab as `make lab-up N={args.sizes[-1]}` does")
            labctl("up", "--hosts", str(args.sizes[-1]))
            subprocess.run([str(VENV_BIN / "ansible-playbook"), "lab/playbooks/lab_seed.yml"], cwd=REPO,
                           env=ansible_env(tmp), stdout=subprocess.DEVNULL, check=False)
        elif not args.keep:
            labctl("down", "--fleet", str(every))
            log("benchmark fleet torn down")
    phases = ["deploy", "noop", "drift1"] + (["ddtree"] if args.ddtree else [])
    table = summarise(points, phases)
    print()
    print(f"{'hosts':>5} {'phase':>7} {'runs':>4} {'min s':>8} {'median s':>9} {'max s':>8} {'T/T1':>6} {'tasks/host':>10}")
    for n, row in table.items():
        for ph in phases:
            if ph in row:
                c = row[ph]
                print(f"{n:>5} {ph:>7} {c['runs']:>4} {c['min_s']:>8.1f} {c['median_s']:>9.1f} {c['max_s']:>8.1f}"
                      f" {c.get('ratio_to_1', 1):>6.2f} {c['tasks_per_host']:>10}")
    ok = all(p[ph]["ok"] for p in points for ph in phases if ph in p)
    print(f"\nall runs as expected: {ok}  (logs under {tmp})")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "scale.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data["machine"] = machine()
    data.setdefault("runs", {})[args.label] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "forks": args.forks,
        "mode": "default lab" if args.use_lab else "own fleet sc01..",
        "phases": phases, "table": table, "points": points, "all_ok": ok, "note": args.note,
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3]}
    path.write_text(json.dumps(data, indent=2) + "\n")
    (args.out / "scale.md").write_text(render_md(data))
    log(f"wrote {path} and {args.out / 'scale.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
