"""Transform geometry against torchvision: same parameters, same boxes, close pixels."""

from __future__ import annotations

import io
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms.transforms as tvt
from PIL import Image
from torchvision import transforms as tv
from torchvision.transforms import functional as F

from dask_ddp import _core
from dask_ddp.data import transforms as T
from images import encode, photo

# Documented tolerance (0-255 levels) against torchvision on PIL images: crops are exact;
# upscaling (bilinear both sides) agrees within 1-2 levels; antialiased shrinking uses
# OpenCV's area filter from 2x on and bilinear below 2x, where PIL uses a widened bilinear
# (triangle) filter: 0.2-2.8 levels apart on average on photos, more at sharp edges.
UPSCALE_MEAN, UPSCALE_MAX = 0.5, 3
DOWNSCALE_MEAN = 3.0


def run(t: T.Transform, data: bytes, **kw: Any) -> np.ndarray:
    return _core.transform_image(data, t._ops(), **kw)


def reference(tvt_: Any, data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        out = tvt_(img.convert("RGB"))
    return np.asarray(tv.PILToTensor()(out) if isinstance(out, Image.Image) else out)


@pytest.mark.parametrize("size", [(500, 375), (333, 257), (120, 91), (60, 200)])
@pytest.mark.parametrize("crop", [100, (64, 90), 250])
def test_center_crop_is_exact(size: tuple[int, int], crop: int | tuple[int, int]) -> None:
    data = encode(photo(*size, seed=3), "png")  # lossless: exact comparison
    t = T.Compose([T.CenterCrop(crop), T.PILToTensor()])
    np.testing.assert_array_equal(run(t, data), reference(t._torchvision(), data))


@pytest.mark.parametrize("size", [(500, 375), (333, 257), (640, 480), (120, 90), (60, 200)])
def test_resize_geometry_and_pixels(size: tuple[int, int]) -> None:
    data = encode(photo(*size, seed=4), "png")
    for resize in (256, 128, (100, 150), (300, 400)):
        t = T.Compose([T.Resize(resize), T.PILToTensor()])
        ours, ref = run(t, data), reference(t._torchvision(), data)
        assert ours.shape == ref.shape, (size, resize)
        diff = np.abs(ours.astype(int) - ref.astype(int))
        upscale = ours.shape[1] >= size[1] and ours.shape[2] >= size[0]
        if upscale:
            assert diff.mean() <= UPSCALE_MEAN and diff.max() <= UPSCALE_MAX, (size, resize)
        else:
            assert diff.mean() <= DOWNSCALE_MEAN, (size, resize, diff.mean())


def test_eval_pipeline_float_output_matches_torchvision() -> None:
    data = encode(photo(500, 375, seed=5), "jpeg")
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    t = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(mean, std)])
    ours = run(t, data)
    ref = reference(t._torchvision(), data)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (3, 224, 224)
    # 3 levels of 255, through the normalisation (largest 1/std is 1/0.224)
    assert np.abs(ours - ref).mean() <= DOWNSCALE_MEAN / 255 / 0.224


class FakeTorch(SimpleNamespace):
    """Stands in for `torch` inside torchvision's RandomResizedCrop.get_params: the
    uniform and randint draws come from a given list; everything else is real torch."""

    def __init__(self, draws: list[float]) -> None:
        super().__init__(log=torch.log, tensor=torch.tensor, exp=torch.exp)
        self.draws = list(draws)
        self.used = 0

    def _next(self) -> float:
        u = self.draws[self.used]
        self.used += 1
        return u

    def empty(self, *size: int) -> Any:
        fake = self

        class Uniform:
            def uniform_(self, a: Any, b: Any) -> torch.Tensor:
                a, b = float(a), float(b)
                return torch.tensor([a + fake._next() * (b - a)], dtype=torch.float32)

        return Uniform()

    def randint(self, low: int, high: int, size: tuple[int, ...]) -> torch.Tensor:
        return torch.tensor([low + math.floor(self._next() * (high - low))])


@pytest.mark.parametrize(
    ("scale", "ratio"),
    [
        ((0.08, 1.0), (3 / 4, 4 / 3)),
        ((0.5, 1.0), (0.2, 5.0)),
        ((0.95, 1.0), (2.5, 6.0)),
        ((0.1, 0.3), (1.0, 1.0)),
    ],
)
def test_random_resized_crop_box_equals_torchvision(
    monkeypatch: pytest.MonkeyPatch, scale: tuple[float, float], ratio: tuple[float, float]
) -> None:
    rng = np.random.default_rng(0)
    fallbacks = 0
    for trial in range(300):
        w, h = int(rng.integers(20, 700)), int(rng.integers(20, 700))
        draws = rng.random(40).tolist()
        fake = FakeTorch(draws)
        monkeypatch.setattr(tvt, "torch", fake)
        want = tv.RandomResizedCrop.get_params(Image.new("RGB", (w, h)), list(scale), list(ratio))
        monkeypatch.undo()
        top, left, bh, bw, used = _core.rrc_box(w, h, scale, ratio, draws)
        assert (top, left, bh, bw) == want, (trial, w, h)
        assert used == fake.used
        fallbacks += used == 20
    if ratio == (2.5, 6.0):
        assert fallbacks > 0  # the fallback path was exercised


def test_random_resized_crop_pixels_follow_the_planned_box() -> None:
    t = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.PILToTensor()])
    for index in range(12):
        data = encode(photo(333, 250, seed=index), "png")
        boxes, flips, denom, _ = _core.sample_plan(333, 250, t._ops(), 7, 1, index)
        assert denom == 1 and len(boxes) == 1 and len(flips) == 1
        with Image.open(io.BytesIO(data)) as img:
            ref = F.resized_crop(img.convert("RGB"), *boxes[0], [96, 96], antialias=True)
        if flips[0]:
            ref = F.hflip(ref)
        ours = _core.transform_image(data, t._ops(), seed=7, epoch=1, index=index)
        diff = np.abs(ours.astype(int) - np.asarray(tv.PILToTensor()(ref)).astype(int))
        assert diff.mean() <= DOWNSCALE_MEAN, (index, boxes, diff.mean())


def test_randomness_depends_on_seed_epoch_index_only() -> None:
    ops = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])._ops()
    a = _core.sample_plan(500, 400, ops, 1, 2, 3)
    assert a == _core.sample_plan(500, 400, ops, 1, 2, 3)
    others = {str(_core.sample_plan(500, 400, ops, *k)) for k in [(2, 2, 3), (1, 3, 3), (1, 2, 4)]}
    assert str(a) not in others
    flips = [_core.sample_plan(10, 10, ops, 0, 0, i)[1][0] for i in range(2000)]
    assert 0.45 < np.mean(flips) < 0.55


def test_scaled_decode_is_chosen_for_large_crops_and_stays_close() -> None:
    t = T.Compose([T.RandomResizedCrop(64, scale=(0.6, 1.0)), T.PILToTensor()])
    data = encode(photo(640, 480, seed=2), "jpeg")
    _, _, denom, _ = _core.sample_plan(640, 480, t._ops(), 0, 0, 0, scaled_decode=True)
    assert denom in (4, 8)
    fast = run(t, data, scaled_decode=True)
    exact = run(t, data, scaled_decode=False)
    assert np.abs(fast.astype(int) - exact.astype(int)).mean() < 3.0


def test_pipeline_validation() -> None:
    def plan(t: T.Transform) -> object:
        return _core.sample_plan(80, 60, t._ops())  # builds the loader's (fixed-size) pipeline

    with pytest.raises(ValueError, match="output size depends on the image"):
        plan(T.Compose([T.Resize(64), T.ToTensor()]))
    with pytest.raises(ValueError, match="ToTensor"):
        plan(T.Compose([T.CenterCrop(8), T.Normalize([0] * 3, [1] * 3), T.ToTensor()]))
    with pytest.raises(ValueError, match="must contain ToTensor"):
        plan(T.CenterCrop(8))
    assert plan(T.Compose([T.Resize(64), T.CenterCrop(8), T.ToTensor()])) == ([], [], 1, None)
    with pytest.raises(ValueError, match="scale"):
        T.RandomResizedCrop(8, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="p must be"):
        T.RandomHorizontalFlip(2.0)
    with pytest.raises(TypeError, match="dask_ddp.data.transforms"):
        T.Compose([tv.ToTensor()])  # type: ignore[list-item]


def test_transforms_are_callable_on_pil_via_torchvision() -> None:
    img = photo(100, 80)
    out = T.Compose([T.CenterCrop(32), T.ToTensor()])(img)
    assert isinstance(out, torch.Tensor) and out.shape == (3, 32, 32)


def test_uint8_output_is_a_quarter_of_the_bytes() -> None:
    data = encode(photo(100, 80), "jpeg")
    u8 = run(T.Compose([T.CenterCrop(32), T.PILToTensor()]), data)
    f32 = run(T.Compose([T.CenterCrop(32), T.ToTensor()]), data)
    assert u8.dtype == np.uint8 and f32.dtype == np.float32
    np.testing.assert_allclose(u8 / 255.0, f32, atol=1e-6)


@pytest.mark.parametrize("kind", ["jpeg", "jpeg-444", "jpeg-gray", "jpeg-cmyk", "jpeg-progressive"])
def test_region_decode_gives_the_same_pixels_as_a_full_decode(kind: str) -> None:
    train = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.PILToTensor()])
    evl = T.Compose([T.CenterCrop(100), T.PILToTensor()])
    regions = 0
    for i in range(12):
        w, h = 200 + 23 * i, 500 - 17 * i
        data = encode(photo(w, h, seed=i), kind)
        for t in (train, evl):
            plan = _core.sample_plan(
                w, h, t._ops(), 0, 0, i, scaled_decode=True, region_decode=True
            )
            regions += plan[3] is not None
            kw = {"index": i, "scaled_decode": True}
            full = _core.transform_image(data, t._ops(), region_decode=False, **kw)
            part = _core.transform_image(data, t._ops(), region_decode=True, **kw)
            np.testing.assert_array_equal(part, full)
    assert regions == 24


def test_region_decode_still_reports_truncation() -> None:
    data = encode(photo(300, 400, seed=1), "jpeg")
    cut = data[: len(data) * 3 // 4]  # the crop may lie entirely in the part that is left
    t = T.Compose([T.CenterCrop(8), T.PILToTensor()])
    with pytest.raises(OSError, match="truncated"):
        _core.transform_image(cut, t._ops(), region_decode=True, url="s3://b/cut.jpg")
