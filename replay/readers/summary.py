"""What an ingest did: its counts (:class:`IngestSummary`, a file's and a byte
range's added in) and their text for the command line."""

from __future__ import annotations

from dataclasses import dataclass, field

from replay.readers.loader import FileStats
from replay.readers.timeorder import FLAGGED


@dataclass
class IngestSummary:
    files: int = 0  # files looked at (new + skipped + unreadable)
    skipped_files: int = 0  # already ingested (same sha256)
    lines: int = 0  # input units of the new files
    loaded: int = 0
    rejected: int = 0
    context: int = 0  # lines of session files that are context, not requests
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    # new files whose loaded units are not in time order: (path, 'reversed' | 'shuffled')
    # (replay.readers.timeorder; they are sorted on replay all the same)
    unordered_files: list[tuple[str, str]] = field(default_factory=list)

    def reconciles(self) -> bool:
        """Every input unit of the new files was loaded, context or rejected."""
        return (self.lines == self.loaded + self.context + self.rejected
                and sum(self.rejected_by_reason.values()) == self.rejected)


def summary_text(summary: IngestSummary) -> str:
    s = summary
    new = s.files - s.skipped_files
    lines = [
        f"files: {new} ingested, {s.skipped_files} skipped (already ingested)",
        f"lines: {s.lines:,}  loaded: {s.loaded:,}  "
        + (f"context: {s.context:,}  " if s.context else "") + f"rejected: {s.rejected:,}"
        + ("" if s.reconciles() else "  (WARNING: counts do not reconcile)"),
    ]
    for reason, n in sorted(s.rejected_by_reason.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {reason:<20} {n:,}")
    if s.unordered_files:
        lines.append(unordered_text(s.unordered_files))
    return "\n".join(lines)


SHOWN_FILES = 10  # unordered files named in the summary; the rest are counted


def unordered_text(files: list[tuple[str, str]]) -> str:
    """One line: how many files were reversed or shuffled, and which (their names, never their text)."""
    counts = {o: sum(1 for _, x in files if x == o) for o in FLAGGED}
    what = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    names = ", ".join(f"{p} ({o})" for p, o in files[:SHOWN_FILES])
    more = f" and {len(files) - SHOWN_FILES} more" if len(files) > SHOWN_FILES else ""
    return (f"time order: {len(files)} file(s) not in time order ({what}; sorted by time all the same): "
            f"{names}{more}")


def add(summary: IngestSummary, stats: FileStats) -> None:
    add_counts(summary, stats, summary.rejected_by_reason)


def add_counts(total, stats: FileStats, reasons: dict) -> None:
    """A file's (or a range's) counts added to ``total`` (a summary, or a cut file's
    stats), its rejects by reason to ``reasons``."""
    total.lines += stats.lines
    total.loaded += stats.loaded
    total.rejected += stats.rejected
    total.context += stats.context
    for k, v in stats.by_reason.items():
        reasons[k] = reasons.get(k, 0) + v
