"""Every request field the OpenAI-compatible endpoints know, and what this server does with it.

A field is HONORED (it works), REFUSED (a 400 naming it whenever it holds anything but a neutral value: a client
that sends `"echo": false` is served, one that sends `"echo": true` is told), or INFORMATIONAL (metadata a server
accepts and, by the API's own definition, need not act on: `user`, `metadata`, `store`). A field no entry names is
ignored with a logged warning (vLLM's behaviour), never taken for a supported one. The catalogue covers the
OpenAI completions, chat and responses schemas (the `openai` client's parameter types: the unit test walks them)
and the vLLM / SGLang extensions clients commonly send; docs/openai_api.md shows it as a table
(`python -m lightllm_mtp.server.request_fields` prints it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger("lightllm_mtp.server")

HONORED, REFUSED, INFORMATIONAL = "honored", "refused", "informational"
COMPLETIONS, CHAT, RESPONSES = "completions", "chat", "responses"
ENDPOINTS = (COMPLETIONS, CHAT, RESPONSES)


@dataclass(frozen=True)
class FieldInfo:
    status: str
    source: str  # "openai", "vllm", "sglang", "lightllm_mtp" (an extension of this server)
    note: str
    endpoints: tuple[str, ...] = ENDPOINTS
    neutral: tuple = (None,)  # REFUSED: the values that ask for nothing (the request is served)
    example: object = None  # HONORED / INFORMATIONAL: a value that parses (the schema walk sends it)
    alongside: tuple = ()  # (name, value) pairs the example needs beside it


def _f(status, source, note, endpoints=ENDPOINTS, neutral=(None,), example=None, alongside=()) -> FieldInfo:
    return FieldInfo(status, source, note, tuple(endpoints), tuple(neutral), example, tuple(alongside))


C, H, R = (COMPLETIONS,), (CHAT,), (RESPONSES,)
CH = (COMPLETIONS, CHAT)
NOT_BUILT = "not implemented"
FIELDS: list[tuple[str, FieldInfo]] = [*{
    # ---- OpenAI, shared ----
    "model": _f(HONORED, "openai", "must name the served model (404 otherwise)", example="m"),
    "stream": _f(HONORED, "openai", "server-sent events", example=True),
    "stream_options": _f(HONORED, "openai", "include_usage; vLLM's continuous_usage_stats",
                         example={"include_usage": True}),  # fmt: skip
    "temperature": _f(HONORED, "openai", "0 is greedy", example=0.5),
    "top_p": _f(HONORED, "openai", "nucleus sampling", example=0.9),
    "seed": _f(HONORED, "openai", "a per-request generator: reproducible sampling", example=3),
    "user": _f(INFORMATIONAL, "openai", "accepted, not used", example="u"),
    "metadata": _f(INFORMATIONAL, "openai", "accepted, not used", CH[1:] + R, example={"k": "v"}),
    "store": _f(INFORMATIONAL, "openai", "accepted; nothing is stored", CH[1:] + R, example=False),
    "safety_identifier": _f(INFORMATIONAL, "openai", "accepted, not used", CH[1:] + R, example="s"),
    "service_tier": _f(INFORMATIONAL, "openai", "accepted; one tier", CH[1:] + R, example="auto"),
    "prompt_cache_key": _f(INFORMATIONAL, "openai", "accepted; the prefix cache needs no key (see cache_salt)",
                           CH[1:] + R, example="k"),  # fmt: skip
    "prompt_cache_retention": _f(REFUSED, "openai", NOT_BUILT, CH[1:] + R),
    "prompt_cache_options": _f(REFUSED, "openai", NOT_BUILT, CH[1:] + R),
    "moderation": _f(REFUSED, "openai", NOT_BUILT, CH[1:] + R),
    # ---- OpenAI completions ----
    "prompt": _f(HONORED, "openai", "text or token ids; one prompt per request", C, example="b"),
    "max_tokens": _f(HONORED, "openai", "", CH, example=5),
    "stop": _f(HONORED, "openai", "up to 4 strings", CH, example=["x"]),
    "n": _f(HONORED, "openai", "up to 16 choices (n engine requests; seeded: seeds s, s+1, ..)", CH, example=2),
    "best_of": _f(HONORED, "openai", "equal to n only (a 400 otherwise: no candidate ranking)", C, example=1),
    "echo": _f(REFUSED, "openai", NOT_BUILT, CH, neutral=(None, False)),
    "suffix": _f(REFUSED, "openai", NOT_BUILT, C, neutral=(None, "")),
    "logprobs": _f(HONORED, "openai", "raw logprobs of the target (MTP: the verify row's), streaming too; "
                   "completions: the number of alternatives", C, example=2),  # fmt: skip
    "top_logprobs": _f(HONORED, "openai", "0..20, with logprobs", H, example=2, alongside=(("logprobs", True),)),
    "presence_penalty": _f(HONORED, "openai", "every verify row and draft choice too", CH, example=0.5),
    "frequency_penalty": _f(HONORED, "openai", "every verify row and draft choice too", CH, example=0.5),
    "logit_bias": _f(HONORED, "openai", "{token id: bias}", CH, example={"7": 5}),
    # ---- OpenAI chat ----
    "messages": _f(HONORED, "openai", "text and image_url content parts (data: URIs; docs/openai_api.md#images); the "
                   "tokenizer's chat template", H,
                   example=[{"role": "user", "content": "b"}]),  # fmt: skip
    "max_completion_tokens": _f(HONORED, "openai", "", H, example=5),
    "response_format": _f(HONORED, "openai", "json_object / json_schema (strict): xgrammar, under MTP too", CH,
                          example={"type": "json_object"}),  # fmt: skip
    "tools": _f(HONORED, "openai", "rendered by the chat template; calls parsed by --tool_call_parser", H,
                example=[{"type": "function", "function": {"name": "f"}}]),  # fmt: skip
    "tool_choice": _f(HONORED, "openai", "none / auto (--enable_auto_tool_choice) / required / named: the last two "
                      "enforced by a grammar", H, example="none"),  # fmt: skip
    "parallel_tool_calls": _f(HONORED, "openai", "false: at most one call", H, example=False),
    "functions": _f(REFUSED, "openai", "deprecated: use tools", H, neutral=(None, [])),
    "function_call": _f(REFUSED, "openai", "deprecated: use tool_choice", H, neutral=(None, "none")),
    "reasoning_effort": _f(REFUSED, "openai", NOT_BUILT, H),
    "modalities": _f(REFUSED, "openai", "text only", H, neutral=(None, ["text"])),
    "audio": _f(REFUSED, "openai", "text only", H),
    "prediction": _f(REFUSED, "openai", NOT_BUILT, H),
    "verbosity": _f(REFUSED, "openai", NOT_BUILT, H),
    "web_search_options": _f(REFUSED, "openai", NOT_BUILT, H),
    # ---- OpenAI responses ----
    "input": _f(HONORED, "openai", "text, or items: messages of input_text / input_image parts, function_call, "
                "function_call_output, reasoning (other item types: 400)", R, example="b"),  # fmt: skip
    "instructions": _f(HONORED, "openai", "a system message", R, example="be brief"),
    "max_output_tokens": _f(HONORED, "openai", "", R, example=5),
    "text": _f(HONORED, "openai", "format: json_object / json_schema", R,
               example={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}),  # fmt: skip
    "reasoning": _f(HONORED, "openai", "effort none: thinking off (the model has no effort levels: others 400); "
                    "summary: 400", R, example={"effort": "none"}),  # fmt: skip
    "include": _f(REFUSED, "openai", NOT_BUILT, R, neutral=(None, [])),
    "previous_response_id": _f(REFUSED, "openai", "nothing is stored", R),
    "conversation": _f(REFUSED, "openai", "nothing is stored", R),
    "background": _f(REFUSED, "openai", NOT_BUILT, R, neutral=(None, False)),
    "background_options": _f(REFUSED, "openai", NOT_BUILT, R),
    "truncation": _f(REFUSED, "openai", "prompts that do not fit are refused", R, neutral=(None, "disabled")),
    "max_tool_calls": _f(REFUSED, "openai", "not implemented (parallel_tool_calls false: one call)", R),
    "context_management": _f(REFUSED, "openai", NOT_BUILT, R),
    "access_programs": _f(REFUSED, "openai", NOT_BUILT, R),
    "image": _f(REFUSED, "openai", "image context options: not implemented", R),
    # ---- vLLM / SGLang sampling extensions ----
    "top_k": _f(HONORED, "vllm", "-1 or 0: off", example=5),
    "stop_token_ids": _f(HONORED, "vllm", "", example=[7]),
    "ignore_eos": _f(HONORED, "vllm", "", example=True),
    "return_token_ids": _f(HONORED, "vllm", "token ids in each choice", CH, example=True),
    "cache_salt": _f(HONORED, "vllm", "prefix-cache partition", example="tenant"),
    "min_p": _f(HONORED, "vllm", "sampling (greedy keeps the argmax)", CH, example=0.1),
    "repetition_penalty": _f(HONORED, "vllm", "every verify row and draft choice too", CH, example=1.2),
    "min_tokens": _f(HONORED, "vllm", "eos, stop_token_ids and stop strings held back until then", CH, example=2),
    "include_stop_str_in_output": _f(HONORED, "vllm", "", CH, example=True),
    "use_beam_search": _f(REFUSED, "vllm", NOT_BUILT, neutral=(None, False)),
    "length_penalty": _f(REFUSED, "vllm", "beam search only", neutral=(None, 1, 1.0)),
    "skip_special_tokens": _f(REFUSED, "vllm", "special tokens are always skipped", neutral=(None, True)),
    "spaces_between_special_tokens": _f(REFUSED, "vllm", NOT_BUILT, neutral=(None, True)),
    "truncate_prompt_tokens": _f(REFUSED, "vllm", NOT_BUILT),
    "prompt_logprobs": _f(REFUSED, "vllm", NOT_BUILT, neutral=(None, 0)),
    "allowed_token_ids": _f(REFUSED, "vllm", NOT_BUILT),
    "bad_words": _f(REFUSED, "vllm", NOT_BUILT, neutral=(None, [])),
    "logits_processors": _f(REFUSED, "vllm", "no custom processors", neutral=(None, [])),
    "priority": _f(REFUSED, "vllm", "one priority", neutral=(None, 0)),
    "request_id": _f(INFORMATIONAL, "vllm", "accepted; responses carry their own id", example="r1"),
    "return_tokens_as_token_ids": _f(REFUSED, "vllm", NOT_BUILT, neutral=(None, False)),
    "add_special_tokens": _f(REFUSED, "vllm", "the template's tokens only", CH, neutral=(None, False)),
    "kv_transfer_params": _f(REFUSED, "vllm", NOT_BUILT),
    "vllm_xargs": _f(REFUSED, "vllm", NOT_BUILT),
    "mm_processor_kwargs": _f(REFUSED, "vllm", "the checkpoint's preprocessor_config.json applies"),
    "multi_modal_data": _f(REFUSED, "vllm", "images are taken as image_url parts of chat messages", C),
    "return_mtp_stats": _f(HONORED, "lightllm_mtp", "the request's acceptance in usage.mtp", example=True),
    # ---- chat template extensions ----
    "chat_template_kwargs": _f(HONORED, "vllm", "passed to the template (enable_thinking)", H + R,
                               example={"enable_thinking": False}),  # fmt: skip
    "chat_template": _f(REFUSED, "vllm", "per request: use the server's --chat_template", H),
    "add_generation_prompt": _f(REFUSED, "vllm", "always on", H, neutral=(None, True)),
    "continue_final_message": _f(REFUSED, "vllm", NOT_BUILT, H, neutral=(None, False)),
    "documents": _f(REFUSED, "vllm", NOT_BUILT, H),
    # ---- structured outputs (vLLM, SGLang) ----
    "guided_json": _f(HONORED, "vllm", "a JSON schema", CH, example={"type": "object"}),
    "guided_regex": _f(HONORED, "vllm", "", CH, example="[0-9]+"),
    "guided_choice": _f(HONORED, "vllm", "", CH, example=["yes", "no"]),
    "guided_grammar": _f(HONORED, "vllm", "EBNF (xgrammar's GBNF dialect)", CH, example='root ::= "a"'),
    "guided_decoding_backend": _f(HONORED, "vllm", "xgrammar or auto (others: 400)", CH, example="xgrammar"),
    "guided_whitespace_pattern": _f(REFUSED, "vllm", "JSON is generated without free whitespace", CH),
    "structural_tag": _f(REFUSED, "vllm", NOT_BUILT, CH),
    "structured_outputs": _f(HONORED, "vllm", "json / regex / choice / grammar / json_object", CH,
                             example={"regex": "[a-z]+"}),  # fmt: skip
    "regex": _f(HONORED, "sglang", "", CH, example="[0-9]+"),
    "json_schema": _f(HONORED, "sglang", "a JSON schema (object or text)", CH, example='{"type": "object"}'),
    "ebnf": _f(HONORED, "sglang", "xgrammar's GBNF dialect", CH, example='root ::= "a"'),
    # ---- SGLang others ----
    "no_stop_trim": _f(REFUSED, "sglang", NOT_BUILT, neutral=(None, False)),
    "separate_reasoning": _f(REFUSED, "sglang", NOT_BUILT, H, neutral=(None, True)),
    "stream_reasoning": _f(REFUSED, "sglang", NOT_BUILT, H, neutral=(None, True)),
    "lora_path": _f(REFUSED, "sglang", "no LoRA"),
    "rid": _f(INFORMATIONAL, "sglang", "accepted; responses carry their own id", example="r1"),
    "session_params": _f(REFUSED, "sglang", NOT_BUILT),
    "return_hidden_states": _f(REFUSED, "sglang", NOT_BUILT, neutral=(None, False)),
}.items(), ("prompt", _f(REFUSED, "openai", "prompt templates are not stored", R)),
  ("top_logprobs", _f(REFUSED, "openai", NOT_BUILT, R, neutral=(None, 0))),
  ("tools", _f(HONORED, "openai", "function tools, as chat's (other tool types: 400)", R,
               example=[{"type": "function", "name": "f"}])),
  ("tool_choice", _f(HONORED, "openai", "none / auto / required / {type: function, name}, as chat's", R,
                     example="none")),
  ("parallel_tool_calls", _f(HONORED, "openai", "false: at most one call", R, example=False)),
  ("logprobs", _f(HONORED, "openai", "raw logprobs of the target (MTP: the verify row's), streaming too", H,
                  example=True))]


def fields_of(endpoint: str) -> dict[str, FieldInfo]:
    return {name: f for name, f in FIELDS if endpoint in f.endpoints}


def is_neutral(info: FieldInfo, value) -> bool:
    return any(value == n and type(value) is type(n) for n in info.neutral if n is not None) or value is None


def check_fields(endpoint: str, data: dict) -> list[str]:
    """Raises UnsupportedField for the first refused field holding a non-neutral value. Drops from `data` the
    refused fields sent with a neutral value, the informational ones and the keys no entry names for this endpoint
    (logged: ignored); returns those unknown keys."""
    known = fields_of(endpoint)
    unknown = []
    for key in list(data):
        info = known.get(key)
        if info is None:
            unknown.append(key)
            del data[key]
        elif info.status == REFUSED:
            if not is_neutral(info, data[key]):
                raise UnsupportedField(key, info)
            del data[key]
        elif info.status == INFORMATIONAL:
            del data[key]
    if unknown:
        logger.warning("%s request: ignoring unknown fields %s", endpoint, sorted(unknown)[:16])
    return unknown


class UnsupportedField(Exception):
    """A 400 naming the field `key` (the catalogue's refusal, or `message` for a value this server cannot serve)."""

    def __init__(self, key: str, info: FieldInfo | None, message: str | None = None):
        if message is None:
            message = (f"{key} is not supported by this server ({info.note})" if info.note != NOT_BUILT
                       else f"{key} is not supported by this server")  # fmt: skip
        super().__init__(message)
        self.key = key


def markdown_table() -> str:
    """The catalogue as the docs' table."""
    rows = ["| field | from | completions | chat | responses | note |", "|---|---|---|---|---|---|"]
    for name, f in sorted(FIELDS, key=lambda kv: (kv[1].source != "openai", kv[0])):
        cells = [f.status if e in f.endpoints else "" for e in ENDPOINTS]
        rows.append(f"| `{name}` | {f.source} | {' | '.join(cells)} | {f.note} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
