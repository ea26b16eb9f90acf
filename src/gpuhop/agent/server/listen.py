"""Runs on the GPU host: the agent's optional TCP listener (TLS, its certificate, its socket).

Off by default. `--listen HOST:PORT` opens it, TLS-only unless the host is a loopback
address and `--no-tls` was given. Without `--tls-cert/--tls-key` the agent makes its own
self-signed certificate on first start (EC P-256, in `tls/` of the state dir, key 0600) and
reuses it later, so the fingerprint clients pinned stays valid across restarts.

A certificate is checked before anything starts (`check_pair`): one that expired, is not
valid yet, or whose key is not its own stops the agent, saying which. One that expires
within two weeks is served, with a warning in the agent's log at start and daily after
(`duties.runner.CertificateExpiry`; `gpuhop doctor` says it too). The agent's own
certificate is not renewed while it is valid, since that would break every client's pin;
its warning says how to renew it. Once it has expired, no pin of it works any more, so the
next start makes a new one, logs both fingerprints, and prints the new one to pin.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import logging
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
    if cert is not None and key is not None:
        # Here, not only when serving: `gpuhop agent start` refuses before starting anything.
        check_pair(cert, key)
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


@dataclass(frozen=True)
class ServedCertificate:
    """The certificate the listener serves: its files, fingerprint and dates."""

    cert: Path
    key: Path
    fingerprint: str
    expires: datetime.datetime
    own: bool  # the agent's self-signed one (in its state dir), not --tls-cert's


def certificate(paths: AgentPaths, spec: ListenSpec) -> ServedCertificate:
    """The certificate and key the listener serves with, checked (see `check_pair`)."""
    if spec.cert is not None and spec.key is not None:
        cert, key = spec.cert, spec.key
        expires = check_pair(cert, key)
        own = False
    else:
        cert, key = ensure_certificate(paths, spec.host)
        expires = check_pair(cert, key, own=True)
        own = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        raise AgentError(f"cannot use the certificate {cert} with the key {key}: {e}") from None
    try:
        fingerprint = fingerprint_of(cert.read_text())
    except (OSError, ValueError) as e:
        raise AgentError(f"cannot read the certificate {cert}: {e}") from None
    return ServedCertificate(cert, key, fingerprint, expires, own)


def check_pair(
    cert: Path, key: Path, now: datetime.datetime | None = None, own: bool = False
) -> datetime.datetime:
    """Check that `cert` holds a certificate valid `now` and `key` its private key; returns
    when the certificate expires. Raises AgentError saying which is wrong and what to do.
    `own`: the agent's own certificate, whose advice differs (it is made, not given)."""
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    except OSError as e:
        raise AgentError(f"cannot read the certificate {cert}: {e.strerror}") from None
    except ValueError:
        raise AgentError(
            f"{cert} is not a PEM certificate (-----BEGIN CERTIFICATE-----): give --tls-cert"
            " the server's certificate, and its chain after it if it has one"
        ) from None
    try:
        private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    except OSError as e:
        raise AgentError(f"cannot read the key {key}: {e.strerror}") from None
    except TypeError:
        raise AgentError(
            f"the key {key} is encrypted, and the agent cannot ask for its passphrase: give"
            " --tls-key an unencrypted copy (e.g. `openssl pkey -in KEY -out KEY.plain`),"
            " readable by the agent's user only"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise AgentError(
            f"{key} is not a PEM private key (-----BEGIN PRIVATE KEY-----): give --tls-key"
            " the key the certificate was issued for"
        ) from None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if private.public_key().public_bytes(*spki) != loaded.public_key().public_bytes(*spki):
        raise AgentError(
            f"the key {key} does not match the certificate {cert}: it is another key than"
            " the one the certificate was issued for; give the pair's own key"
        )
    now = now or datetime.datetime.now(datetime.UTC)
    if now >= loaded.not_valid_after_utc:
        raise AgentError(
            f"the certificate {cert} expired on {_date(loaded.not_valid_after_utc)}: clients"
            " refuse it; renew it and start the agent with the new one (if it has not"
            " expired, this host's clock is wrong)"
        )
    if now < loaded.not_valid_before_utc:
        fix = (
            f"or remove {cert} and {key} to make a new certificate (clients then pin it again)"
            if own
            else "or wait until then"
        )
        raise AgentError(
            f"the certificate {cert} is not valid before {_date(loaded.not_valid_before_utc)},"
            f" and it is {_date(now)} here: correct this host's clock if it is wrong, {fix}"
        )
    return loaded.not_valid_after_utc


def _date(when: datetime.datetime) -> str:
    return f"{when.astimezone(datetime.UTC):%Y-%m-%d %H:%M} UTC"


def ensure_certificate(paths: AgentPaths, listen_host: str) -> tuple[Path, Path]:
    """The agent's own certificate and key: made on first use, reused after, and made anew
    once expired (no pin of an expired one works; the new fingerprint is logged)."""
    cert, key = paths.tls / CERT_NAME, paths.tls / KEY_NAME
    if cert.is_file() and key.is_file():
        old = _expired(cert)
        if old is None:
            return cert, key
        logging.getLogger("gpuhop.agent").warning(
            "the agent's own TLS certificate %s (%s) expired on %s; making a new one: every"
            " client pins it again with `gpuhop remote add NAME URL --replace --fingerprint"
            " NEW` (tokens are kept)",
            cert,
            old[0],
            _date(old[1]),
        )
    paths.tls.mkdir(mode=0o700, exist_ok=True)
    os.chmod(paths.tls, 0o700)
    cert_pem, key_pem = make_self_signed(_names(listen_host))
    _write_private(key, key_pem)
    _write_private(cert, cert_pem, mode=0o644)
    return cert, key


def _expired(cert: Path) -> tuple[str, datetime.datetime] | None:
    """(fingerprint, end) of the certificate in `cert` if it has expired; None if not, or
    if it cannot be read (`check_pair` says why then)."""
    from cryptography import x509

    try:
        pem = cert.read_bytes()
        loaded = x509.load_pem_x509_certificate(pem)
        fingerprint = fingerprint_of(pem.decode())
    except (OSError, ValueError):
        return None
    end = loaded.not_valid_after_utc
    return (fingerprint, end) if datetime.datetime.now(datetime.UTC) >= end else None


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


def listener_info(
    sock: socket.socket, spec: ListenSpec, served: ServedCertificate | None
) -> ListenerInfo:
    host, port = sock.getsockname()[:2]
    address = join_host_port(host, port)
    return ListenerInfo(
        address=address,
        url=f"{'https' if spec.tls else 'http'}://{address}",
        tls=spec.tls,
        fingerprint=served.fingerprint if served else None,
        expires=served.expires if served else None,
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
