"""Put drawn 8x8 digits in a bucket as PNG files, one folder per class, for `train.py`.

    python examples/bucket/upload.py s3://my-bucket/digits          # 600 images
    gpuhop run --data s3://my-bucket/digits:digits examples/bucket/train.py

boto3 signs with your usual AWS configuration (AWS_ENDPOINT_URL for a MinIO or another
S3-compatible server); gpuhop's fetch signs with your gpuhop secrets of the same names
(`gpuhop secret set AWS_ACCESS_KEY_ID`, ...). The digits are drawn by
../digits/drawn_digits.py: only numpy and boto3 here, no download.
"""

import argparse
import struct
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "digits"))
from drawn_digits import draw


def png(image: np.ndarray) -> bytes:
    """An 8-bit grayscale PNG of `image` (rows of 0..255)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    height, width = image.shape
    rows = b"".join(b"\0" + bytes(row) for row in image.astype(np.uint8))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = chunk(b"IDAT", zlib.compress(rows))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + pixels + chunk(b"IEND", b"")


def upload(s3, url: str, n: int, seed: int = 0) -> list[str]:
    """Put `n` digits under `url` (s3://BUCKET/PREFIX) as PREFIX/LABEL/INDEX.png; the keys."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    images, labels = draw(n, seed)
    keys = [f"{prefix.strip('/')}/{label}/{i:05d}.png" for i, label in enumerate(labels)]

    def put(i: int) -> None:
        s3.put_object(Bucket=bucket, Key=keys[i], Body=png(images[i] * 255 // 16))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(n)))
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="s3://BUCKET/PREFIX")
    parser.add_argument("--count", type=int, default=600)
    args = parser.parse_args()
    keys = upload(boto3.client("s3"), args.url, args.count)
    print(f"put {len(keys)} PNG files under {args.url}")


if __name__ == "__main__":
    main()
