"""MTP past the original RoPE window (tiny model, YaRN factor 4 over 64 positions): greedy MTP output equals plain
decoding, and the draft head's pass over a prompt reaching 3x the window equals the training MTP head built from HF's
layers with the same YaRN config (fp32, CPU)."""

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from unit_tests.rope_fixtures import ORIGINAL_WINDOW, YARN_FACTOR
from unit_tests.spec_decode.oracle_drafts import oracle_drafts
from unit_tests.tools.test_train_tiny import record_first_draft_pass

WINDOW = YARN_FACTOR * ORIGINAL_WINDOW
# one prompt starts past the window, one crosses it while generating, one short one stays inside at first
PROMPTS = [[(37 * i + 11) % 1500 + 3 for i in range(150)], [(53 * i + 5) % 1400 + 3 for i in range(40)], [9, 8, 7]]
MAX_NEW = [80, 120, 100]


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_yarn_dir):
    llm = LLM(tiny_yarn_dir, max_model_len=WINDOW)
    return [o.token_ids for o in llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])]


@pytest.mark.parametrize("corrupt_every", [None, 3])
def test_eagle_k2_greedy_equals_plain_past_the_window(monkeypatch, tiny_yarn_dir, reference, corrupt_every):
    """corrupt_every: oracle drafts (the reference continuation, one wrong draft in 3) so that long accepted blocks
    cross the window too; None: the random MTP head's own drafts."""
    if corrupt_every is not None:
        oracle_drafts(monkeypatch, reference, corrupt_every)
    llm = LLM(tiny_yarn_dir, max_model_len=WINDOW, mtp_mode="eagle_with_att", mtp_step=2, chunked_prefill_size=48)
    outs = llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    assert [o.token_ids for o in outs] == reference
    assert all(o.spec.verify_steps > 0 for o in outs)
    if corrupt_every is not None:
        assert min(o.spec.tokens_per_step for o in outs) > 1.5
    assert max(len(p) + n for p, n in zip(PROMPTS, MAX_NEW)) > 3 * ORIGINAL_WINDOW


def test_draft_head_equals_the_hf_mtp_head_past_the_window(monkeypatch, tiny_yarn_dir):
    from training.trainable_mtp import load_tiny_mtp_model

    prompt = PROMPTS[0] + PROMPTS[1]  # 190 tokens: positions up to ~3x the original window
    first = LLM(tiny_yarn_dir, max_model_len=WINDOW).generate([prompt], greedy(1))[0].token_ids
    calls = record_first_draft_pass(monkeypatch)
    LLM(tiny_yarn_dir, max_model_len=WINDOW, mtp_mode="eagle_with_att", mtp_step=1,
        chunked_prefill_size=WINDOW).generate([prompt], greedy(2))  # fmt: skip
    _, engine_hidden, engine_mtp_hidden, _ = calls[0]
    model = load_tiny_mtp_model(tiny_yarn_dir)
    assert model.lm.model.rotary_emb.rope_type == model.mtp.stacks[0].rotary_emb.rope_type == "yarn"
    sequence = torch.tensor([prompt + first])
    with torch.no_grad():
        hidden = model.lm.model(input_ids=sequence[:, :-1]).last_hidden_state[0]
        mtp_hidden = model.mtp(model.lm.model.embed_tokens(sequence[:, 1:]), hidden[None])[0]
    torch.testing.assert_close(engine_hidden, hidden, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(engine_mtp_hidden, mtp_hidden, atol=2e-5, rtol=1e-4)
