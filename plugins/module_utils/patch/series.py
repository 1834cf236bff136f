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
  (``<site-packages>/sglang/.ddtree-patchset.json``).

No Ansible import: the sglang_patch module (AnsiballZ ships it), the controller-side filter
plugin (plugins/filter/patch.py) and the unit tests import the same file by its collection
name. Standard library only.
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
        raise PatchSetError("%s: invalid patch name %r (a plain file name is required)"
                            % (where, name))


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
        raise PatchSetError("sglang_patches: unknown patch %r; the built-in series is %s"
                            % (unknown[0], series))
    plan = []
    for name in [n for n in series if n in selected]:
        if name not in sums:
            raise PatchSetError("patch %s has no checksum in SHA256SUMS" % name)
        plan.append({"name": name, "src": "%s/%s" % (patch_dir, name), "sha256": sums[name]})
    for i, extra in enumerate(extras or []):
        digest = str(extra.get("sha256", "")).lower() if isinstance(extra, dict) else ""
        if not isinstance(extra, dict) or not extra.get("path") or not _SHA256_RE.match(digest):
            raise PatchSetError("sglang_extra_patches[%d]: expected {path: <controller path>, "
                                "sha256: <64 hex>}, got %r" % (i, extra))
        name = str(extra["path"]).rstrip("/").rsplit("/", 1)[-1]
        _check_patch_name(name, "sglang_extra_patches[%d]" % i)
        if any(p["name"] == name for p in plan):
            raise PatchSetError("sglang_extra_patches[%d]: a patch named %s is already in the set"
                                % (i, name))
        plan.append({"name": name, "src": str(extra["path"]), "sha256": digest})
    return plan


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def normalize_entries(entries):
    """Return ``[(name, sha256), ...]`` from ``{"name", "sha256"}`` dicts or pairs."""
    result = []
    seen = set()
    for item in entries or []:
        if isinstance(item, dict):
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
    return full if full == NOPATCH_FINGERPRINT else full[:length]


# --------------------------------------------------------------------------
# patch files
# --------------------------------------------------------------------------


def _strip_path(raw):
    path = raw.split("\t", 1)[0].strip()
    if path.startswith('"') and path.endswith('"') and len(path) >= 2:
        path = path[1:-1]
    if path == "/dev/null":
        return None
    parts = [p for p in path.split("/") if p]
    if len(parts) <= _STRIP:
        raise PatchSetError("patch path %r has too few components for -p%d" % (path, _STRIP))
    if ".." in parts[_STRIP:]:
        raise PatchSetError("patch path %r escapes the target directory" % path)
    return "/".join(parts[_STRIP:])


def patch_targets(text):
    """Relative paths (after -p1) of the files a unified diff touches, in order."""
    lines = text.splitlines()
    files = []
    for index in range(len(lines) - 2):
        old, new, hunk = lines[index], lines[index + 1], lines[index + 2]
        if old.startswith("--- ") and new.startswith("+++ ") and hunk.startswith("@@ "):
            target = _strip_path(new[4:]) or _strip_path(old[4:])
            if target and target not in files:
                files.append(target)
    return files


def patch_adds(text, target, marker):
    """True when the unified diff ``text`` adds a line containing ``marker`` to the file
    ``target`` (a path after -p1, like sglang/srt/arg_groups/fields/spec.py).

    Used to tell, before anything is installed, whether a patch set provides a flag that stock
    SGLang lacks (sglang derives its flags from the dataclass fields of arg_groups/fields/*.py).
    """
    current = None
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("+++ ") and index > 0 and lines[index - 1].startswith("--- "):
            current = _strip_path(line[4:]) or _strip_path(lines[index - 1][4:])
        elif (current == target and line.startswith("+") and not line.startswith("+++ ")
              and marker in line):
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


def _patch_env():
    env = dict(os.environ)
    # Variables that change GNU patch's backup, reject or RCS/SCCS behaviour.
    for name in ("POSIXLY_CORRECT", "PATCH_GET", "PATCH_VERSION_CONTROL", "VERSION_CONTROL",
                 "SIMPLE_BACKUP_SUFFIX"):
        env.pop(name, None)
    env["LC_ALL"] = "C"
    env["QUOTING_STYLE"] = "literal"
    return env


def check_gnu_patch(patch_bin):
    """Return the version line of ``patch_bin``; raise unless it is GNU patch."""
    try:
        proc = subprocess.run([patch_bin, "--version"], capture_output=True, text=True,
                              env=_patch_env(), check=False)
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
    argv = [patch_bin, "-p%d" % _STRIP, "--batch", "--forward", "--fuzz=0",
            "--no-backup-if-mismatch", "-r", "-", "-d", directory, "-i",
            os.path.abspath(patch_path)]
    if reverse:
        argv.append("--reverse")
    if dry_run:
        argv.append("--dry-run")
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=_patch_env(), check=False)
    return proc.returncode, proc.stdout


def _apply(patch_bin, directory, patch):
    """Dry run first: a patch with one failing hunk would otherwise leave the others applied."""
    rc, out = run_patch(patch_bin, directory, patch.path, dry_run=True)
    return run_patch(patch_bin, directory, patch.path) if rc == 0 else (rc, out)


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
        return "ambiguous", ("patch applies both forward and in reverse; refusing to guess\n"
                             + out_fwd)
    return "conflict", out_fwd


def plan_patches(patch_bin, site, patches, scratch):
    """Decide which patches are applied and which must still be applied.

    Works on a copy of the touched files in the empty directory ``scratch`` (which holds the
    fully patched files afterwards): patches found applied are peeled off from the last to the
    first, then the whole set is replayed forward, so patches that depend on earlier ones are
    judged correctly. Returns ``(already_applied names, PatchFile list to apply)``. Raises
    PatchConflictError (nothing changed in ``site``) when a patch can be neither.
    """
    for rel in dict.fromkeys(f for p in patches for f in p.files):
        dst = os.path.join(scratch, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.isfile(os.path.join(site, rel)):
            shutil.copy2(os.path.join(site, rel), dst)
    applied = set()
    for patch in reversed(patches):
        state, out = patch_state(patch_bin, scratch, patch)
        if state == "ambiguous":
            raise PatchConflictError("%s: %s" % (patch.name, out.strip()), patch=patch.name,
                                     output=out)
        if state == "applied":
            rc, out = run_patch(patch_bin, scratch, patch.path, reverse=True)
            if rc != 0:  # pragma: no cover - dry run said it would work
                raise PatchConflictError("%s: reverse apply failed in the scratch copy"
                                         % patch.name, patch=patch.name, output=out)
            applied.add(patch.name)
    for patch in patches:
        rc, out = _apply(patch_bin, scratch, patch)
        if rc != 0:
            if patch.name in applied:
                why = "it looks applied, but not on top of the patches before it"
            else:
                why = "it is neither applied nor cleanly applicable"
            raise PatchConflictError("%s: %s. GNU patch said:\n%s" % (patch.name, why, out.strip()),
                                     patch=patch.name, output=out)
    return ([p.name for p in patches if p.name in applied],
            [p for p in patches if p.name not in applied])


def reverse_patches(patch_bin, site, patches):
    """Reverse ``patches`` (already applied, given in applied order) last first.

    Returns the names reversed; raises PatchSetError if one cannot be.
    """
    reversed_names = []
    for patch in reversed(patches):
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

    On the first failure the patches applied by this call are reversed and PatchConflictError
    is raised. Returns the names applied.
    """
    done = []
    for patch in patches:
        rc, out = _apply(patch_bin, site, patch)
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


def verify_tree(roots, files, expect=None):
    """Return a list of problems (empty when fine).

    A file is looked up in the directories ``roots`` in order (a scratch copy first, then the
    real tree). Every ``.py`` file in ``files`` must compile; each ``expect`` entry (relative
    path -> strings) must be present.
    """
    def locate(rel):
        return next((p for p in (os.path.join(r, rel) for r in roots) if os.path.isfile(p)), None)

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
        norm = os.path.normpath(rel)
        if os.path.isabs(norm) or norm.startswith(".."):
            raise PatchSetError("expect path %r must be relative to site-packages" % rel)
        path = locate(norm)
        if path is None:
            problems.append("%s: expected file is missing" % norm)
            continue
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        for marker in [markers] if isinstance(markers, str) else markers:
            if marker not in text:
                problems.append("%s: expected marker %r not found" % (norm, marker))
    return problems


def _verified(roots, files, expect):
    problems = verify_tree(roots, files, expect)
    if problems:
        raise VerificationError("the patched tree fails verification: " + "; ".join(problems),
                                problems=problems)


# --------------------------------------------------------------------------
# stamp
# --------------------------------------------------------------------------


def stamp_path(site):
    return os.path.join(site, STAMP_RELPATH)


def read_stamp(site):
    """The stamp dict, or None when absent; unreadable stamps read as None."""
    try:
        with open(stamp_path(site), "r", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def make_stamp(entries, applied_at=None):
    """The stamp record; ensure_patchset adds ``files`` (each touched file's sha256) once the
    set is applied and verified, which is what stamp_holds compares a later run with."""
    pairs = normalize_entries(entries)
    if applied_at is None:
        now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        applied_at = now.isoformat().replace("+00:00", "Z")
    return {
        "fingerprint": patchset_fingerprint(pairs),
        "patches": [{"name": n, "sha256": s} for n, s in pairs],
        "applied_at": applied_at,
    }


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


def _recorded(stamp):
    """The (name, sha256) pairs a stamp records, or None when it records none readably."""
    if not isinstance(stamp, dict):
        return None
    try:
        return normalize_entries(stamp.get("patches") or [])
    except PatchSetError:
        return None


def stamp_matches(stamp, entries):
    pairs = normalize_entries(entries)
    return _recorded(stamp) == pairs and stamp.get("fingerprint") == patchset_fingerprint(pairs)


def write_stamp(site, stamp):
    """Write the stamp atomically (temp file + rename in the same directory)."""
    path = stamp_path(site)
    fd, tmp = tempfile.mkstemp(prefix=".ddtree-patchset.", dir=os.path.dirname(path))
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


# --------------------------------------------------------------------------
# the whole operation
# --------------------------------------------------------------------------


def ensure_patchset(site, patch_paths, checksums, expect=None, check_mode=False, patch_bin=None):
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
    path = stamp_path(site)
    if not os.path.isdir(os.path.dirname(path)):
        raise PatchSetError("%s does not exist: is the package installed in %s?"
                            % (os.path.dirname(path), site))

    patches = load_patches(patch_paths, checksums)
    entries = [p.entry() for p in patches]
    fingerprint = patchset_fingerprint(entries)
    existing = read_stamp(site)
    requested = set(normalize_entries(entries))
    foreign = ["%s (%s)" % (n, s[:12]) for n, s in _recorded(existing) or []
               if (n, s) not in requested]
    if foreign:
        raise PatchSetError(
            "%s records patches outside the requested set: %s. This tree was patched with "
            "a different patch set (stamp fingerprint %s, requested %s); install into a "
            "fresh venv instead of re-patching this one."
            % (path, ", ".join(foreign), existing.get("fingerprint"), fingerprint)
        )

    all_files = list(dict.fromkeys(f for p in patches for f in p.files))
    result = {"changed": False, "fingerprint": fingerprint, "applied": [], "already_applied": [],
              "files": [], "stamp_path": path, "stamp": existing, "patches": []}
    if patches and stamp_holds(existing, entries, site, all_files):
        # Applied and verified before, and untouched since: a no-op read (the fleet's state read
        # runs this on every host of every drift run) costs hashing, not a GNU patch replay.
        _verified([site], [], expect)
        result["already_applied"] = [p.name for p in patches]
        return result
    patch_bin = patch_bin or shutil.which("patch")
    if not patch_bin:
        raise PatchSetError("GNU patch is not installed (install the 'patch' package)")

    with tempfile.TemporaryDirectory(prefix="ddtree-patch-plan-") as scratch:
        already, todo = plan_patches(patch_bin, site, patches, scratch)
        # Verify the would-be result first (scratch copy over the real tree).
        _verified([scratch, site], all_files, expect)
    result.update(already_applied=already, applied=[p.name for p in todo], patches=todo,
                  files=list(dict.fromkeys(f for p in todo for f in p.files)))
    if not todo and stamp_matches(existing, entries):
        return result

    stamp = make_stamp(entries)
    result.update(changed=True, stamp=stamp)
    if check_mode:
        return result

    apply_patches(patch_bin, site, todo)
    problems = verify_tree([site], all_files, expect)
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
        write_stamp(site, stamp)
    except OSError as exc:
        rolled = reverse_patches(patch_bin, site, todo)
        raise PatchSetError("cannot write the stamp (rolled back: %s): %s"
                            % (", ".join(rolled), exc))
    return result
