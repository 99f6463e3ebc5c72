"""The submitted call, checked on the client before any rank starts (internal).

- :func:`check_call`: the training function's signature takes the arguments given (a
  typo in a ``submit`` option, ``ouput_dir=``, would reach the function and fail in every
  rank seconds later); a keyword close to a launcher option is named as such.
- :func:`dumps_payload`: ``(fn, args, kwargs)`` pickled; what cannot be pickled is named
  (the function, which of its variables, which argument).
- :func:`code_ranges` and :func:`with_sources`: cloudpickle ships a function defined in
  ``__main__`` (or a notebook) by value and names its code's file ``<dynamic-code>``, so a
  rank's traceback has no file and no source line for the user's own frames. The client
  knows the code objects it sent: their file and line range are kept with the job, and
  the traceback the client raises reads the file and the source line there, where the file
  is (the workers may not have it).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import linecache
import logging
import re
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import cloudpickle

logger = logging.getLogger(__name__)

#: The code objects looked at for :func:`code_ranges` (a bound on the walk).
_MAX_CODES = 256
#: A traceback frame line of code cloudpickle shipped by value.
_DYNAMIC_FRAME = re.compile(r'^(?P<indent>\s*)File "<dynamic-code>", line (?P<line>\d+), '
                            r"in (?P<name>\S+)$", re.MULTILINE)


def _describe(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def check_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
               launcher_options: Iterable[str], *, pass_local_rank: bool = False) -> None:
    """Raise ``TypeError`` now when ``fn`` cannot take ``args`` and ``kwargs`` (each rank
    would raise it); warn when a keyword ``fn`` takes through ``**kwargs`` is close to a
    launcher option (``ouput_dir`` for ``output_dir``).

    Raises
    ------
    TypeError
        Naming the function, the keyword and, for a near miss, the launcher option.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: the rank tells
        return
    options = sorted(launcher_options)
    call_kwargs = {**kwargs, "local_rank": 0} if pass_local_rank else dict(kwargs)
    params = sig.parameters.values()
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in call_kwargs:
        if key in named:
            continue
        close = difflib.get_close_matches(key, options, n=1, cutoff=0.75)
        if takes_any:
            if close and key in kwargs:
                logger.warning(
                    "submit(): %s= goes to the training function %s (its **kwargs); if "
                    "you meant the launcher's option, it is %s=", key, _describe(fn),
                    close[0])
            continue
        if close:
            raise TypeError(
                f"{key}= is not an option of submit() (did you mean {close[0]}=?) and the "
                f"training function {_describe(fn)}{sig} does not take it")
        near = difflib.get_close_matches(key, named, n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]}=?)" if near else ""
        raise TypeError(f"the training function {_describe(fn)}{sig} takes no keyword "
                        f"argument {key!r}{hint}")
    try:
        sig.bind(*args, **call_kwargs)
    except TypeError as exc:
        raise TypeError(f"the training function {_describe(fn)}{sig} cannot be called "
                        f"with the arguments given to submit(): {exc}") from None


def dumps_payload(fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: Mapping[str, Any]) -> bytes:
    """``cloudpickle.dumps((fn, args, kwargs))``; a ``TypeError`` naming what cannot be
    pickled (the function and which variable it uses, or which argument) otherwise."""
    try:
        return cloudpickle.dumps((fn, args, dict(kwargs)))
    except Exception as exc:
        culprit = _unpicklable(fn, args, kwargs)
        raise TypeError(f"{culprit or 'the submitted call'} cannot be pickled to send it "
                        f"to the ranks: {type(exc).__name__}: {exc}") from exc


def _fails(value: Any) -> bool:
    try:
        cloudpickle.dumps(value)
    except Exception:
        return True
    return False


def _unpicklable(fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """What of the call cannot be pickled, in words (``None``: nothing alone)."""
    for i, value in enumerate(args):
        if _fails(value):
            return f"positional argument {i} ({type(value).__name__})"
    for key, value in kwargs.items():
        if _fails(value):
            return f"keyword argument {key!r} ({type(value).__name__})"
    if not _fails(fn):
        return None
    what = f"the training function {_describe(fn)}"
    code = getattr(fn, "__code__", None)
    if code is None:
        return what
    used: list[tuple[str, Any]] = []
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (),
                          strict=False):
        with contextlib.suppress(ValueError):  # an empty cell
            used.append((name, cell.cell_contents))
    fn_globals = getattr(fn, "__globals__", {})
    used.extend((n, fn_globals[n]) for n in code.co_names if n in fn_globals)
    for name, value in used:
        if not isinstance(value, types.ModuleType) and _fails(value):
            return f"{what} (its variable {name!r}, a {type(value).__name__})"
    return what


def code_ranges(fn: Any) -> tuple[tuple[str, str, int, int], ...]:
    """``(name, file, first line, last line)`` of the Python code ``fn`` brings along:
    its own, nested functions', and the functions and classes of its module it uses."""
    seen: set[int] = set()
    out: list[tuple[str, str, int, int]] = []
    todo: list[Any] = [fn]
    while todo and len(seen) < _MAX_CODES:
        obj = todo.pop()
        if isinstance(obj, type):
            todo.extend(v for v in vars(obj).values()
                        if isinstance(v, (types.FunctionType, staticmethod, classmethod)))
            continue
        obj = getattr(obj, "__func__", obj)  # methods, staticmethod, classmethod
        obj = getattr(obj, "func", obj)  # functools.partial
        code = obj if isinstance(obj, types.CodeType) else getattr(obj, "__code__", None)
        if not isinstance(code, types.CodeType) or id(code) in seen:
            continue
        seen.add(id(code))
        lines = [n for _, _, n in code.co_lines() if n is not None]
        if not code.co_filename.startswith("<") or code.co_filename.startswith("<ipython"):
            out.append((code.co_name, code.co_filename, code.co_firstlineno,
                        max(lines, default=code.co_firstlineno)))
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        fn_globals = getattr(obj, "__globals__", None)
        if isinstance(fn_globals, dict):
            todo.extend(fn_globals[n] for n in code.co_names
                        if isinstance(fn_globals.get(n), (types.FunctionType, type))
                        and getattr(fn_globals[n], "__module__", None)
                        == fn_globals.get("__name__"))
    return tuple(out)


def with_sources(text: str, ranges: Iterable[tuple[str, str, int, int]]) -> str:
    """``text`` (a traceback) with each ``File "<dynamic-code>", line N, in NAME`` frame
    naming the file of the code ``NAME`` whose lines hold ``N``, followed by its source
    line (read here, on the client)."""
    known = list(ranges)
    if not known or "<dynamic-code>" not in text:
        return text

    def frame(match: re.Match[str]) -> str:
        line, name, indent = int(match["line"]), match["name"], match["indent"]
        for code_name, filename, first, last in known:
            if code_name == name and first <= line <= last:
                source = linecache.getline(filename, line).strip()
                head = f'{indent}File "{filename}", line {line}, in {name}'
                return f"{head}\n{indent}  {source}" if source else head
        return match.group(0)

    return _DYNAMIC_FRAME.sub(frame, text)


def name_sources(err: Any, ranges: Iterable[tuple[str, str, int, int]]) -> None:
    """Put the files and source lines into a :class:`~dask_ddp.JobError`'s message and
    ``remote_traceback`` (idempotent: a frame named once is no longer dynamic)."""
    ranges = tuple(ranges)
    err.remote_traceback = with_sources(err.remote_traceback, ranges)
    if err.args and isinstance(err.args[0], str):
        err.args = (with_sources(err.args[0], ranges), *err.args[1:])
    cause = err.__cause__
    if cause is not None and type(cause).__name__ == "RemoteException" and cause.args \
            and isinstance(cause.args[0], str):
        cause.args = (with_sources(cause.args[0], ranges), *cause.args[1:])
