"""The last validation in the database and its section of `replay report`.

:func:`store_result` keeps the result of :func:`replay.validate.check.validate`
in the database's meta table; :func:`validation_section` turns it into the
report's markdown, with a verdict and a scatter plot of predicted against
measured cached tokens and times.
"""

from __future__ import annotations

import json
from pathlib import Path

from replay.store import db


def store_result(con, res: dict) -> None:
    """Keep the last validation in the database so `replay report` can show it."""
    db.set_meta(con, "validation", json.dumps(res, default=float))


def load_result(con) -> dict | None:
    raw = db.get_meta(con, "validation")
    return json.loads(raw) if raw else None


def verdict(res: dict) -> str:
    if res.get("error") and not res.get("requests"):
        return f"not validated: {res['error']}"
    exact, err = res.get("cached_exact_share"), res.get("time_median_abs_err")
    parts = []
    if exact is not None:
        parts.append(("the cache prediction holds" if exact >= 0.99 else "the cache prediction is off")
                     + f" ({100 * exact:.1f} % of requests exact)")
    if err is not None:
        parts.append(("the prefill-time model holds" if err <= 0.10 else "the prefill-time model is off")
                     + f" (held-out median error {100 * err:.1f} %)")
    return "; ".join(parts) + ("" if not res.get("error") else f"; partial run: {res['error']}")


def validation_section(con, out_dir) -> str:
    """Markdown + a scatter plot: predicted against measured cached tokens and times."""
    res = load_result(con)
    if not res:
        return ("## Validation against a real engine\n\nNot run for this database: "
                "`replay validate --sample 40` replays a sample through mlx-lm's server "
                "(needs the `mlx` extra).\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = [r for r in res.get("per_request") or [] if r.get("cached_reported") is not None]
    img = ""
    if per:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
        pc = [r["cached_predicted"] for r in per]
        rc = [r["cached_reported"] for r in per]
        axes[0].scatter(pc, rc, s=12)
        hi = max(pc + rc + [1])
        axes[0].plot([0, hi], [0, hi], color="grey", lw=0.8)
        axes[0].set_xlabel("predicted cached tokens (mlx-lm profile)")
        axes[0].set_ylabel("reported cached tokens")
        tp = [(r.get("time_predicted_s"), r.get("time_s")) for r in per
              if r.get("time_predicted_s") is not None and r.get("time_s") is not None]
        if tp:
            x, y = zip(*tp)
            axes[1].scatter(x, y, s=12)
            m = max(x + y)
            axes[1].plot([0, m], [0, m], color="grey", lw=0.8)
        axes[1].set_xlabel("predicted prefill time (s)")
        axes[1].set_ylabel("measured time to first token (s)")
        fig.tight_layout()
        fig.savefig(Path(out_dir) / "validation.png", dpi=110)
        plt.close(fig)
        img = "![validation](validation.png)\n"
    fit = res.get("fit") or {}
    lines = ["## Validation against a real engine", "",
             f"**Verdict: {verdict(res)}.**", "",
             f"Model: `{res.get('model')}` ({res.get('model_kind')}); {res.get('requests')} requests sampled "
             f"as whole streams, replayed in time order with `max_tokens=1`; "
             f"prompt cache size {res.get('prompt_cache_size')}.", ""]
    if res.get("requests"):
        lines += [
            f"- Cached tokens: predicted {res['cached_predicted_tokens']:,}, reported "
            f"{res['cached_reported_tokens']:,}; exact for {res['cached_exact']} of {res['requests']} requests.",
            f"- Server prompt tokens equal replay's for {100 * res['prompt_tokens_match']:.1f} % of requests.",
            f"- Ideal ceiling (unbounded cache) for the same sample: {res['ideal_ceiling_tokens']:,} tokens — "
            "what the engine's small cache leaves on the table is the difference.",
        ]
        if fit:
            lines.append(f"- Prefill time ≈ {fit['a']:.3f} s + {fit['b']:.2e} s·uncached + "
                         f"{fit['c']:.2e} s·attention work (fitted on half, checked on the other half: median "
                         f"error {100 * (res.get('time_median_abs_err') or 0):.1f} %). "
                         f"{fit.get('belongs_to', 'The coefficients belong to this model on this machine.')}")
        if res.get("saved_s_measured") is not None:
            lines.append(f"- Prefill seconds saved by the cache: predicted {res['saved_s_predicted']:.1f} s, "
                         f"measured {res['saved_s_measured']:.1f} s.")
    return "\n".join(lines + ["", img])
