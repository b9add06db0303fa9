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

import functools
import logging
import os
import socket
import threading
from contextvars import Token
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from redis.asyncio.lock import Lock as _AsyncLock
from redis.commands.core import AsyncScript, Script
from redis.exceptions import LockNotOwnedError, NoScriptError
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
    sink = _default_sink
    if sink is not None:  # every acquisition asks: only the first takes the lock
        return sink
    with _sink_lock:
        if _default_sink is None:
            _default_sink = AdapterSink(ADAPTER)
        return _default_sink


@functools.cache
def default_worker_id() -> str:
    """The holder's identity: its host and process (identity only, never proof of ownership);
    worked out once per process (again in a forked child, whose pid differs)."""
    return f"{socket.gethostname()}:{os.getpid()}"


os.register_at_fork(after_in_child=default_worker_id.cache_clear)


def lock_words(name: str, timeout: float | None) -> dict[str, Any]:
    """A holder in Redis's words (DESIGN §5 `context`): the lock's name and its timeout."""
    return words(lock=name, timeout_s=float(timeout) if timeout else None)


def _text(name: str | bytes) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


@dataclass(frozen=True, slots=True)
class _Named:
    """What every acquisition of one lock shares, worked out once (`_Fenced._lock_named`): the
    workflow key, the acquire script's fence key and timeout, the lease's duration and the
    owner's words (shared by its owners: `Ownership.note` replaces words, never mutates them)."""

    name: Any  # the lock's `name` and `timeout` these were worked out from
    timeout: Any
    key: str
    fence_key: str
    timeout_ms: str  # the acquire script's ARGV[2]: "" for none
    lease_s: float | None
    words: dict[str, Any]

    @classmethod
    def of(cls, name: Any, timeout: Any, fence_suffix: str) -> _Named:
        key = _text(name)
        lease_s = float(timeout) if timeout else None
        timeout_ms = str(int(timeout * 1000)) if timeout else ""
        return cls(
            name, timeout, key, key + fence_suffix, timeout_ms, lease_s, lock_words(key, lease_s)
        )


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
    _named: _Named | None = None

    def _lock_named(self) -> _Named:
        """This lock's `_Named`, worked out again only when its `name` or `timeout` was
        reassigned (redis-py reads both at each call, and so does this)."""
        named = self._named
        if named is None or named.name is not self.name or named.timeout is not self.timeout:
            named = self._named = _Named.of(self.name, self.timeout, self.fence_suffix)
        return named

    @property
    def fence_key(self) -> str:
        """The counter's key: the lock's name and `:fence` (in a Redis Cluster, give the lock a
        hash tag, `{payments}`, so that both keys live in one slot)."""
        return self._lock_named().fence_key

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

    def _fenced_keys_args(self, key: str, value: str | bytes) -> tuple[int, list[Any]]:
        """This holder's fence and the fenced-write script's keys and arguments; raises
        ValueError when the lock is not held here."""
        fence = self.fence
        if fence is None:
            raise ValueError(f"{_text(self.name)!r} is not held here: no fence to write with")
        return fence, [key, key + FENCE_SUFFIX, value, fence]

    def _acquired(self, answer: Any, named: _Named) -> bool:
        """The acquire script's answer: 0, the lock is taken by another; else the fence, for
        the acquisition event and the effect calls' owner."""
        fence = int(answer)
        if not fence:
            return False
        try:
            ownership = Ownership(
                self.sink if self.sink is not None else default_sink(),
                named.key,
                fence,
                self.worker_id or default_worker_id(),
                Authority.APPROXIMATE,
                EPOCH_FROM,
                words=named.words,
            )
            if named.lease_s is None:
                ownership.acquired()
            else:
                ownership.acquired(lease_duration_s=named.lease_s)
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
        try:  # noqa: SIM105  (a `suppress` object at each release costs more than the try)
            leave(held.token)
        except ValueError:  # released in another context than it was acquired in: its owner stays
            pass

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

    def _evalsha(self, script: Script | None, *keys_and_args: Any) -> Any:
        """`script` with its two keys, as `Script.__call__` runs it (EVALSHA; on NOSCRIPT, from a
        server restarted, flushed or switched, loaded again) without its per-call work: a lock's
        client is never a pipeline, and the arguments are already one tuple."""
        assert script is not None
        try:
            return self.redis.evalsha(script.sha, 2, *keys_and_args)
        except NoScriptError:
            script.sha = self.redis.script_load(script.script)
            return self.redis.evalsha(script.sha, 2, *keys_and_args)

    def do_acquire(self, token: str | bytes) -> bool:
        named = self._lock_named()
        answer = self._evalsha(
            self.lua_acquire, self.name, named.fence_key, token, named.timeout_ms
        )
        return self._acquired(answer, named)

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
        fence, keys_and_args = self._fenced_keys_args(key, value)
        applied = bool(self._evalsha(self.lua_fenced_set, *keys_and_args))
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

    async def _evalsha(self, script: AsyncScript | None, *keys_and_args: Any) -> Any:
        """`FencedLock._evalsha`, awaited."""
        assert script is not None
        try:
            return await self.redis.evalsha(script.sha, 2, *keys_and_args)
        except NoScriptError:
            script.sha = await self.redis.script_load(script.script)
            return await self.redis.evalsha(script.sha, 2, *keys_and_args)

    async def do_acquire(self, token: str | bytes) -> bool:
        named = self._lock_named()
        answer = await self._evalsha(
            self.lua_acquire, self.name, named.fence_key, token, named.timeout_ms
        )
        return self._acquired(answer, named)

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
        fence, keys_and_args = self._fenced_keys_args(key, value)
        applied = bool(await self._evalsha(self.lua_fenced_set, *keys_and_args))
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
