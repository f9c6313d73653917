"""DuckDB table definitions shared by every stage (see docs/architecture.md)."""

from __future__ import annotations

TABLES: dict[str, str] = {
    "sources": """
        CREATE TABLE IF NOT EXISTS sources (
            source_id BIGINT PRIMARY KEY,
            path VARCHAR NOT NULL,
            sha256 VARCHAR NOT NULL,
            format VARCHAR,
            lines BIGINT,
            loaded BIGINT,
            rejected BIGINT,
            time_unit VARCHAR,          -- the unit its numeric timestamps were read in (s, ms, us)
            ingested_at TIMESTAMP DEFAULT current_timestamp
        )""",
    "requests": """
        CREATE TABLE IF NOT EXISTS requests (
            request_id BIGINT PRIMARY KEY,
            source_id BIGINT NOT NULL,
            line_no BIGINT NOT NULL,
            format VARCHAR NOT NULL,
            ts_us BIGINT NOT NULL,      -- microseconds, epoch or relative (replay.times)
            tenant VARCHAR NOT NULL,
            prompt_cache_key VARCHAR,
            session VARCHAR,
            user_id VARCHAR,
            model VARCHAR,
            body VARCHAR,
            output VARCHAR,
            tokens INTEGER[],
            output_tokens INTEGER[],
            block_ids BIGINT[],
            input_length BIGINT,
            output_length BIGINT,
            usage_prompt_tokens BIGINT,
            usage_cached_tokens BIGINT,
            usage_cache_write_tokens BIGINT,
            usage_output_tokens BIGINT,
            body_blobs UBIGINT[]
        )""",
    "blobs": """
        CREATE TABLE IF NOT EXISTS blobs (
            blob_id UBIGINT NOT NULL,  -- unique by construction; no index (memory)
            kind VARCHAR NOT NULL,
            text VARCHAR NOT NULL,
            first_request BIGINT       -- the first request holding it, so a chunk of requests finds
                                       -- its new blobs by a range (zone maps), not a scan of them all
        )""",
    "rejects": """
        CREATE TABLE IF NOT EXISTS rejects (
            source_id BIGINT,
            path VARCHAR NOT NULL,
            line_no BIGINT,
            reason VARCHAR NOT NULL,
            detail VARCHAR
        )""",
    "segments": """
        CREATE TABLE IF NOT EXISTS segments (
            seg_id UBIGINT NOT NULL,  -- unique by construction; no index (memory)
            n_tokens INTEGER NOT NULL,
            tokens INTEGER[] NOT NULL
        )""",
    "prompts": """
        CREATE TABLE IF NOT EXISTS prompts (
            request_id BIGINT PRIMARY KEY,
            n_tokens BIGINT NOT NULL,
            seg_ids UBIGINT[] NOT NULL,
            seg_parts INTEGER[] NOT NULL,
            output_seg_ids UBIGINT[],
            output_n_tokens BIGINT
        )""",
    "meta": """
        CREATE TABLE IF NOT EXISTS meta (
            key VARCHAR PRIMARY KEY,
            value VARCHAR
        )""",
    "walks": """
        CREATE TABLE IF NOT EXISTS walks (
            variant VARCHAR NOT NULL,
            mode VARCHAR NOT NULL,
            request_id BIGINT NOT NULL,
            stream VARCHAR NOT NULL,
            model VARCHAR,              -- with stream, the cache the request could hit
            ts_us BIGINT NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            gaps BIGINT[] NOT NULL,     -- microseconds
            depths BIGINT[] NOT NULL,
            origins TINYINT[]           -- each step's origin (replay.core.streams.ORIGINS)
        )""",
    "walk_sets": """
        CREATE TABLE IF NOT EXISTS walk_sets (
            variant VARCHAR NOT NULL,
            mode VARCHAR NOT NULL,
            horizon_us BIGINT NOT NULL,  -- exact for every TTL up to this (replay.times.INF_US: all)
            fingerprint VARCHAR NOT NULL,  -- of the requests and prompts it was replayed from
            requests BIGINT NOT NULL,
            PRIMARY KEY (variant, mode)
        )""",
    "set_aside": """
        CREATE TABLE IF NOT EXISTS set_aside (
            request_id BIGINT PRIMARY KEY,  -- loaded, but left out of the replay
            stage VARCHAR NOT NULL,
            reason VARCHAR NOT NULL,
            detail VARCHAR,
            tokenizer VARCHAR            -- the tokenizer (and rendering) that could not take it
        )""",
    "results": """
        CREATE TABLE IF NOT EXISTS results (
            profile VARCHAR NOT NULL,
            stream VARCHAR NOT NULL,
            ttl_s DOUBLE,
            block BIGINT NOT NULL,
            min_prefix BIGINT NOT NULL,
            requests BIGINT NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            hit_tokens BIGINT NOT NULL,
            hit_ratio DOUBLE NOT NULL,
            requests_hit BIGINT NOT NULL
        )""",
}


# A request's body as compact JSON, whichever way ingest stored it: inline in
# `requests.body`, or as content-addressed `blobs` listed in `requests.body_blobs`
# (concatenating their texts in order gives exactly the inline text). One row per
# request; NULL for formats without a body (tokens, mooncake). Readers of bodies
# use this view, never `requests.body` directly.
REQUEST_BODIES_VIEW = """
    CREATE OR REPLACE VIEW request_bodies AS
    SELECT request_id, body FROM requests WHERE body IS NOT NULL OR body_blobs IS NULL
    UNION ALL
    SELECT e.request_id, string_agg(b.text, '' ORDER BY e.i) AS body
    FROM (SELECT request_id, unnest(body_blobs) AS blob_id,
                 unnest(generate_series(1, len(body_blobs))) AS i
          FROM requests WHERE body IS NULL AND body_blobs IS NOT NULL) e
    JOIN blobs b USING (blob_id)
    GROUP BY e.request_id"""


SCHEMA_VERSION = "2"  # 2: times as integer microseconds, walk sets, streams split by model

# Columns added within layout 2, each by an idempotent statement: a database
# written before them keeps working (its rows read as NULL there).
MIGRATIONS = (
    # block traces: the token length of each id of `block_ids`; NULL = Mooncake's
    # rule (512-token blocks, the last one the rest of `input_length`). Tokens
    # beyond the blocks' sum are prompt tokens that never hit.
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS block_lengths INTEGER[]",
    # the provider's own verdict on a request's cache use, where the log holds it
    # (replay.readers.diagnostics): `<provider>:<reason>` (e.g. anthropic:tools_changed,
    # openai:cache_hit) and the input tokens it says were missed after the divergence
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS diag_reason VARCHAR",
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS diag_missed_tokens BIGINT",
    # the time order of a file's loaded units as they came (replay.readers.timeorder):
    # sorted, jittered, reversed or shuffled; NULL for files ingested before it, or
    # whose bytes could not be read
    "ALTER TABLE sources ADD COLUMN IF NOT EXISTS time_order VARCHAR",
    # derived data: each walk step's origin (who last wrote that part of the prefix,
    # docs/origin.md). Walk sets replayed before it have none; they are stale
    # (replay.store.walksets.WALKS_LAYOUT is part of their fingerprint) and
    # `prepare` replays them.
    "ALTER TABLE walks ADD COLUMN IF NOT EXISTS origins TINYINT[]",
    # coding agents' session files (readers.claude_code, readers.codex): lines that are
    # context, not requests (lines = loaded + context + rejected; NULL = 0 before it);
    # the client that wrote the log, the identity of the prompt part the log does not
    # hold (its length is inferred from usage: providers.hidden), the serving backend a
    # gateway names (OpenRouter's `provider`), and Anthropic's 1-hour cache writes
    "ALTER TABLE sources ADD COLUMN IF NOT EXISTS context BIGINT",
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS client VARCHAR",
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS hidden_key VARCHAR",
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS backend VARCHAR",
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS usage_write_1h_tokens BIGINT",
)


class OldDatabase(RuntimeError):
    """A database file written by an earlier version of the tables."""


def create_all(con) -> None:
    """Create every table; refuse a database whose tables are of an earlier version."""
    old = con.execute("""SELECT count(*) FROM information_schema.columns
                         WHERE table_name = 'requests' AND column_name = 'ts'""").fetchone()[0]
    if old:
        raise OldDatabase("this database was written by an earlier version of replay (times in float "
                          "seconds); start a new one (replay run --fresh, or another --db) and ingest again")
    has_meta = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'meta'").fetchone()[0]
    version = con.execute("SELECT max(value) FROM meta WHERE key = 'schema_version'").fetchone()[0] \
        if has_meta else None
    if version is not None and version != SCHEMA_VERSION:
        # refused before anything is written: the file stays as it was
        raise OldDatabase(f"this database has tables of layout {version}, and this replay reads layout "
                          f"{SCHEMA_VERSION}; use the replay that wrote it, or start a new one (replay run "
                          "--fresh, or another --db) and ingest again")
    for ddl in TABLES.values():
        con.execute(ddl)
    for ddl in MIGRATIONS:
        con.execute(ddl)
    con.execute(REQUEST_BODIES_VIEW)
    con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])
