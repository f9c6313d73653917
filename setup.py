"""Builds the compiled trie (replay/core/_trie.pyx), ingest's value hash
(replay/readers/_jsonhash.pyx), the sweep's counts (replay/core/_hits.pyx)
and the capacity pass (replay/core/_capacity.pyx); everything else is in
pyproject.toml.

The extensions are optional: where they cannot be compiled, the install goes on,
``replay.trie`` uses its Python implementation, ingest serializes values to
hash them, and the sweep and capacity pass count in Python and numpy (same
answers, slower)."""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: the Python trie only
    ext_modules = []
else:
    ext_modules = cythonize([Extension("replay.core._trie", ["replay/core/_trie.pyx"], optional=True),
                              Extension("replay.readers._jsonhash", ["replay/readers/_jsonhash.pyx"], optional=True),
                              Extension("replay.core._hits", ["replay/core/_hits.pyx"], optional=True),
                              Extension("replay.core._capacity", ["replay/core/_capacity.pyx"], optional=True)],
                            compiler_directives={"language_level": 3}, quiet=True)

setup(ext_modules=ext_modules)
