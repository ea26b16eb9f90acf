"""Runs on the user's machine: reaching a team agent's TLS listener with a pinned certificate.

`gpuhop remote add team https://host:port` fetches the certificate the agent presents
(`fetch_certificate`), checks its fingerprint against the one the agent printed, and stores
both with the remote. Every later connection trusts exactly that certificate and nothing
else (no CA bundle, no host name check: the pin is stronger than either), and carries the
remote's bearer token.
"""

from __future__ import annotations

import datetime
import os
import socket
import ssl
from urllib.parse import urlsplit

from gpuhop.api import fingerprint_of, normalize_fingerprint
from gpuhop.client.errors import GpuhopError
from gpuhop.client.transport.base import Endpoint
from gpuhop.client.transport.remotes import Remote

__all__ = [
    "fetch_certificate",
    "fingerprint_of",
    "https_endpoint",
    "normalize_fingerprint",
    "pinned_context",
    "validity_problem",
]

TOKEN_ENV = "GPUHOP_TOKEN"


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "https" or not parts.hostname or port is None:
        raise GpuhopError(f"bad agent URL {url!r}: expected https://host:port", "bad_request")
    return parts.hostname, port


def fetch_certificate(url: str, timeout: float = 5) -> tuple[str, str]:
    """The certificate (PEM) the agent at https://host:port presents, and its fingerprint.

    Nothing is verified: this is for a person to confirm against the fingerprint the agent
    printed, and for pinning it after.
    """
    host, port = _host_port(url)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except TimeoutError:
        raise GpuhopError(no_answer(url, timeout), code="unreachable") from None
    except (OSError, ssl.SSLError) as e:
        raise GpuhopError(
            f"cannot fetch the certificate of {url}: {e}", code="unreachable"
        ) from None
    if not der:
        raise GpuhopError(f"{url} presented no certificate", code="unreachable")
    pem = ssl.DER_cert_to_PEM_cert(der)
    return pem, fingerprint_of(pem)


def validity_problem(pem: str, now: datetime.datetime | None = None) -> str | None:
    """Why the certificate `pem` is not valid `now` (it expired, or is not valid yet), in
    words; None while it is. A pin does not stand in for the dates: TLS still checks them,
    so a pinned certificate past its end is refused like any other."""
    from cryptography import x509

    now = now or datetime.datetime.now(datetime.UTC)
    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
    except ValueError:
        return None
    if now > cert.not_valid_after_utc:
        return f"it expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    if now < cert.not_valid_before_utc:
        return f"it is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    return None


def no_answer(url: str, seconds: float) -> str:
    """What a listener that took the connection and never answered is told as."""
    return (
        f"no answer from {url} within {seconds:g} s: is a gpuhop agent listening there"
        " (gpuhop agent start --listen), and not something else, or a frozen one?"
    )


def pinned_context(pem: str) -> ssl.SSLContext:
    """A client context that trusts exactly the certificate `pem` and nothing else."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # The pinned certificate is the only trust anchor; PARTIAL_CHAIN lets a self-signed
    # leaf anchor itself. Host names are not checked: the pin already names the server
    # more precisely than a host name could, and agents are often reached by IP or alias.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cadata=pem)
    except (ssl.SSLError, ValueError) as e:
        raise GpuhopError(f"the pinned certificate cannot be loaded: {e}", "bad_config") from None
    return context


# A request's connect timeout (the session's): TCP and the TLS handshake.
CONNECT_SECONDS = 5.0


def https_endpoint(remote: Remote) -> Endpoint:
    """The endpoint of an https remote: its pinned certificate and its token.

    $GPUHOP_TOKEN, when set, is sent instead of the token stored with the remote.
    """
    host, port = _host_port(remote.url)
    readd = f"`gpuhop remote add {remote.name} {remote.url} --replace --fingerprint SHA256:...`"
    if not remote.certificate or not remote.fingerprint:
        raise GpuhopError(
            f"remote {remote.name!r} has no pinned certificate; add it again with {readd}",
            code="bad_config",
        )
    try:
        pinned = normalize_fingerprint(remote.fingerprint)
        stored = fingerprint_of(remote.certificate)
    except ValueError as e:
        raise GpuhopError(
            f"remote {remote.name!r}: {e}; add it again with {readd}", "bad_config"
        ) from None
    if stored != pinned:
        raise GpuhopError(
            f"remote {remote.name!r}: the stored certificate ({stored}) is not the pinned"
            f" fingerprint {pinned}; add it again with {readd}",
            code="bad_config",
        )
    token = os.environ.get(TOKEN_ENV) or remote.token
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def explain(exc: BaseException) -> str | None:
        import httpx  # loaded already: the TLS way in is httpx's

        if isinstance(exc, httpx.ConnectTimeout):  # TCP, or TLS's handshake, unanswered
            return no_answer(remote.url, CONNECT_SECONDS)
        if not _is_verification_failure(exc):
            return None
        try:
            _, presented = fetch_certificate(remote.url, timeout=5)
        except GpuhopError:
            presented = "unknown"
        if presented == pinned:
            # The pinned certificate itself, refused for its dates: a new pin of the same
            # one would be refused alike.
            why = validity_problem(remote.certificate or "") or "it failed verification"
            return (
                f"the agent of remote {remote.name!r} presents its pinned certificate"
                f" ({pinned}), but {why} (or this machine's clock is wrong): ask the agent's"
                " admin to renew it, then pin the new one with"
                f" `gpuhop remote add {remote.name} {remote.url} --replace --fingerprint NEW`"
                " (your token is kept)"
            )
        return (
            f"the certificate of remote {remote.name!r} ({presented}) does not match the"
            f" pinned fingerprint {pinned}; if it was replaced on purpose, run"
            f" `gpuhop remote add {remote.name} {remote.url} --replace --fingerprint NEW`"
            " (your token is kept)"
        )

    return Endpoint(
        description=f"remote {remote.name!r} ({remote.url})",
        base_url=f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}",
        ssl_context=pinned_context(remote.certificate),
        headers=headers,
        reachable=lambda: _tcp_answers(host, port),
        explain=explain,
    )


def _is_verification_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(10):  # httpx wraps httpcore's error, which wraps the ssl one
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        if "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _tcp_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
