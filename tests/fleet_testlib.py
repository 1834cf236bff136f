"""Test helpers every tier shares, defined once (tests/ is on pytest's pythonpath; the
benchmark scripts under tests/bench put it on theirs): a free loopback port and a fake
``nvidia-smi``. Tier-specific helpers stay in their own *_testlib modules."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

STANDIN_QUERY = ("--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_fake_nvidia_smi(directory, query_out="", list_out="", rc=0, stderr="", expect_args=None) -> Path:
    """Write an executable ``nvidia-smi`` into ``directory``: ``--query-gpu=...`` prints
    ``query_out``, ``-L`` prints ``list_out``, anything else exits 64; every call is appended to
    ``calls.log``. With ``expect_args`` (a tuple of argv words, e.g. STANDIN_QUERY) any other
    argv is refused with exit 2, for callers whose exact query is under test."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    (directory / "query.out").write_text(query_out)
    (directory / "list.out").write_text(list_out)
    (directory / "stderr.out").write_text(stderr)
    guard = ""
    if expect_args is not None:
        want = " ".join(expect_args)
        guard = 'if [ "$*" != "%s" ]; then echo "bad args: $*" >&2; exit 2; fi\n' % want
    path.write_text(
        "#!/bin/sh\n"
        'here="$(dirname "$0")"\n'
        'echo "$@" >> "$here/calls.log"\n'
        + guard +
        'cat "$here/stderr.out" >&2\n'
        'case "$1" in\n'
        '  -L) cat "$here/list.out" ;;\n'
        '  --query-gpu=*) cat "$here/query.out" ;;\n'
        '  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 64 ;;\n'
        "esac\n"
        "exit %d\n" % rc
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
