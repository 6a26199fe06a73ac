"""Click options generated from a config dataclass: one field, one flag.

Design decision: the dataclass is the one source of a setting. A field becomes an option whose flag is
the field's name in kebab case (`max_seq_length` -> `--max-seq-length`), whose help is the field's
attribute docstring (the string under the field, read from the class source with `ast`), whose default
is the field's default (no default: a required option), whose type follows the annotation (`int`,
`float`, `str`, `Path`, `bool` -> a flag, or `--x/--no-x` when it defaults to on, `tuple[int, ...]` ->
comma-separated integers, `X | None` -> X) and whose choices are `field(metadata={"choices": ...})`:
the constant the library itself validates against, so a choice is added in one place. A command
changes an option only where the command really differs from the library (a CLI-only default, another
flag name, a directory check) through `overrides`: click.option keyword arguments per field, plus
`flag` (the flag's name) and `default_text` (what `[default: ...]` says when the default is decided
later, e.g. by a recipe).

Help lives in docstrings rather than in `field(metadata={"help": ...})` because every bertkit dataclass
already documents each field that way (DESIGN.md), a reader of the source sees the text beside the
field, and the library's own documentation and `--help` can then never disagree (litgpt's config
dataclasses, read by jsonargparse, work the same way). A well-kept library (jsonargparse, tyro) would
replace click, its error format and the lazy command table; this adapter is small and keeps them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from bertkit.errors import BertkitError

F = TypeVar("F", bound=Callable[..., Any])
DIRECTORY = click.Path(file_okay=False)
"""The type of options naming a directory (refuses an existing file as click.Path does)."""


class IntList(click.ParamType):
    """Comma-separated integers ("1,2,3") -> a tuple; empty is an error unless the setting is optional."""

    name = "INTS"

    def __init__(self, optional: bool = False) -> None:
        self.optional = optional

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, tuple):
            return value
        flag = param.opts[0] if param is not None else "value"
        try:
            items = tuple(int(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            raise BertkitError(f"{flag} {value!r}: expected comma-separated integers, e.g. 1,2,3") from None
        if not items and not self.optional:
            raise BertkitError(f"{flag} is empty; give at least one integer")
        return items or None


def options(cls: type, *, exclude: Iterable[str] = (), overrides: Mapping[str, Mapping[str, Any]] | None = None
            ) -> Callable[[F], F]:
    """A decorator adding one click option per field of the dataclass `cls` (in field order), except the
    fields in `exclude`; `overrides` maps a field name to click.option keyword arguments (and `flag`,
    `default_text`). The option's parameter name is the field name, so `take(cls, values)` finds it."""
    overrides = dict(overrides or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = (set(exclude) | set(overrides)) - names
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    made = [_option(field, hints[field.name], docs.get(field.name, ""), overrides.get(field.name, {}))
            for field in dataclasses.fields(cls) if field.name not in exclude]

    def decorate(function: F) -> F:
        for option in reversed(made):
            function = option(function)
        return function
    return decorate


def take(cls: type, values: dict[str, Any], *, drop_none: Iterable[str] = ()) -> dict[str, Any]:
    """Remove the values of `cls`'s fields from `values` (a command's parsed flags) and return them;
    fields in `drop_none` whose value is None are left out, so the dataclass default applies."""
    dropped = set(drop_none)
    taken = {f.name: values.pop(f.name) for f in dataclasses.fields(cls) if f.name in values}
    return {name: value for name, value in taken.items() if not (name in dropped and value is None)}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its attribute docstring as one line, for `cls` and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # no source (e.g. a frozen application): options without help
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, following in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _option(field: dataclasses.Field, hint: Any, doc: str, override: Mapping[str, Any]) -> Callable[[F], F]:
    """The click.option of one field."""
    override = dict(override)
    flag = override.pop("flag", "--" + field.name.replace("_", "-"))
    kwargs: dict[str, Any] = {"help": doc, "show_default": True}
    if field.default is not dataclasses.MISSING:
        kwargs["default"] = field.default
    elif field.default_factory is not dataclasses.MISSING:
        kwargs["default"] = field.default_factory()
    else:
        kwargs["required"] = True
    base = _without_none(hint)
    default_text = override.pop("default_text", None)
    if "default" in override:
        kwargs.pop("required", None)
    kwargs.update(override)
    if default_text is not None:
        kwargs.update(help=f"{kwargs['help']} [default: {default_text}]".strip(), show_default=False)
    if "type" in kwargs:  # the command's own type
        return click.option(flag, field.name, **kwargs)
    if base is bool and kwargs.get("default") is False:
        return click.option(flag, field.name, is_flag=True, **kwargs)
    if base is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", field.name, **kwargs)
    choices = field.metadata.get("choices")
    kwargs["type"] = click.Choice(list(choices)) if choices else _click_type(field.name, base, hint)
    return click.option(flag, field.name, **kwargs)


def _without_none(hint: Any) -> Any:
    """X for `X | None` (and X itself otherwise)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint


def _click_type(name: str, base: Any, hint: Any) -> Any:
    if base in (int, float, str):
        return base
    if base is Path:
        return click.Path(path_type=Path)
    if typing.get_origin(base) is tuple and typing.get_args(base) == (int, Ellipsis):
        return IntList(optional=base is not hint)
    raise TypeError(f"field {name}: no command-line type for {hint}; exclude the field or give a type in overrides")
