"""Lease-health labels (tool_class, model, provider) fit for metrics: bounded, shared tuples.

Apart from `_lease` so that a workflow's state (`_state`) can hold its labels while lease health
reads and writes that state.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from sys import intern
from typing import ClassVar, Final

UNLABELLED: Final = "unlabelled"  # an event without the label
OTHER: Final = "other"  # a value that is no short label, or one beyond the cap

Labels = tuple[str, str, str]  # tool_class, model, provider: `LabelBounds.NAMES`
RawLabels = tuple[str | None, str | None, str | None]
_NO_LABELS: Final[RawLabels] = (None, None, None)
# Distinct values kept per label; later ones are counted as `other`.
MAX_LABEL_VALUES: Final = 32
_SHORT_LABEL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/+@-]{0,63}")


class LabelBounds:
    """Label values fit for metrics: bounded, never a workflow key, worker id or effect key.

    Each label keeps at most `max_values` distinct values: a value that is no short label (1 to
    64 letters, digits and `_.:/+@-`), or one beyond the cap, becomes `other`; a missing one
    `unlabelled`. Equal labels come back as one tuple object, which many workflows can share.
    """

    NAMES: ClassVar = ("tool_class", "model", "provider")
    __slots__ = ("_known", "_values", "max_values")

    def __init__(self, max_values: int = MAX_LABEL_VALUES) -> None:
        self.max_values = max_values
        self._values: tuple[dict[str, str], ...] = tuple({} for _ in self.NAMES)
        # Labels as events give them, when bounding keeps them (or only fills in
        # `unlabelled`): bounded by the caps too, and found again in one lookup.
        self._known: dict[RawLabels, Labels] = {}

    def bound(self, raw: RawLabels) -> Labels:
        labels = self._known.get(raw)
        if labels is None:
            labels = (self._value(0, raw[0]), self._value(1, raw[1]), self._value(2, raw[2]))
            labels = self._known.setdefault(labels, labels)
            if all(r is None or r == b for r, b in zip(raw, labels, strict=True)):
                self._known[raw] = labels
        return labels

    def of_attrs(self, attrs: Mapping[str, str] | None) -> Labels:
        """The labels of an event's `attrs`."""
        if not attrs:
            return self.bound(_NO_LABELS)
        return self.bound((attrs.get("tool_class"), attrs.get("model"), attrs.get("provider")))

    def _value(self, i: int, raw: str | None) -> str:
        if not raw:
            return UNLABELLED
        admitted = self._values[i]
        value = admitted.get(raw)
        if value is not None:
            return value
        if raw in (UNLABELLED, OTHER):
            return UNLABELLED if raw == UNLABELLED else OTHER
        if len(admitted) >= self.max_values or not _SHORT_LABEL.fullmatch(raw):
            return OTHER
        value = admitted[raw] = intern(raw)
        return value
