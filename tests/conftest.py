import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("REPLAY_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture
def shared_data():
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED
