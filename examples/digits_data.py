"""A real, learnable image folder built offline from scikit-learn's handwritten digits.

The demo needs images without internet: scikit-learn ships 1,797 8x8 digit scans. They are
upscaled to 32x32 RGB and written as an ImageFolder tree (``digit_0/ ... digit_9/``), half
PNG and half JPEG so both decoders run, to a local folder and optionally to an S3 bucket.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
from PIL import Image

logger = logging.getLogger(__name__)

IMAGE_SIZE = 32


def digit_images() -> list[tuple[str, bytes]]:
    """Encode every digit as ``(relative_key, file_bytes)``, sorted by key.

    Returns
    -------
    list of (str, bytes)
        Keys like ``digit_3/img_0042.png``.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    out: list[tuple[str, bytes]] = []
    for i, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        gray = (pixels * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
        img = Image.fromarray(gray, mode="L").resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
        img = img.convert("RGB")
        buf = io.BytesIO()
        if i % 2 == 0:
            img.save(buf, format="PNG")
            ext = "png"
        else:
            img.save(buf, format="JPEG", quality=95)
            ext = "jpg"
        out.append((f"digit_{int(label)}/img_{i:04d}.{ext}", buf.getvalue()))
    return sorted(out)


def write_local(root: Path) -> Path:
    """Write the digits image folder under ``root`` (skipped if already complete)."""
    images = digit_images()
    marker = root / ".complete"
    if marker.exists():
        return root
    for key, data in images:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    marker.write_text(str(len(images)))
    logger.info("wrote %d digit images to %s", len(images), root)
    return root


def write_s3(bucket: str, prefix: str, endpoint_url: str | None = None) -> str:
    """Upload the digits image folder to ``s3://bucket/prefix`` (creating the bucket)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint_url)
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    for key, data in digit_images():
        s3.put_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{key}", Body=data)
    return f"s3://{bucket}/{prefix.rstrip('/')}"
