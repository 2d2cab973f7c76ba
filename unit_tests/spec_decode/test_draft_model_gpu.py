"""The draft model and PARD on the GPU path (Triton kernels, the draft's window and chain steps replayed from CUDA
graphs): greedy output equal to plain decoding; the target drafting for itself accepts every draft."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from unit_tests.spec_decode.draft_model_fixtures import near_copy

pytestmark = pytest.mark.gpu
PROMPTS = [[5, 17, 300, 42, 9, 77, 1024, 3, 58, 600, 11], [900, 4, 4, 250], [31, 8, 222, 1500, 64, 2, 7]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)


def run(target, **kw):
    llm = LLM(target, device="cuda", dtype="float32", max_model_len=64, graph_max_batch_size=8, **kw)
    return llm, llm.generate(PROMPTS, GREEDY)


@pytest.mark.parametrize("pard", [False, True], ids=["autoregressive", "pard"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_model_on_gpu_equals_plain(tiny_dense_dir, tmp_path, pard, k):
    _, plain = run(tiny_dense_dir)
    draft = near_copy(tiny_dense_dir, tmp_path / "near", pard_token=0)
    llm, outs = run(tiny_dense_dir, mtp_mode="draft_model", mtp_step=k, mtp_draft_model_dir=draft,
                    parallel_drafting=pard)  # fmt: skip
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    proposer = llm.engine.runner.proposer
    assert proposer.window.graph_sets and (pard or k == 1 or proposer.chain.graph_sets)


def test_target_as_its_own_draft_accepts_every_draft_on_gpu(tiny_dense_dir):
    _, outs = run(tiny_dense_dir, mtp_mode="draft_model", mtp_step=3, mtp_draft_model_dir=tiny_dense_dir)
    assert all(o.spec.accepted_drafts_per_step > 2.5 for o in outs), [o.spec.accepted_drafts_per_step for o in outs]
