"""What each feature needs of torch beyond the package's floor, in one table (internal).

The package declares ``torch>=2.4``; a feature that needs more is listed in
:data:`TORCH_NEEDS` and refused where a job is made (``submit``, ``dispatch.run``,
``run_command``: :class:`~dask_ddp._launch.wire.options.LaunchOptions`) with the installed
version and the needed one, and again in the rank, whose worker may have another torch.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata

from packaging.version import InvalidVersion, Version


@dataclasses.dataclass(frozen=True)
class TorchNeed:
    """The oldest torch a feature runs on, and what of torch it uses."""

    version: str
    uses: str
    #: What to do on an older torch besides upgrading.
    instead: str = ""


#: Feature (as the user names it) -> what it needs.
TORCH_NEEDS: dict[str, TorchNeed] = {
    "recovery='live'": TorchNeed(
        "2.14",
        "init_process_group(enable_reconfigure=True) and torch.distributed._reconfigure, "
        "the in-place regrouping of the default process group",
        "or use recovery='restart'"),
}


def installed_torch() -> str:
    """The installed torch's version, read without importing torch when it is not yet."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        return str(torch.__version__)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def supports(feature: str, version: str) -> bool:
    """Whether torch ``version`` has what ``feature`` needs. A pre-release or nightly
    counts as its release (``2.14.0a0+git...`` as 2.14.0); a local tag (``+cu130``) is
    ignored."""
    need = Version(TORCH_NEEDS[feature].version)
    try:
        have = Version(version)
    except InvalidVersion:
        return False
    return have.release >= need.release


def require_torch(feature: str, version: str | None = None) -> None:
    """Raise unless the installed torch (or ``version``) has what ``feature`` needs.

    Raises
    ------
    RuntimeError
        Naming the feature, the installed version and the needed one.
    """
    have = installed_torch() if version is None else version
    if not supports(feature, have):
        need = TORCH_NEEDS[feature]
        raise RuntimeError(
            f"{feature} needs torch>={need.version} ({need.uses}); the installed torch is "
            f"{have}: install torch>={need.version} on the client and the workers"
            + (f", {need.instead}" if need.instead else ""))
