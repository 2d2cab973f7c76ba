"""Qwen's XML tool calls (`--tool_call_parser qwen3_coder`, also named `qwen3_xml`) as OpenAI `tool_calls`, and the
grammar that enforces `tool_choice` "required" or a named function.

The format (Qwen3.5's chat template, lightllm_mtp/chat_templates/qwen3_5.jinja):
    <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>
Each VALUE is typed by the tool's JSON schema for KEY (integer, number, boolean, object / array / null as JSON, a
string as is; a value that does not convert stays a string) and the arguments become one JSON object string.

`ToolCallStream` is the one parser, for whole answers and for streams alike: text outside calls is content (the
whitespace around calls is dropped), a call is emitted once its closing tag has arrived, whole (name and complete
arguments in one delta). Text that may begin `<tool_call>` is held back until the next delta decides, so any
split of the answer into deltas (MTP blocks of any size, two calls in one delta) reassembles to the same content and
calls as the whole answer.
"""

from __future__ import annotations

import json
import re
import uuid

from lightllm_mtp.server.reasoning import _partial_suffix

PARSERS = ("qwen3_coder", "qwen3_xml")
START, END = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def tool_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """name -> parameters schema of each function tool."""
    out = {}
    for t in tools or []:
        fn = t.get("function", t)
        out[fn.get("name", "")] = fn.get("parameters") or {}
    return out


def _typed(raw: str, schema: dict):
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    try:
        if "string" in kinds:
            return raw
        if "integer" in kinds and re.fullmatch(r"-?\d+", raw.strip()):
            return int(raw)
        if "number" in kinds or "integer" in kinds:
            value = float(raw)
            return int(value) if value.is_integer() and "integer" in kinds else value
        if "boolean" in kinds and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        if kind is None or {"object", "array", "null"} & set(kinds):
            return json.loads(raw)
    except ValueError:
        pass
    return raw


def parse_call(block: str, schemas: dict[str, dict]) -> dict | None:
    """The inside of one <tool_call> block -> {"name", "arguments" (JSON text)}, or None if it is not a call."""
    m = _FUNCTION.search(block)
    if m is None:
        return None
    name = m.group(1).strip()
    props = schemas.get(name, {}).get("properties", {})
    args = {k.strip(): _typed(v, props.get(k.strip(), {})) for k, v in _PARAMETER.findall(m.group(2))}
    return {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}


class ToolCallStream:
    def __init__(self, tools: list[dict] | None, parallel: bool = True):
        self.schemas = tool_schemas(tools)
        self.parallel = parallel  # parallel_tool_calls false: the first call only
        self.buf = ""
        self.held = ""  # whitespace not released yet (dropped if a call follows)
        self.before_call = ""  # the held whitespace before the <tool_call> being read
        self.in_call = False
        self.num_calls = 0

    def push(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        """(content delta, calls completed by `text`: OpenAI tool_call dicts with their index)."""
        pieces = self.push_pieces(text, final)
        return "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, dict)]

    def push_pieces(self, text: str, final: bool = False) -> list[str | dict]:
        """What `text` completes, in answer order: content text (str) and calls (dict), no empty strings."""
        self.buf += text
        pieces: list[str | dict] = []

        def content(text: str, final: bool) -> None:
            released = self._content(text, final)
            if released:
                pieces.append(released)

        while True:
            if not self.in_call:
                i = self.buf.find(START)
                if i < 0:
                    keep = 0 if final else _partial_suffix(self.buf, START)
                    content(self.buf[: len(self.buf) - keep], final)
                    self.buf = self.buf[len(self.buf) - keep :]
                    break
                content(self.buf[:i], False)
                self.before_call, self.held = self.held, ""  # dropped if this is a call, given back if not
                self.buf, self.in_call = self.buf[i + len(START) :], True
            else:
                j = self.buf.find(END)
                if j < 0:
                    if final:  # an unterminated call is text
                        content(self.before_call + START + self.buf, True)
                        self.buf = ""
                    break
                call = parse_call(self.buf[:j], self.schemas)
                if call is None:
                    content(self.before_call + START + self.buf[: j + len(END)], False)
                elif self.parallel or self.num_calls == 0:
                    pieces.append({"index": self.num_calls, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                   "function": call})  # fmt: skip
                    self.num_calls += 1
                self.buf, self.in_call = self.buf[j + len(END) :], False
        if final and self.num_calls:
            self.held = ""
        return pieces

    def _content(self, text: str, final: bool) -> str:
        """Text outside calls, less the whitespace that may only separate calls (held until text or the end)."""
        text = self.held + text
        body = text.rstrip()
        if final and not self.num_calls:
            self.held = ""
            return text
        self.held = text[len(body) :]
        return body


VALUE_RULES = {  # a parameter's value by its schema type: one line each, so a call always gets to its closing tags
    "integer": 'value_integer ::= "-"? [0-9]{1,18}',
    "number": 'value_number ::= "-"? [0-9]{1,18} ("." [0-9]{1,12})?',
    "boolean": 'value_boolean ::= "true" | "false"',
    "other": "value_other ::= [^<\\n]{0,256}",
}


def tool_choice_grammar(tools: list[dict], name: str | None, parallel: bool) -> str:
    """EBNF (xgrammar) of answers that are only tool calls: of `name`, or of any tool ("required"); one call, or
    several separated by newlines when parallel. Each parameter's value is one line, typed by its schema (integer,
    number, boolean; anything else: up to 256 characters); a call holds at most as many parameters as its tool has,
    so every call reaches its closing tags."""
    schemas = tool_schemas(tools)
    names = [name] if name is not None else list(schemas)
    rules = []
    for i, n in enumerate(names):
        props = schemas.get(n, {}).get("properties", {})
        alternatives = []
        for key, schema in props.items():
            kind = schema.get("type") if schema.get("type") in VALUE_RULES else "other"
            alternatives.append(f'({json.dumps(f"<parameter={key}>" + chr(10))} value_{kind} "\\n</parameter>\\n")')
        params = f"({' | '.join(alternatives)}){{0,{len(alternatives)}}}" if alternatives else '""'
        rules.append(f'call{i} ::= {json.dumps(f"<tool_call>{chr(10)}<function={n}>{chr(10)}")} {params} '
                     '"</function>\\n</tool_call>"')
    calls = " | ".join(f"call{i}" for i in range(len(names)))
    root = 'root ::= call ("\\n" call)*' if parallel and name is None else "root ::= call"
    return "\n".join([root, f"call ::= {calls}", *rules, *VALUE_RULES.values()])
