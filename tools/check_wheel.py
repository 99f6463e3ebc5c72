"""Checks an installed dask-ddp wheel: run by tools/check_wheel.sh inside a fresh virtual
environment, where the system copies of the libraries the wheel bundles may be hidden.

It imports the package (and says from where, and how long `import dask_ddp._core` took),
opens a file store and a memory store, and runs a Loader over a small folder of real JPEG
and PNG files, checking each sample against a direct transform of its file. With
``--bundled-only`` it fails unless every library the extension needs resolves into the
wheel (dask_ddp.libs) or to the manylinux baseline.
"""

from __future__ import annotations

import argparse
import io
import logging
import re
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("check_wheel")

# The manylinux baseline (PEP 600 / auditwheel policy): libraries a wheel may use from the
# system. Anything else _core needs from outside the wheel means it is not self-contained.
BASELINE = re.compile(
    r"/(ld-linux[^/]*|libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|libutil|libnsl"
    r"|libcrypt|libresolv|libanl|libX11|libXext|libXrender|libICE|libSM|libGL|libgobject-2\.0"
    r"|libgthread-2\.0|libglib-2\.0|libz)[.-][^/]*$"
)


def check_import(expect_under: Path | None) -> None:
    # The dependencies first, so that the second figure is dask_ddp's own import cost
    # (its Python modules and loading _core with its bundled libraries).
    t0 = time.perf_counter()
    import dask.distributed  # noqa: F401, PLC0415
    import numpy  # noqa: F401, PLC0415
    import torch  # noqa: F401, PLC0415

    t1 = time.perf_counter()
    import dask_ddp  # noqa: PLC0415
    import dask_ddp._core as core  # noqa: PLC0415

    t2 = time.perf_counter()
    pkg = Path(dask_ddp.__file__).resolve().parent
    log.info("dask_ddp from %s (%s)", pkg, Path(core.__file__).name)
    log.info(
        "import time: torch+numpy+distributed %.3f s, then dask_ddp with _core %.3f s",
        t1 - t0,
        t2 - t1,
    )
    if expect_under is not None and expect_under.resolve() not in pkg.parents:
        raise SystemExit(f"dask_ddp was imported from {pkg}, not from under {expect_under}")


def check_stores(tmp: Path) -> None:
    from dask_ddp import storage  # noqa: PLC0415

    for url in (str(tmp / "store"), "memory://check-wheel"):
        store = storage.open(url)
        store.put("a/b.bin", b"hello wheel")
        got = store.get("a/b.bin")
        keys = [o.key for o in store.list("a/")]
        if got != b"hello wheel" or keys != ["a/b.bin"]:
            raise SystemExit(f"{url}: put/get/list gave {got!r}, {keys}")
        log.info("store %s: put, get, list ok", store.url)


def make_folder(root: Path) -> None:
    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(0)
    for c, cls in enumerate(("cat", "dog")):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            h, w = 40 + 7 * i, 60 - 3 * i + c
            yy, xx = np.mgrid[0:h, 0:w]
            px = np.stack([xx * 4, yy * 5, (xx + yy) * 2], axis=-1) % 256
            px = (px + rng.integers(0, 20, px.shape)).clip(0, 255).astype(np.uint8)
            buf = io.BytesIO()
            fmt = "JPEG" if i % 2 == 0 else "PNG"
            Image.fromarray(px).save(buf, fmt)
            (root / cls / f"{i}.{fmt.lower().replace('jpeg', 'jpg')}").write_bytes(buf.getvalue())


def check_loader(tmp: Path) -> None:
    import numpy as np  # noqa: PLC0415

    from dask_ddp import _core  # noqa: PLC0415
    from dask_ddp.data import ImageFolder, Loader  # noqa: PLC0415
    from dask_ddp.data import transforms as T  # noqa: PLC0415

    folder = tmp / "images"
    make_folder(folder)
    ds = ImageFolder(folder)
    t = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()])
    loader = Loader(ds, 5, transform=t, shuffle=False, num_threads=2)
    seen = 0
    t0 = time.perf_counter()
    for images, labels in loader:
        if tuple(images.shape[1:]) != (3, 32, 32):
            raise SystemExit(f"Loader batch shape {tuple(images.shape)}, expected (N, 3, 32, 32)")
        for k in range(images.shape[0]):
            path, target = ds.samples[seen]
            want = _core.transform_image(Path(path).read_bytes(), t._ops(), scaled_decode=True)
            if not np.array_equal(images[k].numpy(), want) or labels[k].item() != target:
                raise SystemExit(f"Loader sample {seen} ({path}) differs from its file")
            seen += 1
    if seen != len(ds) or seen != 12:
        raise SystemExit(f"Loader gave {seen} samples of {len(ds)}")
    # And the training path: random crops and flips, uint8 output.
    train = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.PILToTensor()])
    n = sum(x.shape[0] for x, _ in Loader(ds, 4, transform=train, seed=1))
    if n != 12:
        raise SystemExit(f"training Loader gave {n} samples, expected 12")
    log.info("Loader over %d files (JPEG and PNG) ok, %.3f s", seen, time.perf_counter() - t0)


def check_bundled_only() -> None:
    """Every library _core needs resolves into the wheel or to the manylinux baseline."""
    import subprocess  # noqa: PLC0415

    from dask_ddp import _core  # noqa: PLC0415

    out = subprocess.run(["ldd", _core.__file__], check=True, capture_output=True, text=True).stdout
    bundled, outside = [], []
    for line in out.splitlines():
        name, _, where = line.strip().partition(" => ")
        path = where.split(" (")[0].strip()
        if "not found" in where:
            outside.append(f"{name} (not found)")
        elif "dask_ddp.libs/" in path:
            bundled.append(Path(path).name)
        elif path and not BASELINE.search(path):
            outside.append(path)
    log.info("_core's libraries from the wheel: %s", ", ".join(sorted(bundled)) or "none")
    if not bundled:
        raise SystemExit("_core uses no library from dask_ddp.libs: is this a repaired wheel?")
    if outside:
        raise SystemExit(
            "_core needs libraries outside the wheel and the baseline: " + ", ".join(outside)
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--expect-under", type=Path, help="dask_ddp must be imported from under here")
    p.add_argument(
        "--bundled-only",
        action="store_true",
        help="fail if _core needs a non-baseline library from outside the wheel",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="check_wheel: %(message)s", stream=sys.stdout)
    check_import(args.expect_under)
    with tempfile.TemporaryDirectory() as tmp:
        check_stores(Path(tmp))
        check_loader(Path(tmp))
    if args.bundled_only:
        check_bundled_only()
    log.info("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
