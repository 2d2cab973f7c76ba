"""Issue 32: a structured output's grammar compiles in a background thread (sampling/grammar_compiler.py), so a slow
compilation never stalls the steps of other requests: the request waits (WAITING) until its grammar is ready, then
generates exactly what it generates when the grammar is ready at once; a grammar that does not compile finishes its
request with an error, the others unharmed; compiled grammars are cached by their text."""

import json
import threading

import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.engine.request import FinishReason, RequestStatus
from lightllm_mtp.sampling.grammar_compiler import GrammarCompiler
from lightllm_mtp.sampling_params import StructuredOutput

SCHEMA = StructuredOutput("json_schema", json.dumps({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "kind": {"enum": ["file", "dir"]}}, "required": ["name", "kind"]}))
PROMPT, OTHER = "import json\nconfig = ", "def fibonacci(n):"


def greedy(**kw):
    return SamplingParams(temperature=0.0, max_new_tokens=48, **kw)


@pytest.fixture(scope="module", params=[{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "mtp"])
def llm(trained_dense_dir, request):
    return LLM(trained_dense_dir, max_model_len=160, max_batch_size=4, **request.param)


def run_until(engine, done, max_steps=400):
    for _ in range(max_steps):
        if done():
            return
        engine.step_outputs()
    raise AssertionError("not done within the steps given")


def test_a_slow_compilation_does_not_stall_other_requests(llm, monkeypatch):
    release, calls = threading.Event(), []
    original = GrammarCompiler._compile

    def slow_compile(self, so):
        calls.append(so)
        assert release.wait(timeout=60), "the engine never let the other request finish"
        return original(self, so)

    monkeypatch.setattr(GrammarCompiler, "_compile", slow_compile)
    engine = llm.engine
    structured = engine.add_request(llm.tokenizer.encode(PROMPT), greedy(structured=SCHEMA))
    other = engine.add_request(llm.tokenizer.encode(OTHER), greedy())
    run_until(engine, lambda: other.ended)  # while the grammar is still compiling
    assert structured.status is RequestStatus.WAITING and not structured.output_ids and len(other.output_ids) > 8
    release.set()
    run_until(engine, lambda: structured.ended)
    assert structured.finish_reason is FinishReason.STOP and not engine.has_unfinished()
    json.loads(llm.tokenizer.decode(structured.output_ids, skip_special_tokens=True))
    cached = llm.generate(PROMPT, greedy(structured=SCHEMA))[0]  # the cached grammar: ready at once
    assert structured.output_ids == cached.token_ids and len(calls) == 1


def test_a_grammar_that_does_not_compile_fails_its_request_only(llm, monkeypatch):
    def broken(self, so):
        raise ValueError("no room for this grammar")

    monkeypatch.setattr(GrammarCompiler, "_compile", broken)
    bad = StructuredOutput("regex", "[a-z]{3}-broken")
    outs = llm.generate([PROMPT, OTHER], [greedy(structured=bad), greedy()])
    assert outs[0].finish_reason == "error" and "no room for this grammar" in outs[0].error and not outs[0].token_ids
    assert outs[1].finish_reason in ("stop", "length") and outs[1].error is None and outs[1].token_ids
    monkeypatch.undo()  # a failure is not cached: the next request compiles it
    again = llm.generate(PROMPT, greedy(structured=bad))[0]
    assert again.error is None and again.text.endswith("-broken") and len(again.text) == 10


def test_compiled_grammars_are_cached_by_their_text(trained_dense_dir):
    from transformers import AutoTokenizer

    compiler = GrammarCompiler(lambda: AutoTokenizer.from_pretrained(trained_dense_dir), 4096, cache_size=2)
    a, b, c = (StructuredOutput("regex", r) for r in ("[0-9]+", "[a-z]+", "x|y"))
    first, second = compiler.compile(a), compiler.compile(b)
    assert compiler.compile(StructuredOutput("regex", "[0-9]+")) is first
    compiler.compile(c)  # b was the least recently used
    assert list(compiler.cache) == [("regex", "[0-9]+", False), ("regex", "x|y", False)]
    assert compiler.compile(b) is not second
    # after a marker the grammar starts with optional whitespace: its own compilation, the same for any marker
    gated = compiler.compile(StructuredOutput("regex", "x|y", starts_after="</think>"))
    assert gated is not compiler.compile(c)
    assert compiler.compile(StructuredOutput("regex", "x|y", starts_after="E")) is gated
    bad = StructuredOutput("regex", "([")
    failed = compiler.compile(bad)
    with pytest.raises(ValueError, match="invalid regex"):
        failed.result()
    assert compiler.compile(bad) is not failed  # a failure is not kept
