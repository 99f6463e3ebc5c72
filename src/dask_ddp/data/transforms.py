"""Image transforms that run in the C++ engine, named and parameterised like torchvision's.

Build the :class:`~dask_ddp.data.Loader`'s pipeline from these::

    from dask_ddp.data import transforms as T

    train = T.Compose([
        T.RandomResizedCrop(224),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])

Each transform declares its output size up front, so the loader allocates its batch
buffers once: the geometric transforms must end with a fixed size (``CenterCrop``,
``RandomResizedCrop`` or ``Resize((h, w))``), and the pipeline must contain ``ToTensor``
(float32 in [0, 1], then ``Normalize``) or ``PILToTensor`` (uint8, the compact option).

The randomness of each sample depends only on (seed, epoch, index), never on threads.
Resizing gives OpenCV 4.6's pixels (the engine's own code, ``cpp/src/image/resize.h``):
area interpolation when antialiased downscaling (close to PIL's
antialiased bilinear that torchvision uses on PIL images; see ``tests/data/test_transforms.py``
for the measured tolerance), bilinear otherwise.

Each object is also callable on a PIL image, where it runs the torchvision equivalent, so
one pipeline can serve the Loader and a map-style dataset.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

__all__ = [
    "Transform",
    "Compose",
    "Resize",
    "CenterCrop",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "ToTensor",
    "PILToTensor",
    "Normalize",
]

Op = tuple[str, list[float]]


def _size_pair(size: int | Sequence[int], name: str) -> tuple[int, int]:
    """(height, width) from an int or a 1- or 2-sequence, as torchvision reads sizes."""
    if isinstance(size, numbers.Integral):
        pair = (int(size), int(size))
    elif isinstance(size, Sequence) and len(size) in (1, 2):
        pair = (int(size[0]), int(size[-1]))
    else:
        raise ValueError(f"{name}: size must be an int or a sequence of 1 or 2 ints, got {size!r}")
    if pair[0] <= 0 or pair[1] <= 0:
        raise ValueError(f"{name}: size must be positive, got {size!r}")
    return pair


class Transform:
    """Base class: a step of the engine's pipeline."""

    def engine_ops(self) -> list[Op]:
        """The ops the engine runs for this step, as the Loader hands them to it (internal:
        what :func:`to_ops` reads; a subclass defines ``_ops``)."""
        return self._ops()

    def as_torchvision(self) -> Any:
        """The torchvision transform this step runs on a PIL image (what calling it
        applies; a subclass defines ``_torchvision``)."""
        return self._torchvision()

    def _ops(self) -> list[Op]:
        raise NotImplementedError

    def _torchvision(self) -> Any:
        raise NotImplementedError

    def __call__(self, img: Any) -> Any:
        """Apply the torchvision equivalent to a PIL image (for map-style datasets)."""
        return self._torchvision()(img)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Compose(Transform):
    """Several transforms in order, as ``torchvision.transforms.Compose``."""

    def __init__(self, transforms: Sequence[Transform]) -> None:
        for t in transforms:
            if not isinstance(t, Transform):
                raise TypeError(
                    f"Compose item {t!r} is not a dask_ddp.data.transforms transform; the "
                    "engine runs only these (use torchvision transforms with the map-style "
                    "dataset and a torch DataLoader instead)"
                )
        self.transforms = list(transforms)

    def _ops(self) -> list[Op]:
        return [op for t in self.transforms for op in t.engine_ops()]

    def _torchvision(self) -> Any:
        from torchvision import transforms as tv

        return tv.Compose([t.as_torchvision() for t in self.transforms])


class Resize(Transform):
    """Resize: an int makes the shorter side ``size`` (the longer side scales to keep the
    aspect ratio, rounded down as torchvision does); ``(h, w)`` resizes exactly.
    ``antialias=True`` low-pass filters when downscaling."""

    def __init__(self, size: int | Sequence[int], antialias: bool = True) -> None:
        if isinstance(size, numbers.Integral) or (isinstance(size, Sequence) and len(size) == 1):
            s = int(size if isinstance(size, numbers.Integral) else size[0])
            if s <= 0:
                raise ValueError(f"Resize: size must be positive, got {size!r}")
            self.size: int | tuple[int, int] = s
        else:
            self.size = _size_pair(size, "Resize")
        self.antialias = bool(antialias)

    def _ops(self) -> list[Op]:
        h, w = (0, self.size) if isinstance(self.size, int) else self.size
        return [("resize", [h, w, float(self.antialias)])]

    def _torchvision(self) -> Any:
        from torchvision import transforms as tv

        return tv.Resize(self.size, antialias=self.antialias)


class CenterCrop(Transform):
    """Crop the centre (zero padding where the image is smaller), as torchvision."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _size_pair(size, "CenterCrop")

    def _ops(self) -> list[Op]:
        return [("center_crop", [self.size[0], self.size[1]])]

    def _torchvision(self) -> Any:
        from torchvision import transforms as tv

        return tv.CenterCrop(self.size)


class RandomResizedCrop(Transform):
    """A random area/aspect crop resized to ``size``: torchvision's sampling algorithm
    (10 tries, then the central-crop fallback) over the engine's per-sample generator."""

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        antialias: bool = True,
    ) -> None:
        self.size = _size_pair(size, "RandomResizedCrop")
        if len(scale) != 2 or len(ratio) != 2:
            raise ValueError(
                f"RandomResizedCrop: scale and ratio are pairs, got {scale!r}, {ratio!r}"
            )
        if not 0 < scale[0] <= scale[1]:
            raise ValueError(f"RandomResizedCrop: need 0 < scale[0] <= scale[1], got {scale!r}")
        if ratio[0] <= 0 or ratio[1] <= 0:
            raise ValueError(f"RandomResizedCrop: ratio must be positive, got {ratio!r}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.antialias = bool(antialias)

    def _ops(self) -> list[Op]:
        h, w = self.size
        return [("random_resized_crop", [h, w, *self.scale, *self.ratio, float(self.antialias)])]

    def _torchvision(self) -> Any:
        from torchvision import transforms as tv

        return tv.RandomResizedCrop(self.size, self.scale, self.ratio, antialias=self.antialias)


class RandomHorizontalFlip(Transform):
    """Mirror left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {p!r}")
        self.p = float(p)

    def _ops(self) -> list[Op]:
        return [("hflip", [self.p])]

    def _torchvision(self) -> Any:
        from torchvision import transforms as tv

        return tv.RandomHorizontalFlip(self.p)


class ToTensor(Transform):
    """float32 CHW in [0, 1] (pixel / 255)."""

    def _ops(self) -> list[Op]:
        return [("to_tensor", [])]

    def _torchvision(self) -> Any:
        from torchvision import transforms as tv

        return tv.ToTensor()


class PILToTensor(Transform):
    """uint8 CHW, unscaled: a quarter of the memory of ``ToTensor``'s output; normalise
    on the device."""

    def _ops(self) -> list[Op]:
        return [("pil_to_tensor", [])]

    def _torchvision(self) -> Any:
        from torchvision import transforms as tv

        return tv.PILToTensor()


class Normalize(Transform):
    """``(x - mean) / std`` per channel, after ``ToTensor``."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        if len(mean) != 3 or len(std) != 3:
            raise ValueError(f"Normalize: mean and std need 3 values (RGB), got {mean!r}, {std!r}")
        if any(s == 0 for s in std):
            raise ValueError(f"Normalize: std must not contain 0, got {std!r}")
        self.mean = [float(m) for m in mean]
        self.std = [float(s) for s in std]
        self.inplace = inplace

    def _ops(self) -> list[Op]:
        return [("normalize", [*self.mean, *self.std])]

    def _torchvision(self) -> Any:
        from torchvision import transforms as tv

        return tv.Normalize(self.mean, self.std, self.inplace)


def to_ops(transform: object) -> list[Op]:
    """The engine ops of a transform; ``TypeError`` for anything the engine cannot run."""
    if isinstance(transform, Transform):
        return transform.engine_ops()
    module = type(transform).__module__ or ""
    what = f"{module}.{type(transform).__qualname__}" if module else type(transform).__qualname__
    raise TypeError(
        f"Loader runs its transforms in C++ and cannot run {what}; build the pipeline from "
        "dask_ddp.data.transforms (Compose, Resize, CenterCrop, RandomResizedCrop, "
        "RandomHorizontalFlip, ToTensor, PILToTensor, Normalize), or use the map-style "
        "dataset (ImageList / ImageFolder / S3ImageFolder) with any torchvision transform in a "
        "torch DataLoader"
    )
