"""PEP 562 lazy attributes for the package's facades (internal).

A facade module lists where each public name lives; the name's module is imported the
first time the name is read. A rank process so imports only what it uses: ``report()``
needs the results channel's writer, not the launcher (distributed, tornado, cloudpickle).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def attribute_loader(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports a public name's module on first use.

    ``where`` maps each name to ``"module:attribute"``, or to ``"module"`` for a
    submodule; a module path starting with a dot is relative to ``package``. The value is
    then set on the package, so Python asks again only for names never read.
    """

    def __getattr__(name: str) -> Any:
        target = where.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, _, attribute = target.partition(":")
        value: Any = importlib.import_module(module_name, package)
        if attribute:
            value = getattr(value, attribute)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
