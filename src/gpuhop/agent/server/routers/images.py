"""Runs in the agent: /v1/images, the host's container images (list, pull)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpuhop.agent.callers import caller_of
from gpuhop.agent.services import images
from gpuhop.agent.services.longcalls import long_call
from gpuhop.api.images import ImageInfo, ImagePull

router = APIRouter(prefix="/v1/images", tags=["images"])


@router.get("")
def list_images(request: Request) -> list[ImageInfo]:
    """The images the caller may see: an admin every one, a user those their pulls and jobs
    used."""
    return images.list_images(request.app.state.ctx, caller_of(request))


@router.post("/pull")
def pull(body: ImagePull, request: Request) -> ImageInfo:
    """Pull an image from its registry (with the caller's secret holding user:password where
    it is private); answers once it is on the host."""
    with long_call(request, "an image pull"):
        return images.pull(request.app.state.ctx, body, caller_of(request))
