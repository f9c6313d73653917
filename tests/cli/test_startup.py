"""Start-up: `replay --help` lists every command and each command's `--help`
works; the command line imports no stage to do so (a fresh interpreter shows
what was imported), nor to run `replay capacity TRACE` on the direct path; the
names the options show (replay/cli/names.py) equal their owners'."""

import importlib
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from replay.cli import names
from replay.cli.main import main

from support.hashtraces import mooncake_records, write_jsonl
from support.paths import ROOT

#: what start-up must not import (each costs tens to hundreds of ms); numpy too for --help
HEAVY = ("duckdb", "polars", "pyarrow", "transformers", "matplotlib", "tqdm", "tokenizers", "jinja2", "pandas",
         "replay.api", "replay.store.db", "replay.prepare", "replay.text.tok", "replay.readers.ingest")

_PROBE = """
import json, sys
from replay.cli.main import main
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
sys.stdout.flush()
print("\\nIMPORTED " + json.dumps(sorted(m for m in sys.modules if m in {heavy} or m.startswith("replay."))),
      file=sys.stderr)
"""


def imported(args, cwd=ROOT) -> tuple[str, set]:
    """(stdout, the modules of ``HEAVY`` and of the package imported) of the command line run with ``args``."""
    probe = _PROBE.replace("{heavy}", repr(set(HEAVY) | {"numpy"}))
    res = subprocess.run([sys.executable, "-c", probe, *args], cwd=cwd, capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    line = [x for x in res.stderr.splitlines() if x.startswith("IMPORTED ")]
    assert line, res.stderr
    return res.stdout, set(json.loads(line[-1].removeprefix("IMPORTED ")))


def test_help_lists_every_command_and_imports_no_stage():
    out, mods = imported(["--help"])
    for name in main.commands:
        assert f"  {name} " in out, name
    assert not mods & (set(HEAVY) | {"numpy"}), mods & (set(HEAVY) | {"numpy"})


@pytest.mark.parametrize("command", sorted(main.commands))
def test_each_commands_help_works(command):
    res = CliRunner().invoke(main, [command, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage: main " + command in res.output or f"{command} [OPTIONS]" in res.output


@pytest.mark.parametrize("command", ["capacity", "sweep", "ingest", "export", "duplicates", "trend"])
def test_a_commands_help_imports_no_stage(command):
    _, mods = imported([command, "--help"])
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_the_direct_capacity_path_imports_no_database(tmp_path):
    trace = write_jsonl(tmp_path / "t.jsonl", mooncake_records(0))
    out, mods = imported(["capacity", trace, "--block", "512", "--capacity", "2,8", "--json"], cwd=tmp_path)
    assert json.loads(out.strip())[0]["requests"] == 60
    assert not mods & set(HEAVY), mods & set(HEAVY)
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("name", sorted(names.OWNERS))
def test_each_name_equals_its_owners(name):
    module, attr = names.OWNERS[name]
    assert getattr(names, name) == getattr(importlib.import_module(module), attr)
