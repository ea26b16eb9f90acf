"""Runs in the agent: the web dashboard, served under `/ui` (pages, their JSON API, assets).

Nobody reaches it without logging in. `gpuhop ui` (on the user's machine) asks the agent,
with the user's ordinary credentials, for a one-time login code (`POST /v1/ui/login-codes`)
and runs a proxy on 127.0.0.1 that forwards `/ui/...` to the agent through the client's own
transport; the browser trades the code for a session cookie at `/ui/login`. From then on
every `/ui` request needs that cookie *and* arrives with the credentials of the user the
session belongs to (see `gpuhop.agent.ui.gate`). The pages are plain HTML, CSS and JavaScript
files in `static/`, shipped in the package: no build step, nothing fetched from the
internet.
"""
