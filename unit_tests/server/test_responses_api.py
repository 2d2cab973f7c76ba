"""The Responses API without a model (issue 19 item 17, issue 32): every event of a stream, failures included, is one
the official client's types accept, in the order the API sends them; the output items (reasoning, message,
function_call) of any split of an answer into deltas are those of the whole answer; input items (function calls,
their outputs, reasoning) become the chat conversation the template renders; what stays unsupported is a 400 naming
its field."""

import asyncio
import json
import random
import typing

import pytest
from openai.types.responses import Response, ResponseStreamEvent

from lightllm_mtp.server.chat_output import ChatOptions, plan_chat
from lightllm_mtp.server.engine_client import Delta
from lightllm_mtp.server.protocol import ApiError, parse_body
from lightllm_mtp.server.responses_api import _events, _finished, _response
from lightllm_mtp.server.responses_output import ResponseOutput, reasoning_tokens
from lightllm_mtp.server.responses_protocol import ResponsesRequest

EVENT_TYPES = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}  # "response.created": its class
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}}, {"type": "function", "name": "now"}]  # fmt: skip
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
        "</parameter>\n</function>\n</tool_call>")
NOW = "<tool_call>\n<function=now>\n</function>\n</tool_call>"
ANSWER = "Weather, then time.</think>\n\nLet me check.\n" + CALL + "\n" + NOW
OPTIONS = ChatOptions("qwen3", "qwen3_coder", True)


def delta(text, n, finish=None, error=None):
    return Delta(text=text, token_ids=[1] if text else [], finish_reason=finish, error=error, num_prompt_tokens=5,
                 num_output_tokens=n, spec=None)  # fmt: skip


def request(**kw):
    return ResponsesRequest.model_validate({"input": "hi", **kw})


def stream_events(deltas, req=None, prompt_text=""):
    req = req or request(max_output_tokens=3)

    async def stream():
        for d in deltas:
            yield d

    async def collect():
        output = ResponseOutput(plan_chat(req.chat, OPTIONS, prompt_text), req.chat)
        return [e async for e in _events(stream(), _response("resp_1", "m", req), output, len, with_mtp=False)]

    return [EVENT_TYPES[e["type"]].model_validate(e) for e in asyncio.run(collect())]


def test_a_stream_that_runs_out_of_tokens():
    events = stream_events([delta("a", 1), delta("b", 2), delta("c", 3, finish="length")])
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.incomplete",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert isinstance(final, Response) and final.output_text == "abc" and final.usage.output_tokens == 3
    assert final.incomplete_details.reason == "max_output_tokens" and final.output[0].status == "incomplete"


def test_a_failed_generation_ends_with_an_error_event_and_a_failed_response():
    events = stream_events([delta("a", 1), delta("", 1, finish="error", error="worker died")])
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert events[-2].message == "worker died" and events[-2].code == "server_error"
    assert events[-1].response.status == "failed" and events[-1].response.error.message == "worker died"


def whole_output(req, prompt_text):
    output = ResponseOutput(plan_chat(req.chat, OPTIONS, prompt_text), req.chat)
    output.push(ANSWER, final=True)
    output.finish(incomplete=False)
    return Response.model_validate(_finished(_response("r", "m", req), output, delta("", 9, "stop"), 4, False))


def test_reasoning_message_and_calls_whole_and_streamed_alike():
    req = request(tools=TOOLS)
    whole = whole_output(req, "<think>\n")
    reasoning, message, first, second = whole.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Weather, then time."
    assert message.type == "message" and whole.output_text == "Let me check."
    assert (first.type, first.name, json.loads(first.arguments)) == ("function_call", "get_weather",
                                                                     {"city": "Paris", "days": 2})  # fmt: skip
    assert (second.name, second.arguments) == ("now", "{}") and first.call_id != second.call_id
    assert whole.usage.output_tokens_details.reasoning_tokens == 4 and whole.tools[0].name == "get_weather"

    def shape(items):  # the items less their random ids
        return [i.model_dump(exclude={"id", "call_id"}) for i in items]

    rng = random.Random(0)
    for _ in range(100):
        cuts = sorted(rng.sample(range(1, len(ANSWER)), rng.randint(1, 25)))
        pieces = [ANSWER[a:b] for a, b in zip([0, *cuts], [*cuts, len(ANSWER)])]
        deltas = [delta(p, i + 1, "stop" if i == len(pieces) - 1 else None) for i, p in enumerate(pieces)]
        events = stream_events(deltas, req, "<think>\n")
        final = events[-1].response
        assert final.status == "completed" and shape(final.output) == shape(whole.output)
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert shape(done) == shape(whole.output)
        added = [e.output_index for e in events if e.type == "response.output_item.added"]
        assert added == list(range(4)) and [e.sequence_number for e in events] == list(range(len(events)))
        reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        args = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        assert (reasoning, text, args) == ("Weather, then time.", "Let me check.", [first.arguments, "{}"])


def test_no_reasoning_parser_and_one_call():
    req = request(tools=TOOLS, parallel_tool_calls=False)
    output = ResponseOutput(plan_chat(req.chat, ChatOptions(None, "qwen3_coder", True), ""), req.chat)
    output.push(CALL + "\n" + CALL, final=True)
    output.finish(incomplete=False)
    assert [i["type"] for i in output.items] == ["function_call"]


def test_input_items_become_the_conversation():
    req = request(instructions="be brief", tools=TOOLS, tool_choice={"type": "function", "name": "now"}, input=[
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "look"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "now", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
    ])  # fmt: skip
    system, user, assistant, tool1, tool2 = (m.model_dump(exclude_none=True) for m in req.chat.messages)
    assert system == {"role": "system", "content": "be brief"} and user["content"] == "weather?"
    assert assistant["content"] == "Checking." and assistant["reasoning_content"] == "look"
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert (tool1["tool_call_id"], tool1["content"], tool2["content"]) == ("c1", "sunny", "noon")
    assert req.chat.tools[0]["function"]["name"] == "get_weather" and req.chat.named_tool == "now"
    off = request(reasoning={"effort": "none"})
    assert off.chat.chat_template_kwargs == {"enable_thinking": False}
    assert request(text={"format": {"type": "json_object"}}).chat.structured.kind == "json_object"
    with pytest.raises(ApiError) as e:  # the grammar of a forced call and a structured output: one of them
        plan_chat(request(tools=TOOLS, tool_choice="required", text={"format": {"type": "json_object"}}).chat,
                  OPTIONS, "")  # fmt: skip
    assert e.value.param == "tool_choice"


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "missing"}}, "tool_choice"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}, "input"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "xyz"}]}, "input"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"reasoning": {"summary": "auto"}}, "reasoning"),
    ({"text": {"verbosity": "low"}}, "text"),
    ({"max_tool_calls": 2}, "max_tool_calls"),
])  # fmt: skip
def test_what_stays_unsupported_is_a_400_naming_it(extra, param):
    with pytest.raises(ApiError) as e:
        parse_body(ResponsesRequest, json.dumps({"input": "hi", **extra}).encode())
    assert e.value.status == 400 and e.value.param == param, e.value.message


def test_reasoning_tokens_count_up_to_the_end_marker():
    class Chars:  # a tokenizer whose tokens are characters
        def decode(self, ids, skip_special_tokens=True):
            return "".join(map(chr, ids))

    ids = [ord(c) for c in "ab</think>cd"]
    assert reasoning_tokens(Chars(), ids, True) == 10 and reasoning_tokens(Chars(), ids[:5], True) == 5
    assert reasoning_tokens(Chars(), ids, False) == 0 and reasoning_tokens(Chars(), ids, None) == 0
    # a tool call opened before the end marker ends the reasoning: its tag is not counted (reasoning.py)
    ids = [ord(c) for c in "ab<tool_call>\n<function=f>\n</function>\n</tool_call>"]
    assert reasoning_tokens(Chars(), ids, True) == 2 and reasoning_tokens(Chars(), ids[:14], True) == 14


def test_reasoning_tokens_with_a_single_token_marker():
    """The chat fixture's tokenizer (`</think>` one token, as in Qwen's): the count ends at that token."""
    from transformers import AutoTokenizer

    from unit_tests.chat_fixture import tiny_chat_checkpoint

    tok = AutoTokenizer.from_pretrained(tiny_chat_checkpoint())
    ids = tok.encode("def f(x):\n    return x</think>\n\nIt returns x.", add_special_tokens=False)
    end = tok.convert_tokens_to_ids("</think>")
    assert ids.count(end) == 1 and reasoning_tokens(tok, ids, True) == ids.index(end) + 1
