"""The prefill graphs' padding (common/basemodel/prefill_graph.py), run eagerly on CPU through the reference
kernels: a request's chunk of n rows padded to its bucket, with the conv windows of its snapshots remapped, gives
the tokens, snapshots and KV of the unpadded forward (the GPU test replays the captured graphs:
test/test_gpu_prefill_graph.py)."""

import pytest
import torch

from lightllm_mtp import SamplingParams
from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.common.basemodel.prefill_graph import PrefillGraphSet, bucket_sizes

from unit_tests.engine.test_prefix_cache import SYSTEM, build

# hits, branches, a chunk longer than a bucket's half, and chunks of 1-2 rows after a boundary (their end snapshot's
# conv window reaches into the request's conv history, which the padding moves)
PROMPTS = [SYSTEM + [5, 6, 7], SYSTEM + [8, 9], SYSTEM[:17] + [1, 2, 3, 4], SYSTEM + [5, 6, 7] + list(range(40, 60)),
           [9] * 3, SYSTEM[:17], SYSTEM[:16] + [1], SYSTEM[:16] + [1, 2]]  # fmt: skip
MODES = {"plain": {}, "eagle": dict(mtp_mode="eagle_with_att", mtp_step=2)}


def tree_snapshot_slots(llm) -> list[int]:
    nodes = llm.engine.prefix_cache.tree._nodes()
    return sorted(n.snapshot.slot for n in nodes if n.snapshot is not None and not n.snapshot.on_host)


def run_one_by_one(llm, n=6):
    params = SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)
    return [llm.generate([p], params)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize("model", ["dense", "moe"])
@pytest.mark.parametrize("mode", list(MODES))
def test_padded_prompt_chunks_match_the_unpadded_forward(tiny_dense_mtp3_dir, tiny_moe_mtp3_dir, mode, model):
    model_dir = tiny_dense_mtp3_dir if model == "dense" else tiny_moe_mtp3_dir
    expected_llm = build(model_dir, True, **MODES[mode])
    expected = run_one_by_one(expected_llm)
    llm = build(model_dir, True, **MODES[mode])
    runner = llm.engine.model_runner
    graphs = PrefillGraphSet(runner.model.forward, runner.model.caches, keep_all_hidden=bool(MODES[mode]), pool=None,
                             sizes=(16, 32), capture=False)  # fmt: skip
    layouts = []
    run = graphs.run
    graphs.run = lambda batch: (layouts.append((batch.num_tokens, graphs.layout_of(batch))), run(batch))[1]
    runner.graphed.graph_sets.append(graphs)
    assert run_one_by_one(llm) == expected
    # every prompt chunk (<= 16 rows: chunked_prefill_size) went through the padding, with its snapshots
    assert len(layouts) >= len(PROMPTS) and all(n <= 16 for n, _ in layouts)
    assert {layout for _, layout in layouts} >= {(0, 1), (1, 1)}
    ours, theirs = llm.engine.model.caches.snapshots, expected_llm.engine.model.caches.snapshots
    # the snapshots the tree holds (the static batches' start-up runs wrote free slots), equal up to GEMM rounding (a
    # projection over the bucket's rows rounds differently, as over another chunking)
    held = tree_snapshot_slots(llm)
    assert held and held == tree_snapshot_slots(expected_llm)
    torch.testing.assert_close(ours.conv[:, held], theirs.conv[:, held], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours.ssm[:, held], theirs.ssm[:, held], rtol=1e-4, atol=1e-4)
    kv, kv_expected = llm.engine.model.caches.kv_pool, expected_llm.engine.model.caches.kv_pool
    live = slice(0, kv.hold_slot)  # the padding rows write the reserved slot only
    for layer in range(2):
        for ours, theirs in zip(kv.layer(layer), kv_expected.layer(layer)):
            torch.testing.assert_close(ours[live], theirs[live], rtol=1e-4, atol=1e-4)


def test_without_the_prefix_cache_there_are_no_prefill_graphs(tiny_dense_mtp3_dir):
    runner = build(tiny_dense_mtp3_dir, False).engine.model_runner
    with pytest.raises(ValueError, match="snapshot pool"):
        PrefillGraphSet(runner.model.forward, runner.model.caches, keep_all_hidden=False, pool=None, capture=False)


def test_layouts_outside_the_graphs_run_eagerly(tiny_dense_mtp3_dir):
    llm = build(tiny_dense_mtp3_dir, True)
    runner = llm.engine.model_runner
    graphs = PrefillGraphSet(runner.model.forward, runner.model.caches, keep_all_hidden=False, pool=None,
                             sizes=(16,), capture=False)  # fmt: skip

    def fake(n, b=1, mode=ForwardMode.EXTEND, logits=1):
        z = torch.zeros
        return ForwardBatch(mode=mode, input_ids=z(n, dtype=torch.int64), positions=z(n, dtype=torch.int64),
                            mem_index=z(n, dtype=torch.int32), b_req_idx=z(b, dtype=torch.int32),
                            b_seq_len=z(b, dtype=torch.int32), b1_cu_q_len=z(b + 1, dtype=torch.int32),
                            b_has_initial_state=z(b, dtype=torch.bool), b_logits_index=z(logits, dtype=torch.int64),
                            max_q_len=n, host_q_lens=(n,) * b)  # fmt: skip

    assert graphs.can_run(fake(16)) and graphs.can_run(fake(1, logits=0))
    assert not graphs.can_run(fake(17))  # above the largest bucket
    assert not graphs.can_run(fake(4, b=2))  # two requests
    assert not graphs.can_run(fake(1, mode=ForwardMode.DECODE))


def test_buckets_fit_the_page_table_and_stop_at_the_longest_chunk(tiny_dense_mtp3_dir):
    assert bucket_sizes(max_chunk_rows=8192, max_model_len=65536) == (128, 256, 512)
    assert bucket_sizes(max_chunk_rows=200, max_model_len=65536) == (128, 256)
    assert bucket_sizes(max_chunk_rows=32, max_model_len=65536) == (128,)
    assert bucket_sizes(max_chunk_rows=4096, max_model_len=300) == (128, 256)
    assert bucket_sizes(max_chunk_rows=4096, max_model_len=100) == ()
    runner = build(tiny_dense_mtp3_dir, True).engine.model_runner
    width = runner.req_manager.req_to_token.shape[1]
    with pytest.raises(ValueError, match="page table"):  # a warm-up over a longer bucket would read past its row
        PrefillGraphSet(runner.model.forward, runner.model.caches, keep_all_hidden=False, pool=None,
                        sizes=(16, width + 1), capture=False)  # fmt: skip
