"""The wire model of the dashboard's login (`POST /v1/ui/login-codes`). Shared by both sides."""

from datetime import datetime

from gpuhop.api.base import WireModel


class UiLoginCode(WireModel):
    """A one-time code that logs a browser in to the dashboard as the caller who asked.

    Good once, until `expires_at`, and only when it comes back with the same credentials
    (through `gpuhop ui`'s proxy): `GET /ui/login?code=CODE`.
    """

    code: str
    expires_at: datetime
