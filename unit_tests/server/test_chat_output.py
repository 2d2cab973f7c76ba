"""Issue 32 items 4-5 without a model: the reasoning split and the tool-call parser give the same message for a whole
answer and for any split of it into deltas, in particular the deltas of MTP steps of 1..k+1 tokens through the
front's incremental detokenizer (two calls inside one delta included); tool arguments are typed by the tool's schema;
the tool_choice grammar accepts exactly tool calls; the Qwen3.5-style template renders tools and their history."""

import json
import random

import pytest

from lightllm_mtp.chat_templates import chat_template_text
from lightllm_mtp.engine.detokenizer import IncrementalDetokenizer
from lightllm_mtp.sampling.grammar import GATED_LEADING_WHITESPACE
from lightllm_mtp.server.chat_output import ChatAssembler, ChatOptions, chat_message, plan_chat
from lightllm_mtp.server.chat_prompt import ChatPromptEncoder
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from lightllm_mtp.server.protocol import ApiError
from lightllm_mtp.server.reasoning import split_reasoning
from lightllm_mtp.server.tool_calls import tool_choice_grammar
from lightllm_mtp.tools.default_checkpoint import FIXTURES_DIR, TRAINED_CHECKPOINTS
from unit_tests.chat_fixture import tiny_chat_checkpoint

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "hours": {"type": "array"}, "ratio": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n[1, 2]\n</parameter>\n"
        "<parameter=ratio>\n0.5\n</parameter>\n</function>\n</tool_call>")  # fmt: skip
ANSWER = "The user wants weather.\nCall it.</think>\n\nLet me check.\n" + CALL + "\n<tool_call>\n<function=now>\n</function>\n</tool_call>"
# the model opens its calls without closing its thinking (a `<tool_call>` mentioned in the reasoning is no call)
FORGOT = ("The user wants weather: a <tool_call> of get_weather.\n" + CALL
          + "\n<tool_call>\n<function=now>\n</function>\n</tool_call>")  # fmt: skip
OPTIONS = ChatOptions("qwen3", "qwen3_coder", True)


@pytest.fixture(scope="module", params=["text", "chat"])
def tokenizer(request):
    """The trained fixture's tokenizer (the tags are several tokens each) and the chat fixture's (each tag one token,
    as in Qwen's tokenizer), both with the shipped template."""
    from transformers import AutoTokenizer

    model_dir = FIXTURES_DIR / TRAINED_CHECKPOINTS["qwen3_5"] if request.param == "text" else tiny_chat_checkpoint()
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = chat_template_text("qwen3_5")
    return tok


def request(**kw):
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "weather?"}],
                                                 "tools": TOOLS, **kw})  # fmt: skip


def streamed(plan, req, pieces):
    asm, reasoning, content, calls = ChatAssembler(plan, req), "", "", []
    for i, piece in enumerate(pieces):
        r, c, new = asm.push(piece, final=i == len(pieces) - 1)
        reasoning, content, calls = reasoning + r, content + c, calls + new
    return reasoning, content or None, [c["function"] for c in calls], asm.finish_reason("stop")


def test_whole_answer():
    req = request()
    plan = plan_chat(req, OPTIONS, "<|im_start|>assistant\n<think>\n")
    message, asm = chat_message(plan, req, ANSWER)
    assert message["reasoning_content"] == "The user wants weather.\nCall it." and message["content"] == "Let me check."
    first, second = (c["function"] for c in message["tool_calls"])
    assert first["name"] == "get_weather" and second == {"name": "now", "arguments": "{}"}
    assert json.loads(first["arguments"]) == {"city": "New York", "days": 3, "metric": True, "hours": [1, 2],
                                              "ratio": 0.5}  # fmt: skip
    assert asm.finish_reason("stop") == "tool_calls"
    assert [c["index"] for c in message["tool_calls"]] == [0, 1]
    one = plan_chat(request(parallel_tool_calls=False), OPTIONS, "<think>\n")
    assert len(chat_message(one, request(parallel_tool_calls=False), ANSWER)[0]["tool_calls"]) == 1
    off = plan_chat(req, OPTIONS, "<think>\n\n</think>\n\n")  # enable_thinking false: no reasoning
    assert chat_message(off, req, "plain answer")[0] == {"role": "assistant", "content": "plain answer",
                                                         "reasoning_content": None}  # fmt: skip


def test_any_split_reassembles_to_the_whole_answer():
    req = request()
    plan = plan_chat(req, OPTIONS, "<think>\n")
    message, _ = chat_message(plan, req, ANSWER)
    expect = (message["reasoning_content"], message["content"], [c["function"] for c in message["tool_calls"]],
              "tool_calls")  # fmt: skip
    rng = random.Random(0)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(ANSWER)), rng.randint(1, 30)))
        pieces = [ANSWER[a:b] for a, b in zip([0, *cuts], [*cuts, len(ANSWER)])]
        assert streamed(plan, req, pieces) == expect


@pytest.mark.parametrize("answer", [ANSWER, FORGOT], ids=["closed", "forgot"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_mtp_step_deltas_through_the_detokenizer(tokenizer, k, answer):
    """The token ids of the answer cut into steps of 1..k+1 tokens (MTP accept lengths), detokenized as the front
    does: the same message, calls completed inside one delta included (the last step holds both closing tags), and
    a reasoning ended by a tool call wherever the step cuts fall around its `<tool_call>`."""
    req = request()
    plan = plan_chat(req, OPTIONS, "<think>\n")
    message, _ = chat_message(plan, req, answer)
    expect = (message["reasoning_content"], message["content"], [c["function"] for c in message["tool_calls"]],
              "tool_calls")  # fmt: skip
    ids = tokenizer.encode(answer, add_special_tokens=False)
    first_closed = next(n for n in range(len(ids)) if "</tool_call>" in tokenizer.decode(ids[:n]))
    rng = random.Random(k)
    for trial in range(20):
        steps, at = [], 0
        while at < len(ids):
            n = rng.randint(1, k + 1) if trial else k + 1
            steps.append(ids[at : at + n])
            at += n
        if trial == 1:  # both calls' closing tags in one delta
            steps = [ids[: first_closed - 1], ids[first_closed - 1 :]]
        detok = IncrementalDetokenizer(tokenizer, [1, 2, 3])
        pieces = [detok.push(step, final=i == len(steps) - 1) for i, step in enumerate(steps)]
        assert streamed(plan, req, pieces) == expect


def test_a_tool_call_before_the_reasoning_end_ends_it():
    """As vLLM's qwen3 parser: without `</think>`, the first `<tool_call>` followed (after whitespace) by
    `<function=` ends the reasoning; the calls are parsed, the reasoning is the text before it, and any split of the
    answer into deltas gives the same message."""
    req = request()
    plan = plan_chat(req, OPTIONS, "<|im_start|>assistant\n<think>\n")
    message, asm = chat_message(plan, req, FORGOT)
    assert message["reasoning_content"] == "The user wants weather: a <tool_call> of get_weather.\n"
    assert message["content"] is None and asm.finish_reason("stop") == "tool_calls"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "now"]
    expect = (message["reasoning_content"], None, [c["function"] for c in message["tool_calls"]], "tool_calls")
    rng = random.Random(1)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(FORGOT)), rng.randint(1, 30)))
        pieces = [FORGOT[a:b] for a, b in zip([0, *cuts], [*cuts, len(FORGOT)])]
        assert streamed(plan, req, pieces) == expect
    at = FORGOT.index("<tool_call>\n<function")  # one character a delta around the tag, the tag alone
    pieces = [FORGOT[:at], *FORGOT[at : at + 25], FORGOT[at + 25 :]]
    assert streamed(plan, req, pieces) == expect
    # without the tool parser (tool_choice none) the call is the content's text
    no_tools = plan_chat(request(tool_choice="none"), OPTIONS, "<think>\n")
    assert chat_message(no_tools, request(tool_choice="none"), FORGOT)[0]["content"] == FORGOT[at:]
    # `<function` then "=" or whitespace, after optional whitespace; an answer cut before that stays reasoning
    assert split_reasoning("a<tool_call> \n<function name", True) == ("a", "<tool_call> \n<function name")
    for text in ("a<tool_call>\n<func", "a<tool_call>\n<functions", "a<tool_call>x<function=f>", "a<tool_call>"):
        assert split_reasoning(text, True) == (text, "")
    assert split_reasoning("a</think>\n\n<tool_call>\n<function=f>", True) == ("a", "<tool_call>\n<function=f>")
    assert split_reasoning("a<tool_call>\n<function=f>", False) == (None, "a<tool_call>\n<function=f>")


def test_a_tool_call_before_the_reasoning_end_stays_reasoning_under_a_gated_grammar(tokenizer):
    """tool_choice named (or required, or a response_format) with thinking: the grammar applies only after `</think>`
    (StructuredOutput.starts_after), so a `<tool_call>` the model writes inside its thinking is unconstrained text
    (here of the wrong function): it stays reasoning, and the answer is what the grammar wrote after `</think>` (one
    call of the named function, no `</think>` in the content), whole and streamed alike; the Responses API's
    reasoning_tokens count up to `</think>`."""
    from lightllm_mtp.server.responses_output import reasoning_tokens

    req = request(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    plan = plan_chat(req, OPTIONS, "<|im_start|>assistant\n<think>\n")
    assert plan.structured.starts_after == "</think>"
    thinking = "Maybe now?\n<tool_call>\n<function=now>\n</function>\n</tool_call>\nNo, the weather."
    answer = thinking + "</think>\n\n" + CALL
    message, asm = chat_message(plan, req, answer)
    assert message["reasoning_content"] == thinking and message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    expect = (thinking, None, [c["function"] for c in message["tool_calls"]], "tool_calls")
    rng = random.Random(2)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(answer)), rng.randint(1, 30)))
        assert streamed(plan, req, [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)])]) == expect
    ids = tokenizer.encode(answer, add_special_tokens=False)
    closed = next(n for n in range(len(ids) + 1) if "</think>" in tokenizer.decode(ids[:n]))
    assert reasoning_tokens(tokenizer, ids, True, plan.tool_call_ends_reasoning) == closed


def test_a_gated_grammars_leading_whitespace_is_not_content():
    """A structured output gated on `</think>` starts with up to MAX_LEADING_WHITESPACE spaces / tabs / newlines
    (sampling/grammar.py): they are dropped with the newlines, so the content is the grammar's text (a regex or
    choice answer matches whole), whole and streamed alike; without a grammar a leading space stays (indentation)."""
    import re

    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "n?"}], "regex": "[0-9]+"})
    plan = plan_chat(req, OPTIONS, "<|im_start|>assistant\n<think>\n")
    assert plan.structured.starts_after == "</think>" and plan.content_lead == GATED_LEADING_WHITESPACE
    answer = "Count.</think>\n \t 42"
    message, _ = chat_message(plan, req, answer)
    assert message["content"] == "42" and re.fullmatch("[0-9]+", message["content"])
    for cut in range(1, len(answer)):
        assert streamed(plan, req, [answer[:cut], answer[cut:]])[:2] == ("Count.", "42")
    free = plan_chat(request(tool_choice="none"), OPTIONS, "<|im_start|>assistant\n<think>\n")
    assert chat_message(free, request(tool_choice="none"), "a</think>\n  x = 1")[0]["content"] == "  x = 1"


def test_reasoning_split_without_an_end_and_with_a_leading_think():
    assert split_reasoning("still thinking </thi", True) == ("still thinking </thi", "")
    assert split_reasoning("<think>\nabc</think>\n\nx", True) == ("abc", "x")
    assert split_reasoning("no reasoning", False) == (None, "no reasoning")


def test_tool_choice_rules():
    for kw, flags, message in [({}, ChatOptions(), "--enable_auto_tool_choice"),
                               ({"tool_choice": "required"}, ChatOptions(), "--tool_call_parser"),
                               ({"tool_choice": "required", "response_format": {"type": "json_object"}}, OPTIONS,
                                "give one")]:  # fmt: skip
        with pytest.raises(ApiError) as e:
            plan_chat(request(**kw), flags, "")
        assert e.value.param == "tool_choice" and message in e.value.message
    plan = plan_chat(request(tool_choice="none"), ChatOptions(), "")
    assert not plan.parse_tools and plan.structured is None
    named = plan_chat(request(tool_choice={"type": "function", "function": {"name": "now"}}), OPTIONS, "<think>\n")
    assert named.structured.kind == "grammar" and named.structured.starts_after == "</think>"


def test_tool_choice_grammar_accepts_exactly_calls(tokenizer):
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer)
    compiler = xgr.GrammarCompiler(info)

    def accepts(grammar, text):
        m = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
        return m.accept_string(text) and m.is_completed()

    two = CALL + "\n<tool_call>\n<function=now>\n</function>\n</tool_call>"
    assert accepts(tool_choice_grammar(TOOLS, None, True), two)
    assert not accepts(tool_choice_grammar(TOOLS, None, False), two)
    assert accepts(tool_choice_grammar(TOOLS, "get_weather", True), CALL)
    assert not accepts(tool_choice_grammar(TOOLS, "now", True), CALL)
    assert not accepts(tool_choice_grammar(TOOLS, None, True), "Sure! " + CALL)


def test_the_template_renders_tools_and_their_history(tokenizer):
    req = ChatCompletionRequest.model_validate({"tools": TOOLS, "tool_choice": "auto", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "thanks"}]})  # fmt: skip
    ids, text = ChatPromptEncoder(tokenizer).encode_text(req)
    assert '"name": "get_weather"' in text.split("</tools>")[0]
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>" in text
    assert "<tool_response>\nsunny\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n<think>\n")
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    off = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                "chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
    assert ChatPromptEncoder(tokenizer).encode_text(off)[1].endswith("<think>\n\n</think>\n\n")


def test_tool_choice_grammar_caps_the_calls_token_by_token(tokenizer):
    """The engine's matcher (sampling/grammar.py) over the answer's tokens: after one call, parallel_tool_calls false
    allows nothing but eos (a second call is refused at its first token); true allows another call after a newline,
    and the answer must hold at least one call."""
    from lightllm_mtp.sampling.grammar import new_bitmask
    from lightllm_mtp.sampling.grammar_compiler import GrammarCompiler
    from lightllm_mtp.sampling_params import StructuredOutput

    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>")}  # the engine's eos ids are the grammar's stop tokens
    compiler = GrammarCompiler(lambda: tokenizer, len(tokenizer), eos)

    def allowed_after(grammar, text):
        g = compiler.matcher(StructuredOutput("grammar", grammar))
        for t in tokenizer.encode(text, add_special_tokens=False):
            g.advance(t)
        bitmask = new_bitmask(1, len(tokenizer))
        g.fill_after([], bitmask, 0)
        return {t for t in range(len(tokenizer)) if (int(bitmask[0, t // 32]) >> (t % 32)) & 1}

    one, many = tool_choice_grammar(TOOLS, None, False), tool_choice_grammar(TOOLS, None, True)
    assert allowed_after(one, CALL) == eos
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert allowed_after(many, CALL) == eos | set(newline)
    second = allowed_after(many, CALL + "\n")
    assert not second & eos and any(tokenizer.decode([t]).startswith("<") for t in second)
    tag = tokenizer.encode("<tool_call>", add_special_tokens=False)
    if len(tag) == 1:  # the chat tokenizer: the single token opens a call, the first one or a next one
        assert tag[0] in second and tag[0] in allowed_after(one, "")
    assert not allowed_after(one, "") & eos and not allowed_after(many, "") & eos  # "required": at least one call
    named = tool_choice_grammar(TOOLS, "now", True)
    assert allowed_after(named, "<tool_call>\n<function=now>\n</function>\n</tool_call>") == eos
