"""The scheduler's view of the cluster, asked for by the client (a leaf every layer may use)."""

from __future__ import annotations

from typing import Any


def cluster_info(client: Any) -> dict[str, Any]:
    """The scheduler's identity with every worker listed, fetched for this call.

    Parameters
    ----------
    client
        A synchronous :class:`distributed.Client`.

    Returns
    -------
    dict
        What ``client.scheduler_info(n_workers=-1)`` documents: ``"workers"`` maps each
        worker's address to its details.

    Notes
    -----
    ``client.scheduler_info(n_workers=-1)`` returns the client's shared cache, which the
    client's own periodic refresh (fetched with no workers) can overwrite between the fetch
    and the return: a launch then saw a cluster of three workers with none listed.
    """
    if getattr(client, "asynchronous", False):
        raise RuntimeError("an asynchronous Client cannot be used here: pass a synchronous one")
    return dict(client.sync(client.scheduler.identity, n_workers=-1))
