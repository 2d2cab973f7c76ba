"""The prefix cache on the GPU path (Triton attention, fla GDN prefill saving its fp32 chunk states at snapshot
boundaries, CUDA graphs): greedy output identical with and without it, plain and MTP; interval 16 splits the prefill at
boundaries off fla's 64-token chunks, interval 64 takes them all from one call."""

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams

pytestmark = pytest.mark.gpu
SYSTEM = [(37 * i) % 700 + 3 for i in range(70)]


@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2),
                                 dict(mtp_mode="vanilla_with_att", mtp_step=3)], ids=["plain", "eagle", "vanilla"])
@pytest.mark.parametrize("interval", [16, 64])
def test_greedy_identical_with_the_cache(tiny_dense_mtp3_dir, mtp, interval):
    params = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    batches = [[SYSTEM + [1, 2, 3]], [SYSTEM + [4, 5, 6, 7], SYSTEM[:40] + [8, 9]], [SYSTEM[:67] + [10] * j for j in range(1, 5)]]

    def run(cache):
        llm = LLM(tiny_dense_mtp3_dir, device="cuda", dtype="float32", max_model_len=128, graph_max_batch_size=8,
                  chunked_prefill_size=32 if interval == 16 else 128, prefix_cache=cache, prefix_cache_interval=interval,
                  prefix_cache_state_share=0.5, **mtp)  # fmt: skip
        outs = [o for b in batches for o in llm.generate(b, params)]
        llm.engine.evict_prefix_cache()
        assert llm.engine.model.caches.kv_pool.num_free == llm.engine.model.caches.kv_pool.size
        return outs

    ref, outs = run(False), run(True)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert sum(o.num_cached_tokens for o in outs) > 0
