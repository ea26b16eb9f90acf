"""The blob upload framing: each blob is a 40-byte header, then exactly `size` bytes.

The header is the blob's raw sha256 (32 bytes) and its size (8 bytes, big-endian). Many
blobs travel back to back in one request body.
"""

import struct

FRAME_HEADER = struct.Struct(">32sQ")
