"""Helpers for the lab integration tests: ssh into lab hosts, run the playbooks, snapshot hosts.

Everything here talks to the real lab that ``lab/labctl.py up`` boots (systemd-nspawn hosts
reached over ssh, each with its own network namespace).

Lab slots: ``labctl up --slots K`` boots K copies of the lab (ct129 + ct200), one per pytest-xdist
worker, so lab tests run side by side. Worker ``gw<k>`` (or ``DDTREE_LAB_SLOT=k``) uses slot k:
slot 0 is the main lab (inventory/lab, artifacts/), slot k >= 1 the machines s<k>-ct129 and
s<k>-ct200 under the inventory names ct129 and ct200, with their own inventory
($DDTREE_LAB_STATE/slots/<k>/inventory), fact cache and artifacts/lab-slot<k>/. Tests name hosts
by inventory name; everything here maps that name to the slot's machine, address and netns.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = REPO / ".venv" / "bin"
LAB_STATE = Path(os.environ.get("DDTREE_LAB_STATE", "/var/lib/ddtree-lab"))


def lab_slot() -> int:
    """This process's lab slot: $DDTREE_LAB_SLOT, else the xdist worker number (gw3 -> 3), else 0."""
    if os.environ.get("DDTREE_LAB_SLOT"):
        return int(os.environ["DDTREE_LAB_SLOT"])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


SLOT = lab_slot()
SLOT_DIR = LAB_STATE / "slots" / str(SLOT)
HOSTS_JSON = SLOT_DIR / "hosts.json" if SLOT else LAB_STATE / "hosts.json"
INVENTORY = SLOT_DIR / "inventory" if SLOT else REPO / "inventory" / "lab"
FLEET_FILE = SLOT_DIR / "fleet.json" if SLOT else None  # for labctl up/down/restart --fleet
ARTIFACTS = REPO / "artifacts" / f"lab-slot{SLOT}" if SLOT else REPO / "artifacts"
TIMINGS = REPO / "artifacts" / "timings.txt"
LOGS = REPO / "artifacts" / "logs"
STATE_DIR = "/var/lib/ddtree-fleet"
UNIT = "/etc/systemd/system/sglang.service"
ENV_FILE = "/etc/sglang/sglang.env"
SERVICE_URL = "http://127.0.0.1:30000"
LAB_HOSTS = ("ct129", "ct200")
KNOWN_GOOD_ALGORITHM = "NEXTN"


def lab_hosts() -> dict[str, dict]:
    """inventory name -> entry of the slot's hosts.json (machine, address, netns, identity_file,
    known_hosts)."""
    return {h["name"]: h for h in json.loads(HOSTS_JSON.read_text())}


def machine(host: str) -> str:
    """The lab machine behind an inventory name (labctl restart takes it): ct129 or s2-ct129."""
    return lab_hosts()[host].get("machine", host)


def netns(host: str) -> str:
    return lab_hosts()[host].get("netns", f"ddl-{host}")


def labctl_argv(*args: str) -> list[str]:
    """lab/labctl.py for this slot's hosts: up/down/restart get the slot's fleet file when k >= 1
    (snapshot and reset find a host from the record next to its disk; status lists every host)."""
    argv = [str(VENV_BIN / "python"), str(REPO / "lab" / "labctl.py"), *args]
    if FLEET_FILE is not None and args and args[0] in ("up", "down", "restart"):
        argv += ["--fleet", str(FLEET_FILE)]
    return argv


# One SSH connection per host, shared by every check a test makes (a fresh login costs the host
# and the controller about 0.2 s of CPU: with hundreds of checks and polls per run that was a
# tenth of the lab stage's CPU). A master that loses its host (reboot, reset, cut link) is
# noticed by the keepalive and replaced by the next call.
SSH_MUX_DIR = Path("/tmp/ddtree-lab-tests-ssh")
SSH_MUX = ["-o", "ControlMaster=auto", "-o", f"ControlPath={SSH_MUX_DIR}/%C", "-o", "ControlPersist=30",
           "-o", "ServerAliveInterval=3", "-o", "ServerAliveCountMax=3"]


def ssh_argv(host: str, command: str, connect_timeout: int = 10) -> list[str]:
    h = lab_hosts()[host]
    SSH_MUX_DIR.mkdir(mode=0o700, exist_ok=True)
    return ["ssh", "-i", h["identity_file"], "-o", f"UserKnownHostsFile={h['known_hosts']}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", *SSH_MUX,
            "-o", f"ConnectTimeout={connect_timeout}", f"root@{h['address']}", command]


def ssh(host: str, command: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    res = subprocess.run(ssh_argv(host, command), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"ssh {host} {command!r} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
    return res


def ansible_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for secret in ("SGLANG_API_KEY", "SGLANG_ADMIN_API_KEY", "HF_TOKEN"):   # the lab reads them (inventory/lab); tests set them
        env.pop(secret, None)
    env.update(extra or {})
    if SLOT:  # the slot's own inventory (same host names) and fact cache
        env.setdefault("ANSIBLE_INVENTORY", str(INVENTORY))
        env.setdefault("ANSIBLE_CACHE_PLUGIN_CONNECTION", str(REPO / ".ansible" / f"facts-slot{SLOT}"))
    env.update({
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_HOME": str(REPO / ".ansible"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}",
    })
    env.setdefault("XDG_CACHE_HOME", "/tmp/ddtree-fleet-cache")
    return env


@dataclass
class Run:
    """One ansible-playbook run: exit code, output, wall time and when each output line arrived."""
    argv: list[str]
    rc: int
    out: str
    seconds: float
    lines: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, line)

    def recap(self, host: str) -> dict[str, int]:
        m = re.search(rf"^{re.escape(host)}\s+:\s+(.*)$", self.out, re.M)
        assert m, f"no PLAY RECAP line for {host}:\n{self.tail()}"
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}

    def first_line_at(self, pattern: str) -> float | None:
        rx = re.compile(pattern)
        return next((t for t, line in self.lines if rx.search(line)), None)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.out.splitlines()[-n:])

    def __str__(self) -> str:
        return f"{' '.join(map(shlex.quote, self.argv))} -> rc {self.rc} in {self.seconds:.1f}s\n{self.tail()}"


_LOG_SEQ = [0]


def run_log(argv: list[str]) -> Path:
    """A new log file for one command of the current test: one directory per test under
    artifacts/logs/<slot>/ (tests of different workers never share a file)."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "outside-a-test").rsplit(" (", 1)[0]
    test_dir = re.sub(r"[^A-Za-z0-9_.=-]+", "_", current.split("/")[-1])[:150]
    _LOG_SEQ[0] += 1
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(argv[1] if len(argv) > 1 else argv[0]).name)
    path = LOGS / f"slot{SLOT}" / test_dir / f"{_LOG_SEQ[0]:03d}-{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def run_playbook(playbook: str, *args: str, timeout: float = 900, env: dict[str, str] | None = None) -> Run:
    """ansible-playbook from the repository root; every output line is timestamped as it arrives
    and written to the test's own log (run_log)."""
    argv = [str(VENV_BIN / "ansible-playbook"), playbook, *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=ansible_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    with run_log(argv).open("w") as log:
        log.write(" ".join(map(shlex.quote, argv)) + "\n")
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))
            log.write(line)
            if time.monotonic() - t0 > timeout:
                proc.kill()
                break
        rc = proc.wait(timeout=60)
        log.write(f"# rc {rc} after {time.monotonic() - t0:.1f}s\n")
    return Run(argv, rc, "\n".join(line for _, line in lines), time.monotonic() - t0, lines)


class Background:
    """ansible-playbook running in the background (for faults injected mid-run)."""

    def __init__(self, playbook: str, *args: str):
        import threading
        self.argv = [str(VENV_BIN / "ansible-playbook"), playbook, *args]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, cwd=REPO, env=ansible_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines: list[tuple[float, str]] = []
        self.log = run_log(self.argv)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("w") as log:
            log.write(" ".join(map(shlex.quote, self.argv)) + "\n")
            for line in self.proc.stdout:
                self.lines.append((time.monotonic() - self.t0, line.rstrip("\n")))
                log.write(line)
                log.flush()

    def saw(self, pattern: str) -> bool:
        rx = re.compile(pattern)
        return any(rx.search(line) for _, line in list(self.lines))

    def wait(self, timeout: float = 600) -> Run:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(timeout=30)
        self.reader.join(timeout=30)
        return Run(self.argv, rc, "\n".join(line for _, line in self.lines), time.monotonic() - self.t0, self.lines)


def wait_until(pred, timeout: float, interval: float = 0.5, what: str = "condition"):
    """Poll pred() until it returns something truthy; AssertionError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = pred()
        except (AssertionError, subprocess.TimeoutExpired):
            value = None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not reached within {timeout:.0f}s")


def run_ansible(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "ansible"), *args], cwd=REPO, env=ansible_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ host state

SNAPSHOT_SCRIPT = r"""
set -u
for d in /etc/systemd/system /etc/sglang /var/lib/ddtree-fleet; do
  [ -e "$d" ] || { echo "MISSING $d"; continue; }
  find "$d" -xdev -printf 'META %p %y %m %u %g %l\n'
  find "$d" -xdev -type f -print0 | xargs -0 -r sha256sum | sed 's/^/SHA /'
done
find /opt/sglang -printf 'OPT %p %s\n'
systemctl show sglang.service -p ActiveState -p ActiveEnterTimestamp -p MainPID | sed 's/^/SVC /'
"""


def snapshot(host: str) -> list[str]:
    """Sorted lines describing every byte under the project's paths plus the service's start."""
    res = ssh(host, SNAPSHOT_SCRIPT)
    return sorted(res.stdout.splitlines())


def snapshot_diff(before: list[str], after: list[str]) -> str:
    b, a = set(before), set(after)
    gone = sorted(b - a)
    new = sorted(a - b)
    return "\n".join([f"- {x}" for x in gone][:40] + [f"+ {x}" for x in new][:40])


def service(host: str) -> dict[str, str]:
    out = ssh(host, "systemctl show sglang.service -p ActiveState -p SubState -p ActiveEnterTimestamp "
                    "-p MainPID -p NRestarts").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def sha256(host: str, *paths: str) -> dict[str, str]:
    out = ssh(host, "sha256sum " + " ".join(map(shlex.quote, paths))).stdout
    return {p: s for s, p in (line.split(None, 1) for line in out.splitlines())}


def read_text(host: str, path: str) -> str:
    return ssh(host, f"cat {shlex.quote(path)}").stdout


def read_json(host: str, path: str) -> dict:
    return json.loads(read_text(host, path))


def quarantine_files(host: str) -> list[str]:
    out = ssh(host, f"ls -1 {STATE_DIR}/quarantine 2>/dev/null | grep '\\.json$' || true").stdout
    return sorted(out.split())


def clear_quarantine(host: str) -> None:
    ssh(host, f"rm -f {STATE_DIR}/quarantine/*.json")


def known_good(host: str) -> dict:
    """The known-good record: symlink target, meta.json and the sha256 of its unit and env."""
    link = ssh(host, f"readlink {STATE_DIR}/known-good", check=False).stdout.strip()
    meta = read_json(host, f"{STATE_DIR}/known-good/meta.json") if link else {}
    sums = sha256(host, f"{STATE_DIR}/known-good/unit", f"{STATE_DIR}/known-good/env") if link else {}
    return {"link": link, "meta": meta,
            "unit_sha256": sums.get(f"{STATE_DIR}/known-good/unit"),
            "env_sha256": sums.get(f"{STATE_DIR}/known-good/env")}


def seeded_problems(host: str) -> list[str]:
    """Why the host is not in the seeded state (empty list: it is)."""
    problems = []
    kg = known_good(host)
    if kg["meta"].get("algorithm") != KNOWN_GOOD_ALGORITHM:
        problems.append(f"known-good is {kg['meta'].get('algorithm')!r} ({kg['link'] or 'no record'})")
    else:
        live = sha256(host, UNIT, ENV_FILE)
        if live[UNIT] != kg["unit_sha256"] or live[ENV_FILE] != kg["env_sha256"]:
            problems.append("live unit/env differ from the known-good record")
    if service(host).get("ActiveState") != "active":
        problems.append("sglang.service is not active")
    if quarantine_files(host):
        problems.append(f"quarantine records {quarantine_files(host)}")
    return problems


def reseed() -> Run:
    """lab/playbooks/lab_seed.yml: every host back on the known-good NEXTN unit."""
    return run_playbook("lab/playbooks/lab_seed.yml")


def has_snapshot(host: str) -> bool:
    """lab/seed.sh kept a snapshot of the host's disk right after seeding it (labctl snapshot)."""
    return (LAB_STATE / "hosts" / machine(host) / "snapshot").is_dir()


def reset_to_snapshot(hosts: list[str]) -> None:
    """labctl reset: the hosts' disks back to their seeded snapshot, booted, the known-good
    service answering /health (a few seconds, where lab_seed.yml redeploys for about a minute)."""
    res = subprocess.run(labctl_argv("reset", *map(machine, hosts)), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"labctl reset {hosts} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    health = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 {SERVICE_URL}/health || true"
    for h in hosts:
        wait_until(lambda: ssh(h, health).stdout.strip() == "200", 120, what=f"{h}'s known-good service healthy")


def restore_seeded(hosts: list[str], reason: str) -> None:
    """Put the hosts back on the seeded state even where it looks seeded (a known-good that is
    NEXTN with other settings): reset to the snapshots, else lab_seed.yml."""
    print(f"\n[lab] back to the seeded state: {hosts} ({reason})")
    if all(has_snapshot(h) for h in hosts):
        reset_to_snapshot(hosts)
    else:
        res = reseed()
        assert res.rc == 0, f"reseed failed:\n{res}"
    left = {h: seeded_problems(h) for h in hosts}
    assert not any(left.values()), f"not seeded after the reset: {left}"


def ensure_seeded(reason: str) -> None:
    """Clear quarantine records and bring every host that is not in the seeded state back to it:
    reset to its seeded snapshot where there is one, else (or if that did not do it) lab_seed.yml."""
    problems = {h: seeded_problems(h) for h in LAB_HOSTS}
    for h in LAB_HOSTS:
        clear_quarantine(h)
    broken = [h for h, p in problems.items() if any(not x.startswith("quarantine") for x in p)]
    if not broken:
        return
    if all(has_snapshot(h) for h in broken):
        print(f"\n[lab] resetting {broken} to their seeded snapshots ({reason}): {problems}")
        reset_to_snapshot(broken)
        left = {h: seeded_problems(h) for h in LAB_HOSTS}
        if not any(left.values()):
            return
        problems = left
    print(f"\n[lab] reseeding ({reason}): {problems}")
    res = reseed()
    assert res.rc == 0, f"reseed failed:\n{res}"
    left = {h: seeded_problems(h) for h in LAB_HOSTS}
    assert not any(left.values()), f"still not seeded after lab_seed.yml: {left}"


# ------------------------------------------------------------------ probe and evidence

def probe(host: str, timeout: float = 300) -> tuple[int, dict | None, str]:
    """bin/ddtree-probe against the host's service, from inside its network namespace."""
    argv = ["ip", "netns", "exec", netns(host), str(VENV_BIN / "python"), str(REPO / "bin" / "ddtree-probe"),
            "probe", "--url", SERVICE_URL]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    try:
        report = json.loads(res.stdout)
    except ValueError:
        report = None
    return res.returncode, report, res.stderr


def evidence_dirs(host: str) -> set[Path]:
    d = ARTIFACTS / host
    return {p for p in d.iterdir() if p.is_dir()} if d.is_dir() else set()


def new_evidence_dir(host: str, before: set[Path]) -> Path:
    new = sorted(evidence_dirs(host) - before)
    assert new, f"no new evidence directory under {ARTIFACTS / host}"
    return new[-1]


def watchdog_evidence(host: str) -> set[str]:
    """The host's own watchdog evidence directories (<state dir>/evidence/watchdog-*)."""
    return set(ssh(host, f"ls -1d {STATE_DIR}/evidence/watchdog-* 2>/dev/null || true").stdout.split())


def watchdog_restored(host: str, before: set[str], kg_unit_sha: str, timeout: float = 90) -> str:
    """Wait for the watchdog to put the known-good unit back; return its one new evidence directory.

    The evidence holds the unit the watchdog replaced (``unit``) and what fired it (``trigger``):
    that, not a look at the host right after the crash (the timer may already have fired on a slow
    machine), is what proves a candidate was serving when the run died.
    """
    wait_until(lambda: sha256(host, UNIT)[UNIT] == kg_unit_sha, timeout=timeout, interval=1,
               what=f"the watchdog restoring the known-good unit on {host}")
    wait_until(lambda: "restored known-good" in ssh(
        host, "journalctl -u ddtree-fleet-watchdog --no-pager -o cat").stdout,
        timeout=timeout, interval=1, what=f"the watchdog's 'restored known-good' journal line on {host}")
    new = sorted(watchdog_evidence(host) - before)
    assert len(new) == 1, (before, new)
    assert read_text(host, f"{new[0]}/trigger").strip() == "timer"
    return new[0]


def parse_iso(ts: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def record_timing(label: str, **values: float | str) -> str:
    """Print a timing line (pytest -s) and append it to artifacts/timings.txt."""
    parts = " ".join(f"{k}={v:.2f}s" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {label}: {parts}"
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    line = f"{line} (lab slot {SLOT})" if SLOT else line
    with TIMINGS.open("a") as fh:
        fh.write(line + "\n")
    print(f"\n[timing] {line}")
    return line
