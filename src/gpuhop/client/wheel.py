"""Runs on the user's machine: a wheel of the gpuhop that is running, for `remote bootstrap`.

The GPU host gets exactly this version, whether it was installed from a wheel or is an
editable checkout: the wheel is made from the imported package's own files and its
installed metadata (dependencies and entry points included). It is byte-for-byte
reproducible, so its digest says whether a host is up to date.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from importlib import metadata
from pathlib import Path

from gpuhop.version import __version__

# A fixed timestamp makes the archive depend on the content only.
EPOCH = (1980, 1, 1, 0, 0, 0)
SKIP_DIRS = {"__pycache__"}
# The chunker's C library is built for this machine (the host's gpuhop chunks with numpy).
SKIP_SUFFIXES = (".pyc", ".pyo", ".so")


def build_wheel() -> tuple[str, bytes]:
    """The file name and bytes of a py3-none-any wheel of the running gpuhop."""
    version = __version__
    dist_info = f"gpuhop-{version}.dist-info"
    files: list[tuple[str, bytes]] = []
    package = Path(__file__).parents[1]  # the gpuhop package this module is part of
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package)
        if path.is_dir() or SKIP_DIRS & set(rel.parts) or path.suffix in SKIP_SUFFIXES:
            continue
        files.append((f"gpuhop/{rel.as_posix()}", path.read_bytes()))
    dist = metadata.distribution("gpuhop")
    meta = (
        dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: gpuhop\nVersion: {version}\n"
    )
    files.append((f"{dist_info}/METADATA", meta.encode()))
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        files.append((f"{dist_info}/entry_points.txt", entry_points.encode()))
    wheel_info = "Wheel-Version: 1.0\nGenerator: gpuhop\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files.append((f"{dist_info}/WHEEL", wheel_info.encode()))
    record = "".join(f"{name},sha256={_b64(data)},{len(data)}\n" for name, data in files)
    record += f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode()))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return f"gpuhop-{version}-py3-none-any.whl", buf.getvalue()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
