"""The Responses API's stream (issue 19 item 17): every event, failures included, is one the official client's types
accept, in the order the API sends them."""

import asyncio
import typing

from openai.types.responses import Response, ResponseStreamEvent

from lightllm_mtp.server.engine_client import Delta
from lightllm_mtp.server.responses_api import ResponsesRequest, _events, _response

EVENT_TYPES = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}  # "response.created": its class


def delta(text, n, finish=None, error=None):
    return Delta(text=text, token_ids=[1] if text else [], finish_reason=finish, error=error, num_prompt_tokens=5,
                 num_output_tokens=n, spec=None)  # fmt: skip


def stream_events(deltas):
    async def stream():
        for d in deltas:
            yield d

    async def collect():
        req = ResponsesRequest.model_validate({"input": "hi", "max_output_tokens": 3})
        return [e async for e in _events(stream(), _response("resp_1", "m", req), "msg_1", with_mtp=False)]

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
    assert final.incomplete_details.reason == "max_output_tokens"


def test_a_failed_generation_ends_with_an_error_event_and_a_failed_response():
    events = stream_events([delta("a", 1), delta("", 1, finish="error", error="worker died")])
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert events[-2].message == "worker died" and events[-2].code == "server_error"
    assert events[-1].response.status == "failed" and events[-1].response.error.message == "worker died"
