"""Helpers for the lab integration tests: ssh into lab hosts, run the playbooks, snapshot hosts.

Everything here talks to the real lab that ``lab/labctl.py up`` boots (systemd-nspawn hosts
reached over ssh, each with its own network namespace ``ddl-<name>``).
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
HOSTS_JSON = LAB_STATE / "hosts.json"
ARTIFACTS = REPO / "artifacts"
TIMINGS = ARTIFACTS / "timings.txt"
STATE_DIR = "/var/lib/ddtree-fleet"
UNIT = "/etc/systemd/system/sglang.service"
ENV_FILE = "/etc/sglang/sglang.env"
SERVICE_URL = "http://127.0.0.1:30000"
LAB_HOSTS = ("ct129", "ct200")
KNOWN_GOOD_ALGORITHM = "NEXTN"


def lab_hosts() -> dict[str, dict]:
    """name -> entry of /var/lib/ddtree-lab/hosts.json (address, identity_file, known_hosts)."""
    return {h["name"]: h for h in json.loads(HOSTS_JSON.read_text())}


def ssh_argv(host: str, command: str, connect_timeout: int = 10) -> list[str]:
    h = lab_hosts()[host]
    return ["ssh", "-i", h["identity_file"], "-o", f"UserKnownHostsFile={h['known_hosts']}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={connect_timeout}", f"root@{h['address']}", command]


def ssh(host: str, command: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    res = subprocess.run(ssh_argv(host, command), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"ssh {host} {command!r} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
    return res


def ansible_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for secret in ("SGLANG_API_KEY", "HF_TOKEN"):   # the lab reads them (inventory/lab); tests set them
        env.pop(secret, None)
    env.update(extra or {})
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


def run_playbook(playbook: str, *args: str, timeout: float = 900, env: dict[str, str] | None = None) -> Run:
    """ansible-playbook from the repository root; every output line is timestamped as it arrives."""
    argv = [str(VENV_BIN / "ansible-playbook"), playbook, *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=ansible_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.monotonic() - t0, line.rstrip("\n")))
        if time.monotonic() - t0 > timeout:
            proc.kill()
            break
    rc = proc.wait(timeout=60)
    return Run(argv, rc, "\n".join(line for _, line in lines), time.monotonic() - t0, lines)


class Background:
    """ansible-playbook running in the background (for faults injected mid-run)."""

    def __init__(self, playbook: str, *args: str):
        import threading
        self.argv = [str(VENV_BIN / "ansible-playbook"), playbook, *args]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic() - self.t0, line.rstrip("\n")))

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
                          capture_output=True, text=True, timeout=timeout)


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
    """playbooks/lab_seed.yml: every host back on the known-good NEXTN unit."""
    return run_playbook("playbooks/lab_seed.yml")


def ensure_seeded(reason: str) -> None:
    """Clear quarantine records and reseed when a host is not in the seeded state."""
    problems = {h: seeded_problems(h) for h in LAB_HOSTS}
    for h in LAB_HOSTS:
        clear_quarantine(h)
    if any(p for h, p in problems.items() if any(not x.startswith("quarantine") for x in p)):
        print(f"\n[lab] reseeding ({reason}): {problems}")
        res = reseed()
        assert res.rc == 0, f"reseed failed:\n{res}"
        left = {h: seeded_problems(h) for h in LAB_HOSTS}
        assert not any(left.values()), f"still not seeded after lab_seed.yml: {left}"


# ------------------------------------------------------------------ probe and evidence

def probe(host: str, timeout: float = 300) -> tuple[int, dict | None, str]:
    """bin/ddtree-probe against the host's service, from inside its network namespace."""
    argv = ["ip", "netns", "exec", f"ddl-{host}", str(VENV_BIN / "python"), str(REPO / "bin" / "ddtree-probe"),
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


def parse_iso(ts: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def record_timing(label: str, **values: float | str) -> str:
    """Print a timing line (pytest -s) and append it to artifacts/timings.txt."""
    parts = " ".join(f"{k}={v:.2f}s" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {label}: {parts}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with TIMINGS.open("a") as fh:
        fh.write(line + "\n")
    print(f"\n[timing] {line}")
    return line
