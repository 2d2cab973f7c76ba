"""The offline API as a vLLM user writes it: dict prompts, max_tokens, stop strings; anything that is not a prompt is
a TypeError, never generated from."""

import pytest

from lightllm_mtp import LLM, SamplingParams

GREEDY = dict(temperature=0.0, seed=0)


@pytest.fixture(scope="module")
def llm(trained_dense_dir):
    return LLM(trained_dense_dir, max_model_len=256, max_batch_size=4)


def test_dict_prompts_equal_their_plain_forms(llm):
    params = SamplingParams(max_tokens=8, **GREEDY)
    ids = llm.tokenizer.encode("def add(a, b):", add_special_tokens=False)
    want = llm.generate("def add(a, b):", params)[0].token_ids
    assert llm.generate({"prompt": "def add(a, b):"}, params)[0].token_ids == want
    assert llm.generate({"prompt_token_ids": ids}, params)[0].token_ids == want
    outs = llm.generate([{"prompt": "def add(a, b):"}, {"prompt_token_ids": ids}, ids], params)
    assert [o.token_ids for o in outs] == [want] * 3


@pytest.mark.parametrize("prompt", [3.5, None, {"prompt_ids": [1, 2]}, {"prompt": [1, 2]},
                                    {"prompt_token_ids": "abc"}, [[1, 2], 7.0], b"bytes", [True, False]])
def test_anything_else_is_a_type_error_and_queues_nothing(llm, prompt):
    with pytest.raises(TypeError):
        llm.generate(prompt, SamplingParams(max_tokens=4, **GREEDY))
    assert not llm.engine.has_unfinished()


def test_unsupported_dict_fields_are_refused(llm):
    with pytest.raises(ValueError, match="mm_processor_kwargs"):
        llm.generate({"prompt": "x", "mm_processor_kwargs": {}}, SamplingParams(max_tokens=4))


def test_max_tokens_is_max_new_tokens():
    assert SamplingParams(max_tokens=7).max_new_tokens == 7
    assert SamplingParams(max_new_tokens=7).max_tokens == 7
    assert SamplingParams().max_tokens == 16
    assert SamplingParams(max_tokens=5, max_new_tokens=5).max_new_tokens == 5
    with pytest.raises(ValueError, match="differ"):
        SamplingParams(max_tokens=5, max_new_tokens=6)


@pytest.mark.parametrize("stop", [[""], ["a"] * 5, [3], "x" * 1025])
def test_bad_stop_strings_are_refused(stop):
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=stop)


@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "mtp"])
def test_stop_strings_end_the_text_before_them(trained_dense_dir, mtp):
    llm = LLM(trained_dense_dir, max_model_len=256, max_batch_size=4, **mtp)
    prompts = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Stack:\n    def push(self, item):"]
    full = llm.generate(prompts, SamplingParams(max_tokens=40, **GREEDY))
    for prompt, out in zip(prompts, full):
        text = out.text
        stop = text[len(text) // 2 : len(text) // 2 + 3]  # a piece of the middle: it must cut there
        if not stop.strip():
            continue
        cut = llm.generate(prompt, SamplingParams(max_tokens=40, stop=[stop], **GREEDY))[0]
        assert cut.text == text[: text.index(stop)], (prompt, stop)
        assert cut.finish_reason == "stop"
        assert full[0] is not cut and out.token_ids[: len(cut.token_ids)] == cut.token_ids
        assert len(cut.token_ids) < len(out.token_ids)
        assert llm.tokenizer.decode(cut.token_ids).find(stop) >= 0  # the token completing the stop string is kept
    assert not llm.engine.has_unfinished() and llm.engine.scheduler.reserved == 0


@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "mtp"])
def test_min_tokens_holds_back_stop_strings(trained_dense_dir, mtp):
    """A stop string inside the text of the first min_tokens tokens does not end the request; the first one ending
    after it does (vLLM's rule), with MTP steps of several tokens as with one token a step."""
    llm = LLM(trained_dense_dir, max_model_len=256, max_batch_size=4, **mtp)
    tried = 0
    for prompt in ["def fibonacci(n):", "import os\nimport sys\n\n", "class Stack:\n    def push(self, item):"]:
        params = dict(max_tokens=40, min_tokens=12, ignore_eos=True, **GREEDY)
        base = llm.generate(prompt, SamplingParams(**params))[0]
        protected = len(llm.tokenizer.decode(base.token_ids[:12]))
        stop = base.text[protected - 6 : protected - 3]  # it ends inside the first 12 tokens' text
        if not stop.strip():
            continue
        tried += 1
        out = llm.generate(prompt, SamplingParams(stop=[stop], **params))[0]
        later = base.text.find(stop, protected - len(stop) + 1)
        assert out.text == (base.text[:later] if later >= 0 else base.text), (prompt, stop)
        assert out.finish_reason == ("stop" if later >= 0 else "length")
        early = llm.generate(prompt, SamplingParams(stop=[stop], **{**params, "min_tokens": 0}))[0]
        assert early.text == base.text[: base.text.index(stop)] and len(early.text) < len(out.text)
    assert tried >= 2


def test_chat_through_the_shipped_template(trained_dense_dir):
    """LLM.chat renders with the template (the Qwen3.5-style one: thinking on, tools listed), then generates as
    generate does; enable_thinking false pre-fills an empty think block."""
    from lightllm_mtp.chat_templates import chat_template_text

    llm = LLM(trained_dense_dir, max_model_len=256)
    messages = [{"role": "user", "content": "Sort a list."}]
    tools = [{"type": "function", "function": {"name": "sort", "parameters": {"type": "object"}}}]
    params = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    out = llm.chat(messages, params, tools=tools, chat_template="qwen3_5")[0]
    text = llm.tokenizer.apply_chat_template(messages, tools=tools, chat_template=chat_template_text("qwen3_5"),
                                             tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert text.endswith("<think>\n") and '"name": "sort"' in text
    assert out.prompt_token_ids == llm.tokenizer.encode(text, add_special_tokens=False)
    assert out.token_ids == llm.generate([out.prompt_token_ids], params)[0].token_ids
    both = llm.chat([messages, messages], params, chat_template="qwen3_5",
                    chat_template_kwargs={"enable_thinking": False})  # fmt: skip
    assert len(both) == 2 and llm.tokenizer.decode(both[0].prompt_token_ids).endswith("<think>\n\n</think>\n\n")
