"""Builds the compiled parts: the trie, the replay's prompt assembly and hit
origins (replay/core/_trie.pyx), ingest's value hash
(replay/readers/_jsonhash.pyx), the hit kernel (replay/core/_hits.pyx) and the
capacity pass (replay/core/_capacity.pyx); everything else is in pyproject.toml.

They are required: an install needs a C compiler (Cython comes from
pyproject.toml's build requirements), and fails without one rather than leave
the trie or the hit kernel missing."""

from Cython.Build import cythonize
from setuptools import Extension, setup

EXTENSIONS = [("replay.core._trie", "replay/core/_trie.pyx"),
              ("replay.readers._jsonhash", "replay/readers/_jsonhash.pyx"),
              ("replay.core._hits", "replay/core/_hits.pyx"),
              ("replay.core._capacity", "replay/core/_capacity.pyx")]

setup(ext_modules=cythonize([Extension(name, [src]) for name, src in EXTENSIONS],
                            compiler_directives={"language_level": 3}, quiet=True))
