"""Certificates for the TLS tests, made with `cryptography` for the dates a test asks
(expired, not valid yet, expiring soon), and a TLS server on loopback that presents one
whatever its dates (an agent refuses to start with one expired or not valid yet)."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DAY = datetime.timedelta(days=1)


def certificate(
    root: Path,
    starts: datetime.timedelta,
    ends: datetime.timedelta,
    name: str = "server",
) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, valid from now + `starts` to now + `ends`,
    and its key, written to ROOT/NAME.crt and ROOT/NAME.key (mode 0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"a test's {name}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + starts)
        .not_valid_after(now + ends)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = root / f"{name}.crt", root / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def expired_certificate(root: Path, name: str = "expired") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that expired yesterday, and its key."""
    return certificate(root, -90 * DAY, -DAY, name)


@contextmanager
def tls_server(cert: Path, key: Path) -> Iterator[str]:
    """An HTTPS server on loopback presenting `cert` (whatever its dates: OpenSSL serves an
    expired one); its https://127.0.0.1:PORT URL. It answers 404 to every request."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
