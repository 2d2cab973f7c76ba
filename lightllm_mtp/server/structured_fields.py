"""The request fields that ask for a structured output, as one StructuredOutput (sampling_params.py), or a 400
naming the field: OpenAI's `response_format` (chat and, as vLLM, completions) and the Responses API's
`text.format`; vLLM's `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` and `structured_outputs`
({"json" | "regex" | "choice" | "grammar" | "json_object"}); SGLang's `json_schema` / `regex` / `ebnf`. At most one of
them per request. The grammar's syntax is checked here (xgrammar, no tokenizer needed), so a bad schema is a 400."""

from __future__ import annotations

import json

from lightllm_mtp.sampling.grammar import grammar_text
from lightllm_mtp.sampling_params import StructuredOutput
from lightllm_mtp.server.request_fields import UnsupportedField

BACKENDS = ("xgrammar", "auto")  # guided_decoding_backend values that ask for what this server does


def _schema_text(key: str, schema) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise UnsupportedField(key, None, f"{key}: the schema is not valid JSON ({e})") from None
    if not isinstance(schema, dict):
        raise UnsupportedField(key, None, f"{key}: a JSON schema must be an object")
    return json.dumps(schema)


def _from_response_format(key: str, rf) -> StructuredOutput | None:
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise UnsupportedField(key, None, f"{key}: type must be text, json_object or json_schema")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return StructuredOutput("json_object")
    inner = rf.get("json_schema", rf)  # chat: {"json_schema": {"name", "schema", "strict"}}; responses: flat
    if not isinstance(inner, dict) or "schema" not in inner:
        raise UnsupportedField(key, None, f"{key}: json_schema needs a schema")
    return StructuredOutput("json_schema", _schema_text(key, inner["schema"]))


def _from_structured_outputs(key: str, so) -> StructuredOutput | None:
    if not isinstance(so, dict):
        raise UnsupportedField(key, None, f"{key} must be an object")
    given = {k: v for k, v in so.items() if v not in (None, False)}
    unknown = sorted(set(given) - {"json", "regex", "choice", "grammar", "json_object"})
    if unknown or len(given) > 1:
        raise UnsupportedField(key, None, f"{key}: give one of json, regex, choice, grammar, json_object")
    if not given:
        return None
    (kind, value), = given.items()
    return _one(f"{key}.{kind}", {"json": "json_schema", "grammar": "grammar"}.get(kind, kind), value)


def _one(key: str, kind: str, value) -> StructuredOutput:
    if kind == "json_schema":
        return StructuredOutput("json_schema", _schema_text(key, value))
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise UnsupportedField(key, None, f"{key} must be a non-empty list of non-empty strings")
        return StructuredOutput("choice", json.dumps(value))
    if not isinstance(value, str) or not value:
        raise UnsupportedField(key, None, f"{key} must be a non-empty string")
    return StructuredOutput(kind, value)


FIELD_KINDS = {  # request field -> how it reads
    "guided_json": "json_schema", "json_schema": "json_schema", "guided_regex": "regex", "regex": "regex",
    "guided_choice": "choice", "guided_grammar": "grammar", "ebnf": "grammar",
}  # fmt: skip


def structured_output(fields: dict) -> StructuredOutput | None:
    """fields: the request's structured-output fields that were set (name -> value)."""
    backend = fields.pop("guided_decoding_backend", None)
    if backend is not None and backend not in BACKENDS:
        raise UnsupportedField("guided_decoding_backend", None,
                               f"guided_decoding_backend: this server's grammar engine is xgrammar, not {backend!r}")
    found: list[tuple[str, StructuredOutput | None]] = []
    for key, value in fields.items():
        if value is None:
            continue
        if key in ("response_format", "text"):
            fmt = value.get("format") if key == "text" and isinstance(value, dict) else value
            found.append((key, None if fmt is None else _from_response_format(key, fmt)))
        elif key == "structured_outputs":
            found.append((key, _from_structured_outputs(key, value)))
        else:
            found.append((key, _one(key, FIELD_KINDS[key], value)))
    asked = [(k, so) for k, so in found if so is not None]
    if len(asked) > 1:
        raise UnsupportedField(asked[1][0], None, f"{asked[0][0]} and {asked[1][0]} both ask for a structured output")
    if not asked:
        return None
    key, so = asked[0]
    try:
        grammar_text(so)
    except ValueError as e:
        raise UnsupportedField(key, None, f"{key}: {e}") from None
    return so
