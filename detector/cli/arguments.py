"""Argument types every command shares: a bad value says the form it expects, naming the flag
(argparse adds it), whether it came from the command line or a `SPLITBRAIN_` variable."""

from __future__ import annotations

import argparse
from typing import Final

_MAX_INT: Final = 2**31 - 1
_MAX_SECONDS: Final = 10**12


def _number(text: str, whole: bool, least: float, most: float, *, above: bool = False) -> float:
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = None
    low_ok = value is not None and (value > least if above else value >= least)
    if value is None or not low_ok or not value <= most:  # also refuses nan
        kind = "a whole number" if whole else "seconds"
        bound = f"more than {least:g}" if above else f"from {least:g}"
        raise argparse.ArgumentTypeError(f"expected {kind} {bound} to {most:.0f}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, True, 1, _MAX_INT))


def port(text: str) -> int:
    return int(_number(text, True, 0, 65535))


def seconds(text: str) -> float:
    return _number(text, False, 0, _MAX_SECONDS)


def positive_seconds(text: str) -> float:
    return _number(text, False, 0, _MAX_SECONDS, above=True)
