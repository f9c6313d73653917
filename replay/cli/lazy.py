"""``api``: ``replay.api``, imported when a command first uses it.

``replay.api`` imports every stage (DuckDB, polars, Arrow, the tokenizers, the
analyses); the commands reach it only in their bodies, so `--help`, a usage
error and the direct capacity path (``replay.cli.analysis``) never pay for it.
"""

from __future__ import annotations

import importlib


class _Lazy:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


api = _Lazy("replay.api")
