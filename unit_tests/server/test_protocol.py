"""Request parsing: every bad body is one ApiError (status, OpenAI error body, the offending field)."""

import json
import time

import pytest

from lightllm_mtp.server.generate_protocol import GenerateRequest
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.protocol import ApiError, CompletionRequest, parse_body


def parse(model, body):
    return parse_body(model, body if isinstance(body, bytes) else json.dumps(body).encode())


def test_valid_requests_and_their_sampling_params():
    r = parse(CompletionRequest, {"prompt": ["only one"], "temperature": 0, "stop": "\n\n", "seed": 3,
                                  "stream": True, "stream_options": {"include_usage": True}, "user": "ignored"})
    assert r.prompt == "only one" and r.stop_strings == ("\n\n",) and r.include_usage
    p = r.sampling_params(max_new_tokens=5)
    assert (p.temperature, p.max_new_tokens, p.seed, p.greedy) == (0.0, 5, 3, True)
    assert parse(CompletionRequest, {"prompt": [[1, 2, 3]]}).prompt == [1, 2, 3]
    chat = parse(ChatCompletionRequest, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                  {"type": "text", "text": "b"}]}],
                                         "max_completion_tokens": 7})  # fmt: skip
    assert chat.messages[0].parts() == ["a", "b"] and chat.max_new_tokens == 7
    g = parse(GenerateRequest, {"inputs": "x", "parameters": {"max_new_tokens": 3, "stop_sequences": "y"}})
    assert g.parameters.sampling_params().greedy and g.parameters.stop_strings == ("y",)
    sampled = parse(GenerateRequest, {"inputs": "x", "parameters": {"do_sample": True, "temperature": 0.7}})
    assert sampled.parameters.sampling_params().temperature == 0.7


@pytest.mark.parametrize(
    "model, body, param, message",
    [
        (CompletionRequest, b"{nope", None, "not valid JSON"),
        (CompletionRequest, b"[1]", None, "must be a JSON object"),
        (CompletionRequest, {}, "prompt", "Field required"),
        (CompletionRequest, {"prompt": ""}, "prompt", "the prompt is empty"),
        (CompletionRequest, {"prompt": ["a", "b"]}, "prompt", "batched prompts are not supported"),
        (CompletionRequest, {"prompt": [True, False]}, "prompt", "valid integer"),
        (CompletionRequest, {"prompt": "a", "max_tokens": 0}, "max_tokens", "must be at least 1"),
        (CompletionRequest, {"prompt": "a", "temperature": -1}, "temperature", "must be a finite number >= 0"),
        (CompletionRequest, b'{"prompt": "a", "temperature": NaN}', "temperature", "must be a finite number"),
        (CompletionRequest, b'{"prompt": "a", "temperature": Infinity}', "temperature", "must be a finite number"),
        (CompletionRequest, b'{"prompt": "a", "top_p": NaN}', "top_p", "must be in (0, 1]"),
        (CompletionRequest, {"prompt": "a", "temperature": "hot"}, "temperature", "valid number"),
        (CompletionRequest, {"prompt": "a", "top_p": 0}, "top_p", "must be in (0, 1]"),
        (CompletionRequest, {"prompt": "a", "top_k": -3}, "top_k", "must be -1, 0"),
        (CompletionRequest, {"prompt": "a", "n": 17}, "n", "must be in [1, 16]"),
        (CompletionRequest, {"prompt": "a", "stop": ["a"] * 5}, "stop", "at most 4 stop strings"),
        (CompletionRequest, {"prompt": "a", "stop": [""]}, "stop", "non-empty"),
        (CompletionRequest, {"prompt": "a", "stop": 3}, "stop", "valid string"),
        (CompletionRequest, {"prompt": "a", "stop": ["x" * 1025]}, "stop", "at most 1024 characters"),
        (GenerateRequest, {"inputs": "a", "parameters": {"stop_sequences": "x" * 1025}}, "parameters", "at most 1024"),
        (CompletionRequest, {"prompt": "a", "stop_token_ids": [-1]}, "stop_token_ids", "must be >= 0"),
        (CompletionRequest, {"prompt": "a", "seed": 2**64}, "seed", "must fit in 64 bits"),
        (CompletionRequest, {"prompt": "a", "presence_penalty": 2.5}, "presence_penalty", "must be in [-2, 2]"),
        (CompletionRequest, {"prompt": "a", "repetition_penalty": 0}, "repetition_penalty", "> 0"),
        (CompletionRequest, {"prompt": "a", "min_p": 1.5}, "min_p", "must be in [0, 1]"),
        (CompletionRequest, {"prompt": "a", "min_tokens": -1}, "min_tokens", ">= 0"),
        (CompletionRequest, {"prompt": "a", "logit_bias": {"x": 1}}, "logit_bias", "token ids"),
        (CompletionRequest, {"prompt": "a", "logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
        (CompletionRequest, {"prompt": "a", "logprobs": 21}, "logprobs", "must be in [0, 20]"),
        (ChatCompletionRequest, {"messages": [{"role": "user"}], "top_logprobs": 2}, "top_logprobs",
         "needs logprobs"),
        (CompletionRequest, {"prompt": "a", "echo": True}, "echo", "not supported"),
        (CompletionRequest, {"prompt": "a", "best_of": 2}, "best_of", "best_of 2 != n 1"),
        (ChatCompletionRequest, {"messages": []}, "messages", "at least 1 item"),
        (ChatCompletionRequest, {"messages": [{"role": "user"}], "tools": [{"type": "function"}]}, "tools",
         "each tool must be"),
        (ChatCompletionRequest, {"messages": [{"role": "user"}], "tool_choice": "required"}, "tool_choice",
         "needs tools"),
        (ChatCompletionRequest, {"messages": [{"role": "user"}], "tools": [{"type": "function", "function": {
            "name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "'g'"),
        (ChatCompletionRequest, {"messages": [{"role": "user"}], "chat_template_kwargs": {"tools": []}},
         "chat_template_kwargs", "set by the server"),
        (GenerateRequest, {"inputs": ""}, "inputs", "at least 1 character"),
        (GenerateRequest, {"inputs": "a", "parameters": {"stop_sequences": [""]}}, "parameters", "non-empty"),
    ],
)  # fmt: skip
def test_bad_bodies(model, body, param, message):
    with pytest.raises(ApiError) as e:
        parse(model, body)
    err = e.value.body()["error"]
    assert e.value.status == 400 and err["type"] == "invalid_request_error", err
    assert err["param"] == param and message in err["message"], err


def test_an_integer_past_pythons_digit_limit_is_a_bad_request():
    """json.loads refuses integers of more than 4,300 digits with a ValueError that is not a JSONDecodeError."""
    with pytest.raises(ApiError) as e:
        parse_body(CompletionRequest, b'{"prompt": "a", "seed": ' + b"9" * 4301 + b"}")
    assert e.value.status == 400 and e.value.code == "invalid_json" and "cannot read" in e.value.message


def test_cache_salt_reaches_the_sampling_params_of_every_endpoint():
    from lightllm_mtp.server.responses_protocol import ResponsesRequest

    for model, body in [(CompletionRequest, {"prompt": "a"}), (ChatCompletionRequest, {"messages": [{"role": "user"}]}),
                        (ResponsesRequest, {"input": "a"})]:  # fmt: skip
        assert parse(model, {**body, "cache_salt": "tenant-a"}).sampling_params(4).cache_salt == "tenant-a"
        assert parse(model, body).sampling_params(4).cache_salt is None
        with pytest.raises(ApiError) as e:
            parse(model, {**body, "cache_salt": ""})
        assert e.value.param == "cache_salt"
    g = parse(GenerateRequest, {"inputs": "x", "parameters": {"cache_salt": "tenant-b"}})
    assert g.parameters.sampling_params().cache_salt == "tenant-b"
    with pytest.raises(ApiError) as e:
        parse(GenerateRequest, {"inputs": "x", "parameters": {"cache_salt": 7}})
    assert e.value.param == "parameters"


@pytest.mark.parametrize("part, message", [
    ({"type": "image_url"}, "messages.0.content: content part 1: an image_url content part needs"),
    ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
     "messages.0.content: content part 1: content parts of type 'video_url' are not supported"),
    ({"type": "text", "text": 3}, "messages.0.content: content part 1: a text content part needs a string 'text'"),
])  # fmt: skip
def test_bad_chat_content_parts_are_named(part, message):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, part]}]}
    with pytest.raises(ApiError) as e:
        parse(ChatCompletionRequest, body)
    assert e.value.status == 400 and e.value.param == "messages" and e.value.message.startswith(message), e.value.message


@pytest.mark.parametrize("do_sample", ["true", "false"])
def test_generate_with_a_nan_temperature_is_a_bad_request(do_sample):
    body = b'{"inputs": "x", "parameters": {"do_sample": %s, "temperature": NaN}}' % do_sample.encode()
    with pytest.raises(ApiError, match="finite number"):  # do_sample false ignores it, but it is still checked
        parse(GenerateRequest, body)


def test_a_chat_template_that_rejects_the_messages_is_a_bad_request():
    from jinja2 import TemplateError

    from lightllm_mtp.server.chat_prompt import ChatPromptEncoder

    class Tokenizer:
        chat_template = "{{ raise_exception('System message must be at the beginning.') }}"
        all_special_tokens = ["<|im_end|>"]

        def apply_chat_template(self, *args, **kwargs):
            raise TemplateError("System message must be at the beginning.")

    messages = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]
    chat = parse(ChatCompletionRequest, {"messages": messages})
    with pytest.raises(ApiError) as e:
        ChatPromptEncoder(Tokenizer()).encode(chat)
    assert e.value.status == 400 and e.value.body()["error"]["param"] == "messages"
    assert "System message must be at the beginning" in e.value.body()["error"]["message"]


def _bodies_of_bad_items():
    n = 200_000
    bools, fives = b",".join([b"true"] * n), b",".join([b"5"] * n)
    bad_messages = b",".join([b'{"role": "user", "content": 5}'] * n)
    return [
        (CompletionRequest, b'{"prompt": [' + bools + b"]}", "prompt"),
        (CompletionRequest, b'{"prompt": [[' + bools + b"]]}", "prompt"),
        (CompletionRequest, b'{"prompt": "a", "stop_token_ids": [' + bools + b"]}", "stop_token_ids"),
        (CompletionRequest, b'{"prompt": "a", "stop": [' + fives + b"]}", "stop"),
        (CompletionRequest, b'{"prompt": "a", "logit_bias": {' + b",".join(b'"%d": "x"' % i for i in range(n)) + b"}}",
         "logit_bias"),
        (ChatCompletionRequest, b'{"messages": [' + bad_messages + b"]}", "messages"),
        (ChatCompletionRequest, b'{"messages": [{"role": "user", "content": [' + fives + b"]}]}", "messages"),
        (ChatCompletionRequest, b'{"messages": [{"role": "user"}], "tools": [' + fives + b"]}", "tools"),
        (GenerateRequest, b'{"inputs": "a", "parameters": {"stop_sequences": [' + fives + b"]}}", "parameters"),
    ]  # fmt: skip


@pytest.mark.parametrize("model, body, param", _bodies_of_bad_items(), ids=lambda v: getattr(v, "__name__", None))
def test_a_body_of_many_bad_items_fails_at_the_first(model, body, param):
    """One error per collection, not one per item and union member: 1.6M `true`s as token ids (8 MiB) took a minute
    of the front's CPU, 200,000 bad messages seconds."""
    started = time.perf_counter()
    with pytest.raises(ApiError) as e:
        parse_body(model, body)
    assert e.value.status == 400 and e.value.param == param and time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    "body, ok",
    [
        (b'{"prompt": "\\ud83d\\ude00 a pair is fine"}', True),
        (b'{"prompt": "\\\\ud800 is an escaped backslash, then text"}', True),
        (b'{"prompt": "a lone \\ud83d"}', False),
        (b'{"prompt": ["ok", "\\udfff"]}', False),
        (b'{"prompt": "\xed\xa0\x80 (a surrogate encoded as UTF-8)"}', False),
        (b'\xff\xfe{\x00}\x00', False),  # UTF-16: JSON over HTTP is UTF-8
    ],
)  # fmt: skip
def test_strings_must_be_valid_unicode(body, ok):
    if ok:
        assert parse_body(CompletionRequest, body).prompt
    else:
        with pytest.raises(ApiError) as e:
            parse_body(CompletionRequest, body)
        assert e.value.status == 400
