# -*- coding: utf-8 -*-
"""Pure logic behind the ``sglang_patch`` module and the ``ddtree`` filters.

Applies an ordered set of unified diffs (``patch -p1``) to an installed
package tree (a venv's site-packages) with GNU patch, idempotently:

* every patch file is checked against a pinned sha256 before anything runs;
* the state of each patch (applied / applicable / conflicting) is decided on a
  scratch copy of the files the patch set touches, so a conflict is found
  before the real tree is changed;
* patches are applied in order; if one fails, the ones applied by this run are
  reversed again, so the tree is never left half-patched;
* afterwards every touched Python file must still compile and the optional
  "expect" markers must be present, otherwise the run is rolled back too;
* the applied set is recorded in a stamp file
  (``<site-packages>/sglang/.ddtree-patchset.json`` by default).

No Ansible import: the module imports this as
``ansible.module_utils.ddtree_patch``; the controller-side filter plugin and
the unit tests load the same file directly. Standard library only.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile

__all__ = [
    "NOPATCH_FINGERPRINT",
    "STAMP_RELPATH",
    "FINGERPRINT_LENGTH",
    "PatchSetError",
    "ChecksumError",
    "PatchConflictError",
    "VerificationError",
    "PatchFile",
    "parse_series",
    "read_series",
    "parse_sha256sums",
    "read_sha256sums",
    "sha256_file",
    "normalize_entries",
    "patchset_fingerprint",
    "patchset_fingerprint_full",
    "patch_targets",
    "patch_adds",
    "load_patches",
    "find_patch_executable",
    "check_gnu_patch",
    "run_patch",
    "patch_state",
    "plan_patches",
    "apply_patches",
    "reverse_patches",
    "verify_tree",
    "stamp_path",
    "read_stamp",
    "make_stamp",
    "stamp_matches",
    "write_stamp",
    "ensure_patchset",
]

# Fingerprint of an empty patch set (an unpatched venv).
NOPATCH_FINGERPRINT = "nopatch"
# Length of the short fingerprint used in venv paths.
FINGERPRINT_LENGTH = 12
# Stamp file, relative to site-packages.
STAMP_RELPATH = "sglang/.ddtree-patchset.json"
# Version tag mixed into the fingerprint; bump only if the format changes.
_FINGERPRINT_FORMAT = "ddtree-patchset-v1"

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_STRIP = 1  # every patch is applied with -p1


class PatchSetError(Exception):
    """Base class for every failure of this module."""


class ChecksumError(PatchSetError):
    """A patch file is missing from the checksum list or its sha256 differs."""


class PatchConflictError(PatchSetError):
    """A patch is neither applied nor cleanly applicable, or failed to apply.

    ``patch`` is the name of the patch, ``output`` GNU patch's output,
    ``rolled_back`` the names reversed again by this run.
    """

    def __init__(self, message, patch=None, output="", rolled_back=None):
        super().__init__(message)
        self.patch = patch
        self.output = output
        self.rolled_back = list(rolled_back or [])


class VerificationError(PatchSetError):
    """The patched tree failed the compile / expect-marker checks."""

    def __init__(self, message, problems=None, rolled_back=None):
        super().__init__(message)
        self.problems = list(problems or [])
        self.rolled_back = list(rolled_back or [])


class PatchFile:
    """One verified patch: name, path on disk, sha256, text and target files."""

    __slots__ = ("name", "path", "sha256", "text", "files")

    def __init__(self, name, path, sha256, text, files):
        self.name = name
        self.path = path
        self.sha256 = sha256
        self.text = text
        self.files = files

    def entry(self):
        return {"name": self.name, "sha256": self.sha256}

    def __repr__(self):
        return "PatchFile(%r, %s)" % (self.name, self.sha256[:12])


# --------------------------------------------------------------------------
# series / SHA256SUMS / fingerprint
# --------------------------------------------------------------------------


def _check_patch_name(name, where):
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise PatchSetError("%s: invalid patch name %r (a plain file name is required)" % (where, name))


def parse_series(text):
    """Return the ordered patch names of a quilt-style ``series`` file.

    Blank lines and ``#`` comments (whole-line or trailing) are ignored.
    Per-patch options (``-p0``...) are refused: every patch is ``-p1``.
    """
    names = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = "series line %d" % lineno
        if len(fields) != 1:
            raise PatchSetError(
                "%s: expected one patch name, got %r (patch options are not supported; "
                "every patch is applied with -p1)" % (where, line)
            )
        _check_patch_name(fields[0], where)
        if fields[0] in names:
            raise PatchSetError("%s: patch %r is listed twice" % (where, fields[0]))
        names.append(fields[0])
    return names


def read_series(path):
    with open(path, "r", encoding="utf-8") as handle:
        return parse_series(handle.read())


def parse_sha256sums(text):
    """Parse ``sha256sum`` output (``<hex>  <name>`` or ``<hex> *<name>``)."""
    sums = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([0-9A-Fa-f]{64}) [ *](.+)$", line)
        if not match:
            raise PatchSetError("SHA256SUMS line %d is not '<sha256>  <name>': %r" % (lineno, raw))
        digest, name = match.group(1).lower(), match.group(2).strip()
        name = os.path.basename(name) if name.startswith("./") else name
        _check_patch_name(name, "SHA256SUMS line %d" % lineno)
        if name in sums and sums[name] != digest:
            raise PatchSetError("SHA256SUMS lists %r twice with different digests" % name)
        sums[name] = digest
    return sums


def read_sha256sums(path):
    with open(path, "r", encoding="utf-8") as handle:
        return parse_sha256sums(handle.read())


def select_patches(series_text, sums_text, selected, extras, patch_dir):
    """The ordered patch set to apply: selected built-ins in series order, then user patches.

    Each entry is ``{"name", "src", "sha256"}``. The series and SHA256SUMS are read strictly
    (parse_series, parse_sha256sums); unknown names, patches without a pinned checksum and
    malformed user entries raise PatchSetError naming the variable and the offending entry.
    """
    series = parse_series(series_text)
    sums = parse_sha256sums(sums_text)
    selected = list(selected or [])
    unknown = [s for s in selected if s not in series]
    if unknown:
        raise PatchSetError("sglang_patches: unknown patch %r; the built-in series is %s" % (unknown[0], series))
    plan = []
    for name in series:
        if name in selected:
            if name not in sums:
                raise PatchSetError("patch %s has no checksum in SHA256SUMS" % name)
            plan.append({"name": name, "src": "%s/%s" % (patch_dir, name), "sha256": sums[name]})
    for i, extra in enumerate(extras or []):
        digest = str(extra.get("sha256", "")) if isinstance(extra, dict) else ""
        if not isinstance(extra, dict) or not extra.get("path") or not _SHA256_RE.match(digest.lower()):
            raise PatchSetError("sglang_extra_patches[%d]: expected {path: <controller path>, sha256: <64 hex>}, got %r"
                                % (i, extra))
        name = str(extra["path"]).rstrip("/").rsplit("/", 1)[-1]
        _check_patch_name(name, "sglang_extra_patches[%d]" % i)
        if any(p["name"] == name for p in plan):
            raise PatchSetError("sglang_extra_patches[%d]: a patch named %s is already in the set" % (i, name))
        plan.append({"name": name, "src": str(extra["path"]), "sha256": digest.lower()})
    return plan


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def normalize_entries(entries):
    """Return ``[(name, sha256), ...]`` from dicts, pairs or PatchFile objects."""
    result = []
    seen = set()
    for item in entries or []:
        if isinstance(item, PatchFile):
            name, digest = item.name, item.sha256
        elif isinstance(item, dict):
            try:
                name, digest = item["name"], item["sha256"]
            except KeyError as exc:
                raise PatchSetError("patch entry %r lacks key %s" % (item, exc))
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            name, digest = item
        else:
            raise PatchSetError("patch entry %r is not {'name', 'sha256'}" % (item,))
        name = str(name)
        digest = str(digest).strip().lower()
        _check_patch_name(name, "patch entry")
        if not _SHA256_RE.match(digest):
            raise PatchSetError("patch entry %r: %r is not a sha256 hex digest" % (name, digest))
        if name in seen:
            raise PatchSetError("patch %r appears twice in the patch set" % name)
        seen.add(name)
        result.append((name, digest))
    return result


def patchset_fingerprint_full(entries):
    """Full sha256 over the ordered (name, sha256) list; 'nopatch' when empty."""
    pairs = normalize_entries(entries)
    if not pairs:
        return NOPATCH_FINGERPRINT
    canonical = json.dumps([_FINGERPRINT_FORMAT, [list(p) for p in pairs]], separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def patchset_fingerprint(entries, length=FINGERPRINT_LENGTH):
    """Short fingerprint used in venv paths (``<version>-<fingerprint>``)."""
    full = patchset_fingerprint_full(entries)
    if full == NOPATCH_FINGERPRINT:
        return full
    return full[:length]


# --------------------------------------------------------------------------
# patch files
# --------------------------------------------------------------------------


def _strip_path(raw, strip=_STRIP):
    path = raw.split("\t", 1)[0].strip()
    if path.startswith('"') and path.endswith('"') and len(path) >= 2:
        path = path[1:-1]
    if path == "/dev/null":
        return None
    parts = [p for p in path.split("/") if p]
    if len(parts) <= strip:
        raise PatchSetError("patch path %r has too few components for -p%d" % (path, strip))
    rel = "/".join(parts[strip:])
    if rel.startswith("/") or ".." in rel.split("/"):
        raise PatchSetError("patch path %r escapes the target directory" % path)
    return rel


def patch_targets(text, strip=_STRIP):
    """Relative paths (after -p1) of the files a unified diff touches, in order."""
    lines = text.splitlines()
    files = []
    for index in range(len(lines) - 2):
        old, new, hunk = lines[index], lines[index + 1], lines[index + 2]
        if old.startswith("--- ") and new.startswith("+++ ") and hunk.startswith("@@ "):
            target = _strip_path(new[4:], strip) or _strip_path(old[4:], strip)
            if target and target not in files:
                files.append(target)
    return files


def patch_adds(text, target, marker, strip=_STRIP):
    """True when the unified diff ``text`` adds a line containing ``marker`` to the file
    ``target`` (a path after -p1, like sglang/srt/arg_groups/fields/spec.py).

    Used to tell, before anything is installed, whether a patch set provides a flag that stock
    SGLang lacks (sglang derives its flags from the dataclass fields of arg_groups/fields/*.py).
    """
    current = None
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("+++ ") and index > 0 and lines[index - 1].startswith("--- "):
            current = _strip_path(line[4:], strip) or _strip_path(lines[index - 1][4:], strip)
        elif current == target and line.startswith("+") and not line.startswith("+++ ") and marker in line:
            return True
    return False


def load_patches(paths, checksums):
    """Read the patch files and verify each against ``checksums`` (name -> sha256).

    Raises ChecksumError naming every missing or mismatching patch; nothing
    else is done before all of them check out.
    """
    wanted = {}
    for name, digest in (checksums or {}).items():
        digest = str(digest).strip().lower()
        if not _SHA256_RE.match(digest):
            raise ChecksumError("checksum for %r is not a sha256 hex digest: %r" % (name, digest))
        wanted[str(name)] = digest
    problems = []
    patches = []
    for path in paths:
        name = os.path.basename(path)
        if any(p.name == name for p in patches):
            raise PatchSetError("patch %r is listed twice" % name)
        if not os.path.isfile(path):
            problems.append("%s: patch file %s does not exist" % (name, path))
            continue
        actual = sha256_file(path)
        if name not in wanted:
            problems.append("%s: no checksum given for this patch" % name)
        elif wanted[name] != actual:
            problems.append("%s: sha256 is %s, expected %s" % (name, actual, wanted[name]))
        with open(path, "r", encoding="utf-8") as handle:
            text = handle.read()
        files = patch_targets(text)
        if not files:
            problems.append("%s: no unified-diff hunks found" % name)
        patches.append(PatchFile(name, path, actual, text, files))
    if problems:
        raise ChecksumError("patch verification failed: " + "; ".join(problems))
    return patches


# --------------------------------------------------------------------------
# GNU patch
# --------------------------------------------------------------------------


def find_patch_executable(path=None):
    if path:
        return path
    found = shutil.which("patch")
    if not found:
        raise PatchSetError("GNU patch is not installed (install the 'patch' package)")
    return found


def _patch_env():
    env = dict(os.environ)
    env.pop("POSIXLY_CORRECT", None)  # changes backup/reject behaviour
    env.pop("PATCH_GET", None)
    env.pop("PATCH_VERSION_CONTROL", None)
    env.pop("VERSION_CONTROL", None)
    env.pop("SIMPLE_BACKUP_SUFFIX", None)
    env["LC_ALL"] = "C"
    env["QUOTING_STYLE"] = "literal"
    return env


def check_gnu_patch(patch_bin):
    """Return the version line of ``patch_bin``; raise unless it is GNU patch."""
    try:
        proc = subprocess.run([patch_bin, "--version"], capture_output=True, text=True, env=_patch_env(), check=False)
    except OSError as exc:
        raise PatchSetError("cannot run %s: %s" % (patch_bin, exc))
    first = (proc.stdout or proc.stderr).splitlines()[:1]
    if proc.returncode != 0 or not first or "GNU patch" not in first[0]:
        raise PatchSetError("%s is not GNU patch (got %r)" % (patch_bin, first[0] if first else ""))
    return first[0]


def run_patch(patch_bin, directory, patch_path, reverse=False, dry_run=False):
    """Run GNU patch once; return (returncode, combined output).

    ``--forward`` keeps ``--batch`` from silently reversing an already applied
    patch; ``--fuzz=0`` refuses hunks whose context moved; no backup or reject
    files are written.
    """
    argv = [
        patch_bin,
        "-p%d" % _STRIP,
        "--batch",
        "--forward",
        "--fuzz=0",
        "--no-backup-if-mismatch",
        "-r",
        "-",
        "-d",
        directory,
        "-i",
        os.path.abspath(patch_path),
    ]
    if reverse:
        argv.append("--reverse")
    if dry_run:
        argv.append("--dry-run")
    proc = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_patch_env(),
        check=False,
    )
    return proc.returncode, proc.stdout


def patch_state(patch_bin, directory, patch):
    """'applied', 'applicable', 'conflict' or 'ambiguous' for one patch.

    Judged from the patch alone (reverse and forward dry runs); see
    plan_patches for the whole ordered set.
    """
    rc_rev, out_rev = run_patch(patch_bin, directory, patch.path, reverse=True, dry_run=True)
    rc_fwd, out_fwd = run_patch(patch_bin, directory, patch.path, dry_run=True)
    if rc_fwd == 0 and rc_rev != 0:
        return "applicable", out_fwd
    if rc_rev == 0 and rc_fwd != 0:
        return "applied", out_rev
    if rc_rev == 0 and rc_fwd == 0:
        return "ambiguous", "patch applies both forward and in reverse; refusing to guess\n" + out_fwd
    return "conflict", out_fwd


def _copy_targets(site, patches, scratch):
    for patch in patches:
        for rel in patch.files:
            src = os.path.join(site, rel)
            dst = os.path.join(scratch, rel)
            if os.path.exists(dst):
                continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.isfile(src):
                shutil.copy2(src, dst)


def plan_patches(patch_bin, site, patches, scratch=None):
    """Decide which patches are applied and which must still be applied.

    Works on a scratch copy of the touched files: patches found applied are
    peeled off from the last to the first, then the whole set is replayed
    forward, so patches that depend on earlier ones are judged correctly.
    Returns ``(already_applied, to_apply, scratch_dir)`` where the scratch dir
    holds the fully patched files (the caller removes it). Raises
    PatchConflictError (nothing changed in ``site``) when a patch can be
    neither.
    """
    own_scratch = scratch is None
    if own_scratch:
        scratch = tempfile.mkdtemp(prefix="ddtree-patch-plan-")
    try:
        _copy_targets(site, patches, scratch)
        applied = [False] * len(patches)
        for index in range(len(patches) - 1, -1, -1):
            state, out = patch_state(patch_bin, scratch, patches[index])
            if state == "ambiguous":
                raise PatchConflictError(
                    "%s: %s" % (patches[index].name, out.strip()),
                    patch=patches[index].name,
                    output=out,
                )
            if state == "applied":
                rc, out = run_patch(patch_bin, scratch, patches[index].path, reverse=True)
                if rc != 0:  # pragma: no cover - dry run said it would work
                    raise PatchConflictError(
                        "%s: reverse apply failed in the scratch copy" % patches[index].name,
                        patch=patches[index].name,
                        output=out,
                    )
                applied[index] = True
        for index, patch in enumerate(patches):
            rc, out = run_patch(patch_bin, scratch, patch.path, dry_run=True)
            if rc == 0:
                rc, out = run_patch(patch_bin, scratch, patch.path)
            if rc != 0:
                if applied[index]:
                    why = "it looks applied, but not on top of the patches before it"
                else:
                    why = "it is neither applied nor cleanly applicable"
                raise PatchConflictError(
                    "%s: %s. GNU patch said:\n%s" % (patch.name, why, out.strip()),
                    patch=patch.name,
                    output=out,
                )
        already = [p.name for p, done in zip(patches, applied) if done]
        todo = [p for p, done in zip(patches, applied) if not done]
        return already, todo, scratch
    except BaseException:
        if own_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        raise


def reverse_patches(patch_bin, site, patches):
    """Reverse ``patches`` (already applied, given in applied order) last first.

    Returns the names reversed; raises PatchSetError if one cannot be.
    """
    reversed_names = []
    for patch in reversed(list(patches)):
        rc, out = run_patch(patch_bin, site, patch.path, reverse=True)
        if rc != 0:
            raise PatchSetError(
                "rollback failed: could not reverse %s (reversed so far: %s). The tree "
                "needs a reinstall. GNU patch said:\n%s"
                % (patch.name, ", ".join(reversed_names) or "none", out.strip())
            )
        reversed_names.append(patch.name)
    return reversed_names


def apply_patches(patch_bin, site, patches):
    """Apply ``patches`` in order; all or nothing.

    Each patch is dry-run first. On the first failure the patches applied by
    this call are reversed and PatchConflictError is raised. Returns the names
    applied.
    """
    done = []
    for patch in patches:
        rc, out = run_patch(patch_bin, site, patch.path, dry_run=True)
        if rc == 0:
            rc, out = run_patch(patch_bin, site, patch.path)
        if rc != 0:
            rolled = reverse_patches(patch_bin, site, done)
            raise PatchConflictError(
                "%s: failed to apply (rolled back: %s). GNU patch said:\n%s"
                % (patch.name, ", ".join(rolled) or "nothing", out.strip()),
                patch=patch.name,
                output=out,
                rolled_back=rolled,
            )
        done.append(patch)
    return [p.name for p in done]


# --------------------------------------------------------------------------
# verification
# --------------------------------------------------------------------------


def _check_relpath(rel):
    norm = os.path.normpath(rel)
    if os.path.isabs(rel) or norm.startswith(".."):
        raise PatchSetError("expect path %r must be relative to site-packages" % rel)
    return norm


def verify_tree(roots, files, expect=None):
    """Return a list of problems (empty when fine).

    ``roots`` is a directory or a list searched in order (a scratch copy
    first, then the real tree). Every ``.py`` file in ``files`` must compile;
    each ``expect`` entry (relative path -> strings) must be present.
    """
    if isinstance(roots, str):
        roots = [roots]

    def locate(rel):
        for root in roots:
            candidate = os.path.join(root, rel)
            if os.path.isfile(candidate):
                return candidate
        return None

    problems = []
    for rel in files:
        if not rel.endswith(".py"):
            continue
        path = locate(rel)
        if path is None:
            problems.append("%s: missing after patching" % rel)
            continue
        with open(path, "rb") as handle:
            source = handle.read()
        try:
            compile(source, rel, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            problems.append("%s: does not compile: %s" % (rel, exc))
    for rel, markers in sorted((expect or {}).items()):
        rel = _check_relpath(rel)
        if isinstance(markers, str):
            markers = [markers]
        path = locate(rel)
        if path is None:
            problems.append("%s: expected file is missing" % rel)
            continue
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        for marker in markers:
            if marker not in text:
                problems.append("%s: expected marker %r not found" % (rel, marker))
    return problems


# --------------------------------------------------------------------------
# stamp
# --------------------------------------------------------------------------


def stamp_path(site, relpath=STAMP_RELPATH):
    return os.path.join(site, relpath)


def read_stamp(site, relpath=STAMP_RELPATH):
    """The stamp dict, or None when absent; unreadable stamps read as None."""
    path = stamp_path(site, relpath)
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def make_stamp(entries, applied_at=None, files=None):
    """The stamp record; ``files`` maps each touched file to its sha256 once the set is applied
    and verified (what stamp_holds compares a later run with)."""
    pairs = normalize_entries(entries)
    if applied_at is None:
        now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        applied_at = now.isoformat().replace("+00:00", "Z")
    stamp = {
        "fingerprint": patchset_fingerprint(pairs),
        "patches": [{"name": n, "sha256": s} for n, s in pairs],
        "applied_at": applied_at,
    }
    if files is not None:
        stamp["files"] = dict(files)
    return stamp


def file_digests(site, files):
    """{relative path: sha256} of the files under ``site`` (None for a missing one)."""
    out = {}
    for rel in files:
        path = os.path.join(site, rel)
        out[rel] = sha256_file(path) if os.path.isfile(path) else None
    return out


def stamp_holds(stamp, entries, site, files):
    """The stamp records this patch set and every touched file is byte for byte what it was when
    the set was applied and verified: nothing to plan, apply or verify again (no GNU patch run).
    A stamp without file digests (written before they were recorded) never holds."""
    if not stamp_matches(stamp, entries):
        return False
    recorded = stamp.get("files")
    if not isinstance(recorded, dict) or sorted(recorded) != sorted(files):
        return False
    return file_digests(site, files) == recorded


def stamp_matches(stamp, entries):
    if not isinstance(stamp, dict):
        return False
    try:
        recorded = normalize_entries(stamp.get("patches") or [])
    except PatchSetError:
        return False
    pairs = normalize_entries(entries)
    return recorded == pairs and stamp.get("fingerprint") == patchset_fingerprint(pairs)


def write_stamp(site, stamp, relpath=STAMP_RELPATH):
    """Write the stamp atomically (temp file + rename in the same directory)."""
    path = stamp_path(site, relpath)
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".ddtree-patchset.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(stamp, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _foreign_stamp(stamp, entries):
    """Names in an existing stamp that are not part of ``entries`` (same sha)."""
    if not isinstance(stamp, dict):
        return []
    try:
        recorded = normalize_entries(stamp.get("patches") or [])
    except PatchSetError:
        return []
    current = set(normalize_entries(entries))
    return ["%s (%s)" % (n, s[:12]) for n, s in recorded if (n, s) not in current]


# --------------------------------------------------------------------------
# the whole operation
# --------------------------------------------------------------------------


def ensure_patchset(
    site,
    patch_paths,
    checksums,
    expect=None,
    check_mode=False,
    patch_bin=None,
    stamp_relpath=STAMP_RELPATH,
):
    """Bring ``site`` to "every patch applied, stamp written".

    Returns a dict: changed, fingerprint, applied (names applied, or that would
    be in check mode), already_applied, files (relative paths touched),
    stamp (record written / to write / kept), stamp_path, patches (PatchFile
    list applied, for diffs). Raises a PatchSetError subclass on failure; in
    that case the tree is as it was before the call.
    """
    site = os.path.abspath(site)
    if not os.path.isdir(site):
        raise PatchSetError("site-packages directory %s does not exist" % site)
    stamp_dir = os.path.dirname(stamp_path(site, stamp_relpath))
    if not os.path.isdir(stamp_dir):
        raise PatchSetError("%s does not exist: is the package installed in %s?" % (stamp_dir, site))

    patches = load_patches(patch_paths, checksums)
    entries = [p.entry() for p in patches]
    fingerprint = patchset_fingerprint(entries)
    existing = read_stamp(site, stamp_relpath)
    foreign = _foreign_stamp(existing, entries)
    if foreign:
        raise PatchSetError(
            "%s records patches outside the requested set: %s. This tree was patched with "
            "a different patch set (stamp fingerprint %s, requested %s); install into a "
            "fresh venv instead of re-patching this one."
            % (stamp_path(site, stamp_relpath), ", ".join(foreign), existing.get("fingerprint"), fingerprint)
        )

    all_files = []
    for patch in patches:
        all_files.extend(f for f in patch.files if f not in all_files)
    result = {
        "changed": False,
        "fingerprint": fingerprint,
        "applied": [],
        "already_applied": [],
        "files": [],
        "stamp_path": stamp_path(site, stamp_relpath),
        "stamp": existing,
        "patches": [],
    }
    if patches and stamp_holds(existing, entries, site, all_files):
        # Applied and verified before, and untouched since: a no-op read (the fleet's state read
        # runs this on every host of every drift run) costs hashing, not a GNU patch replay.
        problems = verify_tree(site, [], expect)
        if problems:
            raise VerificationError("the patched tree fails verification: " + "; ".join(problems), problems=problems)
        result["already_applied"] = [p.name for p in patches]
        return result
    patch_bin = find_patch_executable(patch_bin)

    already, todo, scratch = plan_patches(patch_bin, site, patches) if patches else ([], [], None)
    try:
        # Verify the would-be result first (scratch copy over the real tree).
        roots = [scratch, site] if scratch else [site]
        problems = verify_tree(roots, all_files, expect)
        if problems:
            raise VerificationError("the patched tree fails verification: " + "; ".join(problems), problems=problems)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    result["already_applied"] = already
    result["applied"] = [p.name for p in todo]
    result["patches"] = todo
    touched = []
    for patch in todo:
        touched.extend(f for f in patch.files if f not in touched)
    result["files"] = touched

    if not todo and stamp_matches(existing, entries):
        return result

    stamp = make_stamp(entries)
    result["changed"] = True
    result["stamp"] = stamp
    if check_mode:
        return result

    apply_patches(patch_bin, site, todo)
    problems = verify_tree(site, all_files, expect)
    if problems:
        rolled = reverse_patches(patch_bin, site, todo)
        raise VerificationError(
            "the patched tree fails verification (rolled back: %s): %s"
            % (", ".join(rolled) or "nothing", "; ".join(problems)),
            problems=problems,
            rolled_back=rolled,
        )
    stamp["files"] = file_digests(site, all_files)
    try:
        write_stamp(site, stamp, stamp_relpath)
    except OSError as exc:
        rolled = reverse_patches(patch_bin, site, todo)
        raise PatchSetError("cannot write the stamp (rolled back: %s): %s" % (", ".join(rolled), exc))
    return result
