"""GPU engine vs the CPU reference path on the tiny checkpoints (skipped without CUDA).

How outputs are compared: in fp32 the GPU path (Triton attention / MoE GEMV, fla GDN prefill, CUDA graphs)
must give the CPU reference's greedy tokens exactly. In bf16 the random tiny models diverge from the fp32
reference after a few tokens (measured on an H200: 20 of 72 tokens before the first divergence, 7/8/5 per
prompt), so bf16 must agree on each prompt's first token, and CUDA graphs on/off must be token-identical."""

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams

pytestmark = pytest.mark.gpu
PROMPTS = [[5, 17, 300, 42, 9, 77, 1024, 3, 58, 600, 11], [900, 4, 4, 250], [31, 8, 222, 1500, 64, 2, 7]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)


def tokens(llm):
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(params=["dense", "moe"])
def model_dir(request, tiny_dense_dir, tiny_moe_dir):
    return {"dense": tiny_dense_dir, "moe": tiny_moe_dir}[request.param]


def test_fp32_gpu_equals_cpu_reference(model_dir):
    cpu = tokens(LLM(model_dir, device="cpu", dtype="float32", max_model_len=64))
    gpu = tokens(LLM(model_dir, device="cuda", dtype="float32", max_model_len=64, graph_max_batch_size=8))
    assert gpu == cpu


def test_bf16_graphs_match_eager_and_track_cpu(model_dir):
    eager = tokens(LLM(model_dir, device="cuda", dtype="bfloat16", max_model_len=64, graph_max_batch_size=0))
    graphs = tokens(LLM(model_dir, device="cuda", dtype="bfloat16", max_model_len=64, graph_max_batch_size=8))
    assert graphs == eager
    cpu = tokens(LLM(model_dir, device="cpu", dtype="float32", max_model_len=64))
    assert [x[0] for x in graphs] == [x[0] for x in cpu]


SPECS = {
    "eagle": dict(mtp_mode="eagle_with_att"),
    "vanilla": dict(mtp_mode="vanilla_with_att"),
    "ptd": dict(mtp_mode="eagle_with_att", parallel_drafting=True),
}


@pytest.mark.parametrize("mode", list(SPECS))
def test_mtp_on_gpu_equals_plain(tiny_dense_mtp3_dir, mode):
    plain = tokens(LLM(tiny_dense_mtp3_dir, device="cuda", dtype="float32", max_model_len=64))
    spec = tokens(LLM(tiny_dense_mtp3_dir, device="cuda", dtype="float32", max_model_len=64, mtp_step=2, **SPECS[mode]))
    assert spec == plain


def test_cuda_graph_padding_rows_leave_live_state_alone(tiny_dense_dir):
    llm = LLM(tiny_dense_dir, device="cuda", dtype="float32", max_model_len=64, graph_max_batch_size=8)
    assert llm.engine.model_runner.graphs
    odd = [o.token_ids for o in llm.generate(PROMPTS[:3], GREEDY)]  # 3 rows replay the 4-row graph
    single = [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS[:3]]
    assert odd == single
    torch.cuda.synchronize()


@pytest.mark.parametrize(("mode", "step"), [("eagle", 1), ("eagle", 3), ("vanilla", 2), ("vanilla", 3), ("ptd", 3),
                                            ("ptd", 7)])
@pytest.mark.parametrize("corrupt_every", [1000, 3])
def test_mtp_verify_graphs_stay_exact_at_high_acceptance(monkeypatch, tiny_dense_mtp3_dir, mode, step, corrupt_every):
    """Verify / draft-pass / eagle-chain CUDA graphs (3 requests replay the 4-request bucket) with oracle drafts:
    long accepted blocks, partial blocks and rejections must give the plain greedy tokens and free every slot."""
    from unit_tests.spec_decode.oracle_drafts import oracle_drafts

    plain = tokens(LLM(tiny_dense_mtp3_dir, device="cuda", dtype="float32", max_model_len=64, graph_max_batch_size=0))
    oracle_drafts(monkeypatch, plain, corrupt_every)
    llm = LLM(tiny_dense_mtp3_dir, device="cuda", dtype="float32", max_model_len=64, graph_max_batch_size=8,
              mtp_step=step, **SPECS[mode])  # fmt: skip
    assert llm.engine.model_runner.graphs and all(m.graph_sets for m in llm.engine.runner.proposer.modules)
    caches = llm.engine.model.caches
    free_kv, free_req = caches.kv_pool.num_free, caches.req_manager.num_free
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.spec.accepted_drafts_per_step * o.spec.verify_steps for o in outs) > 0
    llm.engine.evict_prefix_cache()
    assert caches.kv_pool.num_free == free_kv and caches.req_manager.num_free == free_req


@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "mtp"])
def test_overlap_scheduling_matches_the_synchronous_loop(tiny_dense_mtp3_dir, mtp):
    """bf16 with CUDA graphs: queuing the next step before reading the current one changes no token (greedy, a stop
    token, a seeded sampling request) and leaves every slot free."""
    params = [GREEDY, SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=[7, 11, 64]),
              SamplingParams(temperature=0.9, top_p=0.9, max_new_tokens=24, seed=3, ignore_eos=True)]  # fmt: skip

    def run(disable_overlap):
        llm = LLM(tiny_dense_mtp3_dir, device="cuda", dtype="bfloat16", max_model_len=64, graph_max_batch_size=8,
                  disable_overlap=disable_overlap, **mtp)  # fmt: skip
        caches = llm.engine.model.caches
        free = (caches.kv_pool.num_free, caches.req_manager.num_free)
        outs = [o.token_ids for o in llm.generate(PROMPTS, params)]
        llm.engine.evict_prefix_cache()
        assert (caches.kv_pool.num_free, caches.req_manager.num_free) == free
        return outs

    assert run(disable_overlap=False) == run(disable_overlap=True)


@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2), dict(mtp_mode="vanilla_with_att",
                                 mtp_step=3), dict(mtp_mode="eagle_with_att", mtp_step=3, parallel_drafting=True)],
                         ids=["plain", "eagle", "vanilla", "ptd"])  # fmt: skip
def test_queuing_a_step_never_waits_for_the_device(tiny_dense_mtp3_dir, mtp):
    """Overlap only pays if `launch` queues a decode / verify step without a device sync (a blocking
    copy, .item(), .tolist() of a device tensor): CUDA's sync debug mode reports every such call made while they
    run. Verify steps beside small prompt chunks and a request that runs into max_model_len (padded blocks)
    included. Steps that carry prompt chunks are counted apart: the prefill kernels still read sequence lengths on
    the host (the reference depthwise conv, fla's chunk indices), which the prefill-speed work removes."""
    import warnings

    llm = LLM(tiny_dense_mtp3_dir, device="cuda", dtype="bfloat16", max_model_len=40, graph_max_batch_size=8,
              chunked_prefill_size=8, **mtp)  # fmt: skip
    runner = llm.engine.runner
    launched, syncs, prompt_step_syncs = [0], [], []

    def checked(inner):
        def run(*args, **kwargs):
            chunks = any(s.request.in_prefill for s in args[0])
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    step = inner(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            found = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
            (prompt_step_syncs if chunks else syncs).extend(found)
            launched[0] += step is not None and not chunks
            return step

        return run

    runner.launch = checked(runner.launch)
    outs = llm.generate([*PROMPTS, [3] * 30], GREEDY)
    assert len(outs[-1].token_ids) == 10  # ran into max_model_len
    assert launched[0] > 0
    assert not syncs, syncs[:3]
    print(f"synchronizing calls while queuing steps with prompt chunks: {len(prompt_step_syncs)}")


@pytest.mark.parametrize("mode", list(SPECS))
def test_adaptive_speculation_on_graphs_stays_exact(monkeypatch, tiny_dense_mtp3_dir, mode):
    """--mtp_adaptive on the GPU: a verify graph per block size, a step-cost table measured from the graphs, and a
    forced schedule of k switching between 0 and 3 every launch: plain greedy tokens, every slot freed."""
    import itertools

    from lightllm_mtp.spec_decode.adaptive import SpecLengthController

    plain = tokens(LLM(tiny_dense_mtp3_dir, device="cuda", dtype="float32", max_model_len=64, graph_max_batch_size=0))
    llm = LLM(tiny_dense_mtp3_dir, device="cuda", dtype="float32", max_model_len=64, graph_max_batch_size=8,
              mtp_step=3, mtp_adaptive=True, prefix_cache=False, **SPECS[mode])  # fmt: skip
    costs = llm.engine.runner.controller.costs
    assert sorted(g.q for g in llm.engine.model_runner.graphs) == [1, 2, 3, 4]
    assert costs.batch_sizes == (1, 2, 4, 8) and all(c > 0 for row in costs.cost_ms for c in row)
    ks = itertools.cycle([0, 3, 1, 2, 0, 0, 3])
    monkeypatch.setattr(SpecLengthController, "choose", lambda self, reqs: next(ks))
    caches = llm.engine.model.caches
    free_kv = caches.kv_pool.num_free
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain
    assert outs[0].spec.steps_at_k[0] > 0
    assert caches.kv_pool.num_free == free_kv


def test_pdl_on_and_off_give_the_same_tokens(monkeypatch, model_dir):
    """Programmatic dependent launch changes when kernels start, never what they compute: bf16 prefill and graphed
    decode of the dense and MoE checkpoints, token-identical with it on and off. A kernel touching memory before its
    wait would race with its predecessor and could break this."""
    import dataclasses

    from lightllm_mtp import env

    runs = []
    for pdl in (False, True):
        monkeypatch.setattr(env, "ENV", dataclasses.replace(env.ENV, pdl=pdl))
        llm = LLM(model_dir, device="cuda", dtype="bfloat16", max_model_len=64, graph_max_batch_size=8)
        runs.append(tokens(llm))
        llm.shutdown()
    assert runs[0] == runs[1]
