"""Lazy exports (PEP 562): a package imports a module the first time one of its names
is used, not when the package is imported.

`bastion` and `bastion.storage` export names from modules that pull in heavy things
(Ray, the S3 client, the log code). A program that only builds a topology must not
pay for them, so each package lists what it exports and from where, and gets a
module-level ``__getattr__`` and ``__dir__`` from `lazy_exports`. It lives in storage
because storage, the bottom layer, may import nothing above it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Iterable, Mapping


def lazy_exports(package: str, exports: Mapping[str, Iterable[str]],
                 submodules: Iterable[str] = ()
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each of its
    modules (relative name) to the names it exports; ``submodules`` are exported as
    modules. A loaded name is stored in the package, so the next lookup is plain."""
    module_of = {name: module for module, names in exports.items() for name in names}
    modules = frozenset(submodules)
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in modules:
            return importlib.import_module(f".{name}", package)  # sets the attribute too
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of) | modules)

    return __getattr__, __dir__
