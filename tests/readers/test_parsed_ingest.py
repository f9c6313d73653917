"""Files parsed elsewhere (``replay.readers.parsed``, ``ingest(engine=)``) are
written as the single process writes them: the same rows, ids, blobs, rejects,
sources and counts, first time and on every re-run. The engine here runs each
file's parse in this process (Ray's is checked in ``test_ray.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay import api
from replay.readers.parsed import parse_file
from support.conversations import conversations_log
from support.logs import anthropic_wrapped, dump, mixed_logs, write_jsonl


class InProcess:
    """An engine that parses each file here, in order (what Ray's does, without Ray)."""

    def __init__(self):
        self.calls = 0

    def prepares_parts(self) -> bool:
        return True

    def map_ordered(self, fn, items, *args):
        for item in items:
            self.calls += 1
            yield item, fn(item, *args)


def ingest_both(tmp_path: Path, runs: list[list[str]]):
    """Each run's paths ingested locally and through :class:`InProcess`, one
    database each: (summaries, tables) per way."""
    out = {}
    for way, engine in (("local", None), ("parsed", InProcess())):
        con = api.open_db(str(tmp_path / f"{way}.duckdb"))
        summaries = [api.ingest(con, paths, engine=engine) for paths in runs]
        out[way] = (summaries, dump(con))
        con.close()
    return out


def test_parsed_files_are_written_as_the_single_process_writes_them(tmp_path):
    d = mixed_logs(tmp_path / "logs")
    later = write_jsonl(tmp_path / "later.jsonl", [anthropic_wrapped(ts=900 + i) for i in range(4)])
    got = ingest_both(tmp_path, [[str(d)], [str(d)], [str(d), str(later)]])
    (local_s, local_t), (parsed_s, parsed_t) = got["local"], got["parsed"]
    assert local_s == parsed_s
    assert local_t == parsed_t
    first, again, more = parsed_s
    assert first.reconciles() and first.loaded > 50 and first.rejected >= 5
    assert first.skipped_files == 1  # (the same rows compressed and not: one file)
    assert (again.loaded, again.skipped_files) == (0, again.files)  # re-running never double-counts
    assert (more.loaded, more.skipped_files) == (4, more.files - 1)
    assert len(parsed_t["blobs"]) > 0 and len(parsed_t["sources"]) == first.files - first.skipped_files + 1
    # (ids dense and in file order, as the single process gives them)
    assert [r[0] for r in parsed_t["requests"]] == list(range(1, first.loaded + more.loaded + 1))


@pytest.mark.parametrize("seed", [5, 6])
def test_blobs_first_used_in_a_later_file_keep_their_first_request(tmp_path, seed):
    d = tmp_path / "logs"
    d.mkdir()
    conversations_log((seed,), "anthropic", d / "a.jsonl", n_conv=2, turns=3)
    conversations_log((seed, seed + 10), "anthropic", d / "b.jsonl", n_conv=2, turns=5)
    got = ingest_both(tmp_path, [[str(d / "a.jsonl"), str(d / "b.jsonl")]])
    assert got["local"] == got["parsed"]
    blobs = got["parsed"][1]["blobs"]
    assert len({b[0] for b in blobs}) == len(blobs)  # each blob once, whichever files share it


def test_a_file_already_ingested_is_not_parsed_again(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [anthropic_wrapped(ts=i) for i in range(5)])
    con = api.open_db(str(tmp_path / "db.duckdb"))
    api.ingest(con, [str(p)], engine=InProcess())
    sha = con.execute("SELECT sha256 FROM sources").fetchone()[0]
    con.close()
    assert parse_file(str(p), None, _opts(), frozenset({sha})).status == "known"
    assert parse_file(str(p), None, _opts()).stats.loaded == 5
    assert parse_file(str(tmp_path / "missing.jsonl"), None, _opts()).status == "unopenable"


def _opts():
    from replay.readers.formats import Options

    return Options(fields={}, time_unit=None, split_body=True)


def test_parts_prepared_with_the_parse_give_the_same_tokens(tmp_path):
    """A neutral tokenizer's parts rendered and encoded where each file is parsed
    (``replay.distributed.files``, the reference alone) are taken by the tokenize
    stage: the same segments and prompts as the single process's."""
    d = mixed_logs(tmp_path / "logs")
    rows, taken = {}, {}
    for way, engine in (("local", None), ("parsed", InProcess())):
        con = api.open_db(str(tmp_path / f"{way}.duckdb"))
        tok = api.load_tokenizer(None)  # (here: the encoder process's shortcuts; there: the reference)
        try:
            api.ingest(con, [str(d)], tokenizer=tok, engine=engine)
            waiting = len(tok._elsewhere[0])
            left = []
            release = tok.release
            tok.release = lambda: (left.append(len(tok._elsewhere[0])), release())[1]
            api.tokenize(con, tok)
            taken[way] = waiting - left[0]
        finally:
            tok.close()
        rows[way] = [con.execute(q).fetchall() for q in (
            "SELECT seg_id, n_tokens, tokens FROM segments ORDER BY seg_id",
            "SELECT request_id, n_tokens, seg_ids, seg_parts, output_seg_ids FROM prompts ORDER BY request_id",
            "SELECT request_id, reason FROM set_aside ORDER BY ALL")]
        con.close()
    assert rows["parsed"] == rows["local"]
    assert len(rows["local"][1]) > 50
    assert taken["local"] == 0 and taken["parsed"] > 20  # (the prepared parts were used)


def test_parts_warmed_from_parsed_files_are_taken_with_the_same_rows(tmp_path):
    """Files parsed elsewhere hand their new parts to the encoder process as UTF-8
    bytes (never decoded here): the tokenize stage takes them, and its rows are
    the single process's."""
    d = mixed_logs(tmp_path / "logs")
    rows, taken = {}, {}
    for way, engine in (("local", None), ("parsed", _NoParts())):
        con = api.open_db(str(tmp_path / f"{way}.duckdb"))
        tok = api.load_tokenizer(None)
        got = []
        take = tok.take_blobs_flat
        tok.take_blobs_flat = lambda ids: (lambda r: (got.append(len(r.ids)), r)[1])(take(ids))
        try:
            api.ingest(con, [str(d)], tokenizer=tok, engine=engine)
            api.tokenize(con, tok)
        finally:
            tok.close()
        taken[way] = sum(got)
        rows[way] = [con.execute(q).fetchall() for q in (
            "SELECT seg_id, n_tokens, tokens FROM segments ORDER BY seg_id",
            "SELECT request_id, n_tokens, seg_ids, seg_parts, output_seg_ids FROM prompts ORDER BY request_id")]
        con.close()
    assert rows["parsed"] == rows["local"] and len(rows["local"][1]) > 50
    assert taken["parsed"] > 20 and taken["local"] > 20


class _NoParts(InProcess):
    """An engine whose tasks only parse: the driver warms the encoder process."""

    def prepares_parts(self) -> bool:
        return False
