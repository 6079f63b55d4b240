"""A setting declared once: a dataclass field that carries its default,
its help text and its command-line form.

`setting` makes the field; `add_arguments` derives argparse flags from a
settings dataclass and `from_args` reads the parsed flags back into its
fields, so a command states only where it departs from the declaration
(another default, say).

Examples
--------
>>> import argparse
>>> from dataclasses import dataclass
>>> @dataclass
... class Example:
...     hidden: int = setting(64, "hidden features", type=int)
...     verify: bool = setting(True, "skip the checksum", flag="--no-verify")
>>> parser = argparse.ArgumentParser()
>>> add_arguments(parser, Example, changes={"hidden": {"default": 8}})
>>> args = parser.parse_args(["--no-verify"])
>>> from_args(Example, args)
{'hidden': 8, 'verify': False}
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import MISSING

__all__ = ["add_arguments", "cli_names", "default_of", "flag_of",
           "from_args", "help_of", "same_as", "setting"]


def setting(default=MISSING, help: str | Callable[[], str] = "", *,
            factory: Callable | None = None, type: Callable | None = None,
            choices: Iterable | Callable[[], Iterable] | None = None,
            flag: str | None = None, cli: bool = True):
    """A dataclass field with its default, help text and flag.

    Parameters
    ----------
    default : object
        The value when none is given (``factory`` for a list).
    help : str or callable
        The flag's help; a callable is called when the flag is added (a
        list of registered names that takes a heavy import to read).
    factory : callable, optional
        Makes the default, as `dataclasses.field`'s ``default_factory``.
    type : callable, optional
        argparse ``type=``, one of `hmgraph.args`' checks.
    choices : iterable or callable, optional
        argparse ``choices=``; a callable is called when the flag is added.
    flag : str, optional
        The option; by default ``--`` and the name with dashes. A boolean
        whose default is True takes a ``--no-...`` flag that turns it off
        (``dest`` ``no_<name>``); one whose default is False, a switch.
    cli : bool
        False: a setting of the API only, with no flag.
    """
    metadata = {"help": help, "type": type, "choices": choices,
                "flag": flag, "cli": cli}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def same_as(settings, name: str):
    """A new field declared as field ``name`` of ``settings`` is: the same
    default, help and flag in another settings dataclass."""
    field = _fields(settings)[name]
    if field.default_factory is not MISSING:
        return dataclasses.field(default_factory=field.default_factory,
                                 metadata=field.metadata)
    return dataclasses.field(default=field.default, metadata=field.metadata)


def default_of(settings, name: str):
    """The declared default of field ``name`` of ``settings`` (a fresh
    value for one made by a factory)."""
    field = _fields(settings)[name]
    if field.default_factory is not MISSING:
        return field.default_factory()
    return field.default


def flag_of(field: dataclasses.Field) -> str:
    """The option of ``field``: its ``flag``, else ``--name-with-dashes``
    (``--no-name`` for a boolean that defaults to True)."""
    if field.metadata.get("flag"):
        return field.metadata["flag"]
    if field.default is True:
        return "--no-" + field.name.replace("_", "-")
    return "--" + field.name.replace("_", "-")


def help_of(settings, name: str) -> str:
    """The declared help of field ``name`` of ``settings``."""
    text = _fields(settings)[name].metadata.get("help") or ""
    return text() if callable(text) else text


def cli_names(settings) -> list[str]:
    """The fields of ``settings`` that have a flag, in declaration
    order."""
    return [f.name for f in dataclasses.fields(settings)
            if f.metadata.get("cli")]


def _negated(field: dataclasses.Field) -> bool:
    """A ``--no-...`` switch: the field is True unless it is given."""
    return field.default is True


def _dest(field: dataclasses.Field) -> str:
    return f"no_{field.name}" if _negated(field) else field.name


def _fields(settings) -> dict:
    return {f.name: f for f in dataclasses.fields(settings)}


def add_arguments(parser, settings, names: Iterable[str] | None = None, *,
                  changes: dict | None = None) -> None:
    """Add a flag for each setting of ``settings`` named in ``names``.

    Parameters
    ----------
    parser : argparse.ArgumentParser or argument group
        Where the flags go.
    settings : dataclass or its instance
        The declarations.
    names : iterable of str, optional
        The fields, in the order their flags are added; default every
        field with a flag, in declaration order.
    changes : dict of str to dict, optional
        Where a command departs from the declaration: per field,
        argparse keywords that replace the declared ones (``default``,
        ``help``, ``type``, ``choices``), e.g. ``{"epochs": {"default":
        1}}``.
    """
    declared = _fields(settings)
    changes = changes or {}
    unknown = set(changes) - set(declared)
    if unknown:
        raise ValueError(f"no such settings: {', '.join(sorted(unknown))}")
    if names is None:
        names = cli_names(settings)
    for name in names:
        field = declared[name]
        meta = field.metadata
        options = {"help": meta.get("help") or None}
        if isinstance(field.default, bool):
            options["action"] = "store_true"
            options["dest"] = _dest(field)
        else:
            options["default"] = default_of(settings, name)
            for key in ("type", "choices"):
                if meta.get(key) is not None:
                    options[key] = meta[key]
        options.update(changes.get(name, {}))
        for key in ("help", "choices"):
            if callable(options.get(key)):
                options[key] = options[key]()
        parser.add_argument(flag_of(field), **options)


def from_args(settings, args: argparse.Namespace, **given) -> dict:
    """The values of ``settings``' fields found in ``args`` (a ``--no-x``
    switch read back as ``x = not no_x``), then ``given``.

    Returns
    -------
    dict
        Keyword arguments for ``settings``: the fields the parser had a
        flag for, updated with ``given``.
    """
    values = {}
    for name, field in _fields(settings).items():
        dest = _dest(field)
        if hasattr(args, dest):
            value = getattr(args, dest)
            values[name] = not value if _negated(field) else value
    values.update(given)
    return values
