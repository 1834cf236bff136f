# -*- coding: utf-8 -*-
# ddtree-fleet: a host's live state against its declared state, read in one call.
#
# Used by library/host_state.py on the managed host (standard library only) and by the unit
# tests. ``read_state`` gathers; ``differences`` and ``known_good_problem`` judge what was
# gathered (pure functions: the same text the drift report and the guard print).

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess

from ansible_collections.ddtree.fleet.plugins.module_utils.gpu import QUERY_ARGS, gpu_facts_from_outputs
from ansible_collections.ddtree.fleet.plugins.module_utils.http.client import HttpError, get_json
from ansible_collections.ddtree.fleet.plugins.module_utils.patch.series import PatchSetError, ensure_patchset

KG_FILES = ("meta.json", "unit", "env")
# Recorded since the unit reads a logging config (SGLANG_LOGGING_CONFIG_PATH); a record written
# before has none, and is intact without it (its unit does not read one).
KG_OPTIONAL_FILES = ("logging",)
# What of a host's GPUs the known-good record keeps (roles/known_good promote), and compares.
GPU_KEYS = ("arch", "count", "names", "memory_total_mib")
# Asking the running server what it serves: one small GET, never long (a server still loading
# does not answer, and is not judged).
SERVED_TIMEOUT = 5.0


def file_digest(path, algorithm):
    """Hex digest of a regular file, or None when it does not exist (a directory raises)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return None
    digest = hashlib.new(algorithm)
    with handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json(path):
    """A JSON file's content, or None when it is missing; unreadable JSON raises ValueError."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def systemctl(verb, unit, runner=subprocess.run):
    """``systemctl is-active|is-enabled UNIT`` as systemd prints it ('' when it printed nothing)."""
    try:
        proc = runner(["systemctl", verb, unit], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "unknown (%s)" % exc
    return proc.stdout.strip()


def read_quarantine(quarantine_dir, fingerprint):
    """The quarantine record of a fingerprint in the directory role known_good keeps them in."""
    path = os.path.join(quarantine_dir, fingerprint + ".json")
    record = read_json(path)
    return {"path": path, "exists": record is not None, "record": record}


def read_known_good(state_dir):
    """The known-good link, its files with sha256, its metadata, and how many records exist."""
    kg_dir = os.path.join(state_dir, "known-good")
    files = {}
    for name in KG_FILES + KG_OPTIONAL_FILES:
        digest = file_digest(os.path.join(kg_dir, name), "sha256")
        files[name] = {"exists": digest is not None, "sha256": digest}
    meta = meta_error = None
    if files["meta.json"]["exists"]:
        try:
            meta = read_json(os.path.join(kg_dir, "meta.json"))
        except ValueError as exc:
            meta_error = str(exc)
        if meta_error is None and not isinstance(meta, dict):
            meta, meta_error = None, "meta.json is not a JSON object"
    records_dir = os.path.join(state_dir, "records")
    records = 0
    if os.path.isdir(records_dir):
        records = sum(1 for entry in os.scandir(records_dir) if entry.is_dir(follow_symlinks=False))
    return {
        "dir": kg_dir,
        "link_exists": os.path.lexists(kg_dir),
        "is_link": os.path.islink(kg_dir),
        "link_target": os.readlink(kg_dir) if os.path.islink(kg_dir) else None,
        "files": files,
        "meta": meta,
        "meta_error": meta_error,
        "records": records,
        "fingerprint": str((meta or {}).get("fingerprint", "")),
    }


def known_good_problem(kg, state_dir):
    """Why the known-good record cannot be trusted for a rollback, or None when it can (or is absent)."""
    files = kg["files"]
    present = [name for name in KG_FILES if files[name]["exists"]]
    kg_dir = kg["dir"]
    advice = (
        "Refusing to change the host, since a failed change could not be rolled back. Point the "
        "link at a good record (ln -sfn records/<fingerprint> %s), or remove %s/records and %s to "
        "treat the host as new." % (kg_dir, state_dir, kg_dir)
    )
    if kg["link_exists"] and not present:
        return ("the known-good record is missing: %s points at %s, which does not hold a record. "
                "%s" % (kg_dir, kg["link_target"] or kg_dir, advice))
    if not kg["link_exists"] and kg["records"] > 0:
        return (
            "the known-good record is missing: %s does not exist although %d record(s) in "
            "%s/records show this host was promoted before. %s"
            % (kg_dir, kg["records"], state_dir, advice)
        )
    if files["meta.json"]["exists"]:
        meta = kg["meta"] or {}
        intact = (
            kg["meta_error"] is None
            and files["unit"]["exists"]
            and files["env"]["exists"]
            and files["unit"]["sha256"] == meta.get("unit_sha256")
            and files["env"]["sha256"] == meta.get("env_sha256")
            # The logging config: present and matching when the record lists it, else absent.
            and files["logging"]["sha256"] == meta.get("logging_sha256")
        )
        if not intact:
            return (
                "the known-good record in %s is missing a file or does not match its checksums; refusing to change "
                "the host, since a failed change could not be rolled back. Inspect it, then restore it or remove %s "
                "to start afresh." % (kg_dir, kg_dir)
            )
    elif present:
        return (
            "%s holds a unit or environment but no meta.json; refusing to change the host. Restore meta.json or "
            "remove %s." % (kg_dir, kg_dir)
        )
    return None


def venv_python_version(venv, python, runner=subprocess.run):
    """The venv's X.Y: from its lib/pythonX.Y directory, else by asking ``python``."""
    found = sorted(glob.glob(os.path.join(glob.escape(venv), "lib", "python*.*", "site-packages")))
    if len(found) == 1:
        return os.path.basename(os.path.dirname(found[0]))[len("python"):]
    proc = runner(
        [python, "-c", 'import sys; print("%d.%d" % sys.version_info[:2])'],
        capture_output=True, text=True, timeout=60, check=False,
    )
    return proc.stdout.strip()


def _service_differences(state, declared):
    """The differences of the service itself: unit, environment, logging config, active, enabled."""
    out = []
    live = state["live"]
    for key, label, declared_one in (("unit", "unit", "the declared unit"),
                                     ("env", "environment", "the declared one"),
                                     ("logging", "logging config", "the declared one")):
        item = live.get(key)  # the logging config only when the unit reads one
        if item is None:
            continue
        if not item["exists"]:
            out.append("%s: %s is missing" % (label, item["path"]))
        elif item["sha1"] != declared[key + "_sha1"]:
            out.append("%s: %s differs from %s" % (label, item["path"], declared_one))
    served = state.get("served") or {}
    if served.get("differs"):
        out.append("served model: %s serves %s, declared %s (weights swapped at run time: restart)"
                   % (served["url"], served["model_path"], served["declared"]))
    if live["active"] != "active":
        out.append("service: %s is %s" % (declared["service"], live["active"]))
    if live["enabled"] != "enabled":
        out.append("service: %s is %s" % (declared["service"], live["enabled"] or "not enabled"))
    return out


def differences(state, declared):
    """What differs from the declared state, one line each (the drift report's vocabulary)."""
    out = _service_differences(state, declared)
    venv = state["venv"]
    if not venv["exists"]:
        out.append("venv: %s is missing" % venv["path"])
    patch = state["patch"]
    if patch.get("failed"):
        out.append("patch set: %s" % patch["msg"])
    elif patch.get("changed"):
        out.append("patch set: would apply %s" % ", ".join(patch.get("applied") or []))
    missing = ["weights: %s is missing" % item["path"] for item in state["weights"] if not item["exists"]]
    if missing:
        out.append("; ".join(missing))
    kg_fp = state["known_good"]["fingerprint"]
    if kg_fp != declared["fingerprint"]:
        out.append("known-good: record is %s, declared %s" % (kg_fp or "missing", declared["fingerprint"]))
    return out


def pending_change(state, declared):
    """Whether the service itself (unit, environment, logging config, active, enabled) must change."""
    return bool(_service_differences(state, declared))


def check_patchset(site_packages, patches, checksums):
    """Dry-run the patch set on a venv: {checked, changed, applied, failed, msg}; never changes it."""
    try:
        result = ensure_patchset(site_packages, patches, checksums, check_mode=True)
    except (PatchSetError, OSError) as exc:  # the report says what is wrong; deciding is the caller's
        return {"checked": True, "changed": False, "applied": [], "failed": True, "msg": str(exc)}
    return {"checked": True, "changed": bool(result["changed"]), "applied": list(result["applied"]),
            "failed": False, "msg": ""}


def read_gpu(nvidia_smi, runner=subprocess.run):
    """(GPU summary as gpu_facts returns it, without UUIDs, None) or (None, why it could not be
    read): never raises. One query, not gpu_facts' two: the in-sync test compares GPU_KEYS only,
    and nvidia-smi -L would only add the UUIDs (one process less on every host of every run)."""
    binary = nvidia_smi or shutil.which("nvidia-smi")
    if not binary:
        return None, "nvidia-smi not found on PATH"
    try:
        proc = runner([binary] + list(QUERY_ARGS), capture_output=True, text=True, timeout=60, check=False,
                      env=dict(os.environ, LC_ALL="C"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, "%s: %s" % (binary, exc)
    if proc.returncode != 0:
        return None, "%s %s exited %d" % (binary, " ".join(QUERY_ARGS), proc.returncode)
    try:
        return gpu_facts_from_outputs(proc.stdout, None), None
    except ValueError as exc:
        return None, "nvidia-smi: %s" % exc


def read_served(url, api_key, declared, active, fetch=None):
    """What the running server says it serves (SGLang's GET /model_info: model_path, which a
    runtime weight update moves, and weight_version), compared with the declared model path.

    Not asked when no URL or declared path is given, or the service is not active; a server that
    does not answer (still loading, another key) is reported with its error and not judged."""
    out = {"checked": False, "url": url or "", "declared": declared or "", "model_path": None,
           "weight_version": None, "differs": False, "error": ""}
    if not url or not declared or active != "active":
        return out
    try:
        status, body = (fetch or get_json)(url, "/model_info", api_key or None, SERVED_TIMEOUT)
    except (HttpError, ValueError) as exc:
        out["error"] = str(exc)
        return out
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
        out["error"] = "GET /model_info answered %s" % status
        return out
    served = body["model_path"]
    out.update(checked=True, model_path=served, weight_version=body.get("weight_version"),
               differs=os.path.normpath(served) != os.path.normpath(declared))
    return out


def read_lock(lock_dir):
    """Whether a run holds the host's lock (host_lock's directory), and its owner record."""
    if not lock_dir or not os.path.isdir(lock_dir):
        return {"held": False, "owner": None}
    try:
        owner = read_json(os.path.join(lock_dir, "owner.json"))
    except ValueError:
        owner = None
    return {"held": True, "owner": owner}


def gpu_unchanged(state):
    """The GPUs are the ones the known-good configuration was proven on (same model, count,
    architecture and memory): preflight's verdict for that configuration still holds."""
    gpu, meta = state.get("gpu"), state["known_good"].get("meta") or {}
    proven = meta.get("gpu")
    if not gpu or not isinstance(proven, dict):
        return False
    return all(gpu.get(key) == proven.get(key) for key in GPU_KEYS)


def _live_file(path):
    digest = file_digest(path, "sha1")
    return {"path": path, "sha1": digest, "exists": digest is not None}


def read_state(params, runner=subprocess.run):
    """Everything the "does this host differ from its declared state?" decision needs, in one pass."""
    state_dir = params["state_dir"]
    live = {
        "unit": _live_file(params["unit_path"]),
        "env": _live_file(params["env_file"]),
        "active": systemctl("is-active", params["service"], runner),
        "enabled": systemctl("is-enabled", params["service"], runner),
    }
    if params.get("logging_file"):
        live["logging"] = _live_file(params["logging_file"])
    venv = params["venv"]
    venv_state = {"path": venv, "exists": os.path.exists(os.path.join(venv, ".ddtree-venv.json")),
                  "python_version": None}
    patch = {"checked": False, "changed": False, "applied": [], "failed": False, "msg": ""}
    if venv_state["exists"]:
        venv_state["python_version"] = venv_python_version(venv, params["python"], runner)
        if params["patches"]:
            site = os.path.join(venv, "lib", "python" + venv_state["python_version"], "site-packages")
            patch = check_patchset(site, params["patches"], params["checksums"])
    state = {
        "quarantine": read_quarantine(params.get("quarantine_dir") or os.path.join(state_dir, "quarantine"),
                                      params["fingerprint"]),
        "known_good": read_known_good(state_dir),
        "live": live,
        "venv": venv_state,
        "patch": patch,
        "weights": [{"path": path, "exists": os.path.exists(os.path.join(path, ".ddtree-verified.json"))}
                    for path in params["weights"]],
    }
    state["served"] = read_served(params.get("served_url"), params.get("served_api_key"),
                                  params.get("served_model_path"), live["active"])
    state["known_good"]["problem"] = known_good_problem(state["known_good"], state_dir)
    state["differences"] = differences(state, params)
    state["pending_change"] = pending_change(state, params)
    state["gpu"], state["gpu_error"] = read_gpu(params.get("nvidia_smi"), runner) if params.get("gpu") else (None, None)
    state["lock"] = read_lock(params.get("lock_dir"))
    state["in_sync"] = in_sync(state)
    return state


def in_sync(state):
    """Nothing to do on this host: no difference from the declared state (which includes its
    known-good record being the declared configuration), the record intact, no quarantine, no
    run holding the lock, and the GPUs those the configuration was proven on."""
    return bool(
        not state["differences"]
        and state["known_good"]["problem"] is None
        and not state["quarantine"]["exists"]
        and not state["lock"]["held"]
        and gpu_unchanged(state)
    )
