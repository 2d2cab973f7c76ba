"""A model vocabulary padded past the tokenizer's ids (Qwen3.5's 248320 rows): xgrammar covers the tokenizer's ids
only, and the masks are those of an unpadded vocabulary with the padded ids never allowed in a filled row (the
oracle: a compiler over the tokenizer's own size); the bitmask's rows unpack to the bits a per-bit shift reads."""

import json

import pytest
import torch

from lightllm_mtp.sampling.grammar import new_bitmask, row_masks
from lightllm_mtp.sampling.grammar_compiler import GrammarCompiler
from lightllm_mtp.sampling_params import StructuredOutput
from unit_tests.chat_fixture import tiny_chat_checkpoint

SCHEMA = StructuredOutput("json_schema", json.dumps({"type": "object", "properties": {
    "name": {"type": "string"}, "size": {"type": "integer"}}, "required": ["name", "size"]}))  # fmt: skip
PAD = 1000


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_chat_checkpoint())


def test_padded_vocabulary_masks_equal_the_tokenizers(tokenizer):
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    exact = GrammarCompiler(lambda: tokenizer, len(tokenizer), eos)
    padded = GrammarCompiler(lambda: tokenizer, len(tokenizer) + PAD, eos)
    g_exact, g_padded = exact.matcher(SCHEMA), padded.matcher(SCHEMA)
    assert g_padded.vocab_size == len(tokenizer)
    text = '{"name": "ab", "size": 12}'
    steps = tokenizer.encode(text, add_special_tokens=False)
    for t in [*steps, eos[0]]:
        want = new_bitmask(1, len(tokenizer))
        g_exact.fill_after([], want, 0)
        got = new_bitmask(2, len(tokenizer) + PAD)  # row 1 is not filled: it keeps allowing every id
        g_padded.fill_after([], got, 0)
        allowed = row_masks(got, len(tokenizer) + PAD, torch.device("cpu")).allowed
        assert torch.equal(allowed[0, : len(tokenizer)], row_masks(want, len(tokenizer), torch.device("cpu")).allowed[0])
        assert not allowed[0, len(tokenizer) :].any() and allowed[1].all()
        g_exact.advance(t)
        g_padded.advance(t)
    assert g_padded.matcher.is_terminated()


@pytest.mark.parametrize("vocab", [33, 4096, 4100])
def test_row_masks_unpack_every_bit(vocab):
    bitmask = torch.randint(-(2**31), 2**31 - 1, (5, (vocab + 31) // 32), dtype=torch.int32,
                            generator=torch.Generator().manual_seed(vocab))  # fmt: skip
    shifted = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    assert torch.equal(row_masks(bitmask, vocab, torch.device("cpu")).allowed, shifted.bool().flatten(1)[:, :vocab])
