"""An exception the engine raised on one event, as a worker records it: in a dead letter that
carries the event, and in a log line, by its class and the place it was raised, never by its
message (which may quote the event)."""

from __future__ import annotations

import hashlib
import traceback
from dataclasses import dataclass
from pathlib import PurePath

from detector.contracts.dead_letters import DeadLetter
from detector.version import DISTRIBUTION, package_version


@dataclass(frozen=True, slots=True)
class EngineError:
    error_class: str
    traceback_hash: str
    stack: str  # the frames, each with its file, line and code: no value of the event

    @classmethod
    def of(cls, exc: BaseException) -> EngineError:
        """The same bug at the same place hashes the same on every host and for every event:
        the hash covers the class and each frame's file name, line and function, not the
        message nor the directories (they depend on where the package is installed)."""
        frames = traceback.extract_tb(exc.__traceback__)
        name = type(exc).__qualname__
        places = (f"{PurePath(f.filename).name}:{f.lineno}:{f.name}" for f in frames)
        digest = hashlib.blake2b("\n".join((name, *places)).encode(), digest_size=8)
        return cls(name, digest.hexdigest(), "".join(traceback.format_list(frames)))

    def dead_letter(
        self, key: bytes | None, value: bytes | None, topic: str, partition: int, offset: int
    ) -> DeadLetter:
        """The event as it was read, with the reason, and the class, hash and version apart in
        headers of their own for operators to group by."""
        version = package_version()
        return DeadLetter(
            f"engine_error: {self.error_class} (traceback {self.traceback_hash}, "
            f"{DISTRIBUTION} {version})",
            None,
            key,
            value,
            topic,
            partition,
            offset,
            details=(
                ("error.class", self.error_class),
                ("error.traceback_hash", self.traceback_hash),
                ("detector.version", version),
            ),
        )
