"""Runs in the agent: GET /metrics, the agent's figures in Prometheus' exposition format.

Behind the same authentication as every route: the Unix socket's owner, or any valid
bearer token on the TCP listener (a request without one gets 401 there, like any other).
Any user's token may scrape, not only an admin's: the figures are host-wide aggregates
(jobs per state, queue length, GPU load and memory, run times) of the kind every user
already sees in `gpuhop gpus` and `/v1/agent`, with no job names or users in them (job
ids label only the per-job GPU energy and GPU time counters, each caller's own jobs' alone,
every job's for an admin: see `server.metrics`).
The format follows the scraper's Accept header: OpenMetrics for Prometheus, the classic
text format (0.0.4) otherwise.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client.exposition import choose_encoder

from gpuhop.agent.callers import caller_of
from gpuhop.agent.server import metrics

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def scrape(request: Request) -> Response:
    caller = caller_of(request)  # fails closed if the app runs without an auth middleware
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    body = encode(metrics.registry(request.app.state.ctx, caller))
    return Response(body, media_type=content_type)
