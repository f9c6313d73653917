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
