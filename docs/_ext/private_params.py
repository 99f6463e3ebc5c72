"""Leave a signature's internal parameters off the API pages.

A parameter whose name starts with an underscore is the package's own (e.g.
``ImageList``'s ``_manifest``, which only ``ImageList.from_csv`` passes): the pages show
the signature a user calls.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx


def _top_level(params: str) -> list[str]:
    """``params`` split at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(params):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(params[start:i])
            start = i + 1
    parts.append(params[start:])
    return parts


def public_signature(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                     signature: str | None, return_annotation: str | None
                     ) -> tuple[str | None, str | None] | None:
    """The signature without its parameters named ``_...``."""
    if not signature or not signature.startswith("(") or not signature.endswith(")"):
        return None
    parts = _top_level(signature[1:-1])
    kept = [p for p in parts if not p.strip().startswith("_")]
    if len(kept) == len(parts):
        return None
    if kept and kept[-1].strip() == "*":  # only internal keyword-only parameters
        kept.pop()
    return "(" + ",".join(kept).lstrip() + ")", return_annotation


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("autodoc-process-signature", public_signature)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
