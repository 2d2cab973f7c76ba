"""The trained draft fixtures on the trained dense target (held-out prompts): greedy output equal to plain decoding
for k = 1..4, autoregressively and with PARD, and real acceptance (a broken rollback or chain state would drop it to
the level of an untrained draft, about 0)."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.tools.tiny_corpus import heldout_prompts, split_corpus

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(trained_dense_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_dense_dir)
    return [p for _, p in heldout_prompts(tokenizer, split_corpus().heldout, 6, 64)]


@pytest.fixture(scope="module")
def plain(trained_dense_dir, prompts):
    return [o.token_ids for o in LLM(trained_dense_dir, max_model_len=128).generate(prompts, GREEDY)]


@pytest.mark.parametrize("pard", [False, True], ids=["autoregressive", "pard"])
def test_trained_drafts_are_exact_and_accepted(trained_dense_dir, trained_draft_dir, trained_pard_draft_dir, prompts,
                                               plain, pard):  # fmt: skip
    draft = trained_pard_draft_dir if pard else trained_draft_dir
    first = []
    for k in (1, 2, 4):
        llm = LLM(trained_dense_dir, max_model_len=128, mtp_mode="draft_model", mtp_step=k, mtp_draft_model_dir=draft,
                  parallel_drafting=pard)  # fmt: skip
        outs = llm.generate(prompts, GREEDY)
        assert [o.token_ids for o in outs] == plain
        total = sum((o.spec for o in outs[1:]), outs[0].spec)
        first.append(total.acceptance_per_position[0])
    assert min(first) > 0.1, first  # 16 held-out prompts: 0.31 (autoregressive), 0.21 (PARD; fixtures README)
