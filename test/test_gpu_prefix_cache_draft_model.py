"""The prefix cache with an external draft model on the GPU path (both models' fla GDN prefill saving their states at
the same snapshot boundaries, the draft's window / chain CUDA graphs reading a restored state): greedy output and
per-position acceptance identical with and without the cache, autoregressive and PARD; resumed prompts with 1..k+1
tokens left run as prompt chunks (eagerly), not through the verify graphs."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from unit_tests.trained_fixtures import DENSE as TARGET
from unit_tests.trained_fixtures import DRAFT, PARD_DRAFT

pytestmark = pytest.mark.gpu
DRAFTS = {False: DRAFT, True: PARD_DRAFT}
SYSTEM = [(37 * i) % 700 + 3 for i in range(70)]
K = 3


@pytest.mark.parametrize("pard", [False, True], ids=["draft_model", "pard"])
@pytest.mark.parametrize("interval", [16, 64])
def test_greedy_and_acceptance_identical_with_the_cache(pard, interval):
    params = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    q1 = SYSTEM + [1, 2, 3]
    batches = [[q1], [SYSTEM + [4, 5, 6, 7], SYSTEM[:40] + [8, 9]], [q1 + [4093] * j for j in range(1, K + 2)]]

    def run(cache):
        llm = LLM(TARGET, device="cuda", dtype="float32", max_model_len=160, graph_max_batch_size=8,
                  chunked_prefill_size=32 if interval == 16 else 128, prefix_cache=cache,
                  prefix_cache_interval=interval,
                  prefix_cache_state_share=0.5, max_total_token_num=8192, mtp_mode="draft_model", mtp_step=K,
                  mtp_draft_model_dir=DRAFTS[pard], parallel_drafting=pard)  # fmt: skip
        outs = [o for b in batches for o in llm.generate(b, params)]
        llm.engine.evict_prefix_cache()
        assert llm.engine.model.caches.kv_pool.num_free == llm.engine.model.caches.kv_pool.size
        return outs

    ref, outs = run(False), run(True)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    # the draft's state after a hit is the recomputed one: acceptance as without the cache (fp32 kernels over other
    # chunkings may flip a near-tie draft, so not bit-equal)
    accepted = [sum(sum(o.spec.accepted_at) for o in x) for x in (ref, outs)]
    assert abs(accepted[1] - accepted[0]) <= 0.05 * accepted[0], accepted
    assert [len(o.prompt_token_ids) - o.num_cached_tokens for o in outs[-(K + 1):]] == list(range(1, K + 2))
