"""8x8 digits drawn here, as the UCI handwritten digits were made, so nothing is downloaded.

Each digit is one of ten 5x7 glyphs, drawn on a 32x32 bitmap at a random size, slant and
position, with a few stray pixels of ink and a few missing; the bitmap is then counted in 4x4
blocks (0 to 16 inked pixels each), which is how the UCI set's 8x8 images were made from its
32x32 scans. Only numpy: the same data on a laptop and on the GPU host, for the same seed.
"""

import numpy as np

GLYPHS = (
    "01110 10001 10011 10101 11001 10001 01110",
    "00100 01100 00100 00100 00100 00100 01110",
    "01110 10001 00001 00010 00100 01000 11111",
    "11110 00001 00001 01110 00001 00001 11110",
    "00010 00110 01010 10010 11111 00010 00010",
    "11111 10000 11110 00001 00001 10001 01110",
    "00110 01000 10000 11110 10001 10001 01110",
    "11111 00001 00010 00100 01000 01000 01000",
    "01110 10001 10001 01110 10001 10001 01110",
    "01110 10001 10001 01111 00001 00010 01100",
)
FONT = np.array([[[c == "1" for c in row] for row in g.split()] for g in GLYPHS])  # (10, 7, 5)
SIDE = 32  # the bitmap a digit is drawn on; counted in 4x4 blocks into 8x8


def draw(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` digits, about as many of each: images (n, 8, 8) of counts 0..16, and labels."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 10)
    width, height = rng.uniform(3.0, 4.6, n), rng.uniform(3.0, 4.2, n)  # a glyph cell, in px
    slant = rng.uniform(-0.35, 0.35, n)
    centre_y, centre_x = SIDE / 2 + rng.normal(0, 1.5, (2, n))
    y, x = np.mgrid[0:SIDE, 0:SIDE] + 0.5
    dy = y[None] - centre_y[:, None, None]
    dx = x[None] - centre_x[:, None, None] - slant[:, None, None] * dy
    row = np.floor(dy / height[:, None, None] + 3.5).astype(int)
    col = np.floor(dx / width[:, None, None] + 2.5).astype(int)
    inside = (row >= 0) & (row < 7) & (col >= 0) & (col < 5)
    glyph = FONT[labels[:, None, None], row.clip(0, 6), col.clip(0, 4)]
    ink = inside & glyph
    ink ^= rng.random(ink.shape) < 0.04  # stray ink, and gaps in the strokes
    images = ink.reshape(n, 8, 4, 8, 4).sum(axis=(2, 4))
    return images.astype("float32"), labels.astype("int64")
