"""The text pipeline's test helpers: request bodies and a small local tokenizer,
the tokenize stage's rows, a stand-in for the encoder process that renders a
chat template's requests ahead, and a template rendered in both environments."""

from __future__ import annotations

import json

import replay.api as rp
from replay.text import render_template
from replay.text.render import compact_json
from replay.text.template_ahead import RequestsAhead
from replay.text.tok import load_tokenizer
from replay.text.tokenize import tokenize_stage


def add_requests(con, rows: list[dict]) -> None:
    start = con.execute("SELECT coalesce(max(request_id), -1) + 1 FROM requests").fetchone()[0]
    for i, r in enumerate(rows):
        con.execute(
            "INSERT INTO requests (request_id, source_id, line_no, format, ts_us, tenant, body, output,"
            " tokens, output_tokens, block_ids) VALUES (?, 0, ?, ?, ?, 'default', ?, ?, ?, ?, ?)",
            [start + i, i + 1, r.get("format", "anthropic"), i * 1_000_000,
             None if r.get("body") is None else compact_json(r["body"]),
             None if r.get("output") is None else compact_json(r["output"]),
             r.get("tokens"), r.get("output_tokens"), r.get("block_ids")])


CODE = '''def f(x):\n    """doc"""\n\tif x  >= 10:  # tabs & spaces\n        return {"a": [1, 2]}\n\n\n'''


TOOLS_ANTHROPIC = [
    {"name": "bash", "description": "Run a shell command.\n",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                      "required": ["command"]}},
    {"name": "str_replace_editor", "input_schema": {"type": "object", "properties": {}},
     "description": "Edit files — ünïcödé", "cache_control": {"type": "ephemeral"}},
]


ANTHROPIC_BODIES = [
    {"model": "claude", "system": "You are a helpful assistant.", "messages": [
        {"role": "user", "content": "Hello!"}]},
    {"tools": TOOLS_ANTHROPIC,
     "system": [{"type": "text", "text": "  leading and trailing spaces  "},
                {"type": "text", "text": "\n\nsecond block\n", "cache_control": {"type": "ephemeral"}}],
     "messages": [
         {"role": "user", "content": [{"type": "text", "text": "fix this:\n" + CODE},
                                      {"type": "text", "text": "   "}]},
         {"role": "assistant", "content": [
             {"type": "thinking", "thinking": "Let me think…  ", "signature": "sig=="},
             {"type": "redacted_thinking", "data": "EuYBCkQYAiJA"},
             {"type": "text", "text": "I'll run it. "},
             {"type": "tool_use", "id": "toolu_1", "name": "bash",
              "input": {"command": "ls -la /tmp", "b": 1, "a": [None, True]}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "toolu_1",
              "content": "total 0\r\ndrwx  2 root\n\n", "cache_control": {"type": "ephemeral"}}]},
         {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "bash",
                                            "input": {}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "t2", "is_error": True,
              "content": [{"type": "text", "text": "err: 日本語テキスト 中文 😀🚀 "},
                          {"type": "text", "text": "\t\ttrailing tabs\t"}]},
             {"type": "text", "text": "literal marker text <think> and <｜User｜> inside"}]},
     ]},
    {"system": [], "messages": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": [{"type": "text", "text": "12345678901234 numbers 3.14159"}]},
        {"role": "user", "content": "Ελληνικά — русский — العربية — हिन्दी\u200b\u00a0nbsp"}]},
]


OPENAI_BODIES = [
    {"model": "gpt", "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What's 2+2?  "}]},
    {"tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "location": {"type": "string"}}}, "description": "Weather"}}],
     "messages": [
         {"role": "developer", "content": [{"type": "text", "text": "dev instructions\n"}]},
         {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"},
                                      {"type": "text", "text": " and in 東京"}]},
         {"role": "assistant", "content": None, "reasoning_content": "need tool",
          "tool_calls": [{"id": "call_1", "type": "function", "function": {
              "name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}},
              {"id": "call_2", "type": "function", "function": {
                  "name": "get_weather", "arguments": "{\"location\":\"東京\"}"}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny\n"},
         {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "rain"}]},
         {"role": "assistant", "content": "Paris: 18°C.\n\n```python\n" + CODE + "```"},
         {"role": "system", "content": "mid-conversation system note"},
         {"role": "user", "content": "thanks"}]},
]


def agent_bodies(turns: int) -> list[dict]:
    """A growing agent conversation: each request repeats the previous one plus a turn."""
    msgs: list[dict] = [{"role": "user", "content": "Please fix the bug in foo.py"}]
    out = []
    for k in range(turns):
        out.append({"tools": TOOLS_ANTHROPIC, "system": "You are an agent.",
                    "messages": json.loads(json.dumps(msgs))})
        msgs = msgs + [
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{k}", "name": "bash",
                                               "input": {"command": f"cat file{k}.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{k}",
                                          "content": CODE * (k + 1) + f"# file {k}\n"}]}]
    return out


def make_local_tokenizer(d):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders

    d.mkdir(parents=True, exist_ok=True)
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    corpus = [json.dumps(b, ensure_ascii=False) for b in ANTHROPIC_BODIES + OPENAI_BODIES] * 3
    t.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"], show_progress=False))
    t.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}))
    return d


CHUNK = 10  # requests per chunk of the stage: several chunks, each with its first row rendered here


class InProcess:
    """Stands in for the encoder process: what ingest hands over is kept, rendered
    ahead when the test says so, and taken as the stage asks."""

    def __init__(self, tok):
        tpl = tok.template
        self.ahead = RequestsAhead(tok._inline_engine(), (tpl.source, tpl.origin, tpl.specials), str(tok.path))
        self.handed: list = []
        tok.warm_requests = lambda blobs, requests: self.handed.append((list(blobs), list(requests)))
        tok.take_requests = self.ahead.take

    def render(self, keep=lambda rid: True) -> None:
        for blobs, requests in self.handed:
            self.ahead.add(blobs, [r for r in requests if keep(r[0])])


def rows(con):
    prompts = con.execute("SELECT request_id, n_tokens, seg_ids, seg_parts, output_seg_ids FROM prompts "
                          "ORDER BY request_id").fetchall()
    segments = con.execute("SELECT seg_id, tokens FROM segments ORDER BY seg_id").fetchall()
    aside = con.execute("SELECT request_id, reason FROM set_aside ORDER BY 1").fetchall()
    return prompts, segments, aside


def baseline(tmp_path, log, template):
    tok = load_tokenizer(template=template)
    con = rp.open_db(tmp_path / "here.duckdb")
    rp.ingest(con, [str(log)])
    tokenize_stage(con, tok, chunk_requests=CHUNK)
    got = rows(con)
    con.close()
    tok.close()
    return got


def both(source: str, wrap=lambda v: v, **variables):
    """(our compiled template's result, transformers' environment's result); each
    an output or ``("raised", exception type name)``. ``wrap`` changes our
    variables only (the objects rendering hands a template)."""
    from replay.text import template_env

    out = []
    for template, values in ((render_template.compile_template(source), {k: wrap(v) for k, v in variables.items()}),
                             (template_env.environment().from_string(source), variables)):
        try:
            out.append(template.render(**values))
        except Exception as exc:  # noqa: BLE001 - compared by type
            out.append(("raised", type(exc).__name__))
    return out
