# cython: language_level=3
"""Compiled twins of hot spots of rendering with a chat template
(``replay.text.render_template``, which falls back to its Python versions
when this extension is not built): the tracked message, the sandbox's item
lookup, and the gluing of pieces. Same behaviour, without a Python frame per
read or a bytecode loop per piece."""

cdef frozenset _CONTENT_KEYS = frozenset(("content", "tool_calls", "reasoning_content"))


cdef class Tracked(dict):
    """``render_template._Tracked`` compiled: a message that notes its reads in
    the window ``_w`` shared by all messages (``[last read, first read, last
    content-like read, several read]``), as message ``_index``."""
    cdef public object _index
    cdef public list _w

    cdef inline _note(self, key):
        cdef list w = self._w
        i = self._index
        w[0] = i
        first = w[1]
        if first is None:
            w[1] = i
        elif first != i:
            w[3] = True
        if key in _CONTENT_KEYS:
            w[2] = i

    def __getitem__(self, key):
        self._note(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._note(key)
        return dict.get(self, key, default)


def make_getitem(slow):
    """The sandbox's ``getitem`` (``slow``, bound to its environment) with a
    shortcut: a dict, tracked message, list, tuple or str is subscribed at
    once, and only a failed lookup goes to ``slow`` (which subscribes it again:
    for these types a lookup has no effect beyond the read a tracked message
    notes, which noting twice leaves the same)."""
    def getitem(obj, argument):
        t = type(obj)
        if t is Tracked or t is dict or t is list or t is tuple or t is str:
            try:
                return obj[argument]
            except (TypeError, LookupError):
                pass
        return slow(obj, argument)
    return getitem


def glued(list pieces, list of, cut_at, dict memo, list chars, Py_ssize_t max_chars):
    """``render_template._glued`` (see there), the glued texts remembered in
    ``memo`` (their pieces → the text) while ``chars[0]`` stays under ``max_chars``."""
    cdef Py_ssize_t n = len(pieces), i = 0, j
    cdef list out = []
    while i < n:
        p = pieces[i]
        part = of[i]
        if p in cut_at:
            j = i + 1
            while j < n and of[j] == part and pieces[j] in cut_at:
                j += 1
            if j < n and of[j] == part:
                j += 1
            if j - i > 1:
                key = tuple(pieces[i:j])
                text = memo.get(key)
                if text is None:
                    if chars[0] > max_chars:
                        memo.clear()
                        chars[0] = 0
                    text = "".join(key)
                    memo[key] = text
                    chars[0] += len(text)
                out.append(("text", text, part))
                i = j
                continue
        out.append(("text", p, part))
        i += 1
    return out
