"""Every request field that asks for a structured output becomes one StructuredOutput, or a 400 naming it."""

import json

import pytest

from lightllm_mtp.sampling_params import StructuredOutput
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.protocol import ApiError, CompletionRequest, parse_body
from lightllm_mtp.server.responses_protocol import ResponsesRequest

CHAT = {"messages": [{"role": "user", "content": "a"}]}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def chat(**fields):
    return parse_body(ChatCompletionRequest, json.dumps({**CHAT, **fields}).encode())


@pytest.mark.parametrize("fields, expect", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     StructuredOutput("json_schema", json.dumps(SCHEMA))),
    ({"response_format": {"type": "json_object"}}, StructuredOutput("json_object")),
    ({"response_format": {"type": "text"}}, None),
    ({"guided_json": SCHEMA}, StructuredOutput("json_schema", json.dumps(SCHEMA))),
    ({"json_schema": json.dumps(SCHEMA)}, StructuredOutput("json_schema", json.dumps(SCHEMA))),
    ({"guided_regex": "[0-9]+"}, StructuredOutput("regex", "[0-9]+")),
    ({"regex": "[0-9]+"}, StructuredOutput("regex", "[0-9]+")),
    ({"guided_choice": ["yes", "no"]}, StructuredOutput("choice", '["yes", "no"]')),
    ({"guided_grammar": 'root ::= "a"'}, StructuredOutput("grammar", 'root ::= "a"')),
    ({"ebnf": 'root ::= "a"'}, StructuredOutput("grammar", 'root ::= "a"')),
    ({"structured_outputs": {"choice": ["a", "b"]}}, StructuredOutput("choice", '["a", "b"]')),
    ({"structured_outputs": {"json_object": True}}, StructuredOutput("json_object")),
    ({"guided_regex": "[a-z]", "guided_decoding_backend": "xgrammar"}, StructuredOutput("regex", "[a-z]")),
])  # fmt: skip
def test_each_field_reaches_the_sampling_params(fields, expect):
    assert chat(**fields).sampling_params(8).structured == expect


@pytest.mark.parametrize("fields, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "needs a schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "type must be"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_regex": "(["}, "guided_regex", "invalid regex"),
    ({"guided_grammar": "root ::= "}, "guided_grammar", "invalid grammar"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"guided_regex": "a", "guided_json": SCHEMA}, "guided_regex", "both ask"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "give one of"),
    ({"guided_regex": "a", "guided_decoding_backend": "outlines"}, "guided_decoding_backend", "xgrammar"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "whitespace"),
])  # fmt: skip
def test_bad_structured_fields_are_400s_naming_them(fields, param, message):
    with pytest.raises(ApiError) as e:
        chat(**fields)
    assert e.value.status == 400 and e.value.param == param and message in e.value.message, e.value.message


def test_completions_and_responses_take_theirs():
    c = parse_body(CompletionRequest, json.dumps({"prompt": "a", "response_format": {"type": "json_object"}}).encode())
    assert c.sampling_params(4).structured == StructuredOutput("json_object")
    fmt = {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}}
    r = parse_body(ResponsesRequest, json.dumps({"input": "a", "text": fmt}).encode())
    assert r.sampling_params(4).structured == StructuredOutput("json_schema", json.dumps(SCHEMA))
