"""Large JSON Lines files cut into byte ranges (``replay.readers.units``), each
parsed on its own and merged by the driver, store exactly what the single
process stores: every table, every column, row by row — whatever the cuts
(mid-line, at a newline, on a CRLF, before a last line without newline), the
rejects beside them, the time unit and the time order. The engine here parses
each unit in this process; the local worker processes and Ray are checked in
``tests/distributed``."""

from __future__ import annotations

import gzip
import json
import random
import shutil

import pytest

from replay.readers.ingest import ingest
from replay.readers.parsed import parse_range
from replay.readers.units import Digest, Known, Range, line_cuts, ranges
from replay.store import db
from support.agent_logs import claude_transcript
from support.agent_logs import write_jsonl as write_agent_jsonl
from support.logs import anthropic_wrapped, mixed_logs, write_jsonl
from support.ranges import BAD_LINES, InProcess, full_dump, ingest_runs, messy_lines, write_lines

_Engine = InProcess

SIZES = [1, 2, 7, 40, 150, 600, 2500]


def both(tmp_path, runs, range_bytes, tag=""):
    """(oracle, by units) of the same runs: (summaries, dumps), and the units mapped."""
    want = ingest_runs(tmp_path / f"one{tag}.duckdb", runs)
    engine = InProcess()
    got = ingest_runs(tmp_path / f"units{tag}.duckdb", runs, engine=engine, range_bytes=range_bytes)
    return want, got, engine.items


@pytest.mark.parametrize("seed", range(24))
def test_ranges_of_a_generated_log_store_what_the_single_process_stores(tmp_path, seed):
    rng = random.Random(seed)
    log = write_lines(tmp_path / "log.jsonl", messy_lines(seed, tmp_path), rng)
    size = log.stat().st_size
    for k, rb in enumerate(sorted({rng.choice(SIZES), rng.randint(1, size), rng.randint(1, 64)})):
        want, got, units = both(tmp_path, [[str(log)]], rb, tag=str(k))
        assert got == want, (seed, rb)
        cut = [u for u in units if isinstance(u, Range)]
        if rb < size and want[0][0].loaded:
            assert len(cut) > 1, (seed, rb)  # (it was cut)
        assert got[0][0].reconciles()


def test_cuts_fall_after_newlines_and_cover_the_file(tmp_path):
    for seed in range(40):
        rng = random.Random(seed)
        data = b"".join(rng.choice([b"a", b"bb", b"\n", b"\r\n", b"xyz" * rng.randint(0, 9)]) for _ in range(60))
        p = tmp_path / "f.jsonl"
        p.write_bytes(data)
        for rb in (1, 3, 10, 50):
            cuts = line_cuts(str(p), len(data), rb)
            assert cuts == sorted(set(cuts)) and all(0 < c < len(data) for c in cuts)
            assert all(data[c - 1:c] == b"\n" for c in cuts)
            assert cuts == _cuts_in_memory(data, rb)


def _cuts_in_memory(data: bytes, rb: int) -> list[int]:
    """Each cut just after the first newline at or past the next multiple of ``rb``
    (past the cut before), while one is left before the end."""
    cuts: list[int] = []
    at = rb
    while at < len(data):
        i = data.find(b"\n", max(at - 1, cuts[-1] if cuts else 0))
        if i < 0 or i + 1 >= len(data):
            break
        cuts.append(i + 1)
        at = max(at + rb, i + 2)
    return cuts


def test_a_reject_just_before_or_after_a_cut_keeps_its_file_and_line(tmp_path):
    good = [json.dumps(anthropic_wrapped(ts=1_700_000_000 + i)).encode() for i in range(6)]
    for bad in BAD_LINES:
        lines = good[:3] + [bad] + good[3:]
        log = tmp_path / "edge.jsonl"
        log.write_bytes(b"\n".join(lines) + b"\n")
        starts = [0]
        for x in lines:
            starts.append(starts[-1] + len(x) + 1)
        # a cut exactly before the bad line, exactly after it, and one byte either side
        for rb in {starts[3], starts[4], starts[3] - 1, starts[4] + 1}:
            want, got, units = both(tmp_path, [[str(log)]], rb, tag=f"{rb}")
            assert got == want and len(units) > 1
            assert [r[1:4] for r in got[1]["rejects"]] == [(str(log), 4, r[3]) for r in want[1]["rejects"]]


def test_a_file_whose_later_numbers_look_like_another_unit_is_read_in_the_files(tmp_path, monkeypatch):
    """The unit of numeric times is decided by the file's first number: a range whose
    own first number would guess another is read again in the file's unit."""
    from replay.readers import ingest as ingest_module

    again = []
    monkeypatch.setattr(ingest_module, "parse_range",
                        lambda r, *a, **kw: again.append(r) or parse_range(r, *a, **kw))
    lines = [json.dumps({"ts": t, "tokens": [1, 2, 3]}) for t in [2_000_000_000_000, 2_000_000_001_000]]
    lines += [json.dumps({"ts": 50_000_000_000 + i, "tokens": [4, i]}) for i in range(5)]  # (alone: seconds)
    lines = [json.dumps({"ts": "2025-01-01T00:00:00Z", "tokens": [9]})] + lines  # (ISO: no unit yet)
    log = write_jsonl(tmp_path / "units.jsonl", lines)
    want, got, _ = both(tmp_path, [[str(log)]], 1)
    assert got == want
    assert want[1]["sources"][0][7] == "ms"
    assert len(again) == 5  # (the ranges of the numbers in seconds' range)


def test_files_read_whole_are_not_cut(tmp_path):
    """Compressed files, whole documents, session files: one unit each, and the
    same rows; a mix with files that are cut, twice (nothing added the second time)."""
    d = mixed_logs(tmp_path / "logs")
    write_agent_jsonl(d / "session.jsonl", claude_transcript())
    rows = [anthropic_wrapped(ts=1_700_000_000 + i) for i in range(30)]
    write_jsonl(d / "big.jsonl.gz", rows, opener=gzip.open)
    want, got, units = both(tmp_path, [[str(d)], [str(d)]], 200)
    assert got == want
    whole = {u for u in units if isinstance(u, str)}
    assert {str(d / "big.jsonl.gz"), str(d / "session.jsonl"), str(d / "array.json")} <= whole
    assert any(isinstance(u, Range) for u in units)
    first, again = got[0]
    assert first.loaded > 100 and again.loaded == 0 and again.skipped_files == again.files
    for name in ("big.jsonl.gz", "session.jsonl", "array.json"):
        assert ranges(str(d / name), None, 1) is None


def test_the_same_content_under_a_new_path_adds_nothing(tmp_path):
    rng = random.Random(3)
    log = write_lines(tmp_path / "a.jsonl", messy_lines(3, tmp_path), rng)
    shutil.copy(log, tmp_path / "b.jsonl")
    grown = tmp_path / "grown.jsonl"
    grown.write_bytes(log.read_bytes() + b"\n" + json.dumps(anthropic_wrapped(ts=5)).encode() + b"\n")
    runs = [[str(log)], [str(tmp_path / "b.jsonl")], [str(log), str(grown)]]
    want, got, units = both(tmp_path, runs, 50)
    assert got == want
    assert got[0][1].loaded == 0 and got[0][1].skipped_files == 1
    assert any(isinstance(u, Known) and u.path == str(log) for u in units[len(units) // 2:])


def test_a_cut_file_is_hashed_by_the_engine_not_by_the_driver(tmp_path, monkeypatch):
    """A new file cut into ranges: its hash is a unit of its own, handed out just
    before its ranges, and the driver reads none of it; only a path already in
    `sources` is hashed by the driver (as the single process does: a known
    content is then not parsed at all)."""
    from replay.readers import ingest as ingest_module

    hashed = []
    keys = ingest_module.file_keys
    monkeypatch.setattr(ingest_module, "file_keys", lambda p: hashed.append(p) or keys(p))
    rng = random.Random(5)
    log = write_lines(tmp_path / "a.jsonl", messy_lines(5, tmp_path), rng)
    grown = tmp_path / "g.jsonl"
    grown.write_bytes(log.read_bytes() + b"\n" + json.dumps(anthropic_wrapped(ts=7)).encode() + b"\n")
    runs = [[str(log), str(grown)], [str(log)]]
    want = ingest_runs(tmp_path / "one.duckdb", runs)
    hashed.clear()
    engine = InProcess()
    assert ingest_runs(tmp_path / "units.duckdb", runs, engine=engine, range_bytes=40) == want
    units = engine.items
    first = units[:units.index(Known(str(log), tuple(keys(str(log)))))]
    for path in (str(log), str(grown)):
        mine = [u for u in first if getattr(u, "path", u) == path]
        assert mine[0] == Digest(path) and len(mine) > 2 and all(isinstance(u, Range) for u in mine[1:])
    assert hashed == [str(log)]  # (the second run: a path already in `sources`)


def test_a_cut_file_that_cannot_be_hashed_is_one_reject_and_no_source(tmp_path):
    """The file is gone when its hash unit runs: like a file the single process
    cannot hash, one `unreadable_file` reject (the same text), no `sources` row,
    nothing of its ranges kept; the next file is loaded as usual."""
    from replay.readers.files import describe_error
    from replay.readers.parsed import parse_unit

    rng = random.Random(8)
    gone = write_lines(tmp_path / "gone.jsonl", messy_lines(8, tmp_path), rng)
    kept = write_lines(tmp_path / "kept.jsonl", messy_lines(9, tmp_path), rng)
    content = gone.read_bytes()

    def parse(unit, *args):
        if isinstance(unit, Digest) and unit.path == str(gone) and gone.exists():
            gone.unlink()
        return parse_unit(unit, *args)

    con = db.connect(str(tmp_path / "units.duckdb"))
    engine = _Engine()
    s = ingest(con, [str(gone), str(kept)], engine=engine, parse=parse, range_bytes=60)
    dump = full_dump(con)
    con.close()
    try:
        open(gone)
    except OSError as e:
        why = describe_error(e)
    assert [r[1:] for r in dump["rejects"] if r[0] is None] == [(str(gone), None, "unreadable_file", why)]
    assert [r[1] for r in dump["sources"]] == [str(kept)]
    assert {r[1] for r in dump["requests"]} == {dump["sources"][0][0]} and s.loaded == len(dump["requests"])
    gone.write_bytes(content)
    want = ingest_runs(tmp_path / "one.duckdb", [[str(kept)]])
    assert s.loaded == want[0][0].loaded and s.rejected == want[0][0].rejected + 1
    assert any(isinstance(u, Digest) for u in engine.items)


def test_a_forced_format_and_fields_are_read_in_every_range(tmp_path):
    lines = [json.dumps({"when": 1_700_000_000 + i, "who": f"t{i % 3}", "tokens": [i, i + 1]}) for i in range(20)]
    log = write_jsonl(tmp_path / "f.jsonl", lines)
    kw = {"format": "tokens", "fields": {"timestamp": "when", "tenant": "who"}}
    want = ingest_runs(tmp_path / "one.duckdb", [[str(log)]], **kw)
    got = ingest_runs(tmp_path / "units.duckdb", [[str(log)]], engine=InProcess(), range_bytes=30, **kw)
    assert got == want and want[0][0].loaded == 20


@pytest.mark.parametrize("seed", [0, 1])
def test_gateway_exports_cut_into_ranges(tmp_path, seed):
    """OpenAI, OTLP (a line of many spans: units are not lines), LiteLLM, Langfuse
    pages as JSON Lines, and the bundled fixtures: the same rows by ranges."""
    from support.gateway_logs import langfuse_page, traffic, write_all

    d = tmp_path / "logs"
    write_all(d, seed=seed, sessions=3, turns=4)
    write_jsonl(d / "langfuse_pages.jsonl", [langfuse_page(traffic(seed + k, sessions=1, turns=3)) for k in range(3)])
    for rb in (1, 300, 5000):
        want, got, units = both(tmp_path, [[str(d)]], rb, tag=str(rb))
        assert got == want, rb
    cut = {u.path.rsplit("/", 1)[-1] for u in units if isinstance(u, Range)}
    assert {"openai.jsonl", "otel.jsonl", "litellm.jsonl", "langfuse_pages.jsonl"} <= cut
    assert {r[3] for r in want[1]["sources"]} >= {"openai", "otel", "litellm", "langfuse"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_parts_handed_to_the_encoder_are_the_single_process_s(tmp_path, seed):
    """``warm`` (the encoder process's hint) is handed the same new body parts by
    units as by the single process — ids, kinds and the texts' UTF-8 bytes, in the
    same order, each once — however the conversations' shared messages fall in
    ranges and files, with rejects beside them."""
    rng = random.Random(seed)
    d = tmp_path / "logs"
    d.mkdir()
    for k in range(2):  # (two files sharing conversations: the same parts in other partitions)
        write_lines(d / f"m{k}.jsonl", messy_lines(seed, tmp_path), rng)
    write_lines(d / "other.jsonl", messy_lines(seed + 1, tmp_path), rng)

    def handed(engine, range_bytes):
        got = []
        con = db.connect(str(tmp_path / f"w{len(list(tmp_path.iterdir()))}.duckdb"))
        ingest(con, [str(d)], engine=engine, range_bytes=range_bytes,
               warm=lambda parts: got.extend((b, k, t if isinstance(t, bytes) else t.encode("utf-8", "surrogatepass"))
                                             for b, k, t in parts))
        con.close()
        return got

    want = handed(None, 0)
    assert want and len({b for b, _, _ in want}) == len(want)
    for rb in (1, 200, 5000):
        assert handed(InProcess(), rb) == want, rb
