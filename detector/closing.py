"""`Closing`: the context manager of every object that holds a connection or a socket and lets
it go in `close()`; `with` closes it however the block ends. `Started`: one `with` starts too."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    def close(self) -> None:
        raise NotImplementedError

    def finish(self, exc: BaseException | None) -> None:
        """What a `with` block does before `close`, knowing how it ended (`exc` None: normally),
        such as delivering what it accepted; nothing by default."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.finish(exc)
        finally:
            self.close()


class Started(Closing):
    """A `Closing` that `with` also starts: a server that fails to start is closed at once, so
    that what it half-started (a process, a directory) goes with it."""

    def start(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self
