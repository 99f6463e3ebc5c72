"""The engine's sampler order written out in Python, from its specification: the oracle
the engine's ``DistributedSampler`` (``cpp/src/pipeline/sampler.cc``, through
``dask_ddp._core.sampler_indices``) is checked against. A SplitMix64 Fisher-Yates shuffle
by (seed, epoch), padding by the order's head (or dropping the tail), rank ``r`` at
positions ``r, r + world, ...``, as torch's ``DistributedSampler`` deals them."""

from __future__ import annotations

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class _Rng:
    """The engine's ``image::Rng`` (SplitMix64)."""

    def __init__(self, seed: int, epoch: int, index: int) -> None:
        self.s = (seed ^ _GOLDEN) & _MASK
        self.s = self.next() ^ ((epoch * 0xD1B54A32D192ED03) & _MASK)
        self.s = self.next() ^ ((index * 0x8CB92BA72F3D8DD7) & _MASK)
        self.next()

    def next(self) -> int:
        self.s = (self.s + _GOLDEN) & _MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        v = int(float(self.next() >> 11) * 2.0 ** -53 * float(n))
        return v if v < n else n - 1


def reference_indices(n: int, epoch: int, rank: int, world_size: int, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> list[int]:
    """The dataset indices rank ``rank`` of ``world_size`` reads in ``epoch``, in order:
    the specification (see the module)."""
    if drop_last and n % world_size:
        per_rank = max((n - world_size + world_size - 1) // world_size, 0)
    else:
        per_rank = (n + world_size - 1) // world_size
    order = list(range(n))
    if shuffle and n > 1:
        rng = _Rng(seed, epoch, _MASK)
        for i in range(n - 1, 0, -1):
            j = rng.below(i + 1)
            order[i], order[j] = order[j], order[i]
    total = per_rank * world_size
    k = 0
    while len(order) < total and n > 0:
        order.append(order[k % n])
        k += 1
    del order[total:]
    return order[rank:total:world_size]


