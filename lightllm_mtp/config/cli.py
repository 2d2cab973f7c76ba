"""argparse flags derived from `option(...)` fields (config/options.py): every flag in both `_` and `-` spellings, its
aliases, `--no_<name>` for booleans, and the help text and default of the one declaration.

Flags that are not given stay out of the namespace (argparse.SUPPRESS), so the dataclass default is the only
default: `values_given(namespace, cls)` is what the user passed, ready for `cls(**values)`."""

from __future__ import annotations

import argparse
from typing import Any

from lightllm_mtp.config.options import Option, display, options_of, spellings


def add_options(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = (),
                defaults: dict[str, Any] | None = None, optional: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Adds one flag per option of `cls` (grouped by OptionMeta.group). `defaults` replaces a default for this
    parser only (the main job's mtp_mode); `optional` makes a required option optional (its caller fills it in)."""
    groups: dict[str, argparse._ArgumentGroup] = {
        g.title: g for g in parser._action_groups if g.title is not None  # groups another class already made
    }
    defaults = defaults or {}
    for opt in options_of(cls):
        if opt.name in skip:
            continue
        group = groups.get(opt.meta.group) or groups.setdefault(opt.meta.group, parser.add_argument_group(opt.meta.group))
        default = defaults.get(opt.name, opt.default)
        if opt.name in defaults:
            parser.set_defaults(**{opt.name: default})
        required = opt.required and opt.name not in optional and opt.name not in defaults
        _add(group, opt, default, required)


def _add(group: argparse._ArgumentGroup, opt: Option, default: Any, required: bool) -> None:
    shown = "" if required or default is None else f" (default: {display(default)})"
    if opt.value_type is bool:
        group.add_argument(*opt.flag_names, dest=opt.name, action="store_const", const=True,
                           default=argparse.SUPPRESS, help=opt.meta.help + shown)  # fmt: skip
        off = opt.meta.negations if opt.name.startswith("disable_") else (f"no_{opt.name}", *opt.meta.negations)
        if off:
            group.add_argument(*spellings(*off), dest=opt.name, action="store_const", const=False,
                               default=argparse.SUPPRESS, help=f"sets --{opt.name} off")  # fmt: skip
    else:
        kwargs: dict[str, Any] = dict(dest=opt.name, type=opt.value_type, default=argparse.SUPPRESS,
                                      help=opt.meta.help + shown, required=required,
                                      metavar=opt.name.upper())  # fmt: skip
        if opt.meta.choices is not None:
            kwargs["choices"] = opt.meta.choices
            kwargs["help"] = f"{opt.meta.help}; one of: {', '.join(opt.meta.choices)}{shown}"
        group.add_argument(*opt.flag_names, **kwargs)
    for flag, value in opt.meta.consts:
        group.add_argument(*spellings(flag), dest=opt.name, action="store_const", const=value,
                           default=argparse.SUPPRESS, help=f"same as --{opt.name} {display(value)}")  # fmt: skip


def values_given(namespace: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The options of `cls` present in the namespace (given on the command line, or a parser default)."""
    given = vars(namespace)
    return {opt.name: given[opt.name] for opt in options_of(cls) if opt.name in given}
