"""Volatile bytes in prompts: header lines, timestamps, ids.

Shared by the diagnosis (which names a divergence by what differs) and the
what-if normalizers (which strip or move such bytes).
"""

from __future__ import annotations

import re

HEADER_RE = re.compile(r"^\s*(?:x-[\w.-]+|[\w.-]*-header)\s*:", re.I)
TIMESTAMP_RES = (
    re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
               r"(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}))?)?"),
    re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"),
    re.compile(r"\b\d{1,2}:\d{2}\s?(?:[AaPp][Mm])\b"),
    re.compile(r"\b1[5-9]\d{8}(?:\.\d+)?\b|\b1[5-9]\d{11}\b"),  # epoch s / ms
    re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? \d{1,2} "
               r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{4}"),
    re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2},? \d{4}\b"),
)
ID_RES = (
    re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"),
    re.compile(r"\b[A-Za-z]{2,12}[_-](?=[A-Za-z0-9]*\d)[A-Za-z0-9]{8,}\b"),
    re.compile(r"\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{20,}\b"),
    re.compile(r"\bcch=[0-9a-fA-F]+"),
)
