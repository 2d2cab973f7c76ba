"""The tokens a structured output allows, on the tiny chat tokenizer (unit_tests/chat_fixture.py: `<|im_start|>`,
`<|im_end|>`, `<|endoftext|>` are special added tokens; `<think>`, `</think>`, `<tool_call>`, ... added tokens that
are not): the tokenizer's special tokens are illegal everywhere in a structured output, inside a JSON string too,
except the stop tokens (the engine's eos ids) that end a complete one, which xgrammar alone does not do (the oracle:
its own TokenizerInfo allows `<|im_start|>` inside a string, whose text fits there); a grammar that starts after a
reasoning end begins with bounded optional whitespace (Qwen writes `</think>\\n\\n` before its answer)."""

import json

import pytest

from lightllm_mtp.sampling.grammar import MAX_LEADING_WHITESPACE, new_bitmask
from lightllm_mtp.sampling.grammar_compiler import GrammarCompiler
from lightllm_mtp.sampling_params import StructuredOutput
from lightllm_mtp.server.tool_calls import tool_choice_grammar
from unit_tests.chat_fixture import tiny_chat_checkpoint

NAME = StructuredOutput("json_schema", json.dumps({"type": "object", "properties": {"name": {"type": "string"}},
                                                   "required": ["name"]}))  # fmt: skip
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}}}}]  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_chat_checkpoint())


def ids_of(tokenizer, names) -> set[int]:
    return set(tokenizer.convert_tokens_to_ids(list(names)))


def bits(bitmask, vocab_size: int) -> set[int]:
    return {t for t in range(vocab_size) if (int(bitmask[0, t // 32]) >> (t % 32)) & 1}


def allowed_after(compiler: GrammarCompiler, so: StructuredOutput, tokenizer, text: str) -> set[int]:
    """The tokens the engine's matcher allows after the output `text` (its tokens committed one by one)."""
    g = compiler.matcher(so)
    for t in tokenizer.encode(text, add_special_tokens=False):
        g.advance(t)
    bitmask = new_bitmask(1, len(tokenizer))
    g.fill_after([], bitmask, 0)
    return bits(bitmask, len(tokenizer))


def test_xgrammar_alone_allows_a_special_token_inside_a_json_string(tokenizer):
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=sorted(ids_of(tokenizer, ["<|im_end|>"])))
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_json_schema(NAME.spec, any_whitespace=False))
    assert info.special_token_ids == [] and matcher.accept_string('{"name": "x')
    bitmask = xgr.allocate_token_bitmask(1, len(tokenizer))
    matcher.fill_next_token_bitmask(bitmask)
    assert ids_of(tokenizer, ["<|im_start|>", "<|endoftext|>"]) <= bits(bitmask, len(tokenizer))


@pytest.mark.parametrize("eos", [("<|im_end|>", "<|endoftext|>"), ("<|im_end|>",)])
def test_special_tokens_are_illegal_inside_a_structured_output(tokenizer, eos):
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    stops = ids_of(tokenizer, eos)
    chat_tags = ids_of(tokenizer, ["<tool_call>", "</tool_call>", "<think>", "</think>"])  # text, not special
    assert ids_of(tokenizer, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]) <= special and not chat_tags & special
    compiler = GrammarCompiler(lambda: tokenizer, len(tokenizer), stops)
    open_strings = [(NAME, '{"name": "x'), (StructuredOutput("json_object"), '{"a": "'),
                    (StructuredOutput("grammar", 'root ::= "[" [^\\]]* "]"'), "[x")]  # fmt: skip
    for so, text in open_strings:
        inside = allowed_after(compiler, so, tokenizer, text)
        assert not inside & special and chat_tags <= inside, so
        assert ids_of(tokenizer, ["<"]) <= inside  # the text of a special token may still be spelled out
    # where the grammar may end, the stop tokens end it; the other special tokens never come
    free = allowed_after(compiler, StructuredOutput("regex", "[^\\n]{0,40}"), tokenizer, "x")
    assert free & special == stops and chat_tags <= free
    assert allowed_after(compiler, NAME, tokenizer, '{"name": "x"}') == stops
    # before a reasoning end the output is free: special tokens included
    gated = StructuredOutput(NAME.kind, NAME.spec, starts_after="</think>")
    assert special <= allowed_after(compiler, gated, tokenizer, "Hmm")
    assert set(compiler.info.special_token_ids) == special - stops and set(compiler.info.stop_token_ids) == stops


def test_a_grammar_after_a_reasoning_end_starts_with_bounded_whitespace(tokenizer):
    compiler = GrammarCompiler(lambda: tokenizer, len(tokenizer), ids_of(tokenizer, ["<|im_end|>"]))
    gated = StructuredOutput(NAME.kind, NAME.spec, starts_after="</think>")

    def texts(so, text):
        return {tokenizer.decode([t]) for t in allowed_after(compiler, so, tokenizer, text)}

    first = texts(gated, "Hmm.</think>")
    assert {"\n", "\n\n", " ", "\t", "{"} <= first
    for t in first:  # whitespace, then the JSON's start
        body = t.lstrip(" \t\r\n")
        assert len(t) - len(body) <= MAX_LEADING_WHITESPACE and (not body or body.startswith("{")), repr(t)
    assert "{" in texts(gated, "Hmm.</think>\n\n") and "\n" in texts(gated, "Hmm.</think>\n\n")
    bounded = texts(gated, "Hmm.</think>" + " " * MAX_LEADING_WHITESPACE)
    assert "{" in bounded and all(t.startswith("{") for t in bounded)
    assert all(t.startswith("{") for t in texts(NAME, ""))  # from the first token: compact JSON as before
    # the tool_choice grammar after the reasoning: Qwen's "\n\n" then the call's single-token tag
    calls = StructuredOutput("grammar", tool_choice_grammar(WEATHER, None, False), starts_after="</think>")
    assert "<tool_call>" in texts(calls, "Weather.</think>\n\n")
