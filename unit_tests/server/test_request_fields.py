"""Issue 32 item 1: every request field of the OpenAI completions / chat / responses schemas (walked from the official
client's parameter types) and of the catalogued vLLM / SGLang extensions is honored, refused with a 400 naming it, or
informational; a field nobody knows is ignored with a logged warning."""

import json
import logging

import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as response_params

from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.protocol import ApiError, CompletionRequest, parse_body
from lightllm_mtp.server.request_fields import (
    CHAT,
    COMPLETIONS,
    FIELDS,
    HONORED,
    INFORMATIONAL,
    REFUSED,
    RESPONSES,
    fields_of,
    markdown_table,
)
from lightllm_mtp.server.responses_protocol import ResponsesRequest

MODELS = {COMPLETIONS: CompletionRequest, CHAT: ChatCompletionRequest, RESPONSES: ResponsesRequest}
BASE = {COMPLETIONS: {"prompt": "a"}, CHAT: {"messages": [{"role": "user", "content": "a"}]}, RESPONSES: {"input": "a"}}
OPENAI_SCHEMAS = {
    COMPLETIONS: completion_params.CompletionCreateParamsBase,
    CHAT: chat_params.CompletionCreateParamsBase,
    RESPONSES: response_params.ResponseCreateParamsBase,
}
NOT_NEUTRAL = {"an": "object no field takes as neutral"}


def parse(endpoint, extra):
    return parse_body(MODELS[endpoint], json.dumps({**BASE[endpoint], **extra}).encode())


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT, RESPONSES])
def test_every_openai_field_is_catalogued(endpoint):
    """A field the official client can send that the catalogue does not know would be silently ignored."""
    names = set(OPENAI_SCHEMAS[endpoint].__annotations__) | {"stream"}
    missing = sorted(names - set(fields_of(endpoint)))
    assert not missing, f"{endpoint}: uncatalogued OpenAI fields {missing}"


def _cases():
    for endpoint in (COMPLETIONS, CHAT, RESPONSES):
        for name, info in fields_of(endpoint).items():
            yield pytest.param(endpoint, name, info, id=f"{endpoint}-{name}")


@pytest.mark.parametrize("endpoint, name, info", _cases())
def test_each_field_is_honored_refused_or_informational(endpoint, name, info, caplog):
    model = MODELS[endpoint]
    if info.status == REFUSED:
        with pytest.raises(ApiError) as e:
            parse(endpoint, {name: NOT_NEUTRAL})
        assert e.value.status == 400 and e.value.param == name and name in e.value.message
        for neutral in info.neutral:  # a client sending the neutral value is served
            parse(endpoint, {name: neutral})
        return
    assert info.example is not None, f"{name}: an honored field needs an example"
    with caplog.at_level(logging.WARNING, logger="lightllm_mtp.server"):
        req = parse(endpoint, {**dict(info.alongside), name: info.example})
    assert "unknown" not in caplog.text
    if info.status == HONORED:
        assert name in model.model_fields, f"{name} is honored but {model.__name__} does not declare it"
        default = parse(endpoint, dict(info.alongside))
        assert getattr(req, name) != getattr(default, name), f"{name}: the example changes nothing"
    else:
        assert info.status == INFORMATIONAL and name not in model.model_fields


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT, RESPONSES])
def test_unknown_fields_are_ignored_with_a_warning(endpoint, caplog):
    with caplog.at_level(logging.WARNING, logger="lightllm_mtp.server"):
        parse(endpoint, {"temperatur": 0.5})
    assert "temperatur" in caplog.text and "unknown" in caplog.text


def test_a_field_of_another_endpoint_is_not_taken():
    """`max_tokens` is not a Responses field (max_output_tokens is): ignored with a warning, never half-applied."""
    req = parse(RESPONSES, {"max_tokens": 3})
    assert req.max_tokens is None


def test_the_docs_table_is_the_catalogue():
    with open("docs/openai_api.md") as f:
        assert markdown_table() in f.read()
    assert len({(n, f.endpoints) for n, f in FIELDS}) == len(FIELDS)
