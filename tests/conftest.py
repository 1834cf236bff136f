"""Per-test timings for every tier: ``--times-json PATH`` writes what each test took.

tests/run_all.sh passes it to each pytest run and tests/times_report.py turns the files (and the
stage times run_all.sh records) into the table printed at the end of ``make test`` and written to
artifacts/test-times.md. Under pytest-xdist the controller writes the file: every worker's
reports reach it, with the worker's id.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption("--times-json", default=None, metavar="PATH",
                     help="write each test's seconds (setup + call + teardown), outcome and worker to PATH")


class TimesRecorder:
    def __init__(self, path: Path):
        self.path = path
        self.started = time.time()
        self.tests: dict[str, dict] = {}

    def pytest_runtest_logreport(self, report):
        entry = self.tests.setdefault(report.nodeid, {"nodeid": report.nodeid, "seconds": 0.0,
                                                      "outcome": "passed", "worker": "main"})
        entry["seconds"] += report.duration
        node = getattr(report, "node", None)   # xdist: the worker that ran it
        if node is not None:
            entry["worker"] = node.gateway.id
        if report.failed:
            entry["outcome"] = "failed" if report.when == "call" else f"error ({report.when})"
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"

    def pytest_sessionfinish(self, session, exitstatus):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({
            "args": session.config.invocation_params.args, "exitstatus": int(exitstatus),
            "wall_seconds": round(time.time() - self.started, 2),
            "tests": sorted(self.tests.values(), key=lambda t: -t["seconds"])}, indent=1) + "\n")


def pytest_configure(config):
    path = config.getoption("--times-json")
    if path and not hasattr(config, "workerinput"):   # the xdist controller, or a plain run
        config.pluginmanager.register(TimesRecorder(Path(path)), "ddtree-test-times")
