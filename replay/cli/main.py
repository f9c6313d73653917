"""`replay` command line: parsing and printing over ``replay.api``.

Exit codes: 0 success; 1 the job failed (nothing could be loaded, a stage
error, a validation error); 2 bad usage (click's default).
"""

from __future__ import annotations

import os
import sys

import click

from replay.cli import analysis, commands, duplicates, export, prefixes, show, trend


def _raised(e: BaseException, module: str, name: str) -> bool:
    """``e`` is ``module.name``: looked up only if the command imported that module
    (an error class of a module never imported was never raised), so the
    command line imports no stage to catch their errors."""
    mod = sys.modules.get(module)
    return mod is not None and isinstance(e, getattr(mod, name))


class _Group(click.Group):
    """Errors a user can act on end the command with their message: exit code 1
    (2 for a tokenizer that cannot be loaded: a bad argument)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:  # the reader of our output left (`| head`): nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except Exception as e:  # noqa: BLE001 - re-raised unless the user can act on it
            if _raised(e, "replay.store.schema", "OldDatabase") or _raised(e, "replay.store.db", "DatabaseUnusable"):
                raise click.ClickException(str(e)) from None
            if _raised(e, "replay.text.encoder", "TokenizerUnusable"):
                raise click.UsageError(f"{e}; give a local Hugging Face tokenizer directory "
                                       "(with its tokenizer.json)", ctx) from None
            if "Query interrupted" in str(e) or type(e).__name__ == "InterruptException":
                # Ctrl-C inside a DuckDB query comes out as DuckDB's error: the
                # query's transaction is rolled back, as for Ctrl-C anywhere else
                raise click.Abort() from None
            from replay.store.db import disk_trouble  # (a failure's path only)

            trouble = disk_trouble(e)
            if trouble is None:
                raise
            raise click.ClickException(trouble) from None


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
                 commands.profiles_cmd, commands.synth, analysis.diagnose, analysis.realised, analysis.whatif, analysis.diff,
                 analysis.validate, analysis.capacity, duplicates.duplicates, export.export, trend.trend,
                 prefixes.prefixes, show.show):
    main.add_command(_command)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
