"""Builds the C column kernels of the keyed exchange (`bastion/runtime/_columns.c`).
The rest of the package is described in pyproject.toml. The extension is optional: a
machine without a C compiler installs Bastion with the pure-Python kernels of
`bastion.runtime.columns` instead (slower per exchanged record, same results)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("bastion.runtime._columns", ["bastion/runtime/_columns.c"],
                             optional=True)])
