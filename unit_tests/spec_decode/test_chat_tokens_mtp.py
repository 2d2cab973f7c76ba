"""Issue 32 items 4, 5 and 7 on the tiny chat fixture (unit_tests/chat_fixture.py: `</think>`, `<tool_call>`, ... as
single tokens, as Qwen's tokenizer has them, and the shipped Qwen3.5 template): the model writes `</think>` of itself,
so under greedy speculative decoding (eagle k = 2, 3, multi-layer MTP, parallel drafting, a draft model) it is drafted,
accepted inside draft blocks and rejected. Speculative equals plain decoding there; the reasoning split happens
exactly at that token, for whole answers and for the step deltas the server streams; a json_schema gated after the
reasoning end applies from the token after it (after the whitespace it allows first); a tool call opened before
`</think>` ends the reasoning at its `<tool_call>`, inside accepted draft blocks too; special tokens stay out of a
structured output; tool calls forced by tool_choice, their tags single tokens, stream at k = 1..5 into exactly the
whole answer's calls; a reduced draft vocabulary keeps the chat tokens."""

import json

import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.engine.detokenizer import IncrementalDetokenizer
from lightllm_mtp.sampling.grammar import MAX_LEADING_WHITESPACE
from lightllm_mtp.server.chat_output import ChatAssembler, ChatOptions, chat_message, plan_chat
from lightllm_mtp.server.chat_protocol import ChatCompletionRequest
from unit_tests.chat_fixture import tiny_chat_checkpoint, tiny_chat_dir  # noqa: F401 (fixture)

MAX_MODEL_LEN = 320
QUESTIONS = ["What is the weather in Paris?", "Sort a list.", "Write a function that adds two numbers.",
             "def fibonacci(n):", "Describe a file.", "import os", "How do I read a JSON file?", "Explain recursion."]
OPTIONS = ChatOptions("qwen3", "qwen3_coder", True)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "kind": {"enum": ["file", "dir"]},
                                           "sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
          "required": ["name", "kind", "sizes"]}  # fmt: skip
# mode -> (the trained fixture the chat checkpoint grows from, engine options; `draft`: the draft model's fixture)
MODES = {
    "eagle2": ("qwen3_5", dict(mtp_mode="eagle_with_att", mtp_step=2)),
    "eagle3": ("qwen3_5", dict(mtp_mode="eagle_with_att", mtp_step=3)),
    "multi_layer3": ("qwen3_5_mtp3_ptd", dict(mtp_mode="vanilla_with_att", mtp_step=3)),
    "ptd3": ("qwen3_5_mtp3_ptd", dict(mtp_mode="eagle_with_att", mtp_step=3, parallel_drafting=True)),
    "draft_model2": ("qwen3_5", dict(mtp_mode="draft_model", mtp_step=2, draft="qwen3_5_draft")),
}
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}}}]  # fmt: skip


def chat_request(question, **kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": question}], **kw})


@pytest.fixture(scope="module")
def plain(tiny_chat_dir):
    return LLM(tiny_chat_dir, max_model_len=MAX_MODEL_LEN, max_batch_size=8)


@pytest.fixture(scope="module")
def plain_run(plain):
    """run() on the plain LLM of a chat checkpoint's source, each scenario once for all the modes it is compared at."""
    llms, done = {"qwen3_5": plain}, {}

    def get(scenario: str, prompts, params, source: str = "qwen3_5"):
        if source not in llms:
            llms[source] = LLM(tiny_chat_checkpoint(source), max_model_len=MAX_MODEL_LEN, max_batch_size=8)
        if (source, scenario) not in done:
            done[source, scenario] = run(llms[source], prompts, params)
        return done[source, scenario]

    return get


def mtp_llm(mode: str) -> LLM:
    source, options = MODES[mode]
    options = dict(options)
    if "draft" in options:
        options["mtp_draft_model_dir"] = str(tiny_chat_checkpoint(options.pop("draft")))
    return LLM(tiny_chat_checkpoint(source), max_model_len=MAX_MODEL_LEN, max_batch_size=8, **options)


def prompt_of(llm, req: ChatCompletionRequest) -> tuple[list[int], str]:
    from lightllm_mtp.server.chat_prompt import ChatPromptEncoder

    return ChatPromptEncoder(llm.tokenizer).encode_text(req)


def run(llm, prompts: list[list[int]], params: list[SamplingParams]):
    """Each request's output ids and the token ids of its steps (what the server streams: a verify step's accepted
    drafts, then the target's token)."""
    e = llm.engine
    reqs = [e.add_request(ids, p) for ids, p in zip(prompts, params)]
    steps: dict[int, list[list[int]]] = {r.request_id: [] for r in reqs}
    while e.has_unfinished():
        for o in e.step_outputs():
            steps[o.request.request_id].append(list(o.new_token_ids))
    return [(list(r.output_ids), steps[r.request_id]) for r in reqs]


def streamed(tokenizer, plan, req, prompt_ids, steps):
    """The message the server's stream adds up to: each step's tokens through the incremental detokenizer, then the
    chat assembler (reasoning, content, tool calls)."""
    detok, asm = IncrementalDetokenizer(tokenizer, prompt_ids), ChatAssembler(plan, req)
    reasoning = content = ""
    calls = []
    for i, step in enumerate(steps):
        final = i == len(steps) - 1
        r, c, new = asm.push(detok.push(step, final), final)
        reasoning, content, calls = reasoning + r, content + c, calls + [x["function"] for x in new]
    return reasoning or None, content or None, calls


def whole(plan, req, text):
    message, _ = chat_message(plan, req, text)
    calls = [c["function"] for c in message.get("tool_calls", [])]
    return message["reasoning_content"] or None, message["content"], calls


def drafted(token: int, steps: list[list[int]]) -> int:
    """How many times `token` came from an accepted draft (a step's tokens before its last)."""
    return sum(step[:-1].count(token) for step in steps)


@pytest.fixture
def proposed(monkeypatch):
    """The drafts every proposer writes, as one flat list (rejected ones included)."""
    from lightllm_mtp.spec_decode.draft_state import DraftState

    seen: list[int] = []
    write = DraftState.write_drafts

    def recording(self, b_req_idx, drafts):
        seen.extend(drafts.flatten().tolist())
        return write(self, b_req_idx, drafts)

    monkeypatch.setattr(DraftState, "write_drafts", recording)
    return seen


def check_drafted(mode: str, token: int, outs, proposed: list[int]) -> None:
    """`token` was drafted and rejected somewhere, and (the MTP modes) accepted as a draft somewhere. The tiny draft
    model's choice between `</think>` and its twin is its own coin, never the target's here: its drafts of it are
    all rejected."""
    accepted = sum(drafted(token, steps) for _, steps in outs)
    assert proposed.count(token) > accepted
    assert accepted > 0 or MODES[mode][1]["mtp_mode"] == "draft_model"


@pytest.mark.parametrize("mode", list(MODES))
def test_reasoning_end_inside_accepted_drafts_splits_exactly(plain, plain_run, proposed, mode):
    tok = plain.tokenizer
    end = tok.convert_tokens_to_ids("</think>")
    reqs = [chat_request(q) for q in QUESTIONS]
    prompts = [prompt_of(plain, r) for r in reqs]
    params = [SamplingParams(temperature=0.0, max_tokens=48)] * len(reqs)
    expect = plain_run("reasoning", [p for p, _ in prompts], params, MODES[mode][0])
    outs = run(mtp_llm(mode), [p for p, _ in prompts], params)
    assert [ids for ids, _ in outs] == [ids for ids, _ in expect]
    check_drafted(mode, end, outs, proposed)
    closed = 0
    for req, (prompt_ids, text), (ids, steps) in zip(reqs, prompts, outs):
        plan = plan_chat(req, OPTIONS, text)
        assert plan.in_reasoning  # thinking on: the template opened the think block
        message = whole(plan, req, tok.decode(ids, skip_special_tokens=True))
        assert streamed(tok, plan, req, prompt_ids, steps) == message
        if end in ids:  # the split at the token: before it reasoning, after it content (less its leading newlines)
            closed += 1
            at = ids.index(end)
            content = tok.decode(ids[at + 1 :], skip_special_tokens=True).lstrip("\n")
            assert message == (tok.decode(ids[:at]) or None, content or None, [])
        else:
            assert message == (tok.decode(ids, skip_special_tokens=True), None, [])
    assert 0 < closed < len(reqs)


@pytest.mark.parametrize("mode", list(MODES))
def test_json_schema_after_the_reasoning_end(plain, plain_run, proposed, mode):
    """response_format json_schema with thinking on: the grammar is gated after `</think>` (plan_chat), free before,
    so the answer's content is the schema's JSON; MTP equals plain with the reasoning end inside accepted drafts, and
    a rejected `</think>` draft opens nothing."""
    tok = plain.tokenizer
    end = tok.convert_tokens_to_ids("</think>")
    fmt = {"type": "json_schema", "json_schema": {"name": "entry", "schema": SCHEMA, "strict": True}}
    reqs = [chat_request(q, response_format=fmt) for q in QUESTIONS]
    prompts = [prompt_of(plain, r) for r in reqs]
    plans = [plan_chat(r, OPTIONS, text) for r, (_, text) in zip(reqs, prompts)]
    assert all(p.structured.starts_after == "</think>" for p in plans)
    params = [SamplingParams(temperature=0.0, max_tokens=96, structured=p.structured) for p in plans]
    expect = plain_run("json", [p for p, _ in prompts], params, MODES[mode][0])
    outs = run(mtp_llm(mode), [p for p, _ in prompts], params)
    assert [ids for ids, _ in outs] == [ids for ids, _ in expect]
    check_drafted(mode, end, outs, proposed)
    answered = spaced = 0
    for req, plan, (prompt_ids, _), (ids, steps) in zip(reqs, plans, prompts, outs):
        reasoning, content, _ = message = whole(plan, req, tok.decode(ids, skip_special_tokens=True))
        assert streamed(tok, plan, req, prompt_ids, steps) == message
        if end in ids and ids[-1] in (tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])):
            answered += 1
            value = json.loads(content)
            assert value["kind"] in ("file", "dir") and len(value["sizes"]) <= 3 and len(value["name"]) <= 10
            # the JSON from the token after the reasoning end, after the whitespace the grammar lets the model
            # write first (bounded; not content)
            after = tok.decode(ids[ids.index(end) + 1 :], skip_special_tokens=True)
            head = after[: len(after) - len(after.lstrip())]
            assert content == after.lstrip() and len(head) <= MAX_LEADING_WHITESPACE
            spaced += bool(head)
    assert answered > 0 and spaced > 0  # the tiny model writes whitespace (indentation) after `</think>`


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_forced_tool_calls_stream_exactly_at_every_k(plain, plain_run, tiny_chat_dir, k):
    """tool_choice required with thinking on (free reasoning, `</think>`, then the grammar's Qwen XML calls) and
    with thinking off plus a logit bias that makes the model spell `<tool_call>` / `</tool_call>` as the single tokens
    where the grammar allows them (drafts too). MTP equals plain, and the step deltas reassemble to exactly the whole
    answer's reasoning, content and calls."""
    tok = plain.tokenizer
    call, call_end = tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    thinking = [chat_request(q, tools=WEATHER, tool_choice="required") for q in QUESTIONS[:4]]
    single = [chat_request(q, tools=WEATHER, tool_choice="required", chat_template_kwargs={"enable_thinking": False})
              for q in QUESTIONS[4:]]  # fmt: skip
    reqs = thinking + single
    prompts = [prompt_of(plain, r) for r in reqs]
    plans = [plan_chat(r, OPTIONS, text) for r, (_, text) in zip(reqs, prompts)]
    bias = {call: 30.0, call_end: 30.0}  # "<" outbids a smaller bias on </tool_call> (its head row is small)
    params = [SamplingParams(temperature=0.0, max_tokens=128, structured=p.structured,
                             logit_bias=bias if r in single else None) for r, p in zip(reqs, plans)]  # fmt: skip
    expect = plain_run("tools", [p for p, _ in prompts], params)
    mtp = LLM(tiny_chat_dir, max_model_len=MAX_MODEL_LEN, max_batch_size=8, mtp_mode="eagle_with_att", mtp_step=k)
    outs = run(mtp, [p for p, _ in prompts], params)
    assert [ids for ids, _ in outs] == [ids for ids, _ in expect]
    calls = {"thinking": 0, "single": 0}
    for req, plan, (prompt_ids, _), (ids, steps) in zip(reqs, plans, prompts, outs):
        message = whole(plan, req, tok.decode(ids, skip_special_tokens=True))
        assert streamed(tok, plan, req, prompt_ids, steps) == message
        for c in message[2]:
            assert c["name"] == "get_weather" and set(json.loads(c["arguments"])) <= {"city", "days"}
        if req in single:
            assert message[0] is None and ids.count(call) >= len(message[2]) and ids.count(call_end) >= len(message[2])
        calls["single" if req in single else "thinking"] += len(message[2])
    assert min(calls.values()) > 0, calls


def test_a_tool_call_before_the_reasoning_end_streams_exactly(plain, plain_run, proposed):
    """The model opens a tool call without closing its thinking (a grammar with no reasoning gate: some text without
    `<`, so never `</think>`, then one Qwen XML call; a bias spells the tags as their single tokens): the reasoning
    ends at `<tool_call>` (vLLM's qwen3 parser), the call is parsed from the content, usage's reasoning_tokens ends
    before the tag; eagle k=2 equals plain, the tag lands inside accepted draft blocks, and the step deltas
    reassemble to exactly the whole answer."""
    from lightllm_mtp.sampling_params import StructuredOutput
    from lightllm_mtp.server.responses_output import reasoning_tokens
    from lightllm_mtp.server.tool_calls import tool_choice_grammar

    tok = plain.tokenizer
    call, call_end = tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    reqs = [chat_request(q, tools=WEATHER) for q in QUESTIONS]  # tool_choice auto: calls parsed, no grammar
    prompts = [prompt_of(plain, r) for r in reqs]
    plans = [plan_chat(r, OPTIONS, text) for r, (_, text) in zip(reqs, prompts)]
    assert all(p.in_reasoning and p.parse_tools and p.structured is None for p in plans)
    forced = tool_choice_grammar(WEATHER, None, False).replace("root ::= call", "root ::= [^<]{8,60} call", 1)
    params = [SamplingParams(temperature=0.0, max_tokens=128, structured=StructuredOutput("grammar", forced),
                             logit_bias={call: 30.0, call_end: 30.0})] * len(reqs)  # fmt: skip
    expect = plain_run("forgot", [p for p, _ in prompts], params)
    outs = run(mtp_llm("eagle2"), [p for p, _ in prompts], params)
    assert [ids for ids, _ in outs] == [ids for ids, _ in expect]
    check_drafted("eagle2", call, outs, proposed)
    for req, plan, (prompt_ids, _), (ids, steps) in zip(reqs, plans, prompts, outs):
        assert tok.convert_tokens_to_ids("</think>") not in ids and ids.count(call) == 1
        message = whole(plan, req, tok.decode(ids, skip_special_tokens=True))
        at = ids.index(call)
        assert message[0] == tok.decode(ids[:at]) and message[1] is None
        assert [c["name"] for c in message[2]] == ["get_weather"] and set(json.loads(message[2][0]["arguments"])) <= {
            "city", "days"}  # fmt: skip
        assert streamed(tok, plan, req, prompt_ids, steps) == message
        assert reasoning_tokens(tok, ids, plan.in_reasoning) == at


def test_special_tokens_stay_out_of_a_structured_output(plain, plain_run):
    """A bias that makes `<|im_start|>` (a special token) the model's first choice wherever it may come: under a
    json_schema (thinking off: from the first token) it never comes, inside the JSON's string either, where its text
    would fit (sampling/grammar_compiler.py); the answers end with eos as valid JSON, and eagle k=2 equals plain."""
    tok = plain.tokenizer
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    schema = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 40}}, "required": ["note"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "note", "schema": schema, "strict": True}}
    reqs = [chat_request(q, response_format=fmt, chat_template_kwargs={"enable_thinking": False}) for q in QUESTIONS]
    prompts = [prompt_of(plain, r) for r in reqs]
    plans = [plan_chat(r, OPTIONS, text) for r, (_, text) in zip(reqs, prompts)]
    assert all(not p.in_reasoning and not p.structured.starts_after for p in plans)
    params = [SamplingParams(temperature=0.0, max_tokens=96, structured=p.structured, logit_bias={im_start: 20.0})
              for p in plans]  # fmt: skip
    expect = plain_run("special", [p for p, _ in prompts], params)
    outs = run(mtp_llm("eagle2"), [p for p, _ in prompts], params)
    assert [ids for ids, _ in outs] == [ids for ids, _ in expect]
    eos = set(tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    for ids, _ in outs:
        assert im_start not in ids and ids[-1] in eos
        assert set(json.loads(tok.decode(ids, skip_special_tokens=True))) == {"note"}


def test_a_reduced_draft_vocabulary_keeps_the_chat_tokens(plain, plain_run, tiny_chat_dir, tmp_path):
    """A draft vocabulary ranked on a corpus without chat text (the stdlib) still holds `</think>`, `<tool_call>`, ...
    (build_draft_vocab keeps the tokenizer's added tokens, special or not, at every size), so the drafts propose the
    reasoning end and it is accepted; the output equals plain decoding's."""
    from lightllm_mtp.tools.build_draft_vocab import build
    from lightllm_mtp.tools.tiny_corpus import split_corpus

    tok = plain.tokenizer
    end = tok.convert_tokens_to_ids("</think>")
    data = build(tiny_chat_dir, [f.text for f in split_corpus().train[:40]], "40 stdlib files")
    assert end not in data["token_ids"] and set(tok.added_tokens_decoder) <= set(data["always"])
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(data))
    prompts = [prompt_of(plain, chat_request(q))[0] for q in QUESTIONS]
    params = [SamplingParams(temperature=0.0, max_tokens=48)] * len(prompts)
    expect = plain_run("reasoning", prompts, params)  # the same requests as the reasoning test's
    mtp = LLM(tiny_chat_dir, max_model_len=MAX_MODEL_LEN, max_batch_size=8, mtp_mode="eagle_with_att", mtp_step=2,
              mtp_draft_vocab_file=str(path), mtp_draft_vocab_size=1024)  # fmt: skip
    outs = run(mtp, prompts, params)
    assert [ids for ids, _ in outs] == [ids for ids, _ in expect]
    assert sum(drafted(end, steps) for _, steps in outs) > 0


def test_speculative_sampling_with_a_grammar_after_the_reasoning_end_is_exact(plain):
    """Temperature 1, top-k 3, a bias that makes `</think>` likely early, two digits gated after it: the joint
    distribution of the answers (reasoning end anywhere in the first tokens, inside draft blocks too) under eagle
    k=2 equals plain sampling's (chi-square homogeneity, p > 1e-3)."""
    import torch

    from lightllm_mtp.sampling_params import StructuredOutput
    from unit_tests.spec_decode.test_trained_drafting import _chi2_homogeneity_p

    end = plain.tokenizer.convert_tokens_to_ids("</think>")
    prompt = prompt_of(plain, chat_request("def fibonacci(n):"))[0]
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=5, logit_bias={end: 4.0},
                            structured=StructuredOutput("regex", "[0-9]{2}", starts_after="</think>"))  # fmt: skip

    def counts(**mtp) -> dict[tuple, int]:
        torch.manual_seed(0)
        out: dict[tuple, int] = {}
        llm = LLM(tiny_chat_checkpoint(), max_model_len=128, max_batch_size=64, **mtp)
        for o in llm.generate([prompt] * 500, params):
            out[tuple(o.token_ids)] = out.get(tuple(o.token_ids), 0) + 1
        return out

    base, spec = counts(), counts(mtp_mode="eagle_with_att", mtp_step=2)
    closed = sum(n for ids, n in base.items() if end in ids)
    assert 100 < closed < 490 and len(base) > 20
    assert _chi2_homogeneity_p(base, spec) > 1e-3, (sorted(base.items(), key=lambda kv: -kv[1])[:6],
                                                    sorted(spec.items(), key=lambda kv: -kv[1])[:6])  # fmt: skip
