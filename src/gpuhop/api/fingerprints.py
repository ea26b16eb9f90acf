"""Certificate fingerprints as the agent prints them and clients pin them.

Runs on both sides: the agent prints the fingerprint of the certificate its TLS listener
presents; a client compares what a user pasted with what it fetched, and stores it with the
remote. Standard library only.

The display form is `SHA256:` and the SHA-256 of the certificate's DER bytes as uppercase
hex pairs joined by colons, as `openssl x509 -fingerprint -sha256` shows it.
"""

from __future__ import annotations

import hashlib
import re
import ssl

__all__ = ["fingerprint_of", "normalize_fingerprint"]

_PREFIX = re.compile(r"\ASHA-?256\s*[:=]?", re.IGNORECASE)
_SEPARATORS = re.compile(r"[\s:]+")
_HEX64 = re.compile(r"[0-9A-F]{64}\Z")


def fingerprint_of(pem: str) -> str:
    """The fingerprint of the (first) certificate in `pem`. Raises ValueError if there is none."""
    try:
        der = ssl.PEM_cert_to_DER_cert(_first_certificate(pem))
    except ValueError as e:
        raise ValueError(f"not a PEM certificate: {e}") from None
    return _display(hashlib.sha256(der).hexdigest())


def normalize_fingerprint(text: str) -> str:
    """`text` in the display form. Accepts "SHA256:AB:CD:...", "ab cd ...", or plain hex in
    any case; raises ValueError for anything that is not a SHA-256 fingerprint."""
    body = _PREFIX.sub("", text.strip())
    digits = _SEPARATORS.sub("", body).upper()
    if not _HEX64.match(digits):
        raise ValueError(
            f"{text!r} is not a SHA-256 fingerprint (64 hex digits, e.g. SHA256:AB:CD:...)"
        )
    return _display(digits)


def _display(hex_digits: str) -> str:
    digits = hex_digits.upper()
    return "SHA256:" + ":".join(digits[i : i + 2] for i in range(0, len(digits), 2))


def _first_certificate(pem: str) -> str:
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError("no BEGIN/END CERTIFICATE block")
    return pem[start : stop + len(end)] + "\n"
