"""Runs on the user's machine: the GPU host's container images (list, pull)."""

from __future__ import annotations

from gpuhop.api.images import ImageInfo, ImagePull
from gpuhop.client.session import Session
from gpuhop.client.transport.unixhttp import Timeout


def list_images(session: Session) -> list[ImageInfo]:
    """The host's images you may see: an admin every one, a user those their own pulls and
    jobs used."""
    return [ImageInfo.model_validate(i) for i in session.request("GET", "/v1/images").json()]


def pull(session: Session, reference: str, secret: str | None = None) -> ImageInfo:
    """Pull `reference` onto the host, with your secret `secret` (holding the registry's
    user:password) where the image is private; the image once it is there. A large image
    takes minutes: the answer waits for it."""
    body = ImagePull(reference=reference, secret=secret).model_dump(mode="json")
    response = session.request(
        "POST", "/v1/images/pull", json=body, timeout=Timeout(None, connect=5.0)
    )
    return ImageInfo.model_validate(response.json())
