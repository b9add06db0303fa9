"""The link from a page to its finding: `--finding-url https://…/findings/{finding_id}`.

A finding id is whatever the findings topic holds, so it is percent-encoded into the template:
it can never add a path segment, a query or a fragment to the link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, urlsplit

PLACEHOLDER: Final = "{finding_id}"


@dataclass(frozen=True, slots=True)
class FindingLink:
    template: str

    def __post_init__(self) -> None:
        parts = urlsplit(self.template.replace(PLACEHOLDER, "x"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http(s) URL")
        if parts.username is not None or parts.password is not None:
            raise ValueError("credentials in a URL would show in ps and in logs")
        if self.template.count(PLACEHOLDER) != 1:
            raise ValueError(f"needs {PLACEHOLDER} once, where the finding's id goes")

    def of(self, finding_id: str) -> str:
        return self.template.replace(PLACEHOLDER, quote(finding_id, safe=""))
