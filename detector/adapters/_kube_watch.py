"""The API server's Lease list and watch, as the JSON it sends (for `LeaseWatcher` and for
recording): the Python client's models would hide a malformed Lease behind a parse error and
drop the resourceVersion of bookmarks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes.client import CoordinationV1Api
from kubernetes.watch.watch import iter_resp_lines


def list_leases(
    api: CoordinationV1Api, namespace: str, selector: str | None, *, reason: str
) -> dict[str, Any]:
    """The Leases now, as a `LIST` event that `feed` takes (`reason`: `start`, `gone`)."""
    resp: Any = api.list_namespaced_lease(
        namespace, label_selector=selector or "", _preload_content=False
    )
    return {"type": "LIST", "reason": reason, "object": json.loads(resp.data)}


def watch_leases(
    api: CoordinationV1Api,
    namespace: str,
    selector: str | None,
    resource_version: str,
    *,
    timeout_s: int,
) -> Iterator[dict[str, Any]]:
    """Watch events from `resource_version` until the server ends the watch (`timeout_s`)."""
    resp: Any = api.list_namespaced_lease(
        namespace,
        label_selector=selector or "",
        watch=True,
        resource_version=resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=timeout_s,
        _preload_content=False,
    )
    try:
        for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
            if line.strip():
                event = json.loads(line)
                yield event if isinstance(event, dict) else {"type": "INVALID", "object": event}
    finally:
        resp.release_conn()
