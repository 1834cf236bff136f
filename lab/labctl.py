#!/usr/bin/env python3
"""ddtree-fleet lab: GPU-less stand-ins for ct129 / ct200 as systemd-nspawn containers.

Each lab host is a Debian 12 container booted with systemd as PID 1, with sshd, journald and a
lab-only nvidia-smi, in its own network namespace reached over a veth pair:

    root namespace   ddl<N>h  10.213.<N>.1/30  <-->  10.213.<N>.2/30  eth0  (netns ddl-<name>)

The lab's package/model mirror listens on 10.213.0.1 (an address on the root namespace's lo),
reached from every host through its veth gateway, as an air-gapped site's local mirror would be.

Commands (run as root):
  image            build the cached base rootfs (debootstrap) unless it is current
  up [--hosts N] [--slots K]
                   build the image if needed, start the mirror, boot every host, wait until
                   sshd answers and systemd reports running; idempotent. --slots K also boots
                   K-1 copies of lab/fleet.json ("slots", one per parallel test worker):
                   slot k's hosts are the machines s<k>-ct129, s<k>-ct200 whose inventory
                   names (and hostnames) are ct129, ct200, with their own addresses; their
                   hosts.json and Ansible inventory are under $DDTREE_LAB_STATE/slots/<k>/.
                   A new slot host's disk starts as a copy of its main-lab host's seeded
                   snapshot (less that host's identity), and gets a snapshot of its own
  down             stop everything and remove every process, mount, netns, veth and cgroup
                   the lab made, also after a crashed or interrupted run; idempotent
  snapshot NAME..  keep each host's disk as it is now (lab/seed.sh takes one of every seeded
                   host): orderly shutdown, copy of the overlay's upper dir, boot again
  reset NAME..     put each host back on its snapshot: power cut, upper dir replaced by a copy
                   of the snapshot, boot; the lab tests' cheap way back to the seeded state
  restart NAME     power-cycle one running host: kill its container (every process of its
                   cgroup, no orderly shutdown), keep its disk (overlay upper dir) and network
                   namespace, boot it again, wait until sshd answers and systemd reports
                   running, print the seconds taken
  status           print the state of every host as JSON
  mirror           (re)build the mirror tree only

State lives outside the checkout: the image and download caches under $DDTREE_LAB_CACHE
(default /var/cache/ddtree-lab), per-host roots, keys and PIDs under $DDTREE_LAB_STATE
(default /var/lib/ddtree-lab).
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent
REPO = LAB_DIR.parent
CACHE = Path(os.environ.get("DDTREE_LAB_CACHE", "/var/cache/ddtree-lab"))
STATE = Path(os.environ.get("DDTREE_LAB_STATE", "/var/lib/ddtree-lab"))
FLEET_FILE = LAB_DIR / "fleet.json"
SUITE = "bookworm"
# Every OS package the roles need on a host is baked in here: the hosts have no internet.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "libpam-systemd", "python3", "python3-venv",
    "python3-apt", "openssh-server", "sudo", "iproute2", "patch", "acl", "procps",
    "ca-certificates", "curl", "less",
]
# A control node can live on a lab host too (the drift timer test runs drift.yml there): the
# mirror also serves ansible-core and its dependencies for the host's Python (3.11 on bookworm).
CONTROLLER_REQUIREMENTS = ["ansible-core==2.19.14"]
MIRROR_ADDR = "10.213.0.1"
MIRROR_PORT = 8873
SSH_DIR = STATE / "ssh"
KEY = SSH_DIR / "id_ed25519"
KNOWN_HOSTS = SSH_DIR / "known_hosts"
# Each host's definition (name, index, profile, image) next to its disk, written by `up`.
HOST_RECORD = "host.json"
# Slot k >= 1 (labctl up --slots): a copy of lab/fleet.json at indexes SLOT_BASE_INDEX + 2k, +2k+1.
# Indexes in use elsewhere: lab 1-8 (--hosts N), molecule 21-22 and 31-32, tests/bench/scale.py
# 41-48, the bad-input matrix 51.
SLOT_BASE_INDEX = 60
MAX_SLOTS = 16


def log(msg: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, check=True, capture=False, **kw):
    if capture:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
    res = subprocess.run(cmd, check=False, text=True, **kw)
    if check and res.returncode != 0:
        err = (res.stderr or "").strip() if capture else ""
        raise SystemExit(f"lab: command failed ({res.returncode}): {' '.join(map(str, cmd))}\n{err}")
    return res


# ---------------------------------------------------------------- fleet definition

def fleet(n_hosts: int | None = None, fleet_file: Path | None = None) -> list[dict]:
    """Hosts of lab/fleet.json (or of another fleet file that uses the same profiles)."""
    data = json.loads(FLEET_FILE.read_text())
    hosts = list(json.loads(fleet_file.read_text())["hosts"] if fleet_file else data["hosts"])
    if n_hosts is not None and n_hosts > len(hosts):
        # Extra hosts for scale tests alternate between the two architectures.
        profiles = [h["profile"] for h in data["hosts"]]
        for i in range(len(hosts), n_hosts):
            hosts.append({"name": f"lab{i + 1:02d}", "index": i + 1, "profile": profiles[i % len(profiles)]})
    elif n_hosts is not None:
        hosts = hosts[:n_hosts]
    return describe(hosts, data)


def describe(hosts: list[dict], data: dict | None = None) -> list[dict]:
    """Fleet entries (name, index, profile) completed with addresses, devices and paths."""
    data = data or json.loads(FLEET_FILE.read_text())
    hosts = [dict(h) for h in hosts]
    for h in hosts:
        prof = data["profiles"][h["profile"]]
        h.setdefault("alias", h["name"])  # inventory name and hostname (slot hosts: ct129 for s1-ct129)
        h.update(arch_group=prof["arch_group"], gpus=prof["gpus"],
                 addr=f"10.213.{h['index']}.2", gw=f"10.213.{h['index']}.1",
                 netns=f"ddl-{h['name']}", veth_host=f"ddl{h['index']}h", veth_ct=f"ddl{h['index']}c",
                 dir=STATE / "hosts" / h["name"])
    return hosts


def slot_fleet(k: int) -> list[dict]:
    """Slot k's hosts: lab/fleet.json's hosts under machine names s<k>-<name>, own addresses."""
    if not 1 <= k < MAX_SLOTS:
        raise SystemExit(f"lab: slot {k} is out of range (1..{MAX_SLOTS - 1})")
    base = json.loads(FLEET_FILE.read_text())["hosts"]
    return describe([{"name": f"s{k}-{h['name']}", "alias": h["name"], "profile": h["profile"],
                      "index": SLOT_BASE_INDEX + len(base) * k + i} for i, h in enumerate(base)])


def known_hosts_on_disk() -> list[dict]:
    """Hosts that left state behind (possibly from a larger fleet or a crashed run)."""
    names = {p.name for p in (STATE / "hosts").glob("*") if p.is_dir()} if (STATE / "hosts").exists() else set()
    names |= {n[4:] for n in netns_list() if n.startswith("ddl-")}
    hosts = {h["name"]: h for h in fleet(max(8, len(names) + 2))}
    out = []
    for name in sorted(names):
        rec = STATE / "hosts" / name / HOST_RECORD
        if name in hosts:
            out.append(hosts[name])
        elif rec.exists():  # a host of another fleet file (labctl up --fleet): its own record
            try:
                data = json.loads(rec.read_text())
                out.append(describe([{k: data[k] for k in ("name", "index", "profile", "alias") if k in data}])[0])
            except (ValueError, KeyError):
                out.append({"name": name, "netns": f"ddl-{name}", "veth_host": None, "dir": STATE / "hosts" / name})
        else:  # unknown name: tear down what we can find by name
            out.append({"name": name, "netns": f"ddl-{name}", "veth_host": None,
                        "dir": STATE / "hosts" / name})
    return out


# ---------------------------------------------------------------- base image

def recipe_text() -> str:
    parts = [SUITE, " ".join(PACKAGES), (LAB_DIR / "image" / "nvidia-smi").read_text(),
             (LAB_DIR / "image" / "zipimport_cache.py").read_text(), inspect.getsource(customize)]
    return "\n".join(parts)


def recipe_hash() -> str:
    return hashlib.sha256(recipe_text().encode()).hexdigest()[:12]


def debian_mirror() -> str:
    if os.environ.get("DDTREE_LAB_DEBIAN_MIRROR"):
        return os.environ["DDTREE_LAB_DEBIAN_MIRROR"]
    # Use the archive this machine's apt already uses (no host name is baked into the repo).
    candidates = list(Path("/etc/apt").glob("sources.list.d/*.sources"))
    for src in candidates:
        for stanza in src.read_text().split("\n\n"):
            if re.search(rf"^Suites:.*\b{SUITE}\b(?!-)", stanza, re.M) and "security" not in stanza:
                m = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if m:
                    return m.group(1)
    for src in [Path("/etc/apt/sources.list"), *Path("/etc/apt").glob("sources.list.d/*.list")]:
        if src.exists():
            for line in src.read_text().splitlines():
                m = re.match(rf"deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", line)
                if m and "security" not in line:
                    return m.group(1)
    raise SystemExit("lab: no Debian archive found in /etc/apt; set DDTREE_LAB_DEBIAN_MIRROR")


def image_dir() -> Path:
    return CACHE / f"base-{recipe_hash()}"


def build_image() -> Path:
    target = image_dir()
    rootfs = target / "rootfs"
    if (target / "READY").exists():
        log(f"base image {target.name} is current (cached)")
        return rootfs
    for tool in ("debootstrap", "systemd-nspawn", "ssh-keygen"):
        if not shutil.which(tool):
            raise SystemExit(f"lab: {tool} is missing; run `make lab-deps` (apt packages debootstrap, "
                             "systemd-container, openssh-client)")
    t0 = time.time()
    tmp = CACHE / f".building-{recipe_hash()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    log(f"building base image {target.name} with debootstrap (about a minute)")
    run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
         str(tmp / "rootfs"), debian_mirror()], stdout=subprocess.DEVNULL)
    customize(tmp / "rootfs")
    (tmp / "RECIPE").write_text(recipe_text())
    (tmp / "READY").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    # Drop older images: only the current recipe is kept.
    for old in CACHE.glob("base-*"):
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    log(f"base image built in {time.time() - t0:.0f}s")
    return target / "rootfs"


def customize(root: Path) -> None:
    """Everything a bare debootstrap needs to become a lab host image."""
    shutil.copy(LAB_DIR / "image" / "nvidia-smi", root / "usr/bin/nvidia-smi")
    os.chmod(root / "usr/bin/nvidia-smi", 0o755)
    (root / "etc/ddtree-lab").mkdir(exist_ok=True)
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/10-lab.conf").write_text(
        "# ddtree-fleet lab: key-only root login, no DNS lookups\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n")
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # every host gets its own keys
    (root / "etc/machine-id").write_text("")
    # No DNS in the lab: resolve localhost from /etc/hosts and fail other lookups at once
    # (an unreachable nameserver makes every getfqdn() wait 10 s).
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/resolv.conf").write_text("# ddtree-fleet lab: no DNS (hosts reach only the lab mirror, by address)\n")
    (root / "etc/hostname").write_text("lab\n")
    # No console getty to wait on; no network managers (the lab configures eth0 from outside).
    for unit in ("console-getty.service", "getty@tty1.service", "systemd-networkd-wait-online.service",
                 "apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"):
        link = root / "etc/systemd/system" / unit
        if not link.exists():
            link.symlink_to("/dev/null")
    (root / "etc/apt/apt.conf.d/99-lab-offline").write_text(
        'Acquire::Retries "0";\nAPT::Periodic::Enable "0";\n')
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    # A lab-only speed-up: Ansible's modules arrive as zips of sources, compiled again by every
    # task; the host keeps their bytecode (lab/image/zipimport_cache.py). Production hosts are
    # untouched by it; what a module does is the same either way.
    site = next((root / "usr/lib").glob("python3.*/")).name
    dist = root / "usr/local/lib" / site / "dist-packages"
    dist.mkdir(parents=True, exist_ok=True)
    shutil.copy(LAB_DIR / "image" / "zipimport_cache.py", dist / "ddtree_lab_zipimport_cache.py")
    (dist / "ddtree_lab_zipimport_cache.pth").write_text("import ddtree_lab_zipimport_cache\n")
    (root / "var/cache/ddtree-lab/zipimport-pyc").mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------- mirror

def mirror_inputs() -> str:
    """Identity of everything the mirror is built from (rebuild only when it changes)."""
    h = hashlib.sha256()
    for path in sorted((LAB_DIR / "standin").rglob("*")):
        # Sources only: building the wheel writes build/ and *.egg-info into the tree, and a stamp
        # that counted them would rebuild the mirror (and change its lock) at the next lab up.
        parts = path.relative_to(LAB_DIR / "standin").parts
        if path.is_file() and "__pycache__" not in parts and parts[0] not in ("build", "dist") \
                and not any(p.endswith(".egg-info") for p in parts):
            h.update(str(path.relative_to(LAB_DIR)).encode() + b"\0" + path.read_bytes())
    h.update((LAB_DIR / "mirror" / "make_models.py").read_bytes())
    h.update(" ".join(CONTROLLER_REQUIREMENTS).encode())
    h.update(b"requirements-lab.lock v1")    # what the mirror holds besides the inputs' outputs
    return h.hexdigest()[:16]


def write_lab_lock(path: Path, wheels: list) -> None:
    """The lab venv's hash lock (inventory/lab: sglang_requirements_lock): the mirror's sglang
    wheel and stand-in, each pinned with the sha256 of the file the mirror serves. The lab
    installs without dependencies (sglang_pip_no_deps), so the two make the whole set."""
    lines = ["# The lab venv's hash lock, written by lab/labctl.py from the lab mirror's wheels.",
             "# (The stand-in wheel is built at each mirror build, so its hash is not checked in.)"]
    for whl in sorted(wheels, key=lambda w: w.name):
        name, version = whl.name.split("-")[:2]
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        lines += [f"{re.sub(r'[-_.]+', '-', name).lower()}=={version} \\", f"    --hash=sha256:{digest}"]
    path.write_text("\n".join(lines) + "\n")


def build_mirror() -> Path:
    """The lab's PyPI simple index (sglang wheel + stand-in) and model mirror, under CACHE.

    Built into a fresh directory and renamed into place, and only when its inputs changed, so a
    host that is downloading from the serving mirror never sees a half-written tree.
    """
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    mirror = CACHE / "mirror"
    stamp = mirror_inputs()
    if (mirror / "STAMP").exists() and (mirror / "STAMP").read_text().strip() == stamp:
        return mirror
    sg = list(wheels.glob("sglang-0.5.23-*.whl"))
    if not sg:
        log("downloading the real sglang==0.5.23 wheel (cached under %s)" % wheels)
        run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), "sglang==0.5.23"])
        sg = list(wheels.glob("sglang-0.5.23-*.whl"))
    controller = wheels / "controller"
    if not (controller / "READY").exists():
        log("downloading ansible-core and its dependencies for lab control nodes")
        shutil.rmtree(controller, ignore_errors=True)
        run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(controller),
             *CONTROLLER_REQUIREMENTS], env={**os.environ, "PIP_FIND_LINKS": "", "PIP_CONSTRAINT": ""})
        (controller / "READY").write_text(" ".join(CONTROLLER_REQUIREMENTS) + "\n")
    new = CACHE / f".mirror-{os.getpid()}"
    shutil.rmtree(new, ignore_errors=True)
    standin_dir = new / ".build"
    # SOURCE_DATE_EPOCH: the same sources give the same wheel bytes, so the lab lock's hash (and
    # the venv names that carry it) only change when the stand-in does.
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
         str(standin_dir), str(LAB_DIR / "standin")], stdout=subprocess.DEVNULL,
        env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"})
    standin = list(standin_dir.glob("*.whl"))
    simple = new / "simple"
    for whl in [*sg, *standin, *controller.glob("*.whl")]:
        project = re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()  # PEP 503 name
        (simple / project).mkdir(parents=True, exist_ok=True)
        shutil.copy(whl, simple / project / whl.name)
    for pdir in simple.iterdir():
        links = "".join(f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a><br>'
                        for w in sorted(pdir.glob("*.whl")))
        (pdir / "index.html").write_text(f"<!DOCTYPE html><html><body>{links}</body></html>\n")
    write_lab_lock(new / "requirements-lab.lock", [*sg, *standin])
    (simple / "index.html").write_text("<!DOCTYPE html><html><body>" + "".join(
        f'<a href="{p.name}/">{p.name}</a>' for p in sorted(simple.iterdir()) if p.is_dir()) + "</body></html>\n")
    shutil.rmtree(standin_dir)
    run([sys.executable, str(LAB_DIR / "mirror" / "make_models.py"), str(new / "models")], stdout=subprocess.DEVNULL)
    (new / "STAMP").write_text(stamp + "\n")
    old = CACHE / f".mirror-old-{os.getpid()}"
    if mirror.exists():
        mirror.rename(old)
    new.rename(mirror)
    shutil.rmtree(old, ignore_errors=True)
    log(f"mirror rebuilt ({stamp})")
    return mirror


def mirror_pidfile() -> Path:
    return STATE / "mirror.pid"


def pid_alive(pid: int, needle: str) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# Every container's systemd (and its user manager) takes inotify instances from the one host UID
# they all run as; the kernel's default of 128 runs out at about a dozen hosts, and the next
# host boots degraded (user@0.service failed).
INOTIFY_INSTANCES_PER_HOST = 32
INOTIFY_INSTANCES_SYSCTL = Path("/proc/sys/fs/inotify/max_user_instances")


def ensure_inotify_instances(n_hosts: int) -> None:
    """Raise fs.inotify.max_user_instances to room for n_hosts more containers (never lower it)."""
    try:
        current = int(INOTIFY_INSTANCES_SYSCTL.read_text())
    except (OSError, ValueError):
        return
    running = len(list((STATE / "hosts").glob("*"))) if (STATE / "hosts").is_dir() else 0
    wanted = 128 + INOTIFY_INSTANCES_PER_HOST * (running + n_hosts)
    if wanted > current:
        INOTIFY_INSTANCES_SYSCTL.write_text(f"{wanted}\n")
        log(f"fs.inotify.max_user_instances {current} -> {wanted} (room for {running + n_hosts} lab hosts)")


def ensure_lo_addr() -> None:
    out = run(["ip", "-o", "addr", "show", "dev", "lo"], capture=True).stdout
    if f"{MIRROR_ADDR}/32" not in out:
        run(["ip", "addr", "add", f"{MIRROR_ADDR}/32", "dev", "lo"])


def start_mirror() -> None:
    mirror = build_mirror()
    ensure_lo_addr()
    pid = read_pid(mirror_pidfile())
    if pid and pid_alive(pid, "ddtree-lab-mirror"):
        log(f"mirror already serving on http://{MIRROR_ADDR}:{MIRROR_PORT}/ (pid {pid})")
        return
    logf = open(STATE / "mirror.log", "ab")
    proc = subprocess.Popen([sys.executable, str(LAB_DIR / "mirror" / "serve.py"), "--bind", MIRROR_ADDR,
                             "--port", str(MIRROR_PORT), "--root", str(mirror), "--tag", "ddtree-lab-mirror"],
                            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
    mirror_pidfile().write_text(str(proc.pid))
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection((MIRROR_ADDR, MIRROR_PORT), timeout=1).close()
            log(f"mirror serving {mirror} on http://{MIRROR_ADDR}:{MIRROR_PORT}/ (pid {proc.pid})")
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"lab: mirror did not start; see {STATE / 'mirror.log'}")


def stop_mirror() -> None:
    pid = read_pid(mirror_pidfile())
    if pid and pid_alive(pid, "ddtree-lab-mirror"):
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not pid_alive(pid, "ddtree-lab-mirror"):
                break
            time.sleep(0.1)
    mirror_pidfile().unlink(missing_ok=True)
    out = run(["ip", "-o", "addr", "show", "dev", "lo"], capture=True).stdout
    if f"{MIRROR_ADDR}/32" in out:
        run(["ip", "addr", "del", f"{MIRROR_ADDR}/32", "dev", "lo"], check=False)


# ---------------------------------------------------------------- hosts

def netns_list() -> list[str]:
    out = run(["ip", "netns", "list"], capture=True, check=False).stdout or ""
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cgroup_dirs(name: str) -> list[Path]:
    base = Path("/sys/fs/cgroup")
    cg = f"ddtree-lab-{name}"
    if (base / "unified").is_dir():  # hybrid: v2 at unified/, v1 name=systemd at systemd/
        return [base / "unified" / cg, base / "systemd" / cg]
    return [base / cg]


def ensure_ssh_key() -> None:
    SSH_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not KEY.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ddtree-lab", "-f", str(KEY)])


def setup_network(h: dict) -> None:
    ns = h["netns"]
    if ns not in netns_list():
        run(["ip", "netns", "add", ns])
    links = run(["ip", "-o", "link", "show"], capture=True).stdout
    if f" {h['veth_host']}@" not in links and f" {h['veth_host']}:" not in links:
        run(["ip", "link", "add", h["veth_host"], "type", "veth", "peer", "name", h["veth_ct"]])
        run(["ip", "link", "set", h["veth_ct"], "netns", ns])
        run(["ip", "-n", ns, "link", "set", h["veth_ct"], "name", "eth0"])
    out = run(["ip", "-o", "addr", "show", "dev", h["veth_host"]], capture=True).stdout
    if f"{h['gw']}/30" not in out:
        run(["ip", "addr", "add", f"{h['gw']}/30", "dev", h["veth_host"]])
    run(["ip", "link", "set", h["veth_host"], "up"])
    out = run(["ip", "-n", ns, "-o", "addr", "show", "dev", "eth0"], capture=True).stdout
    if f"{h['addr']}/30" not in out:
        run(["ip", "-n", ns, "addr", "add", f"{h['addr']}/30", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    routes = run(["ip", "-n", ns, "route", "show"], capture=True).stdout
    if "default" not in routes:
        run(["ip", "-n", ns, "route", "add", "default", "via", h["gw"]])


# What a host's disk holds of its own identity: left out when a slot host's disk starts as a
# copy of another host's (prepare_root writes them anew), and the other host's journal.
IDENTITY = ["etc/machine-id", "etc/hostname", "etc/hosts", "etc/ssh/ssh_host_*", "var/log/journal"]


def clone_disk(snapshot_dir: Path, upper: Path) -> None:
    """upper becomes a copy of another host's snapshot, less that host's identity."""
    shutil.rmtree(upper, ignore_errors=True)
    upper.parent.mkdir(parents=True, exist_ok=True)
    run(["cp", "-a", str(snapshot_dir), str(upper)])
    for pattern in IDENTITY:
        for path in upper.glob(pattern):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def mount_disk(d: Path, lower: Path | str) -> Path:
    """The host's disk: its upper dir over the image, mounted at root/ (unless it already is)."""
    merged = d / "root"
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(merged):
        run(["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={lower},upperdir={d / 'upper'},workdir={d / 'work'}", str(merged)])
    return merged


def unmount(merged: Path, lazy: bool = False) -> None:
    """Unmount a host's disk, retrying while its last processes go; then lazily (teardown) or fail."""
    for _ in range(20):
        if not os.path.ismount(merged):
            return
        if run(["umount", str(merged)], check=False, capture=True).returncode != 0:
            time.sleep(0.2)
    if os.path.ismount(merged):
        if not lazy:
            raise SystemExit(f"lab: could not unmount {merged}")
        run(["umount", "-l", str(merged)], check=False)


def prepare_root(h: dict, base: Path, clone_from: Path | None = None) -> Path:
    d: Path = h["dir"]
    if clone_from is not None:
        clone_disk(clone_from, d / "upper")
    merged = mount_disk(d, base)
    (merged / "etc/hostname").write_text(h["alias"] + "\n")
    mid = merged / "etc/machine-id"
    if not mid.read_text().strip():
        mid.write_text(secrets.token_hex(16) + "\n")
    if not (merged / "etc/ssh/ssh_host_ed25519_key").exists():
        run(["ssh-keygen", "-A", "-f", str(merged)], stdout=subprocess.DEVNULL)
    ak = merged / "root/.ssh/authorized_keys"
    ak.write_text(Path(str(KEY) + ".pub").read_text())
    os.chmod(ak, 0o600)
    (merged / "etc/ddtree-lab").mkdir(exist_ok=True)
    (merged / "etc/ddtree-lab/gpus.csv").write_text(
        "# name, compute_cap, memory.total [MiB], memory.used [MiB], driver_version (lab physics)\n"
        + "".join(", ".join(str(x) for x in g) + "\n" for g in h["gpus"]))
    hosts_file = merged / "etc/hosts"
    text = hosts_file.read_text() if hosts_file.exists() else ""
    if "ddtree-lab-mirror" not in text:
        hosts_file.write_text(text + f"127.0.1.1\t{h['alias']}\n{MIRROR_ADDR}\tddtree-lab-mirror\n")
    return merged


def host_pid(h: dict) -> int | None:
    pid = read_pid(h["dir"] / "nspawn.pid")
    return pid if pid and pid_alive(pid, f"-M {h['name']} ") else None


def boot(h: dict, merged: Path) -> int:
    cgs = cgroup_dirs(h["name"])
    for cg in cgs:
        cg.mkdir(exist_ok=True)

    def into_cgroup():
        os.setsid()
        for cg in cgs:
            (cg / "cgroup.procs").write_text(str(os.getpid()))

    logf = open(h["dir"] / "console.log", "ab")
    cmd = ["systemd-nspawn", "-q", "--register=no", "--keep-unit", "-D", str(merged), "-M", h["name"],
           f"--hostname={h['alias']}", f"--network-namespace-path=/run/netns/{h['netns']}",
           "--resolv-conf=off", "--console=pipe", "-b"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, preexec_fn=into_cgroup)
    (h["dir"] / "nspawn.pid").write_text(str(proc.pid))
    return proc.pid


def ssh_cmd(h: dict, *remote: str, timeout: int = 10) -> list[str]:
    return ["ssh", "-i", str(KEY), "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={KNOWN_HOSTS}",
            "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={timeout}", f"root@{h['addr']}", *remote]


def write_known_hosts(hosts: list[dict]) -> None:
    """Add (or replace) the hosts' keys; serialised, since fleets boot side by side (tests, molecule)."""
    import fcntl
    with open(SSH_DIR / "known_hosts.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write_known_hosts(hosts)


def _write_known_hosts(hosts: list[dict]) -> None:
    lines = []
    if KNOWN_HOSTS.exists():
        mine = {h["addr"] for h in hosts} | {h["name"] for h in hosts}
        lines = [l for l in KNOWN_HOSTS.read_text().splitlines() if l.split(" ")[0].split(",")[0] not in mine]
    for h in hosts:
        pub = (h["dir"] / "root/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
        lines.append(f"{h['addr']},{h['name']} {pub[0]} {pub[1]}")
    tmp = KNOWN_HOSTS.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(KNOWN_HOSTS)  # atomic: concurrent ssh never sees a half-written file


def wait_ready(h: dict, pid: int, timeout: float = 90) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not pid_alive(pid, f"-M {h['name']} "):
            raise SystemExit(f"lab: {h['name']} exited during boot; see {h['dir'] / 'console.log'}")
        try:
            with socket.create_connection((h["addr"], 22), timeout=1) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-"):
                    break
        except OSError:
            time.sleep(0.2)
    else:
        raise SystemExit(f"lab: {h['name']}: sshd did not answer on {h['addr']}:22 within {timeout:.0f}s")
    res = run(ssh_cmd(h, "systemctl", "is-system-running", "--wait"), capture=True, check=False,
              timeout=max(10, timeout - (time.time() - t0)))
    state = res.stdout.strip()
    if state != "running":
        failed = run(ssh_cmd(h, "systemctl", "--failed", "--no-legend"), capture=True, check=False).stdout
        raise SystemExit(f"lab: {h['name']}: systemd is {state or 'unreachable'}: {res.stderr.strip()}\n{failed}")
    return time.time() - t0


def up(n_hosts: int | None, fleet_file: Path | None = None, slots: int = 1, first_slot: int = 1) -> None:
    if os.geteuid() != 0:
        raise SystemExit("lab: must run as root (network namespaces, mounts, nspawn)")
    if not 1 <= slots <= MAX_SLOTS:
        raise SystemExit(f"lab: --slots must be 1..{MAX_SLOTS}, not {slots}")
    if slots > 1 and fleet_file is not None:
        raise SystemExit("lab: --slots copies lab/fleet.json; it does not go with --fleet")
    if not 1 <= first_slot <= max(slots - 1, 1):
        raise SystemExit(f"lab: --first-slot must be 1..{max(slots - 1, 1)}, not {first_slot}")
    t0 = time.time()
    main_hosts = fleet(n_hosts, fleet_file)
    slot_hosts = [h for k in range(first_slot, slots) for h in slot_fleet(k)]
    hosts = main_hosts + slot_hosts
    # A slot host's disk starts as a copy of its main-lab host's seeded snapshot (lab/seed.sh
    # takes them): the seeded state is reached once per host, not once per slot.
    seeded = {h["name"]: STATE / "hosts" / h["alias"] / "snapshot" for h in slot_hosts}
    missing = sorted({str(seeded[h["name"]]) for h in slot_hosts
                      if not seeded[h["name"]].is_dir() and not host_pid(h)})
    if missing:
        raise SystemExit("lab: --slots copies the seeded main lab, which has no snapshot yet "
                         f"({', '.join(missing)}): run `make lab-up` (boot, seed, snapshot) first")
    base = build_image()
    ensure_ssh_key()
    start_mirror()
    ensure_inotify_instances(len(hosts))
    booted = []
    cloned = []
    for h in hosts:
        pid = host_pid(h)
        if pid:
            log(f"{h['name']}: already running (pid {pid})")
            booted.append((h, pid))
            continue
        teardown_host(h, quiet=True)  # leftovers of a crashed run
        setup_network(h)
        merged = prepare_root(h, base, clone_from=seeded.get(h["name"]))
        write_host_record(h, base)
        pid = boot(h, merged)
        booted.append((h, pid))
        if h["name"] in seeded:
            cloned.append(h)
        log(f"{h['name']}: booting ({h['arch_group']}, {len(h['gpus'])} GPUs, {h['addr']}, pid {pid})"
            + (f", disk copied from {h['alias']}'s seeded snapshot" if h["name"] in seeded else ""))
    write_known_hosts(hosts)
    for h, pid in booted:
        took = wait_ready(h, pid)
        log(f"{h['name']}: systemd running, sshd up ({took:.1f}s)")
    for h in cloned:   # its own snapshot, with its own identity, for `labctl reset`
        snapshot(h["name"])
    if fleet_file is None:
        write_inventory_hosts(main_hosts)
        for k in range(first_slot, slots):
            write_slot(k)
        if first_slot == 1:
            drop_stale_slots(slots)
    log(f"lab up: {', '.join(h['name'] for h in hosts)} in {time.time() - t0:.1f}s")


def drop_stale_slots(keep: int) -> None:
    """Forget slot directories (inventories) beyond the first `keep` slots whose hosts are not
    running, left by a crashed or older run, so nothing seeds or tests hosts that are gone."""
    for d in sorted((STATE / "slots").glob("*")):
        k = int(d.name) if d.name.isdigit() else -1
        if k < keep and k >= 1:
            continue
        if 1 <= k < MAX_SLOTS and any(host_pid(h) for h in slot_fleet(k)):
            continue
        shutil.rmtree(d, ignore_errors=True)
        log(f"slot {d.name}: its hosts are not running; {d} removed")


def host_entries(hosts: list[dict]) -> list[dict]:
    """What other tools read of a fleet: name (the inventory name), machine, address, netns, key."""
    return [{"name": h["alias"], "machine": h["name"], "address": h["addr"], "arch_group": h["arch_group"],
             "gpus": len(h["gpus"]), "netns": h["netns"], "identity_file": str(KEY),
             "known_hosts": str(KNOWN_HOSTS)} for h in hosts]


def write_slot(k: int) -> Path:
    """$STATE/slots/<k>/: fleet.json (for labctl --fleet), hosts.json, and an Ansible inventory
    that names the slot's machines ct129 and ct200, with the lab's group_vars (a symlink, so
    edits to inventory/lab reach every slot) and the slot's own controller-side output dirs."""
    hosts = slot_fleet(k)
    d = STATE / "slots" / str(k)
    gv = d / "inventory" / "group_vars" / "all"
    gv.mkdir(parents=True, exist_ok=True)
    (d / "fleet.json").write_text(json.dumps(
        {"_comment": f"lab slot {k} (labctl up --slots)",
         "hosts": [{x: h[x] for x in ("name", "alias", "index", "profile")} for h in hosts]}, indent=2) + "\n")
    (d / "hosts.json").write_text(json.dumps(host_entries(hosts), indent=2) + "\n")
    groups: dict[str, list[dict]] = {}
    for h in hosts:
        groups.setdefault(h["arch_group"], []).append(h)
    lines = [f"# lab slot {k}: written by lab/labctl.py up --slots; machines s{k}-*, inventory names as in",
             "# inventory/lab/hosts.yml.", "sglang_servers:", "  children:"]
    for group in dict.fromkeys(["sm86", "sm120", "sm90", "sm100", *groups]):   # inventory/lab's order
        members = groups.get(group, [])
        lines += [f"    {group}:", "      hosts:" + ("" if members else " {}")]
        lines += [f"        {h['alias']}:\n          ansible_host: {h['addr']}" for h in members]
    (d / "inventory" / "hosts.yml").write_text("---\n" + "\n".join(lines) + "\n")
    link = gv / "00-lab.yml"
    if not link.is_symlink():
        link.unlink(missing_ok=True)
        link.symlink_to(REPO / "inventory" / "lab" / "group_vars" / "all.yml")
    out = REPO / "artifacts" / f"lab-slot{k}"
    (gv / "10-slot.yml").write_text(
        f"---\n# Lab slot {k}: controller-side outputs apart from the main lab's artifacts/.\n"
        f"ddtree_artifacts_dir: {out}\n")
    return d


def write_host_record(h: dict, base: Path) -> None:
    """The host's definition and its image, for `restart` (which may not know its fleet file)."""
    rec = {k: h[k] for k in ("name", "alias", "index", "profile") if k in h}
    rec["lowerdir"] = str(base)
    (h["dir"] / HOST_RECORD).write_text(json.dumps(rec, indent=2) + "\n")


def find_host(name: str, fleet_file: Path | None = None) -> dict:
    """A host by name: from a fleet file, from the record `up` wrote, or from lab/fleet.json."""
    if fleet_file is not None:
        hosts = {h["name"]: h for h in fleet(None, fleet_file)}
        if name not in hosts:
            raise SystemExit(f"lab: no host {name!r} in {fleet_file}")
        return hosts[name]
    rec_path = STATE / "hosts" / name / HOST_RECORD
    if rec_path.exists():
        rec = json.loads(rec_path.read_text())
        h = describe([{k: rec[k] for k in ("name", "alias", "index", "profile") if k in rec}])[0]
        h["lowerdir"] = rec.get("lowerdir")
        return h
    hosts = {h["name"]: h for h in fleet(8)}  # ct129, ct200 and the lab03.. hosts of --hosts N
    if name not in hosts:
        raise SystemExit(f"lab: unknown host {name!r}: not in lab/fleet.json and no record under "
                         f"{STATE / 'hosts' / name}; pass --fleet FILE for a host of another fleet")
    return hosts[name]


def overlay_lowerdir(merged: Path) -> str | None:
    """The lowerdir of the overlay mounted at merged (None when it is not mounted)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[1] == str(merged) and parts[2] == "overlay":
            m = re.search(r"(?:^|,)lowerdir=([^,]+)", parts[3])
            return m.group(1) if m else None
    return None


def _existing_host(name: str, fleet_file: Path | None) -> dict:
    if os.geteuid() != 0:
        raise SystemExit("lab: must run as root (cgroups, mounts, nspawn)")
    h = find_host(name, fleet_file)
    d: Path = h["dir"]
    if not (d / "upper").is_dir():
        raise SystemExit(f"lab: {name} has no disk under {d}; boot it with `labctl up` first")
    if h["netns"] not in netns_list():
        raise SystemExit(f"lab: {name}: network namespace {h['netns']} is gone; boot it with `labctl up`")
    return h


def power_off(h: dict, orderly: bool = False) -> int | None:
    """Stop the host's container; its disk and network namespace stay. orderly=False is a power
    cut: the nspawn process and everything in the container's cgroup are killed at once."""
    name = h["name"]
    pid = host_pid(h)
    if pid and orderly:
        os.kill(pid, signal.SIGTERM)   # systemd in the container shuts down, then nspawn exits
        deadline = time.time() + 30
        while pid_alive(pid, f"-M {name} ") and time.time() < deadline:
            time.sleep(0.05)
    if pid and pid_alive(pid, f"-M {name} "):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for cg in cgroup_dirs(name):
        kill_cgroup(cg)
    for cg in cgroup_dirs(name):
        rm_cgroup(cg)
    deadline = time.time() + 10
    while pid and pid_alive(pid, f"-M {name} ") and time.time() < deadline:
        time.sleep(0.05)
    if pid and pid_alive(pid, f"-M {name} "):
        raise SystemExit(f"lab: {name}: container process {pid} survived SIGKILL")
    shutil.rmtree(Path("/run/systemd/nspawn/propagate") / name, ignore_errors=True)
    return pid


def power_on(h: dict, timeout: float) -> int:
    """Boot the host from its disk (the overlay on its own image, mounted again if needed)."""
    d: Path = h["dir"]
    if not os.path.ismount(d / "root"):
        lower = h.get("lowerdir") or str(image_dir() / "rootfs")
        if not Path(lower).is_dir():
            raise SystemExit(f"lab: {h['name']}: its base image {lower} is gone; cannot boot the same disk")
        mount_disk(d, lower)
    pid = boot(h, d / "root")
    log(f"{h['name']}: booting again (pid {pid})")
    try:
        wait_ready(h, pid, timeout=timeout)
    except SystemExit as first:
        # Once more after a clean power-off: the previous container's leftovers (its cgroup,
        # its machine registration) can outlive a power cut on a loaded machine.
        log(f"{h['name']}: {first}; powering off and booting once more")
        power_off(h)
        pid = boot(h, d / "root")
        log(f"{h['name']}: booting again (pid {pid})")
        wait_ready(h, pid, timeout=timeout)
    log(f"{h['name']}: systemd running, sshd up")
    return pid


def restart(name: str, fleet_file: Path | None = None, timeout: float = 90) -> float:
    """Power-cycle one host: SIGKILL its container, keep its disk and netns, boot, wait ready."""
    h = _existing_host(name, fleet_file)
    t0 = time.time()
    pid = power_off(h)
    log(f"{name}: powered off (pid {pid or 'none'} killed); disk {h['dir'] / 'upper'} kept")
    power_on(h, timeout)
    took = time.time() - t0
    print(f"{name}: restarted in {took:.1f}s", flush=True)
    return took


def snapshot(name: str, fleet_file: Path | None = None, timeout: float = 90) -> float:
    """Keep the host's disk as it is now (after `make lab-up` seeded it) for `reset`: an orderly
    shutdown, a copy of the overlay's upper directory to snapshot/, boot again."""
    h = _existing_host(name, fleet_file)
    d: Path = h["dir"]
    t0 = time.time()
    power_off(h, orderly=True)
    unmount(d / "root")
    tmp = d / "snapshot.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    run(["cp", "-a", str(d / "upper"), str(tmp)])
    shutil.rmtree(d / "snapshot", ignore_errors=True)
    tmp.rename(d / "snapshot")
    power_on(h, timeout)
    took = time.time() - t0
    print(f"{name}: snapshot taken in {took:.1f}s", flush=True)
    return took


def reset(name: str, fleet_file: Path | None = None, timeout: float = 90) -> float:
    """Put the host back on its snapshot: power cut, the upper directory replaced by a copy of
    the snapshot, boot (its services start as they did when the snapshot was taken)."""
    h = _existing_host(name, fleet_file)
    d: Path = h["dir"]
    if not (d / "snapshot").is_dir():
        raise SystemExit(f"lab: {name} has no snapshot; take one with `labctl snapshot {name}`")
    t0 = time.time()
    power_off(h)
    unmount(d / "root")
    for sub in ("upper", "work"):
        shutil.rmtree(d / sub, ignore_errors=True)
    run(["cp", "-a", str(d / "snapshot"), str(d / "upper")])
    (d / "work").mkdir()
    power_on(h, timeout)
    took = time.time() - t0
    print(f"{name}: reset to its snapshot in {took:.1f}s", flush=True)
    return took


def write_inventory_hosts(hosts: list[dict]) -> None:
    """Facts other tools read: the lab's hosts, addresses and key (not the Ansible inventory)."""
    (STATE / "hosts.json").write_text(json.dumps(host_entries(hosts), indent=2) + "\n")


def kill_cgroup(cg: Path) -> None:
    if not cg.exists():
        return
    if (cg / "cgroup.kill").exists():
        try:
            (cg / "cgroup.kill").write_text("1")
        except OSError:
            pass
    else:
        for procs in cg.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass


def rm_cgroup(cg: Path, seconds: float = 30) -> None:
    """Remove the cgroup once its processes are gone. A loaded machine can take many seconds to
    reap a killed container's processes (seen in CI: still there after 5 s), so keep killing
    and retrying for ``seconds``."""
    if not cg.exists():
        return
    deadline = time.time() + seconds
    while time.time() < deadline:
        dirs = sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        try:
            for d in dirs + [cg]:
                d.rmdir()
            return
        except OSError:
            kill_cgroup(cg)
            time.sleep(0.1)
    log(f"warning: could not remove cgroup {cg}")


def teardown_host(h: dict, quiet: bool = False) -> None:
    d: Path = h["dir"]
    pid = read_pid(d / "nspawn.pid")
    if pid and pid_alive(pid, f"-M {h['name']} "):
        os.kill(pid, signal.SIGTERM)  # orderly poweroff of the container
        deadline = time.time() + 15
        while time.time() < deadline and pid_alive(pid, f"-M {h['name']} "):
            time.sleep(0.1)
        if pid_alive(pid, f"-M {h['name']} "):
            os.kill(pid, signal.SIGKILL)
    for cg in cgroup_dirs(h["name"]):
        kill_cgroup(cg)
    for cg in cgroup_dirs(h["name"]):
        rm_cgroup(cg)
    unmount(d / "root", lazy=True)
    if h.get("veth_host"):
        run(["ip", "link", "del", h["veth_host"]], check=False, capture=True)
    if h["netns"] in netns_list():
        run(["ip", "netns", "del", h["netns"]], check=False)
    shutil.rmtree(Path("/run/systemd/nspawn/propagate") / h["name"], ignore_errors=True)
    if d.exists():
        shutil.rmtree(d, ignore_errors=True)
    if not quiet:
        log(f"{h['name']}: down")


def down(fleet_file: Path | None = None) -> None:
    if os.geteuid() != 0:
        raise SystemExit("lab: must run as root")
    if fleet_file is not None:  # only these hosts; the main lab and the mirror stay up
        for h in fleet(None, fleet_file):
            teardown_host(h)
        slot_dir = fleet_file.resolve().parent
        if slot_dir.parent == (STATE / "slots").resolve():   # a slot's hosts: its inventory goes too
            shutil.rmtree(slot_dir, ignore_errors=True)
        return
    hosts = {h["name"]: h for h in fleet()}
    for h in known_hosts_on_disk():
        hosts[h["name"]] = h
    for h in hosts.values():
        teardown_host(h, quiet=not h["dir"].exists() and h["netns"] not in netns_list())
    stop_mirror()
    (STATE / "hosts.json").unlink(missing_ok=True)
    shutil.rmtree(STATE / "slots", ignore_errors=True)
    leftovers = leftover_report()
    if leftovers:
        raise SystemExit("lab: down left things behind:\n  " + "\n  ".join(leftovers))
    log("lab down: no container process, mount, netns, veth or cgroup left")


def leftover_report() -> list[str]:
    left = []
    left += [f"netns {n}" for n in netns_list() if n.startswith("ddl-")]
    links = run(["ip", "-o", "link", "show"], capture=True).stdout
    left += [f"veth {m}" for m in re.findall(r"^\d+: (ddl\d+[hc])[@:]", links, re.M)]
    mounts = Path("/proc/self/mounts").read_text()
    left += [f"mount {line.split()[1]}" for line in mounts.splitlines() if str(STATE / "hosts") in line]
    for base in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup")):
        if base.is_dir():
            left += [f"cgroup {p}" for p in base.glob("ddtree-lab-*")]
    # Any container of ours: its root is under $STATE/hosts/ (the main lab, slots, other fleets).
    out = run(["pgrep", "-af", "systemd-nspawn .*--register=no"], capture=True, check=False).stdout or ""
    left += [f"process {line}" for line in out.splitlines() if f"-D {STATE / 'hosts'}/" in line]
    pid = read_pid(mirror_pidfile())
    if pid and pid_alive(pid, "ddtree-lab-mirror"):
        left.append(f"mirror process {pid}")
    return left


def status() -> None:
    out = []
    hosts = {h["name"]: h for h in fleet()}
    for h in known_hosts_on_disk():  # also lab03.. of `up --hosts N` and hosts of other fleets
        hosts.setdefault(h["name"], h)
    for h in hosts.values():
        if "addr" not in h:
            continue
        pid = host_pid(h)
        out.append({"name": h["name"], "address": h["addr"], "running": bool(pid), "pid": pid,
                    "arch_group": h["arch_group"]})
    print(json.dumps({"hosts": out, "mirror": f"http://{MIRROR_ADDR}:{MIRROR_PORT}/",
                      "image": str(image_dir()), "image_ready": (image_dir() / "READY").exists(),
                      "leftovers_if_down": leftover_report() if not any(o["running"] for o in out) else []},
                     indent=2))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("image")
    p_up = sub.add_parser("up")
    p_up.add_argument("--hosts", type=int, default=None, help="number of hosts (default: lab/fleet.json)")
    p_up.add_argument("--fleet", type=Path, default=None,
                      help="another fleet file (same profiles), e.g. a molecule scenario's own hosts")
    p_up.add_argument("--slots", type=int, default=1,
                      help="also boot slots 1..K-1: copies of lab/fleet.json for parallel test workers "
                           "(inventories under $DDTREE_LAB_STATE/slots/<k>/)")
    p_up.add_argument("--first-slot", type=int, default=1,
                      help="boot only slots F..K-1 (a test's own extra hosts next to the workers' slots)")
    p_down = sub.add_parser("down")
    p_down.add_argument("--fleet", type=Path, default=None, help="tear down only this fleet file's hosts")
    p_restart = sub.add_parser("restart", help="power-cycle one host (its disk survives)")
    p_restart.add_argument("name", help="host name, e.g. ct129")
    p_restart.add_argument("--fleet", type=Path, default=None,
                           help="the fleet file the host was booted from (default: found by name)")
    p_restart.add_argument("--timeout", type=float, default=90,
                           help="seconds to wait for sshd and systemd after the boot (default 90)")
    for cmd, what in (("snapshot", "keep one host's disk as it is now (orderly shutdown, copy, boot)"),
                      ("reset", "put one host back on its snapshot (power cut, disk replaced, boot)")):
        p = sub.add_parser(cmd, help=what)
        p.add_argument("names", nargs="+", metavar="name", help="host (machine) names, e.g. ct129 or s1-ct129")
        p.add_argument("--fleet", type=Path, default=None, help="the fleet file the host was booted from")
        p.add_argument("--timeout", type=float, default=90, help="seconds to wait after the boot (default 90)")
    sub.add_parser("status")
    sub.add_parser("mirror")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    STATE.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    if args.cmd == "image":
        build_image()
    elif args.cmd == "up":
        up(args.hosts, args.fleet, args.slots, args.first_slot)
    elif args.cmd == "down":
        down(args.fleet)
    elif args.cmd == "restart":
        restart(args.name, args.fleet, args.timeout)
    elif args.cmd in ("snapshot", "reset"):
        for name in args.names:
            (snapshot if args.cmd == "snapshot" else reset)(name, args.fleet, args.timeout)
    elif args.cmd == "status":
        status()
    elif args.cmd == "mirror":
        build_mirror()


if __name__ == "__main__":
    main()
