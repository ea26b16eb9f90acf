"""Runs on the user's machine: a command's options, declared once, read by typer and by a
small parser that needs no typer.

The everyday commands (`run`, `ps`, `show`, `logs`, `cancel`) declare their parameters with
`Option` and `Argument` below, which take typer's own arguments. `for_typer` turns such a
function into the one typer reads (`main.build` applies it to every command), so `--help`,
the errors and every other use of a command stay typer's. `parse` reads the same
declarations to parse a plain, valid command line with the standard library only: typer
(with the click it carries and the pydantic it builds a validator with for each parameter)
costs a command more than the rest of its start. Whatever `parse` does not take as surely
valid (`--help`, an unknown or malformed option, a value out of range, a missing argument)
it leaves to typer by returning None, so typer says what is wrong, as it always has.
"""

from __future__ import annotations

import enum
import functools
import os
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

# Keywords of typer.Option/Argument that only change help texts: `parse` may ignore them.
HELP_ONLY = frozenset({"help", "metavar", "show_default", "show_envvar", "rich_help_panel"})
# ... and those `parse` applies itself.
PARSED = frozenset({"min", "max", "envvar"})
# The context settings `parse` knows how to honour (as `run` has them).
SETTINGS = frozenset({"allow_interspersed_args", "ignore_unknown_options"})


class Param(NamedTuple):
    """What `typer.Option(default, *decls, **kw)` or `typer.Argument(default, **kw)` says."""

    default: Any
    decls: tuple[str, ...]
    kw: dict[str, Any]
    argument: bool = False


def Option(default: Any, *decls: str, **kw: Any) -> Any:
    """A command option, as `typer.Option` takes it."""
    return Param(default, decls, kw)


def Argument(default: Any, **kw: Any) -> Any:
    """A command argument, as `typer.Argument` takes it."""
    return Param(default, (), kw, argument=True)


def for_typer(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as typer reads it: each `Param` default made the typer.Option/Argument it
    stands for (a function with none is returned as it is)."""
    import inspect  # typer's path only (typer loads it anyway): `parse` reads __code__

    signature = inspect.signature(fn)
    if not any(isinstance(p.default, Param) for p in signature.parameters.values()):
        return fn
    import typer

    def made(default: Any) -> Any:
        if not isinstance(default, Param):
            return default
        if default.argument:
            return typer.Argument(default.default, **default.kw)
        return typer.Option(default.default, *default.decls, **default.kw)

    hints = typing.get_type_hints(fn)
    parameters = [
        p.replace(default=made(p.default), annotation=hints.get(p.name, p.annotation))
        for p in signature.parameters.values()
    ]

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    command.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=hints.get("return", None)
    )
    command.__annotations__ = hints
    return command


class Unsure(Exception):
    """A command line `parse` leaves to typer."""


def parse(
    fn: Callable[..., Any], args: Sequence[str], settings: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The keyword arguments typer would call `fn` with for `args`, or None where typer is
    to parse them (see the module's docstring)."""
    try:
        return _parse(fn, list(args), settings or {})
    except Unsure:
        return None


class _Spec(NamedTuple):
    name: str
    param: Param
    kind: Any  # the value's type, Optional and list taken off
    many: bool  # a list: repeatable, or every remaining argument


_NO_DEFAULT = object()


def parameters(fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    """Each parameter of a plain function and its default (`_NO_DEFAULT` if none), in
    order, as `inspect.signature` lists them, read from the function's code and defaults:
    `inspect` (with `ast`, `dis` and `tokenize`) would cost a command some 5 ms of its
    start. A function that takes *args or **kwargs, or wraps another, raises Unsure."""
    code = getattr(fn, "__code__", None)
    if code is None or hasattr(fn, "__wrapped__") or code.co_flags & 0x0C:  # VARARGS|VARKW
        raise Unsure
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    defaults = fn.__defaults__ or ()
    kwdefaults = fn.__kwdefaults__ or {}
    first_default = code.co_argcount - len(defaults)
    return [
        (
            name,
            defaults[i - first_default]
            if first_default <= i < code.co_argcount
            else kwdefaults.get(name, _NO_DEFAULT),
        )
        for i, name in enumerate(names)
    ]


def option_values(fn: Callable[..., Any]) -> dict[str, bool]:
    """Each option name of `fn` (both sides of an --on/--off pair) and whether it takes a
    value: a flag takes none."""
    hints = typing.get_type_hints(fn)
    names: dict[str, bool] = {}
    for name, default in parameters(fn):
        if isinstance(default, Param) and not default.argument:
            for decl in default.decls:
                on, _, off = decl.partition("/")
                names[on] = hints[name] is not bool
                if off:
                    names[off] = False
    return names


def _specs(fn: Callable[..., Any]) -> list[_Spec]:
    hints = typing.get_type_hints(fn)
    specs = []
    for name, default in parameters(fn):
        if not isinstance(default, Param) or set(default.kw) - HELP_ONLY - PARSED:
            raise Unsure
        kind, many = _unwrap(hints[name])
        specs.append(_Spec(name, default, kind, many))
    return specs


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise Unsure
        return _unwrap(rest[0])
    if typing.get_origin(annotation) is list:
        return args[0], True
    return annotation, False


def _parse(fn: Callable[..., Any], args: list[str], settings: dict[str, Any]) -> dict[str, Any]:
    if set(settings) - SETTINGS:
        raise Unsure
    interspersed = settings.get("allow_interspersed_args", True)
    specs = _specs(fn)
    flags: dict[str, tuple[_Spec, Any]] = {}  # a name -> its option, and the flag's value
    for spec in (s for s in specs if not s.param.argument):
        for decl in spec.param.decls:
            on, _, off = decl.partition("/")
            flags[on] = (spec, True if spec.kind is bool else None)
            if off:
                flags[off] = (spec, False)
    given: dict[str, list[Any]] = {}
    positional: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == "--":
            positional += rest
            break
        if positional and not interspersed:
            positional += [arg, *rest]
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg[:2], "", "")
        if name not in flags:
            raise Unsure  # --help, an unknown option, short options run together: typer's
        spec, flag = flags[name]
        if flag is not None:
            if eq or len(arg) > len(name):
                raise Unsure
            value: str | bool = flag
        elif eq:
            value = inline
        elif len(arg) > 2 and not arg.startswith("--"):
            value = arg[2:]  # -n5
        else:
            value = next(rest, None)  # type: ignore[assignment]
            if value is None:
                raise Unsure
        given.setdefault(spec.name, []).append(value)
    kwargs: dict[str, Any] = {}
    arguments = [s for s in specs if s.param.argument]
    for spec in arguments:
        if spec.many:
            if spec is not arguments[-1]:
                raise Unsure
            given[spec.name], positional = positional, []
        elif positional:
            given[spec.name] = [positional.pop(0)]
    if positional:
        raise Unsure  # more arguments than the command takes
    for spec in specs:
        values = given.get(spec.name)
        if values is None and spec.param.kw.get("envvar"):
            env = os.environ.get(spec.param.kw["envvar"])
            values = [env] if env else None
        if values is None or (spec.many and spec.param.argument and not values):
            kwargs[spec.name] = _default(spec)
        elif spec.many:
            kwargs[spec.name] = [_convert(spec, v) for v in values]
        else:
            kwargs[spec.name] = _convert(spec, values[-1])
    return kwargs


def _default(spec: _Spec) -> Any:
    default = spec.param.default
    if default is ... or callable(default):
        raise Unsure  # required, or made by a factory: typer's call
    if spec.many and default is not None:
        return list(default)  # a fresh list, as typer gives
    return default


def _convert(spec: _Spec, value: str | bool) -> Any:
    kind = spec.kind
    if isinstance(value, bool):
        return value
    try:
        if kind is str:
            result: Any = value
        elif kind is int or kind is float:
            result = kind(value)
        elif kind is Path:
            result = Path(value)
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            result = kind(value)
        else:
            raise Unsure
    except ValueError:
        raise Unsure from None
    low, high = spec.param.kw.get("min"), spec.param.kw.get("max")
    if (low is not None and result < low) or (high is not None and result > high):
        raise Unsure
    return result
