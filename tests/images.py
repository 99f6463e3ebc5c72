"""Real image files for the data tests, written by PIL's encoders.

Photographic content comes from the photos scikit-image ships (recropped and resized),
so JPEG behaves as on real data; every variant the loader must handle has a maker here.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable
from functools import cache

import numpy as np
from PIL import Image

PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "retina",
)


@cache
def _photo(name: str) -> np.ndarray:
    from skimage import data

    img = getattr(data, name)()
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    return np.ascontiguousarray(img[..., :3].astype(np.uint8))


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """An RGB photo crop of ``width`` x ``height``: a random window of a scikit-image photo,
    resized (and mirrored for variety) to the requested size."""
    rng = np.random.default_rng(seed)
    src = _photo(PHOTOS[seed % len(PHOTOS)])
    h, w = src.shape[:2]
    ch = int(rng.integers(h // 2, h + 1))
    cw = int(rng.integers(w // 2, w + 1))
    top = int(rng.integers(0, h - ch + 1))
    left = int(rng.integers(0, w - cw + 1))
    img = Image.fromarray(src[top : top + ch, left : left + cw])
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return img.resize((width, height), Image.Resampling.BICUBIC)


def encode(img: Image.Image, kind: str, quality: int = 90) -> bytes:
    """Encode ``img`` as one of the variants the loader must read.

    ``kind``: ``jpeg``, ``jpeg-gray``, ``jpeg-cmyk``, ``jpeg-progressive``, ``jpeg-444``,
    ``png``, ``png-gray``, ``png-palette``, ``png-rgba``, ``png-16``.
    """
    buf = io.BytesIO()
    if kind == "jpeg":
        img.convert("RGB").save(buf, "JPEG", quality=quality)
    elif kind == "jpeg-444":
        img.convert("RGB").save(buf, "JPEG", quality=quality, subsampling=0)
    elif kind == "jpeg-gray":
        img.convert("L").save(buf, "JPEG", quality=quality)
    elif kind == "jpeg-cmyk":
        img.convert("CMYK").save(buf, "JPEG", quality=quality)
    elif kind == "jpeg-progressive":
        img.convert("RGB").save(buf, "JPEG", quality=quality, progressive=True)
    elif kind == "png":
        img.convert("RGB").save(buf, "PNG")
    elif kind == "png-gray":
        img.convert("L").save(buf, "PNG")
    elif kind == "png-palette":
        img.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(buf, "PNG")
    elif kind == "png-rgba":
        rgba = img.convert("RGBA")
        alpha = np.linspace(0, 255, rgba.width, dtype=np.uint8)[None, :].repeat(rgba.height, 0)
        rgba.putalpha(Image.fromarray(alpha))
        rgba.save(buf, "PNG")
    elif kind == "png-16":
        arr = np.asarray(img.convert("L"), dtype=np.uint16) * 257
        Image.fromarray(arr).save(buf, "PNG")
    else:
        raise ValueError(f"unknown image kind {kind!r}")
    return buf.getvalue()


KINDS = (
    "jpeg",
    "jpeg-444",
    "jpeg-gray",
    "jpeg-cmyk",
    "jpeg-progressive",
    "png",
    "png-gray",
    "png-palette",
    "png-rgba",
)

EXT = {"jpeg": ".jpg", "png": ".png"}


def ext_of(kind: str) -> str:
    return EXT[kind.split("-")[0]]


def huge_png(width: int = 20000, height: int = 4) -> bytes:
    """A real, small PNG whose width exceeds the default dimension limit (2^14)."""
    buf = io.BytesIO()
    Image.new("L", (width, height)).save(buf, "PNG")
    return buf.getvalue()


def truncated(data: bytes, fraction: float = 0.5) -> bytes:
    return data[: int(len(data) * fraction)]


def write_folder(
    put: Callable[[str, bytes], None],
    classes: Iterable[str],
    per_class: int,
    sizes: Iterable[tuple[int, int]] = ((64, 48), (50, 70), (81, 81), (120, 90)),
    kinds: Iterable[str] = ("jpeg",),
    seed: int = 0,
) -> list[tuple[str, int]]:
    """Write ``per_class`` images into each class folder through ``put(key, bytes)``;
    returns (key, label) sorted by key. Sizes and kinds cycle over the images."""
    sizes = list(sizes)
    kinds = list(kinds)
    out = []
    n = 0
    for label, cls in enumerate(sorted(classes)):
        for i in range(per_class):
            w, h = sizes[n % len(sizes)]
            kind = kinds[n % len(kinds)]
            key = f"{cls}/img_{i:04d}{ext_of(kind)}"
            put(key, encode(photo(w, h, seed + n), kind))
            out.append((key, label))
            n += 1
    return sorted(out)


def file_putter(root: str) -> Callable[[str, bytes], None]:
    """``put`` for :func:`write_folder` writing files under a local folder."""

    def put(key: str, data: bytes) -> None:
        path = os.path.join(root, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    return put
