"""tools/make_tiny_chat.py: Qwen3.5's chat tokens as single added tokens with the published tokenizer's special flags
(decoding with skip_special_tokens keeps `<think>` / `<tool_call>`, drops `<|im_end|>`), the shipped template
rendering through them, the text weights the trained fixture's, and a model that writes `</think>` of itself (HF's
greedy decoding is the oracle); make_tiny_vision.py grows it further."""

import json

import pytest
import torch

from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.tools.make_tiny_chat import CHAT_TEMPLATE, CHAT_TOKENS, TWINS, make_tiny_chat
from unit_tests.chat_fixture import tiny_chat_dir  # noqa: F401 (fixture)
from unit_tests.tools.test_make_tiny_vision import tensors
from unit_tests.grown_fixtures import assert_regrown_identically
from unit_tests.trained_fixtures import trained_fixture_path

OLD_VOCAB = 4096
# Qwen3 / Qwen3.5's published tokenizer_config.json (added_tokens_decoder): which added tokens are special
PUBLISHED_SPECIAL = {"<|endoftext|>": True, "<|im_start|>": True, "<|im_end|>": True, "<tool_call>": False,
                     "</tool_call>": False, "<tool_response>": False, "</tool_response>": False, "<think>": False,
                     "</think>": False}  # fmt: skip
CONVERSATION = [{"role": "user", "content": "def fibonacci(n):"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_chat_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_chat_dir)


def test_single_tokens_with_the_published_special_flags(tiny_chat_dir, tokenizer):
    hf = json.loads((tiny_chat_dir / "config.json").read_text())
    assert ModelConfig.from_hf(hf).vocab_size == len(tokenizer) == OLD_VOCAB + len(CHAT_TOKENS)
    added = {t.content: (i, t.special) for i, t in tokenizer.added_tokens_decoder.items()}
    assert {name: special for name, (_, special) in added.items()} == PUBLISHED_SPECIAL
    assert [added[t.content][0] for t in CHAT_TOKENS] == list(range(OLD_VOCAB, OLD_VOCAB + len(CHAT_TOKENS)))
    end, call = added["</think>"][0], added["<tool_call>"][0]
    assert tokenizer.encode("a</think>\n\n<tool_call>\n", add_special_tokens=False)[1:4:2] == [end, call]
    im_end = added["<|im_end|>"][0]
    assert tokenizer.decode([end, im_end, call], skip_special_tokens=True) == "</think><tool_call>"
    generation = json.loads((tiny_chat_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [im_end, added["<|endoftext|>"][0]]  # Qwen3.5's eos ids


def test_the_template_renders_through_the_single_tokens(tiny_chat_dir, tokenizer):
    assert (tiny_chat_dir / "chat_template.jinja").read_text() == CHAT_TEMPLATE.read_text()
    on = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True)
    off = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, enable_thinking=False)
    on, off = (ids if isinstance(ids, list) else ids["input_ids"] for ids in (on, off))
    think, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    assert on[-2:] == [think, tokenizer.encode("\n")[0]]
    assert off[-4] == think and off[-2] == end


def test_text_weights_are_the_trained_fixtures(tiny_chat_dir):
    from unit_tests.hf_reference import hf_prefill_logits

    source = trained_fixture_path("qwen3_5")
    old, new = tensors(source), tensors(tiny_chat_dir)
    assert set(new) == set(old)
    for name, t in old.items():
        if name in ("lm_head.weight", "model.language_model.embed_tokens.weight"):
            assert new[name].shape == (OLD_VOCAB + len(CHAT_TOKENS), t.shape[1])
            assert torch.equal(new[name][:OLD_VOCAB], t), name
        else:
            assert torch.equal(new[name], t), name
    prompt = [101, 7, 2048, 3000, 55, 4093]
    after = hf_prefill_logits(tiny_chat_dir, prompt)
    assert torch.equal(after[:, :OLD_VOCAB], hf_prefill_logits(source, prompt))


def test_the_model_writes_think_end_as_one_token(tiny_chat_dir, tokenizer):
    """The twin rows: `</think>` doubles "\\n" (HF's greedy chain writes it in a chat answer) and the engine decodes
    the same tokens as HF."""
    from lightllm_mtp import LLM, SamplingParams
    from unit_tests.hf_reference import hf_greedy

    end = tokenizer.convert_tokens_to_ids("</think>")
    twin = tokenizer.encode(TWINS["</think>"])[0]
    heads = tensors(tiny_chat_dir)["lm_head.weight"].float()
    assert torch.nn.functional.cosine_similarity(heads[end], heads[twin], dim=0) > 0.9
    prompt = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    want, _ = hf_greedy(tiny_chat_dir, ids, 32)
    assert end in want
    got = LLM(tiny_chat_dir, max_model_len=128, max_batch_size=1).generate(
        [ids], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))[0]  # fmt: skip
    assert got.token_ids == want and "</think>" in got.text


def test_same_seed_same_files_and_vision_on_top(tiny_chat_dir, tmp_path):
    from lightllm_mtp.tools.make_tiny_vision import VISION_TOKENS, make_tiny_vision

    assert_regrown_identically(make_tiny_chat, tiny_chat_dir, tmp_path)
    both = make_tiny_vision(tmp_path / "vision", tiny_chat_dir)
    cfg = ModelConfig.from_hf(json.loads((both / "config.json").read_text()))
    first = OLD_VOCAB + len(CHAT_TOKENS)
    assert cfg.vocab_size == first + len(VISION_TOKENS) and cfg.vision.vision_start_token_id == first
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(both)
    assert tok.convert_tokens_to_ids(["</think>", "<|image_pad|>"]) == [OLD_VOCAB + 5, first + 2]
    assert tok.added_tokens_decoder[first].special and not tok.added_tokens_decoder[OLD_VOCAB + 5].special
