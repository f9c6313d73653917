"""The tokenize stage's own check of a chat template's cuts (``tokenize.check_cuts``)."""

from __future__ import annotations

import json

import pytest

from replay import api
from replay.text import render_template
from replay.text.tokenize import check_cuts

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<｜User｜>{{ m.role }}: {{ m.content }}{{ eos_token }}"
            "{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}")


def _log(path, n=6):
    with open(path, "w") as f:
        for i in range(n):
            msgs = [{"role": "user" if k % 2 == 0 else "assistant", "content": f"turn {k} hello world"}
                    for k in range(i + 1)]
            f.write(json.dumps({"timestamp": 1_700_000_000 + i, "model": "m",
                                "request": {"model": "m", "messages": msgs}}) + "\n")


def test_cuts_at_added_tokens_pass_the_check(tmp_path):
    tpl = tmp_path / "t.jinja"
    tpl.write_text(TEMPLATE)
    tok = api.load_tokenizer(None, template=str(tpl), backend="tokenizers")
    try:
        pieces = tok.render_request({"messages": [{"role": "user", "content": "hi there"}]}, "openai", 0)
        assert len(pieces) > 2
        check_cuts(tok, 1, pieces)  # no error
    finally:
        tok.close()


def test_a_cut_inside_a_word_stops_the_stage(tmp_path, monkeypatch):
    tpl = tmp_path / "t.jinja"
    tpl.write_text(TEMPLATE)
    _log(tmp_path / "log.jsonl")
    real = render_template.Splitter.pieces

    def bad_pieces(self, text):  # also cut every piece in the middle: a merge now crosses a cut
        out = []
        for s, piece in real(self, text):
            mid = len(piece) // 2
            out.extend([(s, piece[:mid]), (s + mid, piece[mid:])] if len(piece) > 4 else [(s, piece)])
        return out

    monkeypatch.setattr(render_template.Splitter, "pieces", bad_pieces)
    con = api.open_db(str(tmp_path / "db.duckdb"))
    api.ingest(con, [str(tmp_path / "log.jsonl")])
    with pytest.raises(RuntimeError, match="REPLAY_TEMPLATE_WHOLE_TEXT"):
        api.tokenize(con, api.tokenizer_spec(None, None, str(tpl)))
    monkeypatch.undo()
    monkeypatch.setenv(render_template.WHOLE_TEXT_ENV, "1")  # the way out the error names
    api.tokenize(con, api.tokenizer_spec(None, None, str(tpl)))
    n_segs = con.execute("SELECT max(len(seg_ids)) FROM prompts").fetchone()[0]
    assert n_segs == 1  # whole texts
