"""Where things are, wherever a test module stands in tests/."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
SAMPLE = ROOT / "data" / "sample"           # the shipped sample log
FIXTURES = ROOT / "tests" / "fixtures"      # the checked-in test inputs
# the shared data sets beside the repository (tests that read them skip without them)
SHARED = Path(os.environ.get("REPLAY_SHARED_DATA", ROOT.parent / "shared" / "data"))
