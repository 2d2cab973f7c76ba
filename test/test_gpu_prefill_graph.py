"""Prefill CUDA graphs on the GPU (common/basemodel/prefill_graph.py): one request's prompt chunks replay padded
graphs, with and without snapshots, and give the tokens of eager chunks; the captured forward equals the eager one on
the same chunk."""

import dataclasses

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.common.basemodel.prefill_graph import PrefillGraphSet
from lightllm_mtp.engine.request import Request
from lightllm_mtp.engine.scheduler import ScheduledRequest

pytestmark = pytest.mark.gpu
SYSTEM = [(37 * i) % 700 + 3 for i in range(300)]


def prefill_graphs(llm) -> PrefillGraphSet | None:
    return next((g for g in llm.engine.model_runner.graphs if isinstance(g, PrefillGraphSet)), None)


@pytest.mark.parametrize("model", ["dense", "moe"])
@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "eagle"])
@pytest.mark.parametrize("cache", [True, False])
def test_tokens_identical_with_and_without_prefill_graphs(tiny_dense_mtp3_dir, tiny_moe_mtp3_dir, mtp, cache, model):
    """MoE too: a bucket's padding rows are zeroed before routing (ForwardBatch.padded)."""
    model_dir = tiny_dense_mtp3_dir if model == "dense" else tiny_moe_mtp3_dir
    params = SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True)
    prompts = [SYSTEM + [1, 2, 3], SYSTEM + [4, 5], SYSTEM[:130] + [6], SYSTEM[:200] + list(range(50, 120)), [7] * 5,
               SYSTEM[:64], SYSTEM[:65]]  # fmt: skip

    def run(graphs):
        llm = LLM(model_dir, device="cuda", dtype="float32", max_model_len=512, graph_max_batch_size=8,
                  chunked_prefill_size=256, prefix_cache=cache, prefix_cache_interval=64, prefix_cache_state_share=0.5,
                  prefill_cuda_graphs=graphs, **mtp)  # fmt: skip
        replays = []
        g = prefill_graphs(llm)
        assert (g is not None) == (graphs and cache)  # the graphs come with the prefix cache
        if g is not None:
            run_one = g.run
            g.run = lambda batch: (replays.append((batch.num_tokens, g.layout_of(batch))), run_one(batch))[1]
        outs = [llm.generate([p], params)[0] for p in prompts]  # one at a time: single-request chunks
        snaps = held_snapshots(llm) if cache else None
        return [o.token_ids for o in outs], replays, sum(o.num_cached_tokens for o in outs), snaps

    ref, none, _, ref_snaps = run(False)
    got, replays, cached, snaps = run(True)
    assert got == ref and not none
    if cache:  # every chunk of <= 512 rows of a lone request (the 256-row cut ones too)
        assert len(replays) >= len(prompts) - 1
        assert cached > 0 and {(0, 1), (1, 1)} <= {layout for _, layout in replays}
        # the snapshots the replays wrote (their slots copied into the graphs' static plan) equal the eager ones up
        # to rounding: the graphed chunk's GEMMs run over the bucket's rows and fla's dots are TF32 (the H100 run:
        # <= 1.3e-3 in 2% of the conv elements, at the last GDN layer); a wrong slot or window would differ by O(1)
        assert snaps[0] == ref_snaps[0] and snaps[0]
        for ours, theirs in zip(snaps[1:], ref_snaps[1:]):
            torch.testing.assert_close(ours, theirs, rtol=1e-2, atol=5e-3)


def held_snapshots(llm):
    """The slots of the snapshots the tree holds and their conv / SSM contents."""
    nodes = llm.engine.prefix_cache.tree._nodes()
    held = sorted(n.snapshot.slot for n in nodes if n.snapshot is not None and not n.snapshot.on_host)
    pool = llm.engine.model.caches.snapshots
    return held, pool.conv[:, held].clone(), pool.ssm[:, held].clone()


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_replayed_chunk_equals_the_eager_forward(tiny_dense_mtp3_dir, tiny_moe_mtp3_dir, model):
    model_dir = tiny_dense_mtp3_dir if model == "dense" else tiny_moe_mtp3_dir
    llm = LLM(model_dir, device="cuda", dtype="float32", max_model_len=512, graph_max_batch_size=8,
              prefix_cache_state_share=0.5, mtp_mode="eagle_with_att", mtp_step=1)  # fmt: skip
    g = prefill_graphs(llm)
    runner = llm.engine.model_runner

    outs = []
    for use_graph in (True, False):
        req = Request(request_id=0, prompt_ids=SYSTEM[:77], params=SamplingParams(max_new_tokens=1))
        batch, _ = runner.build_batch([ScheduledRequest(req, 77)])
        batch = dataclasses.replace(batch, keep_all_hidden=True)
        assert g.can_run(batch)
        out = g.run(batch) if use_graph else runner.model.forward(batch)
        outs.append((out.logits.clone(), out.hidden.clone()))
        runner.release(req)
    (lg, hg), (le, he) = outs
    torch.testing.assert_close(lg, le, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hg, he, rtol=1e-4, atol=1e-4)
