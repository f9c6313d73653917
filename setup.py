"""Builds the compiled trie (replay/_trie.pyx) and ingest's value hash
(replay/_jsonhash.pyx); everything else is in pyproject.toml.

The extensions are optional: where they cannot be compiled, the install goes on,
``replay.trie`` uses its Python implementation and ingest serializes values to
hash them (same answers, slower)."""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: the Python trie only
    ext_modules = []
else:
    ext_modules = cythonize([Extension("replay._trie", ["replay/_trie.pyx"], optional=True),
                              Extension("replay._jsonhash", ["replay/_jsonhash.pyx"], optional=True)],
                            compiler_directives={"language_level": 3}, quiet=True)

setup(ext_modules=ext_modules)
