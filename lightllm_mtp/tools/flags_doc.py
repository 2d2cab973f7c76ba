"""Writes docs/flags.md from the option declarations (EngineArgs, ServerArgs): the one place the flags are described
is their declaration, and a test keeps the page equal to this output.

    python -m lightllm_mtp.tools.flags_doc > docs/flags.md
"""

from __future__ import annotations

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.options import Option, display, options_of, spellings
from lightllm_mtp.server.args import ServerArgs

HEADER = """# Flags and `LLM(...)` keywords

Generated from the option declarations (`lightllm_mtp/config/engine_args.py`, `lightllm_mtp/server/args.py`) by
`python -m lightllm_mtp.tools.flags_doc > docs/flags.md`; a test keeps this page current.

Every engine option is a server flag (`python -m lightllm_mtp.server.api_server`), a main-job flag
(`python -m lightllm_mtp`) and a keyword of `LLM(...)`; the server options are flags only. Each flag also takes its
dashed spelling (`--model-dir`); boolean options are switched off with `--no_<name>` (or the listed legacy flag).
"""


def _row(opt: Option) -> str:
    other = [f"`{f}`" for f in spellings(*opt.meta.aliases)]
    if opt.value_type is bool:
        off = opt.meta.negations if opt.name.startswith("disable_") else (f"no_{opt.name}", *opt.meta.negations)
        other += [f"`--{name}`" for name in off]
    other += [f"`--{flag}`" for flag, _ in opt.meta.consts]
    default = "required" if opt.required else f"`{display(opt.default)}`"
    meaning = opt.meta.help.replace("|", "\\|")
    if opt.meta.choices:
        meaning += f" ({', '.join(opt.meta.choices)})"
    return f"| `--{opt.name}` | {', '.join(other)} | {default} | {meaning} |"


def render() -> str:
    out = [HEADER]
    for title, cls in (("Engine options (flags and `LLM(...)` keywords)", EngineArgs), ("Server options", ServerArgs)):
        out.append(f"## {title}\n")
        groups: dict[str, list[Option]] = {}
        for opt in options_of(cls):
            groups.setdefault(opt.meta.group, []).append(opt)
        for group, opts in groups.items():
            out.append(f"### {group}\n\n| flag | other spellings | default | meaning |\n|---|---|---|---|")
            out += [_row(o) for o in opts]
            out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
