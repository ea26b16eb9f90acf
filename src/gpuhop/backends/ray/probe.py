"""Runs on the agent's host (in a short-lived subprocess of the agent, and in each job's
leader): asks a Ray cluster's GCS whether it enforces token authentication, and which
nodes and GPUs it has.

It talks to the GCS over gRPC with Ray's own generated stubs, once without a token and
then with the token Ray's loader finds ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, or
~/.ray/auth_token), and never becomes a Ray driver: a dead address fails within `timeout`
instead of hanging in `ray.init`. A cluster that answers the call without a token does
not enforce authentication.

`python -m gpuhop.backends.ray.probe ADDRESS` prints one JSON object: {"auth": bool,
"nodes": [...]} or {"error": "..."}.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gpuhop.runtime.iri import skip_iri_grammar

TOKEN_DOCS = "https://docs.ray.io/en/latest/ray-security/token-auth.html"


class ProbeError(Exception):
    """The cluster cannot be used; the message says why and what to do."""


def probe(address: str, timeout: float = 10.0) -> dict[str, Any]:
    """{"auth": whether the cluster enforces token auth, "nodes": its live nodes}."""
    import grpc

    try:
        reply = _node_info(address, (), timeout)
        return {"auth": False, "nodes": _nodes(reply)}
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAUTHENTICATED:
            raise ProbeError(_unreachable(address, e)) from None
    token = _token()
    if token is None:
        raise ProbeError(
            f"the Ray cluster at {address} requires a token and none was found: give the agent"
            " --ray-token-file FILE (`ray get-auth-token` on the head node prints it), or set"
            " RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH in its environment"
        )
    try:
        reply = _node_info(address, (("authorization", f"Bearer {token}"),), timeout)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise ProbeError(
                f"the Ray cluster at {address} refused gpuhop's token: it is not this"
                " cluster's (`ray get-auth-token` on the head node prints the right one)"
            ) from None
        raise ProbeError(_unreachable(address, e)) from None
    return {"auth": True, "nodes": _nodes(reply)}


def _node_info(address: str, metadata: tuple[tuple[str, str], ...], timeout: float) -> Any:
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with _channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        request = gcs_service_pb2.GetAllNodeInfoRequest()  # type: ignore[attr-defined, unused-ignore]
        return stub.GetAllNodeInfo(request, timeout=timeout, metadata=metadata)


def _channel(address: str) -> Any:
    """A channel with no token interceptor (unlike Ray's own factory in token mode), over
    TLS when the cluster uses it (RAY_USE_TLS and its certificate variables, as Ray reads
    them)."""
    import os

    import grpc

    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        from ray._common.tls_utils import load_certs_from_env

        chain, key, ca = load_certs_from_env()
        credentials = grpc.ssl_channel_credentials(
            certificate_chain=chain, private_key=key, root_certificates=ca
        )
        return grpc.secure_channel(address, credentials)
    return grpc.insecure_channel(address)


def _token() -> str | None:
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined, unused-ignore]

    loader = AuthenticationTokenLoader.instance()
    if not loader.has_token(ignore_auth_mode=True):
        return None
    token = loader.get_raw_token(ignore_auth_mode=True)
    return str(token) if token else None


def _unreachable(address: str, error: Any) -> str:
    return (
        f"cannot reach the Ray cluster at {address} ({error.code().name}: {error.details()})."
        " Is Ray running there (`ray start --head`), and is this its GCS address, HOST:PORT"
        " (port 6379 unless --port was given)?"
    )


def _nodes(reply: Any) -> list[dict[str, Any]]:
    nodes = []
    for n in reply.node_info_list:
        if n.state != 0:  # GcsNodeState.ALIVE
            continue
        resources = dict(n.resources_total)
        accelerator = next(
            (k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), None
        )
        nodes.append(
            {
                "node_id": n.node_id.hex(),
                "address": n.node_manager_address,
                "name": n.node_name or n.node_manager_hostname,
                "head": bool(n.is_head_node),
                "gpus": int(resources.get("GPU", 0)),
                "cpus": resources.get("CPU", 0.0),
                "accelerator": accelerator,
            }
        )
    return nodes


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpuhop.backends.ray.probe ADDRESS", file=sys.stderr)
        return 2
    skip_iri_grammar()
    try:
        print(json.dumps(probe(argv[0])))
    except ProbeError as e:
        print(json.dumps({"error": str(e)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
