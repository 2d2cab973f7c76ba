"""One declaration per option. A field made by `option(...)` carries its default, help, group and other CLI spellings;
the server's flags, the main job's flags and `LLM(...)`'s keywords are all derived from such fields (config/cli.py),
so adding an option is one edit in one dataclass."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class OptionMeta:
    help: str
    group: str
    aliases: tuple[str, ...] = ()  # other names of the flag (LightLLM / vLLM spellings); each also with dashes
    # bool options: flags that set it False besides --no_<name> (e.g. --disable_prefix_cache)
    negations: tuple[str, ...] = ()
    # flags that set the option to a constant (e.g. --disable_cudagraph sets graph_max_batch_size to 0)
    consts: tuple[tuple[str, Any], ...] = ()
    choices: tuple[str, ...] | None = None  # the accepted CLI texts (None: any text the type parses)
    cli_type: type | None = None  # CLI text -> value (None: from the field's annotation)


def option(default: Any = dataclasses.MISSING, help: str = "", *, group: str, aliases: tuple[str, ...] = (),
           negations: tuple[str, ...] = (), consts: dict[str, Any] | None = None,
           choices: tuple[str, ...] | None = None, cli_type: type | None = None) -> Any:  # fmt: skip
    meta = OptionMeta(help, group, tuple(aliases), tuple(negations), tuple((consts or {}).items()), choices, cli_type)
    return field(default=default, metadata={"option": meta})


@dataclass(frozen=True)
class Option:
    """One declared option of a config class, with what the CLI and `LLM(...)` need to know of it."""

    name: str
    default: Any  # dataclasses.MISSING for a required option
    meta: OptionMeta
    value_type: type  # int, float, str or bool: what the CLI parses (enums and devices arrive as text)
    optional: bool  # None is a legal value

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def flag_names(self) -> tuple[str, ...]:
        return spellings(self.name, *self.meta.aliases)


def spellings(*names: str) -> tuple[str, ...]:
    """`--model_dir` and `--model-dir` for each name, in order, without repeats."""
    out: list[str] = []
    for name in names:
        for flag in (f"--{name}", f"--{name.replace('_', '-')}"):
            if flag not in out:
                out.append(flag)
    return tuple(out)


def options_of(cls: type) -> list[Option]:
    """The `option(...)` fields of a dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("option")
        if meta is None or not f.init:
            continue
        value_type, optional = _cli_type(hints[f.name])
        out.append(Option(f.name, f.default, meta, meta.cli_type or value_type, optional))
    return out


def _cli_type(annotation: Any) -> tuple[type, bool]:
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or typing.get_origin(
        annotation) is typing.Union else (annotation,)  # fmt: skip
    optional = type(None) in args
    kinds = [a for a in args if a is not type(None)]
    for simple in (bool, int, float):
        if simple in kinds:
            return simple, optional
    return str, optional


def display(value: Any) -> str:
    """How a default reads in --help and docs: enum and torch values by their user-facing text."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if value is None:
        return "none"
    return str(value)
