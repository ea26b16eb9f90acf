"""Runs on the GPU host: the agent's optional TCP listener (TLS, its certificate, its socket).

Off by default. `--listen HOST:PORT` opens it, TLS-only unless the host is a loopback
address and `--no-tls` was given. Without `--tls-cert/--tls-key` the agent makes its own
self-signed certificate on first start (EC P-256, in `tls/` of the state dir, key 0600) and
reuses it later, so the fingerprint clients pinned stays valid across restarts.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from gpuhop.api import ListenerInfo, fingerprint_of
from gpuhop.home import AgentError, AgentPaths

CERT_NAME = "cert.pem"
KEY_NAME = "key.pem"
CERT_DAYS = 10 * 365


@dataclass(frozen=True)
class ListenSpec:
    """What `--listen`, `--no-tls`, `--tls-cert` and `--tls-key` asked for."""

    host: str
    port: int
    tls: bool = True
    cert: Path | None = None
    key: Path | None = None

    def args(self) -> list[str]:
        """The same request as `python -m gpuhop.agent` arguments."""
        out = ["--listen", join_host_port(self.host, self.port)]
        if not self.tls:
            out.append("--no-tls")
        if self.cert is not None and self.key is not None:
            out += ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]
        return out


def parse_listen(
    text: str, tls: bool = True, cert: Path | None = None, key: Path | None = None
) -> ListenSpec:
    """Check a listen request; raises AgentError with what to do instead."""
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise AgentError(
            f"--listen {text!r}: give HOST:PORT, e.g. 0.0.0.0:8443, 127.0.0.1:0 or [::1]:8443"
        )
    if (cert is None) != (key is None):
        raise AgentError("--tls-cert and --tls-key go together: give both or neither")
    if not tls and cert is not None:
        raise AgentError("--no-tls cannot be combined with --tls-cert/--tls-key")
    if not tls and not is_loopback(host):
        raise AgentError(
            f"refusing to listen on {host} without TLS: tokens would cross the network in"
            " clear text. --no-tls is accepted only for loopback addresses (127.0.0.1, ::1,"
            " localhost); drop it and the agent serves HTTPS with its own certificate"
        )
    for path in (cert, key):
        if path is not None and not path.is_file():
            raise AgentError(f"no such file: {path}")
    return ListenSpec(
        host,
        int(port_text),
        tls,
        cert.absolute() if cert else None,
        key.absolute() if key else None,
    )


def is_loopback(host: str) -> bool:
    """Whether every address `host` stands for is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos
    )


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(spec: ListenSpec) -> socket.socket:
    """The listening TCP socket, bound before the server starts (port 0: any free port)."""
    try:
        infos = socket.getaddrinfo(
            spec.host, spec.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as e:
        raise AgentError(f"cannot listen on {spec.host}: {e}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Inherited by every accepted connection: small answers are not held back for the
        # client's delayed ACK (about 40 ms each).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise AgentError(
            f"cannot listen on {join_host_port(spec.host, spec.port)}: {e.strerror}"
        ) from None
    sock.set_inheritable(False)
    return sock


def certificate(paths: AgentPaths, spec: ListenSpec) -> tuple[Path, Path, str]:
    """The certificate and key the listener serves with (checked), and the fingerprint."""
    if spec.cert is not None and spec.key is not None:
        cert, key = spec.cert, spec.key
    else:
        cert, key = ensure_certificate(paths, spec.host)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        raise AgentError(f"cannot use the certificate {cert} with the key {key}: {e}") from None
    try:
        fingerprint = fingerprint_of(cert.read_text())
    except (OSError, ValueError) as e:
        raise AgentError(f"cannot read the certificate {cert}: {e}") from None
    return cert, key, fingerprint


def ensure_certificate(paths: AgentPaths, listen_host: str) -> tuple[Path, Path]:
    """The agent's own certificate and key: made on first use, reused after."""
    cert, key = paths.tls / CERT_NAME, paths.tls / KEY_NAME
    if cert.is_file() and key.is_file():
        return cert, key
    paths.tls.mkdir(mode=0o700, exist_ok=True)
    os.chmod(paths.tls, 0o700)
    cert_pem, key_pem = make_self_signed(_names(listen_host))
    _write_private(key, key_pem)
    _write_private(cert, cert_pem, mode=0o644)
    return cert, key


def _names(listen_host: str) -> list[str]:
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
    with contextlib.suppress(OSError):
        names.append(socket.getfqdn())
    unspecified = listen_host in ("0.0.0.0", "::", "")
    if not unspecified:
        names.append(listen_host)
    return list(dict.fromkeys(n for n in names if n))


def make_self_signed(names: list[str]) -> tuple[bytes, bytes]:
    """A self-signed server certificate for `names` (DNS names and IPs): (cert, key) PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"gpuhop agent on {socket.gethostname()}")]
    )
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def listener_info(sock: socket.socket, spec: ListenSpec, fingerprint: str | None) -> ListenerInfo:
    host, port = sock.getsockname()[:2]
    address = join_host_port(host, port)
    return ListenerInfo(
        address=address,
        url=f"{'https' if spec.tls else 'http'}://{address}",
        tls=spec.tls,
        fingerprint=fingerprint,
    )


def write_listen_file(paths: AgentPaths, info: ListenerInfo) -> None:
    tmp = paths.listen_file.with_name(paths.listen_file.name + ".tmp")
    tmp.write_text(info.model_dump_json(indent=2) + "\n")
    os.replace(tmp, paths.listen_file)


def read_listen_file(paths: AgentPaths) -> ListenerInfo | None:
    """What the running agent's TCP listener is, if it has one."""
    try:
        return ListenerInfo.model_validate_json(paths.listen_file.read_bytes())
    except (OSError, ValueError):
        return None
