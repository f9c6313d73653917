# cython: language_level=3
"""Compiled twins of hot spots of rendering with a chat template
(``replay.text.render_template``, which falls back to its Python versions
when this extension is not built): the tracked message, the item and
attribute lookups, a namespace's assignment, the remembered ``tojson``, and
the gluing of pieces. Same behaviour, without a Python frame per read or a
bytecode loop per piece."""

from cpython.object cimport PyObject_GenericGetAttr

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


def make_getattr(frozenset dict_names, frozenset read_names, tuple namespaces, tuple plain, undefined, slow):
    """``render_template._fast_compiled``'s ``getattr_`` (see there)."""
    def getattr_(obj, attribute):
        t = type(obj)
        if t is dict or t is Tracked:
            if attribute not in (dict_names if t is dict else read_names):
                try:
                    return obj[attribute]
                except KeyError:
                    return undefined(obj=obj, name=attribute)
        elif t in namespaces and attribute[:1] != "_":
            attrs = PyObject_GenericGetAttr(obj, "_Namespace__attrs")
            if attribute in attrs:
                value = attrs[attribute]
                if type(value) in plain:
                    return value
        return slow(obj, attribute)
    return getattr_


def make_ns_setitem(check_name):
    """``FastNamespace.__setitem__`` (``render_template._fast_compiled``)."""
    def __setitem__(self, name, value):
        if type(name) is not str or name[:1] == "_":
            check_name(name)
        PyObject_GenericGetAttr(self, "_Namespace__attrs")[name] = value
    return __setitem__


def make_tojson(tojson, list frozen, dict memo, Py_ssize_t max_entries):
    """``render_template._fast_compiled``'s ``tojson_`` (see there)."""
    def tojson_(x, *args, **kwargs):
        t = type(x)
        if not frozen[0] or args or kwargs or not (t is dict or t is list):
            return tojson(x, *args, **kwargs)
        hit = memo.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        out = tojson(x)
        if len(memo) >= max_entries:
            memo.clear()
        memo[id(x)] = (x, out)
        return out
    return tojson_


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
