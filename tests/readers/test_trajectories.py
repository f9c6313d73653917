"""Real agent sessions against the DeepSeek API: the prediction against the provider's own counts.

The trajectories in ``../shared/data/mini-swe-agent-deepseek`` carry DeepSeek's
``prompt_cache_hit_tokens`` for every request. Under the ``deepseek`` profile
(64-token units, prompt + output cached, one cache per account and model) the
predicted hit ratio must come within 2 points of the realised one, overall and
for each model. Each side is a ratio in its own tokenization (ours renders with
the neutral template, so our prompts are a few per cent shorter).
"""

import math

import pytest

from replay import api


@pytest.fixture(scope="module")
def deepseek_sweep(shared_data, tmp_path_factory):
    path = shared_data / "mini-swe-agent-deepseek"
    if not path.exists():
        pytest.skip(f"no trajectories at {path}")
    con = api.open_db(tmp_path_factory.mktemp("traj") / "t.duckdb")
    summary = api.ingest(con, [str(path)], format="trajectory")
    assert summary.loaded > 4000 and summary.reconciles()
    grid = api.Grid(ttls=(math.inf,), blocks=(64,), min_prefixes=(64,), streams=("global",))
    return (api.profile_sweep(con, ["deepseek"], grid).to_dicts(),
            api.profile_sweep(con, ["deepseek"], grid, by_stream=True).to_dicts())


def test_the_deepseek_prediction_is_within_two_points_of_the_realised_ratio(deepseek_sweep):
    overall, per_model = deepseek_sweep
    (row,) = overall
    assert row["realized_requests"] == row["requests"]
    assert abs(row["hit_ratio"] - row["realized_hit_ratio"]) <= 0.02, row
    assert {r["model"] for r in per_model} == {"deepseek-chat", "deepseek-reasoner"}
    for r in per_model:
        assert abs(r["hit_ratio"] - r["realized_hit_ratio"]) <= 0.02, r


# --------------------------------------------------------------------------- --render deepseek

RUNS = ("deepseek_chat_dev", "deepseek_lite_dev_noparallel", "deepseek_reasoner_dev")


@pytest.fixture(scope="module")
def deepseek_rendered(shared_data, tmp_path_factory):
    """The three runs rendered with DeepSeek's encoding: the sweep, and the
    rendered against the provider's prompt tokens per run folder."""
    from replay.providers.economics import fidelity

    path = shared_data / "mini-swe-agent-deepseek"
    if not path.exists():
        pytest.skip(f"no trajectories at {path}")
    con = api.open_db(tmp_path_factory.mktemp("traj-ds") / "t.duckdb")
    api.ingest(con, [str(path)], format="trajectory")
    spec = api.tokenizer_spec(None, "deepseek")
    grid = api.Grid(ttls=(math.inf,), blocks=(64,), min_prefixes=(64,), streams=("global",))
    overall = api.profile_sweep(con, ["deepseek"], grid, tokenizer=spec).to_dicts()
    per_model = api.profile_sweep(con, ["deepseek"], grid, by_stream=True, tokenizer=spec).to_dicts()
    run_of = dict(con.execute("SELECT r.request_id, s.path FROM requests r JOIN sources s USING (source_id)")
                  .fetchall())
    fid = fidelity(con).to_dicts()
    by_run = {run: [f for f in fid if f"/{run}/" in run_of[f["request_id"]]] for run in RUNS}
    return overall, per_model, by_run


@pytest.mark.parametrize("run", RUNS)
def test_deepseek_rendering_matches_the_providers_prompt_tokens(deepseek_rendered, run):
    _, _, by_run = deepseek_rendered
    rows = by_run[run]
    assert len(rows) > 500
    rendered = sum(r["rendered_tokens"] for r in rows)
    provider = sum(r["provider_tokens"] for r in rows)
    assert abs(rendered / provider - 1) <= 0.02, (rendered, provider)
    rel = sorted(r["rel_diff"] for r in rows)
    assert abs(rel[len(rel) // 2]) <= 0.02
    # measured: exact to the token on 99 % of the requests (one message of one session is one token over)
    assert sum(r["diff"] == 0 for r in rows) >= 0.95 * len(rows)


def test_deepseek_rendering_keeps_the_prediction_within_two_points(deepseek_rendered):
    overall, per_model, _ = deepseek_rendered
    (row,) = overall
    assert abs(row["hit_ratio"] - row["realized_hit_ratio"]) <= 0.02, row
    for r in per_model:
        assert abs(r["hit_ratio"] - r["realized_hit_ratio"]) <= 0.02, r
