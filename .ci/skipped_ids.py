"""A pytest plugin for .ci/run: the node ids of the tests (and test modules) that
skipped, one a line, written to the file $REPLAY_CI_SKIPPED when the run ends."""

from __future__ import annotations

import os

_skipped: dict[str, None] = {}


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped[report.nodeid] = None


def pytest_collectreport(report):
    if report.skipped:  # a module that skips as a whole (pytest.importorskip at its top)
        _skipped[report.nodeid] = None


def pytest_sessionfinish(session):
    path = os.environ.get("REPLAY_CI_SKIPPED")
    if path and not hasattr(session.config, "workerinput"):  # (the controller: workers report to it)
        with open(path, "w") as f:
            f.writelines(f"{nodeid}\n" for nodeid in _skipped)
