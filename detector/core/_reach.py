"""Which items of a workflow can a late acquisition reach? Those below its epoch, and at or after
its `seq`: a two-sided query answered in time that grows with what it finds, not with what is held.

A late acquisition of epoch E at seq S can only displace events of epochs below E at or after S,
and can only rename the owners of findings whose epochs are below E (or at it) and whose latest
conditions are at or after S (DESIGN §4: the work per event does not grow with acquisitions that
arrive after the events they displace). Oldest first, the findings held are below E but before S;
newest first, they are after S but above E: a scan of either side alone is quadratic, this is not.

Items are keyed by a small integer (an epoch, or -1) and carry a value (a seq). A binary trie over
the keys keeps, per node, the highest value below it: a query walks down only where a value can
reach the threshold, O((found + 1) x log(highest key)). Not persisted: built again from the state
when first needed.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, Generic, TypeVar

T = TypeVar("T", bound=Hashable)

NEVER: Final = -1  # a value no threshold reaches (seqs are never negative)
ALWAYS: Final = 2**64  # a value every threshold reaches


class Reach(Generic[T]):
    """Items by (key ≥ -1, value); `report(key, value)`: those at or below the key and at or
    above the value."""

    __slots__ = ("_bits", "_items", "_leaves", "_max")

    def __init__(self) -> None:
        self._bits = 0  # the trie covers keys 0 .. 2**bits - 1 (a key k is stored as k + 1)
        self._leaves: dict[int, dict[T, int]] = {}
        self._max: dict[tuple[int, int], int] = {}  # (level, prefix) -> highest value below
        self._items: dict[T, int] = {}  # item -> its key

    def __len__(self) -> int:
        return len(self._items)

    def set(self, item: T, key: int, value: int) -> None:
        """Put the item at `key` with `value` (moved from where it was)."""
        k = key + 1
        was = self._items.get(item)
        if was is not None and was != k:
            self.discard(item)
            was = None
        if k >> self._bits:
            self._grow(k.bit_length())
        leaf = self._leaves.get(k)
        if leaf is None:
            leaf = self._leaves[k] = {}
        old = leaf.get(item)
        leaf[item] = value
        self._items[item] = k
        if old is not None and value < old:
            self._fix(k)
            return
        top = self._max
        for level in range(self._bits + 1):
            node = (level, k >> level)
            if top.get(node, NEVER - 1) >= value:
                return
            top[node] = value

    def discard(self, item: T) -> None:
        k = self._items.pop(item, None)
        if k is None:
            return
        leaf = self._leaves[k]
        del leaf[item]
        if not leaf:
            del self._leaves[k]
        self._fix(k)

    def report(self, key: int, value: int) -> list[T]:
        """The items at or below `key` whose value is at least `value`."""
        limit = key + 1  # stored keys up to this one
        found: list[T] = []
        if limit < 0:
            return found
        top = self._max
        stack = [(self._bits, 0)]
        while stack:
            level, prefix = stack.pop()
            if top.get((level, prefix), NEVER - 1) < value or prefix << level > limit:
                continue
            if level == 0:
                found.extend(i for i, v in self._leaves[prefix].items() if v >= value)
                continue
            stack.append((level - 1, 2 * prefix))
            stack.append((level - 1, 2 * prefix + 1))
        return found

    def _fix(self, k: int) -> None:
        """The highest values on the path of a leaf whose values went down or went."""
        top = self._max
        leaf = self._leaves.get(k)
        if leaf:
            top[(0, k)] = max(leaf.values())
        else:
            top.pop((0, k), None)
        for level in range(1, self._bits + 1):
            p = k >> level
            a = top.get((level - 1, 2 * p))
            b = top.get((level - 1, 2 * p + 1))
            if a is None and b is None:
                top.pop((level, p), None)
            else:
                top[(level, p)] = max(NEVER - 1 if a is None else a, NEVER - 1 if b is None else b)

    def _grow(self, bits: int) -> None:
        """The trie gets levels above its root: every key held so far is under the new roots'
        first child, whose highest value is the old root's (a step per level)."""
        top = self._max
        root = top.get((self._bits, 0))
        for level in range(self._bits + 1, bits + 1):
            if root is not None:
                top[(level, 0)] = root
        self._bits = bits
