"""The variables the launcher sets for torch's collectives (internal).

A rank's supervisor puts them in the rank's environment
(:mod:`dask_ddp._launch.worker.rank_env`); the rank's probe sets any that are missing
before torch makes a process group (a script started some other way, a user's
``os.environ`` edit; :mod:`dask_ddp._launch.rank.probe`).
"""

from __future__ import annotations

from collections.abc import Mapping

#: What the launcher sets for torch's collectives unless the job or the worker did (docs,
#: "Stalls, live stacks and waits"). The flight recorder keeps each process group's last
#: collectives (gloo's too, the reducer's gradient all-reduce included) in a ring the
#: probe reads for stall detection; 64 entries cost about what 2000 do per collective
#: and keep each read small. An NCCL rank whose collective times out is torn down and
#: exits (torchrun's choice, so the supervisor sees it end) after the watchdog dumped the
#: ring of its last collectives (the probe points the dump into the rank's work directory).
COLLECTIVE_DEFAULTS = {
    "TORCH_FR_BUFFER_SIZE": "64",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
#: torch's older name of the flight recorder's size: a user who set it keeps it.
_FR_ALIASES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def collective_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of :data:`COLLECTIVE_DEFAULTS` that ``env`` leaves unset."""
    added = {k: v for k, v in COLLECTIVE_DEFAULTS.items() if k not in env}
    if any(name in env for name in _FR_ALIASES):
        added.pop("TORCH_FR_BUFFER_SIZE", None)
    return added
