import os

import pytest

from support.paths import SHARED


@pytest.fixture(scope="session")
def shared_data():
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="module")
def sample_con(tmp_path_factory):
    """A database of the shipped sample, ingested and tokenized (one per test module)."""
    from replay import api

    con = api.open_db(tmp_path_factory.mktemp("sample") / "s.duckdb")
    api.ingest(con, ["data/sample"])
    api.prepare(con, modes=())  # tokenize
    yield con
    con.close()


@pytest.fixture
def inline(monkeypatch):
    """The encoder in this process (``REPLAY_ENCODER=inline``)."""
    monkeypatch.setenv("REPLAY_ENCODER", "inline")
