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
            ingested_at TIMESTAMP DEFAULT current_timestamp
        )""",
    "requests": """
        CREATE TABLE IF NOT EXISTS requests (
            request_id BIGINT PRIMARY KEY,
            source_id BIGINT NOT NULL,
            line_no BIGINT NOT NULL,
            format VARCHAR NOT NULL,
            ts DOUBLE NOT NULL,
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
            ts DOUBLE NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            gaps DOUBLE[] NOT NULL,
            depths BIGINT[] NOT NULL
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


def create_all(con) -> None:
    for ddl in TABLES.values():
        con.execute(ddl)
    # additive migration of databases made before body blobs existed
    con.execute("ALTER TABLE requests ADD COLUMN IF NOT EXISTS body_blobs UBIGINT[]")
    con.execute("ALTER TABLE blobs ADD COLUMN IF NOT EXISTS first_request BIGINT")
    con.execute(REQUEST_BODIES_VIEW)
