"""Argument types of the flags only the command line sets (`audit`'s caps, `dev up`'s ports,
`replay`'s rate...), made from the setting types of `detector.settings`: such a flag is checked
by the same rule and bounds as a setting, and a bad value exits 2 naming the flag and the form it
expects (argparse names the flag). Also `--format`, which every command that can print JSON
declares alike, and the stack's ports, which `demo` and `dev up` declare alike."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from detector.settings import (
    Port,
    PositiveInt,
    PositiveNumber,
    PositiveSeconds,
    form_of,
)


def argument_type(kind: Any) -> Callable[[str], Any]:
    """An argparse `type` that validates a flag's text as `kind`, an annotated type that says
    its `Form`."""

    @functools.cache
    def adapter() -> TypeAdapter[Any]:
        # Built when a flag of this type is parsed: building the parser stays cheap.
        return TypeAdapter(kind)

    def parse(text: str) -> Any:
        try:
            return adapter().validate_python(text)
        except ValidationError:
            form = form_of(FieldInfo.from_annotation(kind)).text
            raise argparse.ArgumentTypeError(f"expected {form}, got {text!r}") from None

    return parse


positive_int: Final[Callable[[str], int]] = argument_type(PositiveInt)
positive_seconds: Final[Callable[[str], float]] = argument_type(PositiveSeconds)
positive_number: Final[Callable[[str], float]] = argument_type(PositiveNumber)
port: Final[Callable[[str], int]] = argument_type(Port)


def add_stack_ports(parser: argparse.ArgumentParser) -> None:
    """The ports of the stack's servers (`detector.devstack.preflight.Options`), which `demo`
    and `dev up` take alike."""
    for name in ("prometheus", "alertmanager", "destination"):
        parser.add_argument(
            f"--{name}-port",
            type=port,
            default=0,
            metavar="PORT",
            help=f"{name}'s port on 127.0.0.1 (default 0: a free one)",
        )


def add_format(parser: argparse.ArgumentParser, what: str) -> None:
    """`--format text|json`, text by default, as every command that can print JSON takes it;
    `what` is its help."""
    parser.add_argument("--format", choices=("text", "json"), default="text", help=what)
