"""Click options generated from a config dataclass: one field, one flag.

Design decision: the dataclass is the one source of a setting. A field becomes an option whose flag is
the field's name in kebab case (`max_seq_length` -> `--max-seq-length`), whose help is the field's
attribute docstring (the string under the field, read from the class source with `ast`), whose default
is the field's default (no default: a required option), whose type follows the annotation (`int`,
`float`, `str`, `Path`, `bool` -> a flag, or `--x/--no-x` when it defaults to on, `tuple[int, ...]` ->
comma-separated integers, `tuple[str, ...]` / `tuple[Path, ...]` -> a repeatable option, `X | None` -> X).
A field's metadata says the rest, so the library and the command line read it from one place:
`choices` (the constant the library itself validates against, so a choice is added in one place),
`min`/`max` (a click.IntRange/FloatRange; `bertkit.settings.Settings` checks the same bounds and choices for
Python callers when an object is made), `flag` (another flag name, e.g. `--timeout` for `timeout_s`;
`--a/--b` names both sides of an on/off flag) and `path` ("file" or "dir", with `exists`: a click.Path that
checks it). A command changes an option only where the command really differs from the library (a CLI-only default, a
callback) through `overrides`: click.option keyword arguments per field, plus `flag` and `default_text`
(what `[default: ...]` says when the default is decided later, e.g. by a recipe). A docstring says what
None means in a clause `; unset: ...` to the end of its sentence; where the command's flag cannot be
unset (a default that is not None, a `default_text`, a required flag), the help leaves that clause out,
so `--help` never offers what the flag cannot do next to the default it shows (tests/cli/test_options.py).
A field whose type is itself a settings dataclass (FinetuneSettings.train, ServerSettings.limits) stands for
its fields: their flags take its place, with the holder's defaults, so one run description has one set of
flags in every command that holds it.

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
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from bertkit.errors import BertkitError
from bertkit.settings import field_flag

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")


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


def settings_options(cls: type, *, exclude: Iterable[str] = (), only: Iterable[str] | None = None,
                     overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Callable[[F], F]:
    """A decorator adding one click option per field of the settings dataclass `cls` (in field order), except
    the fields in `exclude` (or only those in `only`); a field that is itself a settings dataclass (e.g.
    `FinetuneSettings.train`) adds the options of its fields in its place, their defaults taken from the
    field's default. `overrides` maps a field name (of `cls` or of a nested class) to click.option keyword
    arguments (and `flag`, `default_text`). An option's parameter name is its field's name, so
    `settings_from_flags(cls, flags)` finds it."""
    overrides = dict(overrides or {})
    fields = _flag_fields(cls)
    names = [field.name for field, _, _, _ in fields]
    unknown = (set(exclude) | set(only or ()) | set(overrides)) - set(names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    skipped = set(exclude) | (set(names) - set(only) if only is not None else set())
    made = [_option(field, hint, doc, default, overrides.get(field.name, {}))
            for field, hint, doc, default in fields if field.name not in skipped]

    def decorate(function: F) -> F:
        for option in reversed(made):
            function = option(function)
        return function
    return decorate


def _flag_fields(cls: type, default: Any = None) -> list[tuple[dataclasses.Field, Any, str, Any]]:
    """(field, type hint, docstring, default) of every field that may become a flag: `cls`'s own, and those of
    a nested settings dataclass in its place (with the nested default object's values as defaults). Names are
    unique across the levels, so a flag names one setting."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    found: list[tuple[dataclasses.Field, Any, str, Any]] = []
    for field in dataclasses.fields(cls):
        value = _field_default(field) if default is None else getattr(default, field.name)
        if _nested(hints[field.name]):
            found += _flag_fields(hints[field.name], None if value is dataclasses.MISSING else value)
        else:
            found.append((field, hints[field.name], docs.get(field.name, ""), value))
    names = [field.name for field, _, _, _ in found]
    repeated = {name for name in names if names.count(name) > 1}
    if repeated:
        raise TypeError(f"{cls.__name__}: field(s) {sorted(repeated)} declared at two levels; one name per setting")
    return found


def _nested(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def pop_settings(cls: type, flags: dict[str, Any], *, drop_none: Iterable[str] = ()) -> dict[str, Any]:
    """Remove the values of `cls`'s fields from `flags` (a command's parsed flags) and return them; a nested
    settings field gets its object, made from its default with the values of its fields' flags. Fields in
    `drop_none` whose value is None are left out, so the dataclass default applies."""
    dropped = set(drop_none)
    hints = typing.get_type_hints(cls)
    taken: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if _nested(hints[field.name]):
            nested = pop_settings(hints[field.name], flags, drop_none=dropped)
            default = _field_default(field)
            taken[field.name] = (hints[field.name](**nested) if default is dataclasses.MISSING
                                 else dataclasses.replace(default, **nested))
        elif field.name in flags and not (field.name in dropped and flags[field.name] is None):
            taken[field.name] = flags.pop(field.name)
        else:
            flags.pop(field.name, None)
    return taken


def settings_from_flags(cls: type[S], flags: dict[str, Any], *, drop_none: Iterable[str] = (), **given: Any) -> S:
    """The settings object `cls` made from the parsed flags of its fields (removed from `flags`, see
    `pop_settings`) and `given` (what the command decides itself); checked as it is made."""
    return cls(**pop_settings(cls, flags, drop_none=drop_none), **given)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its attribute docstring as one line, for `cls` and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = _class_body(klass)
        except (OSError, TypeError):  # no source (e.g. a frozen application): options without help
            continue
        for node, following in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _class_body(klass: type) -> list[ast.stmt]:
    """The statements of a class's body, from its module's source parsed once (inspect.getsource of a class
    parses the whole module each time: 20 ms per class for bertkit.settings)."""
    body = _module_classes(klass.__module__).get(klass.__qualname__)
    if body is None:  # not at module level (e.g. defined in a function)
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
    return body


@functools.cache
def _module_classes(module: str) -> dict[str, list[ast.stmt]]:
    tree = ast.parse(inspect.getsource(sys.modules[module]))
    return {node.name: node.body for node in tree.body if isinstance(node, ast.ClassDef)}


def _option(field: dataclasses.Field, hint: Any, doc: str, default: Any, override: Mapping[str, Any]
            ) -> Callable[[F], F]:
    """The click.option of one field, whose default is `default` (MISSING: a required option)."""
    override = dict(override)
    flag = override.pop("flag", field_flag(field))
    kwargs: dict[str, Any] = {"help": doc, "show_default": True}
    if default is dataclasses.MISSING:
        kwargs["required"] = True
    else:
        kwargs["default"] = default
    base = _without_none(hint)
    if typing.get_origin(base) is tuple and typing.get_args(base) in ((str, Ellipsis), (Path, Ellipsis)):
        kwargs["multiple"], base = True, typing.get_args(base)[0]  # a repeatable option
    elif isinstance(kwargs.get("default"), tuple) and kwargs["default"]:
        kwargs["default"] = ",".join(map(str, kwargs["default"]))  # shown as it is typed (1,2,3); IntList parses it
    default_text = override.pop("default_text", None)
    if "default" in override:
        kwargs.pop("required", None)
    kwargs.update(override)
    if default_text is not None or kwargs.get("default") is not None or kwargs.get("required"):
        kwargs["help"] = without_unset(kwargs["help"])  # this flag is never None, whatever None would mean
    if default_text is not None:
        kwargs.update(help=f"{kwargs['help']} [default: {default_text}]".strip(), show_default=False)
    if "type" in kwargs:  # the command's own type
        return click.option(flag, field.name, **kwargs)
    if base is bool and "/" in flag:
        return click.option(flag, field.name, **kwargs)
    if base is bool and kwargs.get("default") is False:
        return click.option(flag, field.name, is_flag=True, **kwargs)
    if base is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", field.name, **kwargs)
    kwargs["type"] = _click_type(field, base, hint)
    return click.option(flag, field.name, **kwargs)


_UNSET = re.compile(r";\s*unset:")
_SENTENCE_END = re.compile(r"\.(?=\s|$)")


def without_unset(help_text: str) -> str:
    """`help_text` without its "; unset: ..." clause (to the end of that sentence), which says what the
    setting's None means: wrong beside a flag that is never None."""
    clause = _UNSET.search(help_text)
    if clause is None:
        return help_text
    end = _SENTENCE_END.search(help_text, clause.end())
    return help_text[:clause.start()] + (help_text[end.start():] if end else "")


def _without_none(hint: Any) -> Any:
    """X for `X | None` (and X itself otherwise)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint


def _click_type(field: dataclasses.Field, base: Any, hint: Any) -> Any:
    """The click type of a field from its metadata (choices, bounds, path checks) and annotation."""
    meta = field.metadata
    if meta.get("choices"):
        return click.Choice(list(meta["choices"]))
    if base in (int, float) and ("min" in meta or "max" in meta):
        return (click.IntRange if base is int else click.FloatRange)(meta.get("min"), meta.get("max"))
    if base in (int, float, str) and "path" not in meta:
        return base
    if base in (str, Path):
        kind = meta.get("path")
        return click.Path(exists=meta.get("exists", False), file_okay=kind != "dir", dir_okay=kind != "file",
                          path_type=Path if base is Path else None)
    if typing.get_origin(base) is tuple and typing.get_args(base) == (int, Ellipsis):
        return IntList(optional=base is not hint)
    raise TypeError(f"field {field.name}: no command-line type for {hint}; exclude the field or give a type in "
                    "overrides")


def memory_line(peak: dict[str, float]) -> str:
    """`runtime.peak_memory`'s record in words, e.g. 'resident 812 MiB; CUDA tensors 5,120 MiB (reserved 6,000)'."""
    line = f"resident {peak['rss_mib']:,.0f} MiB"
    if "cuda_allocated_mib" in peak:
        line += f"; CUDA tensors {peak['cuda_allocated_mib']:,.0f} MiB (reserved {peak['cuda_reserved_mib']:,.0f})"
    return line
