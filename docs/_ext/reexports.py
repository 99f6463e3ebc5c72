"""Resolve references to a re-exported name to the place it is documented.

``dask_ddp.submit`` is ``dask_ddp.dispatch.submit`` and ``dask_ddp.StallError`` is
``dask_ddp.errors.StallError``: docstrings use either spelling, and each object is
documented once, in the module that owns it. A reference Sphinx cannot find is imported;
when the object is one documented under another name, the reference points there.
Anything else stays unresolved (a warning under ``-n``).
"""

from __future__ import annotations

import importlib
from typing import Any

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util.nodes import make_refnode


def _import(dotted: str) -> Any:
    """The object a dotted name refers to (a module, or attributes of one); None if none."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                value = getattr(value, attr)
        except (AttributeError, ImportError):  # a lazy attribute whose module fails
            return None  # to import: autodoc reports that failure itself
        return value
    return None


def _documented(env: BuildEnvironment) -> dict[int, tuple[str, str, str]]:
    """id(object) -> (documented name, its page, its anchor) of every documented object."""
    cache: dict[int, tuple[str, str, str]] | None = getattr(env, "_reexports_cache", None)
    if cache is None:
        cache = {}
        for name, _disp, typ, docname, anchor, _prio in env.get_domain("py").get_objects():
            if typ in ("module", "method", "attribute", "property"):
                continue
            obj = _import(name)
            if obj is not None and id(obj) not in cache:
                cache[id(obj)] = (name, docname, anchor)
        env._reexports_cache = cache  # type: ignore[attr-defined]
    return cache


def resolve(app: Sphinx, env: BuildEnvironment, node: pending_xref,
            contnode: nodes.Element) -> nodes.Element | None:
    """Point a missing ``dask_ddp.*`` reference at the object's documented name."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("dask_ddp."):
        return None
    obj = _import(target)
    if obj is None:
        return None
    found = _documented(env).get(id(obj))
    if found is None:
        return None
    name, docname, anchor = found
    return make_refnode(app.builder, node["refdoc"], docname, anchor, contnode, name)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", resolve)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
