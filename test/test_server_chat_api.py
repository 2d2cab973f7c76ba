"""Issue 32 through the official openai client against real servers on CPU (the qwen3 reasoning and tool-call
parsers; the trained tiny checkpoint with --chat_template qwen3_5, whose tags are several tokens each, and the tiny chat
checkpoint, whose `<think>`, `</think>`, `<tool_call>` ... are single tokens as in Qwen's tokenizer): MTP (eagle, k=2)
and plain decoding give the same greedy text and logprobs under penalties, bias and min_tokens, the same JSON under a
schema (after the reasoning too, no special token inside it) and the same tool calls; n choices, reasoning and tool
calls streamed reassemble to the whole answers; the reasoning splits where the model closes it;
include_stop_str_in_output; /tokenize, /detokenize, /v1/models/{id}; a refused field is a 400 naming it."""

import json

import httpx
import openai
import pytest

from lightllm_mtp.server.launcher import ServerProcess
from unit_tests.chat_fixture import tiny_chat_checkpoint
from unit_tests.trained_fixtures import trained_fixture, trained_fixture_path

COMMON = ["--device", "cpu", "--max_req_total_len", "512", "--log_level", "warning", "--running_max_req_size", "8",
          "--chat_template", "qwen3_5", "--reasoning_parser", "qwen3", "--tool_call_parser", "qwen3_coder",
          "--enable_auto_tool_choice"]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module", params=["text", "chat"])
def model_kind(request):
    return request.param


@pytest.fixture(scope="module")
def servers(model_kind, tmp_path_factory):
    if model_kind == "text":
        model_dir = trained_fixture("qwen3_5")
        if model_dir is None:
            pytest.skip(f"trained qwen3_5 checkpoint not there complete at {trained_fixture_path('qwen3_5')}")
    else:
        model_dir = tiny_chat_checkpoint()
    mtp_flags = ["--model_dir", str(model_dir), "--mtp_mode", "eagle_with_att", "--mtp_step", "2", *COMMON]
    plain_flags = ["--model_dir", str(model_dir), *COMMON]
    logs = tmp_path_factory.mktemp(f"chat_api_{model_kind}")
    with ServerProcess(mtp_flags, logs / "mtp.log") as mtp, ServerProcess(plain_flags, logs / "plain.log") as plain:
        yield {"mtp": mtp, "plain": plain}


def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def complete(server, **kw):
    c = client(server)
    return c.completions.create(model=c.models.list().data[0].id, prompt=PROMPT, temperature=0, **kw)


@pytest.mark.parametrize("extra", [
    {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3},
    {"logit_bias": {"11": 3.0}, "min_tokens": 8},
])  # fmt: skip
def test_mtp_equals_plain_with_penalties_and_logprobs(servers, extra):
    outs = {}
    for name, server in servers.items():
        out = complete(server, max_tokens=24, logprobs=2, extra_body={"ignore_eos": True, **extra})
        outs[name] = out.choices[0]
    mtp, plain = outs["mtp"], outs["plain"]
    assert mtp.text == plain.text and mtp.logprobs.tokens == plain.logprobs.tokens
    assert all(abs(a - b) < 1e-4 for a, b in zip(mtp.logprobs.token_logprobs, plain.logprobs.token_logprobs))
    assert len(mtp.logprobs.top_logprobs) == 24 and all(len(t) == 2 for t in mtp.logprobs.top_logprobs)
    base = complete(servers["plain"], max_tokens=24, extra_body={"ignore_eos": True}).choices[0].text
    assert plain.text != base


def test_n_choices_streamed_reassemble_to_the_collected_ones(servers):
    server = servers["mtp"]
    c = client(server)
    model = c.models.list().data[0].id
    kw = dict(model=model, messages=[{"role": "user", "content": "Sort a list."}], max_tokens=12, temperature=0.8,
              seed=5, n=3, logprobs=True, top_logprobs=1, extra_body=NO_THINKING)  # fmt: skip
    full = c.chat.completions.create(**kw)
    assert [ch.index for ch in full.choices] == [0, 1, 2] and full.usage.completion_tokens == sum(
        len(ch.logprobs.content) for ch in full.choices)
    texts = ["", "", ""]
    for chunk in c.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts == [ch.message.content for ch in full.choices]
    assert len(set(texts)) > 1  # seeds s, s+1, s+2


def test_include_stop_str_in_output(servers):
    base = complete(servers["mtp"], max_tokens=24, extra_body={"ignore_eos": True}).choices[0].text
    stop = base[5:8]
    cut = complete(servers["mtp"], max_tokens=24, stop=[stop]).choices[0].text
    kept = complete(servers["mtp"], max_tokens=24, stop=[stop],
                    extra_body={"include_stop_str_in_output": True}).choices[0].text  # fmt: skip
    assert kept == cut + stop and base.startswith(kept)


def test_min_tokens_holds_back_stop_strings(servers):
    """A stop string that ends inside the first min_tokens tokens' text does not end the request (vLLM's rule), on
    the MTP server as on the plain one."""
    texts = {}
    for name, server in servers.items():
        params = {"ignore_eos": True, "min_tokens": 10}
        base = complete(server, max_tokens=24, extra_body={**params, "return_token_ids": True}).choices[0]
        first = httpx.post(f"{server.url}/detokenize", json={"tokens": base.model_extra["token_ids"][:10]}).json()
        protected = len(first["prompt"])
        stop = base.text[protected - 5 : protected - 2]
        assert stop.strip() and stop in base.text[:protected]
        out = complete(server, max_tokens=24, stop=[stop], extra_body=params).choices[0]
        later = base.text.find(stop, protected - len(stop) + 1)
        assert out.text == (base.text[:later] if later >= 0 else base.text)
        assert out.finish_reason == ("stop" if later >= 0 else "length")
        texts[name] = out.text
    assert texts["mtp"] == texts["plain"]


def test_refused_fields_are_400s_naming_them(servers):
    c = client(servers["plain"])
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=c.models.list().data[0].id, prompt=PROMPT, max_tokens=2, echo=True)
    assert "echo" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        complete(servers["plain"], max_tokens=2, n=2, best_of=3)
    assert "best_of" in str(e.value)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "kind": {"enum": ["file", "dir"]},
                                           "sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
          "required": ["name", "kind", "sizes"]}  # fmt: skip


def test_structured_outputs_through_the_client(servers):
    fmt = {"type": "json_schema", "json_schema": {"name": "entry", "schema": SCHEMA, "strict": True}}
    texts = {}
    for name, server in servers.items():
        c = client(server)
        out = c.chat.completions.create(model=c.models.list().data[0].id, temperature=0, max_tokens=80,
                                        messages=[{"role": "user", "content": "Describe a file."}],
                                        response_format=fmt, extra_body=NO_THINKING)  # fmt: skip
        texts[name] = out.choices[0].message.content
        value = json.loads(texts[name])
        assert value["kind"] in ("file", "dir") and isinstance(value["sizes"], list) and len(value["name"]) <= 10
    assert texts["mtp"] == texts["plain"]
    for extra, check in [({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
                         ({"regex": "[0-9]{4}"}, lambda t: len(t) == 4 and t.isdigit()),
                         ({"structured_outputs": {"json_object": True}}, lambda t: isinstance(json.loads(t), dict))]:
        out = complete(servers["mtp"], max_tokens=40, extra_body=extra).choices[0].text
        assert check(out), (extra, out)
    with pytest.raises(openai.BadRequestError) as e:
        complete(servers["mtp"], max_tokens=4, extra_body={"guided_json": "{oops"})
    assert "guided_json" in str(e.value)


WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]  # fmt: skip


def chat(server, stream=False, **kw):
    c = client(server)
    body = dict(model=c.models.list().data[0].id, temperature=0, max_tokens=48,
                messages=[{"role": "user", "content": "What is the weather in Paris?"}])  # fmt: skip
    return c.chat.completions.create(**{**body, **kw}, stream=stream)


def reassembled(chunks):
    """The message a stream's deltas add up to (content, reasoning_content, tool calls by index)."""
    content = reasoning = ""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in chunks:
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    return content or None, reasoning or None, [calls[i] for i in sorted(calls)], finish


def whole(out):
    m = out.choices[0].message
    calls = [{"name": t.function.name, "arguments": t.function.arguments} for t in m.tool_calls or []]
    return m.content, (m.model_extra or {}).get("reasoning_content"), calls, out.choices[0].finish_reason


def test_json_after_the_reasoning_and_no_special_tokens_in_it(servers, model_kind):
    """json_schema with thinking on: the grammar starts after `</think>`, with optional whitespace first; thinking
    off, a bias on the special `<|im_start|>` cannot put it into the JSON (its string neither). MTP == plain and the
    stream reassembles to the whole answer, both times."""
    schema = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 40}}, "required": ["note"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "note", "schema": schema, "strict": True}}
    (im_start,) = httpx.post(f"{servers['mtp'].url}/tokenize", json={"prompt": "<|im_start|>"}).json()["tokens"]
    thinking = dict(max_tokens=96, messages=[{"role": "user", "content": "def fibonacci(n):"}], response_format=fmt)
    biased = dict(max_tokens=96, response_format=fmt, logit_bias={str(im_start): 20},
                  extra_body={"return_token_ids": True, **NO_THINKING})  # fmt: skip
    for kw in (thinking, biased):
        mtp = chat(servers["mtp"], **kw)
        assert whole(mtp) == whole(chat(servers["plain"], **kw))
        assert reassembled(chat(servers["mtp"], stream=True, **kw)) == whole(mtp)
    content, reasoning, _, finish = whole(mtp)
    assert im_start not in mtp.choices[0].model_extra["token_ids"] and reasoning is None and finish == "stop"
    assert set(json.loads(content)) == {"note"}
    content, reasoning, _, finish = whole(chat(servers["mtp"], **thinking))
    if model_kind == "chat":  # this answer closes its reasoning (the single `</think>` after ten tokens)
        assert reasoning and finish == "stop" and set(json.loads(content)) == {"note"}


def test_reasoning_content_and_enable_thinking(servers, model_kind):
    on = chat(servers["mtp"], max_tokens=24)
    content, reasoning, _, _ = whole(on)
    assert reasoning and content is None  # thinking on (the template's default): the tiny model does not close it here
    assert reassembled(chat(servers["mtp"], stream=True, max_tokens=24)) == whole(on)
    off = chat(servers["mtp"], max_tokens=24, extra_body=NO_THINKING)
    assert whole(off)[0] and whole(off)[1] is None
    assert whole(off) == whole(chat(servers["plain"], max_tokens=24, extra_body=NO_THINKING))
    # this question's answer closes its reasoning: the chat model writes the single `</think>` after ten tokens
    closing = dict(max_tokens=32, messages=[{"role": "user", "content": "def fibonacci(n):"}],
                   extra_body={"return_token_ids": True})  # fmt: skip
    mtp, plain = chat(servers["mtp"], **closing), chat(servers["plain"], **closing)
    assert whole(mtp) == whole(plain) and reassembled(chat(servers["mtp"], stream=True, **closing)) == whole(mtp)
    if model_kind == "chat":
        end = httpx.post(f"{servers['mtp'].url}/tokenize", json={"prompt": "</think>"}).json()["tokens"]
        ids = mtp.choices[0].model_extra["token_ids"]
        assert len(end) == 1 and end[0] in ids and whole(mtp)[0] and whole(mtp)[1]
        text = httpx.post(f"{servers['mtp'].url}/detokenize", json={"tokens": ids[: ids.index(end[0])]}).json()
        assert whole(mtp)[1] == text["prompt"]  # the reasoning ends exactly before the token


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_calls_equal_under_mtp_and_streamed(servers, choice):
    """The grammar (after the reasoning ends: thinking off here) forces one Qwen XML call (parallel_tool_calls false:
    the tiny model would go on calling); the parser types its arguments by the tool's schema."""
    kw = dict(tools=WEATHER, tool_choice=choice, extra_body=NO_THINKING, max_tokens=200, parallel_tool_calls=False)
    mtp, plain = whole(chat(servers["mtp"], **kw)), whole(chat(servers["plain"], **kw))
    assert mtp == plain and mtp[3] == "tool_calls" and mtp[2][0]["name"] == "get_weather"
    args = json.loads(mtp[2][0]["arguments"])
    assert all(isinstance(args[k], {"city": str, "days": int}[k]) for k in args)
    assert reassembled(chat(servers["mtp"], stream=True, **kw)) == mtp


def test_tool_history_and_auto_choice(servers):
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]  # fmt: skip
    out = chat(servers["mtp"], messages=history, tools=WEATHER, extra_body=NO_THINKING, max_tokens=16)
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reassembled(chat(servers["mtp"], stream=True, messages=history, tools=WEATHER, extra_body=NO_THINKING,
                            max_tokens=16)) == whole(out)  # fmt: skip
    tok = httpx.post(f"{servers['mtp'].url}/tokenize", json={"messages": history, "tools": WEATHER, **NO_THINKING}).json()
    text = httpx.post(f"{servers['mtp'].url}/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text and "<parameter=city>\nParis" in text
    assert tok["count"] == out.usage.prompt_tokens


def test_tokenize_detokenize_and_model_card(servers):
    url = servers["plain"].url
    tok = httpx.post(f"{url}/tokenize", json={"prompt": PROMPT, "return_token_strs": True}).json()
    assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"]) and tok["max_model_len"] == 512
    assert httpx.post(f"{url}/detokenize", json={"tokens": tok["tokens"]}).json() == {"prompt": PROMPT}
    c = client(servers["plain"])
    name = c.models.list().data[0].id
    assert c.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-4")
    assert httpx.post(f"{url}/detokenize", json={"tokens": [10**7]}).status_code == 400


RESPONSES_WEATHER = [{"type": "function", "name": "get_weather", "description": "weather of a city",
                      "parameters": WEATHER[0]["function"]["parameters"]}]  # fmt: skip


def items(response):
    """A response's output items less their random ids."""
    return [i.model_dump(exclude={"id", "call_id"}) for i in response.output]


def test_responses_api_tools_and_reasoning(servers):
    """/v1/responses through client.responses.create: a forced call is a function_call item (MTP == plain, streamed ==
    whole); its call and output sent back as input items render as the chat endpoint's tool history; with thinking
    on, the answer starts with a reasoning item."""
    kw = dict(input="What is the weather in Paris?", tools=RESPONSES_WEATHER, tool_choice="required", temperature=0,
              parallel_tool_calls=False, max_output_tokens=200, extra_body=NO_THINKING)  # fmt: skip
    outs = {}
    for name, server in servers.items():
        c = client(server)
        outs[name] = c.responses.create(model=c.models.list().data[0].id, **kw)
    mtp = outs["mtp"]
    assert items(mtp) == items(outs["plain"]) and mtp.status == "completed"
    (call,) = mtp.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    args = json.loads(call.arguments)
    assert all(isinstance(args[k], {"city": str, "days": int}[k]) for k in args)
    c = client(servers["mtp"])
    model = c.models.list().data[0].id
    events = list(c.responses.create(model=model, stream=True, **kw))
    assert items(events[-1].response) == items(mtp) and events[-1].type == "response.completed"
    assert [e.delta for e in events if e.type == "response.function_call_arguments.delta"] == [call.arguments]

    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": call.arguments},
               {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}]  # fmt: skip
    answer = c.responses.create(model=model, input=history, tools=RESPONSES_WEATHER, max_output_tokens=8,
                                temperature=0, extra_body=NO_THINKING)  # fmt: skip
    as_chat = [history[0], {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
               "function": {"name": "get_weather", "arguments": call.arguments}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]  # fmt: skip
    body = {"messages": as_chat, "tools": WEATHER, **NO_THINKING}
    tok = httpx.post(f"{servers['mtp'].url}/tokenize", json=body).json()
    assert answer.usage.input_tokens == tok["count"]

    thinking = c.responses.create(model=model, input="Sort a list.", max_output_tokens=16, temperature=0)
    reasoning = thinking.output[0]
    assert reasoning.type == "reasoning" and reasoning.content[0].text and len(thinking.output) == 1
    assert thinking.usage.output_tokens_details.reasoning_tokens == 16  # the tiny model never closes its think block
    off = c.responses.create(model=model, input="Sort a list.", max_output_tokens=16, temperature=0,
                             reasoning={"effort": "none"})  # fmt: skip
    assert [i.type for i in off.output] == ["message"] and off.usage.output_tokens_details.reasoning_tokens == 0
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=model, input="hi", tools=[{"type": "web_search"}])
    assert "tools" in str(e.value)
