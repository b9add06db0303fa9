"""Typed settings of a command: its flags win, then its `SPLITBRAIN_` variables, then defaults.

pydantic-settings reads the variables and validates every value. This module adds what a command
line needs on top: one flag per field, generated from the model so that a flag and its variable
cannot drift apart, and one line per bad value naming where the value came from (the flag or the
variable) and the form expected.

A command builds its settings when it runs, from its own models only, so it reads only its own
variables: a bad worker variable never breaks `audit`, and building the parser reads none.

An empty variable is refused like any other bad value, not taken as unset: it is most often the
substitution of something unset (`SPLITBRAIN_GROUP_ID=$GROUP`), and quietly falling back to the
default would hide that. Unset the variable to get the default. Names match regardless of case,
as pydantic-settings reads them.

A secret is never a flag's value, which `ps` and shell history keep: it comes from its variable
or from the file `--<name>-file` names, and `--<name> VALUE` is refused.

Why not pydantic-settings' own `CliSettingsSource` and `secrets_dir`: its metavars (`int`) and
help (`(default: 100)`) come from private methods, where the help and the reference pin `N` and
`(env SPLITBRAIN_<NAME>, default 100)`; its errors do not say whether a flag or a variable gave the
value; and `secrets_dir` reads a directory of files named after the fields, not `--<name>-file`.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Final,
    Literal,
    Self,
    get_args,
    get_origin,
    get_type_hints,
)
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUndefined
from pydantic_settings import BaseSettings, SettingsConfigDict

from detector.errors import ExitCode, SplitbrainError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_PREFIX: Final = "SPLITBRAIN_"
MAX_INT: Final = 2**31 - 1
MAX_SECONDS: Final = 10**12


@dataclasses.dataclass(frozen=True, slots=True)
class Form:
    """How a value is written: said by an error about it, and shown as the flag's metavar."""

    text: str
    metavar: str


PositiveInt = Annotated[
    int, Field(ge=1, le=MAX_INT), Form(f"a whole number from 1 to {MAX_INT}", "N")
]
_PORT: Final = (Field(ge=0, le=65535), Form("a port number from 0 to 65535", "PORT"))
Port = Annotated[int, *_PORT]


def _ip_address(text: str) -> str:
    return str(ipaddress.ip_address(text))


IpAddress = Annotated[
    str,
    AfterValidator(_ip_address),
    Form("an IP address to listen on (127.0.0.1, 0.0.0.0, ::)", "ADDRESS"),
]
_SECONDS: Final = (
    Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False),
    Form(f"seconds from 0 to {MAX_SECONDS}", "S"),
)
Seconds = Annotated[float, *_SECONDS]
PositiveSeconds = Annotated[
    float,
    Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False),
    Form(f"seconds more than 0 to {MAX_SECONDS}", "S"),
]
PositiveNumber = Annotated[
    float,
    Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False),
    Form(f"a number more than 0 to {MAX_SECONDS}", "N"),
]


def _off(value: float | None) -> float | None:
    return value or None


# 0 turns a feature off: what reads the setting gets None, never a magic 0 (a default too).
_ZERO_IS_OFF: Final = (AfterValidator(_off), Field(validate_default=True))
PortOrOff = Annotated[int | None, *_PORT, *_ZERO_IS_OFF]
SecondsOrOff = Annotated[float | None, *_SECONDS, *_ZERO_IS_OFF]
Name = Annotated[str, Form("a non-empty name", "NAME")]
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(str.upper)
]
Directory = Annotated[Path, Form("a directory path", "DIR")]
Text = Annotated[str | None, Form("a non-empty value", "VALUE")]


def _http_url(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in a URL would show in ps and in logs")
    return value


HttpUrl = Annotated[
    str | None,
    AfterValidator(_http_url),
    Form("an http:// or https:// URL without credentials", "URL"),
]
Secret = Annotated[SecretStr | None, Form("a non-empty secret", "PATH")]


class SettingsError(SplitbrainError):
    """A flag's or variable's value cannot be used: one line per value, naming its source."""

    exit_code = ExitCode.UNUSABLE


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def form_of(field: FieldInfo) -> Form:
    """A choice lists its choices; any other field says its form by its type's `Form`."""
    if get_origin(field.annotation) is Literal:
        choices = [str(choice) for choice in get_args(field.annotation)]
        return Form("one of " + ", ".join(choices), "{" + ",".join(choices) + "}")
    (form,) = (m for m in field.metadata if isinstance(m, Form))
    return form


def declared_fields(declared: type[DataclassInstance]) -> dict[str, Any]:
    """The fields of the frozen dataclass `declared` that have a default, as a settings model's
    fields (`pydantic.create_model`): the dataclass its code reads is then the one declaration of
    each setting, its type (a form of this module), default and `Field(description=...)`. Fields
    without a default are built by the command from others (the worker's Kafka config)."""
    hints = get_type_hints(declared, include_extras=True)
    made: dict[str, Any] = {}
    for f in dataclasses.fields(declared):
        if f.default_factory is not dataclasses.MISSING:
            made[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        elif f.default is not dataclasses.MISSING:
            made[f.name] = (hints[f.name], f.default)
    return made


def _is_secret(field: FieldInfo) -> bool:
    return SecretStr in get_args(field.annotation)


def _secret_flag(name: str) -> str:
    return flag(name) + "-file"


class _RefuseSecret(argparse.Action):
    """`--sasl-password VALUE` exists only to say no: without it, argparse would take it as an
    abbreviation of `--sasl-password-file` and read a file named after the password."""

    def __init__(self, *args: Any, variable: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.variable = variable

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"{option_string} is not accepted: a secret on the command line leaks through ps and "
            f"shell history; set {self.variable} or pass {option_string}-file PATH"
        )


def _read_secret(name: str, path: str) -> str:
    try:
        # A trailing newline is the editor's, not the password's.
        return Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise SettingsError(
            f"cannot read {_secret_flag(name)} {path}: {exc.strerror or exc}"
        ) from None


def _shown(default: object) -> str:
    """A float as short as it reads; a whole one as an integer (1382400, not 1.3824e+06)."""
    if isinstance(default, float):
        return str(int(default)) if default.is_integer() else f"{default:g}"
    return str(default)


class CommandSettings(BaseSettings):
    """Frozen settings of one command, each field a flag (`--commit-interval-ms`) and a variable
    (`SPLITBRAIN_COMMIT_INTERVAL_MS`). A field's `description` is its flag's help; its type's
    `Form` says how to write it. A long-running command whose variables must not be confused with
    a worker's sets a prefix of its own (`model_config`'s `env_prefix`, `SPLITBRAIN_PAGE_`): its
    variables, the flags' help, the error lines and the refusal of a secret's flag all use it."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    _flags: frozenset[str] = PrivateAttr(frozenset())

    @field_validator("*", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if value == "":
            raise ValueError("empty")
        return value

    @classmethod
    def variable(cls, name: str) -> str:
        return str(cls.model_config["env_prefix"]) + name.upper()

    @classmethod
    def add_flags(cls, parser: argparse._ActionsContainer) -> None:
        """One flag per field, without an argparse default: an absent flag leaves its field to
        the variable, then to the model's default."""
        for name, field in cls.model_fields.items():
            var = cls.variable(name)
            if _is_secret(field):
                parser.add_argument(
                    _secret_flag(name),
                    dest=f"{name}_file",
                    default=argparse.SUPPRESS,
                    metavar=form_of(field).metavar,
                    help=f"read {field.description} from this file (or set env {var})",
                )
                parser.add_argument(
                    flag(name),
                    dest=name,
                    action=_RefuseSecret,
                    variable=var,
                    default=argparse.SUPPRESS,
                    help=argparse.SUPPRESS,
                )
                continue
            default = field.default
            shown = "" if default in (None, PydanticUndefined) else f", default {_shown(default)}"
            parser.add_argument(
                flag(name),
                dest=name,
                default=argparse.SUPPRESS,
                metavar=form_of(field).metavar,
                help=f"{field.description} (env {var}{shown})",
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Self:
        """The settings from the flags given in `args`, then the environment, then defaults;
        a `SettingsError` with one line per bad value."""
        given: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            if _is_secret(field):
                path = getattr(args, f"{name}_file", None)
                if path is not None:
                    given[name] = _read_secret(name, path)
            elif hasattr(args, name):
                given[name] = getattr(args, name)
        return cls._given(given)

    @classmethod
    def from_env(cls) -> Self:
        """The settings from the environment, then defaults, for code that has no command line
        (a library such as the emitter); a `SettingsError` with one line per bad variable."""
        return cls._given({})

    @classmethod
    def _given(cls, given: Mapping[str, Any]) -> Self:
        try:
            settings = cls(**given)
        except ValidationError as exc:
            raise SettingsError(cls._problems(exc.errors(), given)) from None
        settings._flags = frozenset(given)
        return settings

    @classmethod
    def _problems(cls, errors: list[ErrorDetails], given: Mapping[str, Any]) -> str:
        problems: dict[str, str] = {}
        for error in errors:
            name = str(error["loc"][0])
            if name in problems:
                continue  # a union reports each of its branches
            from_flag = name in given
            value = given[name] if from_flag else error["input"]
            line = f"{cls._named(name, value, from_flag=from_flag)}: expected "
            line += form_of(cls.model_fields[name]).text
            if value == "" and not from_flag:
                line += "; unset the variable to use the default"
            problems[name] = line
        return "\n".join(problems.values())

    @classmethod
    def _named(cls, name: str, value: object, *, from_flag: bool) -> str:
        """A field's source, its flag or else its variable, with the value as written there (a
        secret's is never shown). A default is named by the flag that changes it."""
        secret = _is_secret(cls.model_fields[name])
        where = _secret_flag(name) if secret else flag(name)
        if not from_flag:
            # pydantic-settings matches names regardless of case, and so does this.
            for variable, text in os.environ.items():
                if variable.upper() == cls.variable(name):
                    where, value = variable, text
        return where if secret else f"{where}={str(value)!r}"

    def named(self, name: str) -> str:
        """A field and its value as the user gave it, to name it in an error found later."""
        return self._named(name, getattr(self, name), from_flag=name in self._flags)
