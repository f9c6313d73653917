"""The tokenize stage's rendering spread over processes (``tokenize_stage(workers=N)``).

A chunk's rendering — bodies rendered whole (``--render deepseek``, bodies not
stored as parts) and body parts the encoder process did not prepare — is
pure Python and holds one core; the encoder process's fastokens encodes a
chunk's new texts in a few milliseconds. So with ``workers`` N the chunk's
items are split N ways: N - 1 helper processes (``python -P -m
replay.text.render_pool``, this copy of the package) and the stage's own
process render a share each, at once, and give back each item's pieces with
their segment ids. The stage then goes on exactly as with one process (the
same ``NewSegments``, in item order), so the rows are the same: each new
unique text is still encoded once, by the tokenizer, when the chunk is stored.

A helper reads (rendering, items) batches until its end of the connection
closes, then exits; it ignores Ctrl-C (the stage closes it). A helper that
dies makes the chunk fail with :class:`WorkerFailed` before anything of the
chunk is written: the next ``prepare`` does it again.
"""

from __future__ import annotations

import signal
import socket
import sys
from multiprocessing.connection import Connection

from replay.store.jsontext import loads
from replay.text import child, renderers, segids
from replay.text.render import render_part

# an item: ("part", kind, JSON text) or ("body", format, JSON body or None, JSON output or None)
# its result: ("ok", pieces, seg ids, output pieces, output seg ids) or ("error", why)


class WorkerFailed(RuntimeError):
    """A rendering helper ended before answering."""


def render_items(render: str, items: list) -> list:
    """Each item's pieces and segment ids (module comment above), in order."""
    request, output = renderers.request_renderer(render), renderers.output_renderer(render)
    out = []
    for item in items:
        try:
            if item[0] == "part":
                pieces, opieces = render_part(item[1], loads(item[2])), None
            else:
                pieces = None if item[2] is None else request(loads(item[2]), item[1])
                o = None if item[3] is None else loads(item[3])
                opieces = None if o is None else output(o, item[1])
        except Exception as exc:  # noqa: BLE001 - the stage sets the request aside, with the reason
            out.append(("error", type(exc).__name__))
            continue
        out.append(("ok", pieces, _ids(pieces), opieces, _ids(opieces)))
    return out


def _ids(pieces: list | None) -> list | None:
    return None if pieces is None else [segids.piece_seg_id(p) for p in pieces]


class RenderPool:
    """``workers - 1`` helpers beside this process (module docstring); ``close`` stops them."""

    def __init__(self, workers: int):
        self.helpers: list[tuple] = []
        try:
            for _ in range(max(1, workers) - 1):
                mine, theirs = socket.socketpair()
                try:
                    proc = child.spawn("replay.text.render_pool", str(theirs.fileno()), pass_fds=(theirs.fileno(),))
                finally:
                    theirs.close()
                self.helpers.append((proc, Connection(mine.detach())))
        except BaseException:
            self.close()
            raise

    @property
    def size(self) -> int:
        return len(self.helpers) + 1

    def render(self, render: str, items: list) -> list:
        """:func:`render_items` of ``items``, split in contiguous shares over the
        helpers and this process."""
        if not self.helpers or len(items) < 2:
            return render_items(render, items)
        n = self.size
        bounds = [len(items) * k // n for k in range(n + 1)]
        sent = []
        for k, (proc, conn) in enumerate(self.helpers, start=1):
            share = items[bounds[k]:bounds[k + 1]]
            if share:
                self._call(k, proc, lambda: conn.send((render, share)))
                sent.append(k)
        out = render_items(render, items[:bounds[1]])  # this process's share, meanwhile
        for k in sent:
            proc, conn = self.helpers[k - 1]
            out.extend(self._call(k, proc, conn.recv))
        return out

    @staticmethod
    def _call(k: int, proc, fn):
        try:
            return fn()
        except (EOFError, OSError):
            code = proc.poll()
            raise WorkerFailed(
                f"tokenize: rendering helper {k} ended unexpectedly (exit code {code}); nothing of this "
                "chunk was stored, and the next prepare redoes it") from None

    def close(self) -> None:
        helpers, self.helpers = self.helpers, []
        for _, conn in helpers:
            conn.close()  # a helper reads its end of input, and leaves
        for proc, _ in helpers:
            child.stop(proc, timeout=2)

    def __enter__(self) -> "RenderPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _serve(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the stage stops its helpers itself)
    conn = Connection(fd)
    while True:
        try:
            render, items = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(render_items(render, items))


if __name__ == "__main__":
    try:
        _serve(int(sys.argv[1]))
    except (BrokenPipeError, ConnectionResetError):  # the stage left before an answer
        pass


def rendered_rows(pool: RenderPool, render: str, fmts: list, bodies: list, outputs: list, by_blobs,
                  ahead: dict | None) -> dict[int, tuple]:
    """Row → :func:`render_items` result of a chunk's rows the stage renders
    itself: the body (rows not stored as parts, with one) and the output; rows
    of pre-tokenized requests or rendered ahead are left out."""
    rows = [i for i, f in enumerate(fmts)
            if f != "tokens" and not (ahead and i in ahead) and (by_blobs[i] or bodies[i] is not None)]
    items = [("body", fmts[i], None if by_blobs[i] else bodies[i], outputs[i]) for i in rows]
    return dict(zip(rows, pool.render(render, items)))
