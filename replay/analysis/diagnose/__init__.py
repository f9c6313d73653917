"""Why requests miss: an exact, additive split of every missed prompt token.

For one configuration (TTL τ, block B, minimum prefix m, stream mode, profile)
every request's prompt splits into parts that add up *exactly* to its length:

    prompt_tokens = hit + block_rounding + below_minimum + ttl_expired
                    + stream_split + premature + new_content

from the walks the replay already keeps (``replay.core.walks``):

* ``L_τ``   = deepest step of the request's walk in its cache with gap ≤ τ,
* ``L_∞``   = deepest step in its cache whatever the gap,
* ``L_g``   = deepest step in the ``global`` walk (every earlier request of the
  same model: no other model's cache can serve it),
* ``hit``   = floor(L_τ/B)·B, zeroed when < m (semantics.md);
* ``block_rounding`` = L_τ − floor(L_τ/B)·B; ``below_minimum`` = the floored hit
  when it is < m; ``ttl_expired`` = L_∞ − L_τ (with the idle gap that made the
  prefix go cold: the gap of the first walk step beyond τ); ``stream_split`` =
  L_g − L_∞ (the prefix lived in another tenant's / key's / session's stream);
* the unshared remainder ``prompt_tokens − L_g`` is split by looking at where the
  prompt diverged from its *closest earlier request* ``c``: ``premature`` tokens
  are those between the divergence point ``L_g`` and the start of the content
  that is genuinely new in this turn (the trailing run of messages that ``c``
  does not hold); everything else is ``new_content``.

The closest earlier request (of the same model) is searched among a small candidate set: the most
recent requests sharing the longest segment prefix (the ones realising ``L_g``),
the previous request of the same session, stream and user, and the latest
request whose conversation messages are the longest prefix of this one's. The
candidate that held the most of this request's content (largest new-content
start, then longest shared prefix, then same session/user, then most recent) is
``c``; its divergence point is classified by rules on the rendered pieces and
the request bodies (never on any ground-truth file):

``rotating_header``  the first differing line is a header line (``x-…:`` or
                     ``…-header:``), e.g. ``x-anthropic-billing-header: … cch=…``;
``tool_order``       same tool names, other order;
``json_key_order``   same JSON value, other key order / separators / escaping
                     (tool definitions, or any piece that parses as JSON);
``tool_schema_change`` same tool name, other definition (e.g. description);
``timestamp``        the differing bytes are part of a date / time / epoch;
``volatile_id``      … of a UUID, long hex id, prefixed id (``req_…``) or a long
                     random-looking token;
``per_user_data``    the same position differs and the two requests belong to
                     different users (``user_id``: Anthropic ``metadata.user_id``,
                     OpenAI ``user``, or a mapped field; else the tenant);
``history_rewrite``  an earlier message of the conversation was edited,
                     truncated or summarised;
``template_date``    (chat template tokenizations only, checked before the rules
                     above) a date/time the template prints changed: rendering
                     this request at ``c``'s time agrees with ``c`` beyond the
                     divergence, the logged system, tools and messages being equal
                     up to it;
``template_history_rewrite`` (idem) the template rendered the same logged history
                     differently (e.g. dropped earlier turns' reasoning): the
                     divergence falls in a message whose logged JSON, and all
                     before it, are identical in both bodies — not because of the time;
``other``            anything else before the new content.

Under a chat template (``--chat-template``) the bodies are rendered with that
template at each request's own time, so the command needs the template the
prompts were tokenized with (refused without it).

A divergence is *not* premature (its tokens are ``new_content``) when ``c``
held nothing of this request beyond the divergence point, when the two
requests are different conversations (different non-null sessions, for a
divergence inside the messages), or when the differing tools/system are not
similar at all (a different application).

Text is never shown unless asked: examples carry lengths, character classes
and short hashes of the differing bytes (``show_text=True`` shows them).

The modules: ``rules`` (naming a divergence), ``segments`` (requests as
segment lists, the candidate index), ``split`` (the per-request split),
``summary`` (``diagnose``, ``miss_parts``, the report section), ``diffview``.
"""

from replay.analysis.diagnose.diffview import diff_view
from replay.analysis.diagnose.rules import classify_pieces, mask
from replay.analysis.diagnose.split import CAUSES, PARTS
from replay.analysis.diagnose.summary import diagnose, format_text, miss_parts, why_miss_section

__all__ = ["CAUSES", "PARTS", "miss_parts", "diagnose", "diff_view", "why_miss_section", "format_text",
           "classify_pieces", "mask"]
