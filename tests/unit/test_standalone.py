"""The repository stands alone: nothing in it points outside it. A clone, a wheel or a code
host's view of it has no design folder beside it, so a reference there is a dead link to its
reader (the pattern is `OUTSIDE`)."""

from __future__ import annotations

import re
import subprocess

from tests.paths import ROOT

OUTSIDE = re.compile(rb"\.\./shared\b|\bshared/(?:DESIGN|ADAPTERS|scenarios|cases|hooks)\b")
NEWLINE = b"\n"


def test_no_tracked_file_refers_outside_the_repository() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    files = [name for name in listed.decode().split("\0") if name]
    assert len(files) > 100  # the repository's own files, not an empty listing
    found = [
        f"{name}:{text.count(NEWLINE, 0, match.start()) + 1}: {match.group().decode()}"
        for name in files
        if (ROOT / name).is_file()
        for text in [(ROOT / name).read_bytes()]
        for match in OUTSIDE.finditer(text)
    ]
    assert found == []
