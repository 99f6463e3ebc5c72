"""scikit-image's sample photos, from the files the GPU check's bundle copied from it.

``DASK_DDP_GPU_PHOTOS`` names the folder (build/gpu-bundle/photos).
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

FILES = {
    "astronaut": "astronaut.png",
    "coffee": "coffee.png",
    "chelsea": "chelsea.png",
    "rocket": "rocket.jpg",
    "immunohistochemistry": "ihc.png",
    "hubble_deep_field": "hubble_deep_field.jpg",
    "retina": "retina.jpg",
}


def _load(name: str) -> np.ndarray:
    folder = os.environ.get("DASK_DDP_GPU_PHOTOS")
    if not folder:
        raise RuntimeError("skimage stand-in: DASK_DDP_GPU_PHOTOS names no photo folder")
    with Image.open(os.path.join(folder, FILES[name])) as img:
        return np.asarray(img.convert("RGB"))


def __getattr__(name: str) -> object:
    if name in FILES:
        return lambda: _load(name)
    raise AttributeError(f"the skimage stand-in has no data.{name}")
