"""Builds the C column kernels of the keyed exchange (`bastion/runtime/_columns.c`), the
log writer's record framing (`bastion/storage/_logframe.c`) and the packed runs of a
CEC burst (`bastion/runtime/_durable.c`). The rest of the package is described in
pyproject.toml. All three extensions are optional: a machine without a C compiler
installs Bastion with the pure-Python loops of `bastion.runtime.columns`,
`bastion.storage.log` and `bastion.runtime.durable` instead (slower per exchanged or
logged record, same results)."""

from setuptools import Extension, setup

# the headers the runtime kernels include (rebuilt when they change, shipped with them)
_COMPACT_LONG = ["bastion/runtime/_compact_long.h"]
_INT_COLUMN = ["bastion/runtime/_int_column.h"]

setup(ext_modules=[Extension("bastion.runtime._columns", ["bastion/runtime/_columns.c"],
                             depends=_COMPACT_LONG + _INT_COLUMN, optional=True),
                   Extension("bastion.storage._logframe", ["bastion/storage/_logframe.c"],
                             optional=True),
                   Extension("bastion.runtime._durable", ["bastion/runtime/_durable.c"],
                             depends=_COMPACT_LONG, optional=True)])
