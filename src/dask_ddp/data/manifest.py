"""Manifests: CSV/TSV files listing image keys and labels, read through any store.

:meth:`dask_ddp.data.ImageList.from_csv` is the public face; this module parses the
file and checks each key stays under the dataset root, with errors naming the manifest
URL and the line. :func:`checked_samples` checks the keys and labels an ``ImageList`` is
given directly the same way.
"""

from __future__ import annotations

import csv
import io
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dask_ddp import storage

__all__ = ["Manifest", "Root", "checked_samples", "read_csv", "split_url"]

_INT = re.compile(r"[+-]?[0-9]+")


class Root:
    """The root of a dataset, to turn manifest keys into keys relative to it.

    Parameters
    ----------
    url
        The root as given (a path or URL).
    store_url
        The root's store URL, normalised by the store (``Store.url``).
    """

    def __init__(self, url: str, store_url: str) -> None:
        self.url = url
        self._shown = storage.redact_url(url)  # for messages: no credentials
        self._local: str | None = None
        prefixes = {store_url.rstrip("/") + "/", url.rstrip("/") + "/"}
        parsed = storage.parse_url(url)
        if parsed.local:
            self._local = os.path.abspath(parsed.location)
            prefixes.add("file://" + self._local.rstrip("/") + "/")
        self._prefixes = tuple(sorted(prefixes, key=len, reverse=True))

    def relative(self, key: str) -> str:
        """``key`` relative to the root, with ``.`` segments dropped.

        Raises
        ------
        ValueError
            Naming the key, if it is empty, leaves the root (``..``, an absolute path or
            a URL elsewhere) or has an empty segment.
        """
        # The common case, a plain relative key, passes without splitting.
        if (
            key
            and not key.startswith(("/", "."))
            and "/." not in key
            and "//" not in key
            and "://" not in key
            and not key.endswith("/")
        ):
            return key
        if not key:
            raise ValueError("empty key")
        shown = repr(storage.redact_url(key))  # for messages: no credentials
        rel = key
        if "://" in key:
            for prefix in self._prefixes:
                if key.startswith(prefix):
                    rel = key[len(prefix) :]
                    break
            else:
                raise ValueError(f"key {shown} is a URL outside the root {self._shown}")
        elif key.startswith("/"):
            local = self._local
            if local is None or not key.startswith(local.rstrip("/") + "/"):
                raise ValueError(
                    f"key {shown} is an absolute path outside the root {self._shown} "
                    "(keys are relative to the root)"
                )
            rel = key[len(local.rstrip("/")) + 1 :]
        parts = []
        for seg in rel.split("/"):
            if seg == ".":
                continue
            if seg == "..":
                raise ValueError(f"key {shown} leaves the root {self._shown} (a '..' segment)")
            if not seg:
                raise ValueError(f"key {shown} has an empty path segment")
            parts.append(seg)
        if not parts:
            raise ValueError(f"key {shown} names the root {self._shown}, not an image")
        return "/".join(parts)


@dataclass
class Manifest:
    """What a manifest lists: keys relative to ``root``, their labels and the classes."""

    url: str
    root: str
    store: storage.Store  # the root's store, already open
    keys: list[str]
    targets: list[int]
    classes: list[str]


def split_url(url: str) -> tuple[str, str]:
    """A file URL or path as (its folder's URL, its name).

    Raises
    ------
    ValueError
        If the URL names no file (a bare bucket or host).
    """
    parsed = storage.parse_url(url)
    if parsed.local:
        path = os.path.abspath(parsed.location)
        folder, name = os.path.dirname(path), os.path.basename(path)
        return ("file://" + folder if url.startswith("file://") else folder), name
    scheme, rest = url.split("://", 1)
    head, sep, name = rest.rstrip("/").rpartition("/")
    if not sep or not name or rest.endswith("/"):
        raise ValueError(
            f"manifest URL {storage.redact_url(url)!r} names no file (expected e.g. s3://bucket/train.csv)"
        )
    return f"{scheme}://{head}", name


def _read_text(
    url: str, anon: bool, encoding: str, options: Mapping[str, Any]
) -> tuple[str, str, storage.Store]:
    """The manifest's text, its folder URL and that folder's store."""
    folder, name = split_url(url)
    store = storage.open(folder, anon=anon, **options)
    data = store.get(name)  # FileNotFoundError names the URL
    try:
        return data.decode(encoding), folder, store
    except UnicodeDecodeError as e:
        shown = storage.redact_url(url)
        raise ValueError(f"{shown}: not {encoding} text ({e}); pass encoding=") from None


def read_csv(
    url: str,
    root: str | None,
    *,
    key_column: str,
    label_column: str,
    delimiter: str,
    classes: Sequence[str] | None,
    anon: bool,
    encoding: str,
    storage_options: Mapping[str, Any] | None = None,
) -> Manifest:
    """Parse a CSV/TSV manifest with a header row (see ``ImageList.from_csv``)."""
    options = dict(storage_options or {})
    text, folder, store = _read_text(url, anon, encoding, options)
    shown = storage.redact_url(url)  # for messages: no credentials
    if root is None or root == folder:
        root = folder
    else:
        store = storage.open(root, anon=anon, **options)
    where = Root(root, store.url)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)

    def error(line: int, what: str) -> ValueError:
        return ValueError(f"{shown}, line {line}: {what}")

    header: list[str] | None = None
    for row in reader:
        if any(f.strip() for f in row):
            header = [f.strip() for f in row]
            break
    if header is None:
        raise ValueError(
            f"{shown}: empty manifest: expected a header line naming the columns "
            f"{key_column!r} and {label_column!r}, then a row per image"
        )
    cols = []
    for option, name in (("key_column", key_column), ("label_column", label_column)):
        if name not in header:
            hint = ""
            if len(header) == 1 and any(d in header[0] for d in ",\t;|"):
                hint = f"; is delimiter={delimiter!r} right?"
            raise error(
                reader.line_num,
                f"no column {name!r} in the header {header} (set {option}=){hint}",
            )
        cols.append(header.index(name))
    ki, li = cols
    need = max(ki, li) + 1

    keys: list[str] = []
    labels: list[str] = []
    lines: list[int] = []
    for row in reader:
        if not row:
            continue  # a blank line
        line = reader.line_num
        if len(row) < need:
            if not any(f.strip() for f in row):
                continue
            raise error(
                line,
                f"{len(row)} field(s), expected at least {need} (columns {header}; "
                f"delimiter {delimiter!r})",
            )
        key, label = row[ki].strip(), row[li].strip()
        if not key and not label and not "".join(row).strip():
            continue  # a row of empty fields, as spreadsheets export
        try:
            keys.append(where.relative(key))
        except ValueError as e:
            raise error(line, str(e)) from None
        labels.append(label)
        lines.append(line)
    if not keys:
        raise ValueError(f"{shown}: empty manifest: a header {header} but no rows")
    targets, names = _labels(labels, lines, classes, error)
    return Manifest(url, root, store, keys, targets, names)


def _labels(
    labels: list[str],
    lines: list[int],
    classes: Sequence[str] | None,
    err: Callable[[int, str], ValueError],
) -> tuple[list[int], list[str]]:
    """Labels (integers or class names) as integer targets, and the class names."""
    if classes is not None:
        names = [str(c) for c in classes]
        index = {c: i for i, c in enumerate(names)}
        targets = []
        for label, line in zip(labels, lines, strict=True):
            t = index.get(label)
            if t is None and _INT.fullmatch(label) and 0 <= int(label) < len(names):
                t = int(label)
            if t is None:
                shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
                raise err(
                    line, f"bad label {label!r}: not one of the {len(names)} classes ({shown})"
                )
            targets.append(t)
        return targets, names
    if _INT.fullmatch(labels[0]):
        targets = []
        for label, line in zip(labels, lines, strict=True):
            if not _INT.fullmatch(label) or int(label) < 0:
                raise err(
                    line,
                    f"bad label {label!r}: the labels are integers >= 0 (as {labels[0]!r} on "
                    f"line {lines[0]}); pass classes= for named labels",
                )
            targets.append(int(label))
        return targets, [str(c) for c in range(max(targets) + 1)]
    for label, line in zip(labels, lines, strict=True):
        if not label:
            raise err(line, "bad label '': empty")
    names = sorted(set(labels))
    index = {c: i for i, c in enumerate(names)}
    return [index[c] for c in labels], names


def checked_samples(
    name: str,
    root: Root | None,
    keys: Sequence[str],
    targets: Sequence[int],
    classes: Sequence[str] | None,
) -> tuple[list[str], list[int], list[str]]:
    """The keys (relative to ``root``), integer labels and class names of the image list
    ``name``, or an error naming it and the key or label.

    ``root`` None: the keys are relative and the targets integers ``>= 0`` already (listed
    from the store, or read by :func:`read_csv`). ``classes`` None: ``"0"``, ``"1"``, ...
    up to the largest label.
    """
    if len(keys) != len(targets):
        raise ValueError(f"{name}: {len(keys)} keys but {len(targets)} targets")
    if not keys:
        raise ValueError(f"{name}: no keys, an empty dataset")
    if root is None:
        key_list, labels = list(keys), list(targets)
    else:
        key_list, labels = _checked(name, root, keys, targets)
    if classes is None:
        return key_list, labels, [str(c) for c in range(max(labels) + 1)]
    names = [str(c) for c in classes]
    if len(set(names)) != len(names):
        raise ValueError(f"{name}: classes has duplicate names: {names}")
    top = max(labels)
    if top >= len(names):
        i = labels.index(top)
        raise ValueError(
            f"{name}: target {i} is {top} (key {key_list[i]!r}) but there are "
            f"{len(names)} classes"
        )
    return key_list, labels, names


def _checked(
    name: str, root: Root, keys: Sequence[str], targets: Sequence[int]
) -> tuple[list[str], list[int]]:
    """Keys made relative to ``root`` and targets as ints, or an error naming one."""
    key_list = []
    for i, key in enumerate(keys):
        try:
            key_list.append(root.relative(os.fspath(key)))
        except ValueError as e:
            raise ValueError(f"{name}: key {i}: {e}") from None
    labels = []
    for i, t in enumerate(targets):
        try:
            label = operator.index(t)
        except TypeError:
            raise TypeError(
                f"{name}: target {i} ({t!r}, key {key_list[i]!r}) is not an integer"
            ) from None
        if label < 0:
            raise ValueError(
                f"{name}: target {i} is {label} (key {key_list[i]!r}); labels are "
                "integers >= 0"
            )
        labels.append(label)
    return key_list, labels
