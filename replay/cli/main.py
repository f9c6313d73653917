"""`replay` command line: parsing and printing over ``replay.api``.

Exit codes: 0 success; 1 the job failed (nothing could be loaded, a stage
error, a validation error); 2 bad usage (click's default).
"""

from __future__ import annotations

import sys

import click

from replay.cli import analysis, commands, duplicates
from replay.store.db import DatabaseInUse
from replay.store.schema import OldDatabase


class _Group(click.Group):
    """Errors a user can act on end the command with their message and exit code 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (OldDatabase, DatabaseInUse) as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="prefix-replay")
def main():
    """Replay your own LLM request logs to measure how much prefix caching would save.

    \b
    Typical use:
      replay run                      # the whole job on the shipped sample → reports/sample/
      replay run logs/2026-w47/ --name w47
      replay sweep logs/*.jsonl --ttl 5m,1h,inf --block 16 --json
    """


for _command in (commands.ingest, commands.tokenize, commands.sweep, commands.run, commands.report,
                 commands.profiles_cmd, commands.synth, analysis.diagnose, analysis.whatif, analysis.diff,
                 analysis.validate, analysis.capacity, duplicates.duplicates):
    main.add_command(_command)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
