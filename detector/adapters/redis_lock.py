"""redis-py locks with a fencing token (`pip install 'splitbrain-detector[redis-lock]'`).

A redis-py `Lock` has no fencing token: a holder paused past its timeout wakes up, sees nothing
(its `owned()` is a racy GET it need not call), and writes; only its later `extend` or `release`
raises `LockNotOwnedError`. `FencedLock` is a `lock_class` for `Redis.lock` that mints one:

    lock = r.lock("payments", timeout=10, lock_class=FencedLock)
    with lock:
        lock.fence                         # 7: give it to a destination that can refuse it
        lock.extend(10)                    # a heartbeat
        effect_committed("charge/42")      # carries the lock's name and fence

Its acquisition is one script: `SET name token NX PX timeout` and, only when that succeeded,
`INCR name:fence`, so each fence value has exactly one winner, assigned by the server at the
moment of the acquisition. The fence is the epoch, and the lock's name the workflow key.

Authority: `approximate` (ADAPTERS.md's B), never `system`. Redis assigns the number and it grows
for as long as Redis keeps the counter, but Redis itself never refuses a stale holder on it, and
the counter can go back: a failover to a replica the last INCRs had not reached (replication is
asynchronous), an `allkeys-*` eviction of the counter (it has no TTL: `volatile-*` policies never
evict it), a FLUSHALL or FLUSHDB. The acquisition is therefore the worker's word (`source:
worker`), and findings are ordered by arrival (no `seq`: Redis gives no order a worker can read).

Events (through `AdapterSink`: the holder is never blocked or failed by the detector):
`lease_acquired` on an acquisition (`lease_duration_s`: the lock's timeout), `heartbeat` on
`extend`/`reacquire`, `lease_lost` when Redis says the token is no longer there
(`LockNotOwnedError` from `extend`, `reacquire` or `release`, or `owned()` returning False), and
`lease_released` on a release. While the lock is held, the effect calls of
`detector.adapters` made in the acquiring thread (or asyncio task) carry its name and fence.
`fenced_set` is a destination that refuses a stale fence, with its receipt.

`AsyncFencedLock` is the same for `redis.asyncio`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from contextvars import Token
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from redis.asyncio.lock import Lock as _AsyncLock
from redis.commands.core import AsyncScript, Script
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock as _Lock

from detector.contracts.events import Kind, Source

from ._context import Authority, Ownership, enter, leave, words
from ._sink import AdapterSink

log = logging.getLogger(__name__)

ADAPTER: Final = "redis-lock"
EPOCH_FROM: Final = "redis.fence_incr"
DESTINATION: Final = "redis"
FENCE_SUFFIX: Final = ":fence"

# KEYS[1] the lock, KEYS[2] its fence counter; ARGV[1] the token, ARGV[2] the timeout in ms
# ("" for none). The fence after a successful SET NX, else 0.
ACQUIRE_SCRIPT: Final = """
local ok
if ARGV[2] == '' then
    ok = redis.call('set', KEYS[1], ARGV[1], 'NX')
else
    ok = redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
end
if not ok then
    return 0
end
return redis.call('incr', KEYS[2])
"""

# A destination that refuses a stale fence (Kleppmann's storage server): KEYS[1] the value,
# KEYS[2] the highest fence it accepted; ARGV[1] the value, ARGV[2] the writer's fence. 1 when
# written, 0 when the fence is below one already accepted.
FENCED_SET_SCRIPT: Final = """
local seen = tonumber(redis.call('get', KEYS[2]) or '0')
local fence = tonumber(ARGV[2])
if fence < seen then
    return 0
end
redis.call('set', KEYS[2], fence)
redis.call('set', KEYS[1], ARGV[1])
return 1
"""

_sink_lock = threading.Lock()
_default_sink: AdapterSink | None = None


def default_sink() -> AdapterSink:
    """The process's sink for locks given none, configured by the `SPLITBRAIN_*` variables."""
    global _default_sink  # noqa: PLW0603  (one per process, made at the first acquisition)
    with _sink_lock:
        if _default_sink is None:
            _default_sink = AdapterSink(ADAPTER)
        return _default_sink


def default_worker_id() -> str:
    """The holder's identity: its host and process (identity only, never proof of ownership)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def lock_words(name: str, timeout: float | None) -> dict[str, Any]:
    """A holder in Redis's words (DESIGN §5 `context`): the lock's name and its timeout."""
    return words(lock=name, timeout_s=float(timeout) if timeout else None)


def _text(name: str | bytes) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


@dataclass(slots=True)
class _Held:
    """One acquisition, in the lock's (thread-)local state."""

    ownership: Ownership
    token: Token[Ownership | None]
    lost: bool = False


class _Fenced:
    """What the sync and asyncio locks share: the events of one acquisition."""

    # Set by `fenced_lock_class`; the defaults: the process's sink, host:pid.
    sink: ClassVar[AdapterSink | None] = None
    worker_id: ClassVar[str | None] = None
    fence_suffix: ClassVar[str] = FENCE_SUFFIX

    name: Any
    timeout: Any
    local: Any
    redis: Any

    @property
    def fence_key(self) -> str:
        """The counter's key: the lock's name and `:fence` (in a Redis Cluster, give the lock a
        hash tag, `{payments}`, so that both keys live in one slot)."""
        return _text(self.name) + self.fence_suffix

    @property
    def fence(self) -> int | None:
        """The fencing token of this thread's (or task's) acquisition, None when not held:
        hand it to a destination that refuses a lower one than it has seen."""
        held: _Held | None = getattr(self.local, "held", None)
        return None if held is None else held.ownership.owner_epoch

    @property
    def ownership(self) -> Ownership | None:
        held: _Held | None = getattr(self.local, "held", None)
        return None if held is None else held.ownership

    def _register_fence_scripts(self) -> None:
        """Register the acquire and fenced-write scripts once per class, beside redis-py's."""
        cls: Any = type(self)
        if cls.lua_acquire is None:
            cls.lua_acquire = self.redis.register_script(ACQUIRE_SCRIPT)
        if cls.lua_fenced_set is None:
            cls.lua_fenced_set = self.redis.register_script(FENCED_SET_SCRIPT)

    def _acquire_keys_args(self, token: str | bytes) -> tuple[list[Any], list[Any]]:
        """The acquire script's keys and arguments: the lock and its counter; the token and
        the timeout in ms (empty: none)."""
        timeout_ms = str(int(self.timeout * 1000)) if self.timeout else ""
        return [self.name, self.fence_key], [token, timeout_ms]

    def _fenced_keys_args(self, key: str, value: str | bytes) -> tuple[int, list[Any], list[Any]]:
        """This holder's fence and the fenced-write script's keys and arguments; raises
        ValueError when the lock is not held here."""
        fence = self.fence
        if fence is None:
            raise ValueError(f"{_text(self.name)!r} is not held here: no fence to write with")
        return fence, [key, key + FENCE_SUFFIX], [value, fence]

    def _acquired(self, answer: Any) -> bool:
        """The acquire script's answer: 0, the lock is taken by another; else the fence, for
        the acquisition event and the effect calls' owner."""
        fence = int(answer)
        if not fence:
            return False
        try:
            timeout = float(self.timeout) if self.timeout else None
            ownership = Ownership(
                self.sink if self.sink is not None else default_sink(),
                _text(self.name),
                fence,
                self.worker_id or default_worker_id(),
                Authority.APPROXIMATE,
                EPOCH_FROM,
                words=lock_words(_text(self.name), timeout),
            )
            if timeout is None:
                ownership.acquired()
            else:
                ownership.acquired(lease_duration_s=timeout)
            self.local.held = _Held(ownership, enter(ownership))
        except Exception:  # the holder's lock is taken whatever happens to its event
            log.exception("redis-lock adapter: an acquisition could not be reported")
        return True

    def _heartbeat(self) -> None:
        held: _Held | None = getattr(self.local, "held", None)
        if held is not None:
            held.ownership.emit(Kind.HEARTBEAT)

    def _lost(self, call: str) -> None:
        """Redis says the token is gone: the holder now knows it is displaced (once)."""
        held: _Held | None = getattr(self.local, "held", None)
        if held is not None and not held.lost:
            held.lost = True
            held.ownership.note(lost_at=call)
            held.ownership.emit(Kind.LEASE_LOST, detail={"call": call})

    def _ended(self, released: bool) -> None:
        """The release's answer: released, or lost (Redis had no longer this token)."""
        held: _Held | None = getattr(self.local, "held", None)
        if held is None:
            return
        if released:
            held.ownership.emit(Kind.LEASE_RELEASED)
        else:
            self._lost("release")
        self.local.held = None
        # Released in another context than it was acquired in: that one's owner stays.
        with contextlib.suppress(ValueError):
            leave(held.token)

    def _checked_owned(self, owned: bool) -> bool:
        if not owned and getattr(self.local, "held", None) is not None:
            self._lost("owned")
        return owned

    def _write(self, applied: bool, effect_key: str, fence: int) -> None:
        """`fenced_set`'s receipt, as the destination's word."""
        held: _Held | None = getattr(self.local, "held", None)
        if held is None:
            return
        held.ownership.emit(
            Kind.EFFECT_COMMITTED if applied else Kind.EFFECT_REJECTED,
            effect_key=effect_key,
            destination=DESTINATION,
            source=Source.DESTINATION,
            detail={"fence": fence},
        )


class FencedLock(_Fenced, _Lock):
    """redis-py's `Lock` with a fence minted at each acquisition (`Redis.lock(...,
    lock_class=FencedLock)`), reported to splitbrain. Behaves as `Lock` in every other way."""

    lua_acquire: ClassVar[Script | None] = None
    lua_fenced_set: ClassVar[Script | None] = None

    def register_scripts(self) -> None:
        super().register_scripts()
        self._register_fence_scripts()

    def do_acquire(self, token: str | bytes) -> bool:
        assert self.lua_acquire is not None
        keys, args = self._acquire_keys_args(token)
        return self._acquired(self.lua_acquire(keys=keys, args=args, client=self.redis))

    def do_extend(self, additional_time: float, replace_ttl: bool) -> Literal[True]:
        try:
            super().do_extend(additional_time, replace_ttl)
        except LockNotOwnedError:
            self._lost("extend")
            raise
        self._heartbeat()
        return True

    def do_reacquire(self) -> Literal[True]:
        try:
            super().do_reacquire()
        except LockNotOwnedError:
            self._lost("reacquire")
            raise
        self._heartbeat()
        return True

    def do_release(self, expected_token: str) -> None:
        try:
            super().do_release(expected_token)
        except LockNotOwnedError:
            self._ended(released=False)
            raise
        self._ended(released=True)

    def owned(self) -> bool:
        return self._checked_owned(super().owned())

    def fenced_set(self, key: str, value: str | bytes, *, effect_key: str) -> bool:
        """Write `key` on this lock's Redis unless a higher fence than this holder's already
        wrote it (the highest kept at `key` + `:fence`); True when written. Either way the
        receipt is reported as the destination's (`effect_committed` or `effect_rejected`)."""
        fence, keys, args = self._fenced_keys_args(key, value)
        assert self.lua_fenced_set is not None
        applied = bool(self.lua_fenced_set(keys=keys, args=args, client=self.redis))
        self._write(applied, effect_key, fence)
        return applied


class AsyncFencedLock(_Fenced, _AsyncLock):
    """`FencedLock` for `redis.asyncio` (`await r.lock(..., lock_class=AsyncFencedLock)`): the
    effect calls of the task that acquired it carry its name and fence."""

    lua_acquire: ClassVar[AsyncScript | None] = None
    lua_fenced_set: ClassVar[AsyncScript | None] = None

    def register_scripts(self) -> None:
        super().register_scripts()  # type: ignore[no-untyped-call]
        self._register_fence_scripts()

    async def do_acquire(self, token: str | bytes) -> bool:
        assert self.lua_acquire is not None
        keys, args = self._acquire_keys_args(token)
        return self._acquired(await self.lua_acquire(keys=keys, args=args, client=self.redis))

    async def do_extend(self, additional_time: float, replace_ttl: bool) -> Literal[True]:
        try:
            await super().do_extend(additional_time, replace_ttl)
        except LockNotOwnedError:
            self._lost("extend")
            raise
        self._heartbeat()
        return True

    async def do_reacquire(self) -> Literal[True]:
        try:
            await super().do_reacquire()
        except LockNotOwnedError:
            self._lost("reacquire")
            raise
        self._heartbeat()
        return True

    async def do_release(self, expected_token: bytes) -> None:
        try:
            await super().do_release(expected_token)
        except LockNotOwnedError:
            self._ended(released=False)
            raise
        self._ended(released=True)

    async def owned(self) -> bool:
        return self._checked_owned(await super().owned())

    async def fenced_set(self, key: str, value: str | bytes, *, effect_key: str) -> bool:
        """`FencedLock.fenced_set`, awaited."""
        fence, keys, args = self._fenced_keys_args(key, value)
        assert self.lua_fenced_set is not None
        applied = bool(await self.lua_fenced_set(keys=keys, args=args, client=self.redis))
        self._write(applied, effect_key, fence)
        return applied


def fenced_lock_class(
    sink: AdapterSink | None = None, *, worker_id: str | None = None
) -> type[FencedLock]:
    """A `FencedLock` reporting to `sink` (default: one configured by the `SPLITBRAIN_*`
    variables) as `worker_id` (default: host:pid): `Redis.lock` takes a class, not arguments."""
    return type("FencedLock", (FencedLock,), {"sink": sink, "worker_id": worker_id})


def async_fenced_lock_class(
    sink: AdapterSink | None = None, *, worker_id: str | None = None
) -> type[AsyncFencedLock]:
    """`fenced_lock_class` for `redis.asyncio`."""
    return type("AsyncFencedLock", (AsyncFencedLock,), {"sink": sink, "worker_id": worker_id})
