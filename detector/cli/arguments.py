"""Argument types of the flags only the command line sets (`audit`'s), with the forms and bounds
of the settings in `detector.settings`: a bad value says the form it expects, and argparse names
the flag."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from detector.settings import PositiveInt, PositiveSeconds, form_of


def _argument_type(kind: Any) -> Callable[[str], Any]:
    adapter: TypeAdapter[Any] = TypeAdapter(kind)
    form = form_of(FieldInfo.from_annotation(kind)).text

    def parse(text: str) -> Any:
        try:
            return adapter.validate_python(text)
        except ValidationError:
            raise argparse.ArgumentTypeError(f"expected {form}, got {text!r}") from None

    return parse


positive_int: Final[Callable[[str], int]] = _argument_type(PositiveInt)
positive_seconds: Final[Callable[[str], float]] = _argument_type(PositiveSeconds)
