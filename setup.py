"""Builds the compiled trie (replay/_trie.pyx); everything else is in pyproject.toml.

The extension is optional: where it cannot be compiled, the install goes on and
``replay.trie`` uses its Python implementation (same answers, slower)."""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: the Python trie only
    ext_modules = []
else:
    ext_modules = cythonize([Extension("replay._trie", ["replay/_trie.pyx"], optional=True)],
                            compiler_directives={"language_level": 3}, quiet=True)

setup(ext_modules=ext_modules)
