"""PEP 562 lazy attributes for the package's facades (internal).

A facade module lists where each public name lives; the name's module is imported the
first time the name is read. A rank process so imports only what it uses: ``report()``
needs the results channel's writer, not the launcher (distributed, tornado, cloudpickle).
Its ``__dir__`` lists ``__all__``, so ``dir()`` and tab completion in a REPL or notebook
offer the public names (not the facade's own imports), none of them imported.
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


def public_dir(package: str) -> Callable[[], list[str]]:
    """A module ``__dir__``: the names of the module's ``__all__`` and its dunders
    (``__version__``, ``__doc__``...), sorted; read when called, so ``__all__`` may be
    set after this."""

    def __dir__() -> list[str]:
        module = sys.modules[package]
        dunders = {n for n in vars(module) if n.startswith("__") and n.endswith("__")}
        return sorted(set(getattr(module, "__all__", ())) | dunders)

    return __dir__
