# -*- coding: utf-8 -*-
"""Files written as one step: a directory and the files in it, each atomically.

The controller writes evidence, reports and results as a handful of small files at a time. One
``copy`` per file costs a module run each (a Python process on the controller, a stat and a
copy); ``plan`` and ``apply`` do the same in-process for the whole set, for the action plugin
``controller_files`` (and its module, wherever it runs). Standard library only.

``plan(directory, files, dir_mode, file_mode)`` reads what is there and returns one entry per
file with what would change; ``apply`` carries the plan out: the directory (and missing parents)
created with ``dir_mode``, each changed file written to a temporary file beside it, flushed,
and renamed over the old one, so a reader sees the old file or the new, never half of one.
"""

from __future__ import annotations

import os
import stat
import tempfile

# The options of module and action plugin alike (plugins/modules/controller_files.py documents them).
ARGUMENT_SPEC = {
    "dir": {"type": "path", "required": True},
    "dir_mode": {"type": "raw", "default": "0755"},
    "mode": {"type": "raw", "default": "0644"},
    "files": {"type": "list", "elements": "dict", "required": True},
}

# Diffs larger than this (bytes, before or after) are not shown: Ansible's own max_diff_size.
MAX_DIFF_BYTES = 104448


class FilesError(ValueError):
    """Bad input, named: the option and the item."""


def _mode(value, option):
    """An octal mode given as '0640', '640' or an int (already octal-valued)."""
    if isinstance(value, int) and not isinstance(value, bool):
        mode = value
    elif isinstance(value, str) and value.strip():
        try:
            mode = int(value.strip(), 8)
        except ValueError:
            raise FilesError("%s: %r is not an octal mode such as '0640'" % (option, value)) from None
    else:
        raise FilesError("%s: expected an octal mode such as '0640', got %r" % (option, value))
    if not 0 <= mode <= 0o7777:
        raise FilesError("%s: %o is not a file mode" % (option, mode))
    return mode


def normalize(files, file_mode):
    """The files as [(name, bytes, mode)]; each name a plain file name, each given once."""
    if not isinstance(files, list):
        raise FilesError("files: expected a list of {name, content[, mode]}, got %s" % type(files).__name__)
    default = _mode(file_mode, "mode")
    out, seen = [], set()
    for i, item in enumerate(files):
        where = "files[%d]" % i
        if not isinstance(item, dict) or "name" not in item or "content" not in item:
            raise FilesError("%s: expected a mapping with name and content, got %r" % (where, item))
        name = item["name"]
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name:
            raise FilesError("%s.name: %r is not a plain file name (no '/', not '.' or '..')" % (where, name))
        if name in seen:
            raise FilesError("%s.name: %r is given twice" % (where, name))
        seen.add(name)
        content = item["content"]
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise FilesError("%s.content: expected text, got %s" % (where, type(content).__name__))
        mode = _mode(item["mode"], where + ".mode") if item.get("mode") is not None else default
        out.append((name, content.encode("utf-8"), mode))
    return out


def plan(directory, files, dir_mode="0755", file_mode="0644"):
    """What writing ``files`` into ``directory`` changes: a dict with the directory's entry and
    one entry per file (path, state absent|differs|mode|same, changed, before/after for a diff)."""
    if not isinstance(directory, str) or not directory.startswith("/"):
        raise FilesError("dir: expected an absolute path, got %r" % (directory,))
    dmode = _mode(dir_mode, "dir_mode")
    entries = []
    dir_exists = os.path.isdir(directory)
    if os.path.lexists(directory) and not dir_exists:
        raise FilesError("dir: %s exists and is not a directory" % directory)
    for name, data, mode in normalize(files, file_mode):
        path = os.path.join(directory, name)
        before = None
        state = "absent"
        if dir_exists and os.path.lexists(path):
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                raise FilesError("files: %s exists and is not a regular file" % path)
            with open(path, "rb") as fh:
                before = fh.read()
            if before != data:
                state = "differs"
            elif stat.S_IMODE(st.st_mode) != mode:
                state = "mode"
            else:
                state = "same"
        entries.append({"name": name, "path": path, "mode": mode, "data": data, "before": before,
                        "state": state, "changed": state != "same"})
    return {"dir": directory, "dir_mode": dmode, "dir_created": not dir_exists, "files": entries}


def _write_atomic(path, data, mode):
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def apply(the_plan):
    """Carry the plan out; returns the names of the files changed."""
    directory = the_plan["dir"]
    if the_plan["dir_created"]:
        missing = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            os.mkdir(d, the_plan["dir_mode"])
            os.chmod(d, the_plan["dir_mode"])   # the umask does not narrow the declared mode
    changed = []
    for entry in the_plan["files"]:
        if entry["state"] == "mode":
            os.chmod(entry["path"], entry["mode"])
        elif entry["changed"]:
            _write_atomic(entry["path"], entry["data"], entry["mode"])
        if entry["changed"]:
            changed.append(entry["name"])
    return changed


def _text(data):
    return data.decode("utf-8", "replace") if data is not None else ""


def result(the_plan):
    """The task result (without 'changed' policy): per-file summary and diffs for --diff."""
    files, diffs = [], []
    for e in the_plan["files"]:
        files.append({"name": e["name"], "path": e["path"], "state": e["state"], "changed": e["changed"],
                      "size": len(e["data"]), "mode": "%04o" % e["mode"]})
        if e["changed"] and e["state"] != "mode":
            big = len(e["data"]) > MAX_DIFF_BYTES or len(e["before"] or b"") > MAX_DIFF_BYTES
            diffs.append({"before_header": e["path"] if e["before"] is not None else "/dev/null",
                          "after_header": e["path"],
                          "before": "" if big else _text(e["before"]),
                          "after": "(%d bytes, larger than the diff limit)\n" % len(e["data"]) if big
                          else _text(e["data"])})
    out = {"dir": the_plan["dir"], "dir_created": the_plan["dir_created"], "files": files,
           "written": [f["name"] for f in files if f["changed"]]}
    if the_plan["dir_created"]:
        diffs.insert(0, {"before_header": the_plan["dir"], "after_header": the_plan["dir"],
                         "before": "state: absent\n", "after": "state: directory\n"})
    return out, diffs


def write(params, check_mode=False, diff=False):
    """The whole task (module and action plugin alike): plan, apply unless ``check_mode``, result
    with ``changed`` and, with ``diff``, the diffs. Raises FilesError or OSError."""
    the_plan = plan(params["dir"], params["files"], params["dir_mode"], params["mode"])
    if not check_mode:
        apply(the_plan)
    out, diffs = result(the_plan)
    out["changed"] = the_plan["dir_created"] or bool(out["written"])
    if diff and diffs:
        out["diff"] = diffs
    return out

