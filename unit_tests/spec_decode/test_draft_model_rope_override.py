"""The engine's rope_scaling reaches an external draft model: with YaRN over the pair's 4096-position window, a
max_model_len past it builds (the draft's window is scaled as the target's) and greedy output equals plain decoding
(before, the draft's own 4096-position window refused the engine)."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from unit_tests.trained_fixtures import DENSE, DRAFT, trained_fixture

YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096}
PROMPTS = [[(31 * i + 7) % 4000 + 3 for i in range(40)], [5, 6, 7, 8]]


@pytest.fixture(scope="module")
def pair():
    if trained_fixture("qwen3_5") is None or trained_fixture("qwen3_5_draft") is None:
        pytest.skip("trained target / draft fixtures not there")
    return str(DENSE), str(DRAFT)


def test_draft_model_takes_the_rope_override(pair):
    target, draft = pair
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    plain = LLM(target, max_model_len=6000, rope_scaling=YARN, max_batch_size=2)
    want = [o.token_ids for o in plain.generate(PROMPTS, greedy)]
    spec = LLM(target, max_model_len=6000, rope_scaling=YARN, max_batch_size=2, mtp_mode="draft_model",
               mtp_step=2, mtp_draft_model_dir=draft)  # fmt: skip
    assert spec.engine.runner.proposer.draft.cfg.rope_scaling is not None
    outs = spec.generate(PROMPTS, greedy)
    assert [o.token_ids for o in outs] == want and sum(o.spec.accepted_drafts for o in outs) > 0

