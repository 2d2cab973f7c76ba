"""Chat templates shipped with the package (`--chat_template NAME`, `LLM.chat(chat_template=NAME)`): qwen3_5.jinja,
a Qwen3.5-style template (thinking on by default, tools in Qwen's XML format)."""

from __future__ import annotations

from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent


def chat_template_text(value: str) -> str:
    """The template a --chat_template value names: a shipped template's name, or a path to a Jinja file."""
    shipped = TEMPLATES_DIR / f"{value}.jinja"
    path = shipped if shipped.is_file() else Path(value)
    if not path.is_file():
        names = sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))
        raise ValueError(f"chat_template {value!r}: no such file, nor a shipped template ({', '.join(names)})")
    return path.read_text()
