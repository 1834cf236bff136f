# -*- coding: utf-8 -*-
# ddtree-fleet: what a host keeps of the past, and what it may collect.
#
# Used by plugins/modules/host_retention.py on the managed host (standard library only) and by the
# unit tests. ``plan`` only reads and decides; ``carry_out`` removes what the plan lists.
#
# Kept, always: the known-good record, the declared configuration's record, and everything a kept
# record names in its meta.json (venv, model_dir, draft_dir), the declared venv and weights, the
# patch sets of kept venvs. Kept besides: the ``keep`` most recent others of each kind (records;
# venvs; weight revisions per repository; the watchdog's evidence on the host). Directories still
# being built (*.partial) are left alone.
#
# The controller side (``controller_plan``): old run reports and the evidence of failed changes
# under the controller's artifacts directory, used by plugins/modules/artifact_retention.py.

from __future__ import annotations

import json
import os
import re
import shutil

KINDS = ("records", "venvs", "weights", "patches", "evidence")


def _children(root, wanted):
    """Entries of ``root`` (not links, not dot names) that ``wanted(name, path)`` accepts, newest
    first by mtime; [] when ``root`` does not exist."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        path = os.path.join(root, name)
        if not name.startswith(".") and not os.path.islink(path) and wanted(name, path):
            out.append((os.stat(path).st_mtime, path))
    return [path for _, path in sorted(out, reverse=True)]


def _dirs(root):
    """Sub-directories of ``root``, newest first; directories still being built (*.partial) excluded."""
    return _children(root, lambda name, path: not name.endswith(".partial") and os.path.isdir(path))


def _meta(record):
    try:
        with open(os.path.join(record, "meta.json"), encoding="utf-8") as handle:
            meta = json.load(handle)
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def patchset_of(venv):
    """The patch set a venv was built with: its record's ``patchset`` (.ddtree-venv.json), else its
    name, <source>-<patch set>[-lock-<lock id>] (role sglang's sglang_config_venv)."""
    try:
        with open(os.path.join(venv, ".ddtree-venv.json"), encoding="utf-8") as handle:
            record = json.load(handle)
        if isinstance(record, dict) and record.get("patchset"):
            return str(record["patchset"])
    except (OSError, ValueError):
        pass
    name = re.sub(r"-lock-[0-9a-f]+$", "", os.path.basename(venv))
    return name.rsplit("-", 1)[-1]


def _split(paths, protected, keep):
    """(kept, removed): the protected ones, then the ``keep`` newest of the rest."""
    rest = [p for p in paths if os.path.normpath(p) not in protected]
    return [p for p in paths if p not in rest[keep:]], rest[keep:]


def plan(state_dir, venv_root, models_root, patch_root, declared, keep):
    """{kind: {"kept": [...], "removed": [...]}} for records, venvs, weights, patches and evidence.

    ``declared``: {"fingerprint", "venv", "weights": [dirs]} of the declared configuration."""
    if keep < 0:
        raise ValueError("keep must be >= 0, got %r" % (keep,))
    norm = os.path.normpath
    records_root = os.path.join(state_dir, "records")
    link = os.path.join(state_dir, "known-good")
    protected = {norm(os.path.join(records_root, str(declared.get("fingerprint") or "")))}
    if os.path.islink(link):
        protected.add(norm(os.path.join(state_dir, os.readlink(link))))
    out = {}
    kept, removed = _split(_dirs(records_root), protected, keep)
    out["records"] = {"kept": kept, "removed": removed}

    needed_venvs = {norm(declared["venv"])} if declared.get("venv") else set()
    needed_weights = {norm(w) for w in declared.get("weights") or []}
    for record in kept:
        meta = _meta(record)
        if meta.get("venv"):
            needed_venvs.add(norm(meta["venv"]))
        needed_weights.update(norm(meta[k]) for k in ("model_dir", "draft_dir") if meta.get(k))

    kept, removed = _split(_dirs(venv_root), needed_venvs, keep)
    out["venvs"] = {"kept": kept, "removed": removed}

    wk, wr = [], []
    for repo in sorted(_dirs(models_root)):
        k, r = _split(_dirs(repo), needed_weights, keep)
        wk += k
        wr += r
    out["weights"] = {"kept": wk, "removed": wr}

    # A venv's patch set lives under patch_root/<patch set>.
    sets = {patchset_of(v) for v in out["venvs"]["kept"]}
    if declared.get("venv"):
        sets.add(patchset_of(norm(declared["venv"])))
    # The watchdog's own evidence on the host (<state dir>/evidence/watchdog-<time>): the newest stay.
    kept, removed = _split(_dirs(os.path.join(state_dir, "evidence")), set(), keep)
    out["evidence"] = {"kept": kept, "removed": removed}
    patches = _dirs(patch_root)
    out["patches"] = {"kept": [p for p in patches if os.path.basename(p) in sets],
                      "removed": [p for p in patches if os.path.basename(p) not in sets]}
    return out


def size_bytes(path):
    """Bytes of a file, or of every file under a directory."""
    if os.path.isfile(path):
        return os.lstat(path).st_size
    total = 0
    for root, _dirs_, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def carry_out(planned, kinds, check_mode=False, diff=False):
    """A module's result for ``planned``: removes what it lists (nothing in check mode) and says what
    went (or would), what stays and the bytes freed; with ``diff``, the removed paths one per line."""
    removed = {kind: planned[kind]["removed"] for kind in kinds}
    freed = sum(size_bytes(path) for kind in kinds for path in removed[kind])
    if not check_mode:
        for kind in kinds:
            for path in removed[kind]:
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
    changed = any(removed.values())
    result = dict(changed=changed, removed=removed, kept={kind: planned[kind]["kept"] for kind in kinds},
                  freed_bytes=freed)
    if diff and changed:
        result["diff"] = {"before": "".join("%s\n" % path for kind in kinds for path in removed[kind]),
                          "after": "", "before_header": "removed", "after_header": "removed"}
    return result


# ---------------------------------------------------------------------------------------------
# The controller's artifacts (plugins/modules/artifact_retention.py, role retention "controller")
# ---------------------------------------------------------------------------------------------

CONTROLLER_KINDS = ("reports", "evidence")
REPORT_KINDS = ("deploy", "drift")

# artifact_retention's options (its module and its in-process action plugin read them here).
CONTROLLER_ARGUMENT_SPEC = {
    "artifacts_dir": {"type": "path", "required": True},
    "hosts": {"type": "list", "elements": "str", "default": []},
    "protected": {"type": "list", "elements": "path", "default": []},
    "keep_runs": {"type": "int", "default": 200},
    "keep_evidence": {"type": "int", "default": 20},
}


def collect_controller(params, check_mode=False, diff=False):
    """artifact_retention's whole task: the result of collecting under ``params['artifacts_dir']``.
    Raises ValueError (a bad count) or OSError."""
    try:
        planned = controller_plan(params["artifacts_dir"], params["hosts"], params["protected"],
                                  params["keep_runs"], params["keep_evidence"])
        return carry_out(planned, CONTROLLER_KINDS, check_mode, diff)
    except OSError as exc:
        raise OSError("cannot collect old artifacts under %s: %s" % (params["artifacts_dir"], exc)) from None


def _files(root, suffix):
    """Regular files of ``root`` ending in ``suffix``, newest first."""
    return _children(root, lambda name, path: name.endswith(suffix) and os.path.isfile(path))


def controller_plan(artifacts_dir, hosts, protected, keep_runs, keep_evidence):
    """{"reports": {kept, removed}, "evidence": {kept, removed}} under the controller's artifacts.

    Reports: <artifacts>/<deploy|drift>/<run>[.slice-K-of-N].json, the ``keep_runs`` newest of
    each kind; latest*.json always stay (they are the newest by definition, and tools read them).
    Evidence: <artifacts>/<host>/<time>/ of the ``hosts`` this run targeted, the ``keep_evidence``
    newest per host, plus every directory in ``protected`` (the evidence a quarantine or this
    run's report names). Other hosts' evidence is left alone: this run does not know their state."""
    for name, value in (("keep_runs", keep_runs), ("keep_evidence", keep_evidence)):
        if int(value) < 0:
            raise ValueError("%s=%d: expected 0 or more" % (name, int(value)))
    keep_safe = {os.path.normpath(str(p)) for p in protected or [] if p}
    reports = {"kept": [], "removed": []}
    for kind in REPORT_KINDS:
        files = [f for f in _files(os.path.join(artifacts_dir, kind), ".json")
                 if not os.path.basename(f).startswith("latest")]
        reports["kept"] += files[:int(keep_runs)]
        reports["removed"] += files[int(keep_runs):]
    evidence = {"kept": [], "removed": []}
    for host in sorted(set(hosts or [])):
        if not host or "/" in host or host in (".", "..") or host in REPORT_KINDS:
            continue
        kept, removed = _split(_dirs(os.path.join(artifacts_dir, host)), keep_safe, int(keep_evidence))
        evidence["kept"] += kept
        evidence["removed"] += removed
    return {"reports": reports, "evidence": evidence}
