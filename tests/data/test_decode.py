"""Decode of real JPEG/PNG files against PIL, and bad input naming its URL."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from dask_ddp import _core
from images import KINDS, encode, huge_png, photo, truncated

# Tolerance against PIL (documented in BENCHMARKS.md / the transforms module): both use
# libjpeg-turbo with the accurate integer DCT and fancy upsampling, and the same CMYK
# formula, so pixels agree exactly here; allow 2 levels for other libjpeg-turbo builds.
MAX_DIFF = 2
MEAN_DIFF = 0.25


def pil_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [(64, 48), (333, 257), (17, 300)])
def test_pixels_agree_with_pil(kind: str, size: tuple[int, int]) -> None:
    data = encode(photo(*size, seed=hash(kind) % 7), kind)
    ours = _core.decode_image(data, f"mem://{kind}")
    ref = pil_rgb(data)
    assert ours.shape == ref.shape == (size[1], size[0], 3)
    diff = np.abs(ours.astype(int) - ref.astype(int))
    assert diff.max() <= MAX_DIFF, f"{kind}: max diff {diff.max()}"
    assert diff.mean() <= MEAN_DIFF


def test_png16_takes_the_high_byte() -> None:
    # PIL clips 16-bit grey to 255 when converting to RGB (a quirk); we scale to 8 bits.
    img = photo(40, 30, seed=2).convert("L")
    ours = _core.decode_image(encode(img, "png-16"))
    want = np.asarray(img)
    assert np.abs(ours[..., 0].astype(int) - want).max() <= 1
    assert (ours[..., 0] == ours[..., 2]).all()


def test_scaled_decode_sizes_and_content() -> None:
    data = encode(photo(640, 480, seed=1), "jpeg")
    full = _core.decode_image(data)
    for d in (2, 4, 8):
        small = _core.decode_image(data, scale_denom=d)
        assert small.shape == (480 // d, 640 // d, 3)
        ref = np.asarray(Image.fromarray(full).reduce(d))
        assert np.abs(small.astype(int) - ref.astype(int)).mean() < 3.0


def test_image_info() -> None:
    assert _core.image_info(encode(photo(50, 20), "jpeg")) == (50, 20, "jpeg")
    assert _core.image_info(encode(photo(50, 20), "png-palette")) == (50, 20, "png")


@pytest.mark.parametrize(
    ("data", "exc", "words"),
    [
        (b"", ValueError, "0 bytes"),
        (b"GIF89a not supported", ValueError, "not a JPEG or PNG"),
        (truncated(encode(photo(300, 200), "jpeg"), 0.6), OSError, "truncated"),
        (truncated(encode(photo(300, 200), "jpeg-progressive"), 0.5), OSError, "JPEG"),
        (truncated(encode(photo(100, 80), "png"), 0.7), OSError, "PNG"),
        (huge_png(), OSError, "20000x4"),
    ],
    ids=["zero-byte", "gif", "truncated-jpeg", "truncated-progressive", "truncated-png", "huge"],
)
def test_bad_input_names_the_url(data: bytes, exc: type[Exception], words: str) -> None:
    url = "s3://bucket/cls/bad.img"
    with pytest.raises(exc) as info:
        _core.decode_image(data, url)
    assert url in str(info.value)
    assert words in str(info.value)


def test_dimension_limit_is_configurable() -> None:
    data = encode(photo(300, 200), "jpeg")
    with pytest.raises(OSError, match=r"300x200 pixels, over the limit of 256 per side"):
        _core.decode_image(data, "x.jpg", max_side=256)
    assert _core.decode_image(data, "x.jpg", max_side=300).shape == (200, 300, 3)


def test_corrupted_bytes_never_crash() -> None:
    # Flipped bytes all through a JPEG: an error or an image, never a crash.
    data = bytearray(encode(photo(120, 90), "jpeg"))
    rng = np.random.default_rng(0)
    for _ in range(200):
        bad = bytearray(data)
        for pos in rng.integers(2, len(bad), size=8):
            bad[pos] = int(rng.integers(0, 256))
        try:
            img = _core.decode_image(bytes(bad), "fuzz.jpg")
        except (OSError, ValueError) as e:
            assert "fuzz.jpg" in str(e)
        else:
            assert img.shape[2] == 3
