"""tp / pp on ONE GPU (LIGHTLLM_MTP_DIST_BACKEND=gloo: every rank on cuda:0, collectives staged through host
memory): greedy tokens identical to one process with CUDA graphs, for plain decoding and eagle k=2, dense and MoE.
pp=2 captures CUDA graphs per stage (send / recv outside them); tp=2 runs eagerly there (gloo all-reduces cannot
be captured). fp32, so that tp's all-reduce order cannot flip a greedy token of the tiny checkpoints.
`pytest -m gpu unit_tests/parallel/test_gpu_one_gpu.py`; skipped without CUDA."""

import dataclasses

import pytest
import torch

from lightllm_mtp import env
from unit_tests.parallel.workload import DENSE, MOE, count_launch_ahead, engine, run

EAGLE = dict(mtp_mode="eagle_with_att", mtp_step=2)
CASES = [(DENSE, {}, 1, 2), (DENSE, EAGLE, 1, 2), (MOE, {}, 1, 2), (MOE, EAGLE, 1, 2),
         (DENSE, EAGLE, 2, 1), (MOE, {}, 2, 1), (MOE, EAGLE, 2, 2)]  # fmt: skip
IDS = [f"{'moe' if m == MOE else 'dense'}-{'eagle' if d else 'plain'}-tp{tp}-pp{pp}" for m, d, tp, pp in CASES]
CUDA = dict(device="cuda", dtype="float32")
_reference: dict = {}


def reference(model_dir, mtp):
    """One process, CUDA graphs on (the decode / verify layouts of max_batch_size 3: buckets 1, 2, 3)."""
    key = (model_dir, bool(mtp))
    if key not in _reference:
        eng = engine(model_dir, mtp, **CUDA)
        assert eng.model_runner.graphs
        _reference[key] = run(eng)
        del eng
        torch.cuda.empty_cache()
    return _reference[key]


def count_replays(eng) -> list[int]:
    """Replays of the driver's own graph sets, counted as the engine runs."""
    count = [0]
    for graphs in eng.model_runner.graphs:
        inner = graphs.run

        def counted(*args, _inner=inner, **kwargs):
            count[0] += 1
            return _inner(*args, **kwargs)

        graphs.run = counted
    return count


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model_dir,mtp,tp,pp", CASES, ids=IDS)
def test_one_gpu_gloo_greedy_tokens_identical_to_one_process(model_dir, mtp, tp, pp, monkeypatch):
    want = reference(model_dir, mtp)
    monkeypatch.setattr(env, "ENV", dataclasses.replace(env.ENV, dist_backend="gloo"))
    # a generous timeout: a follower's first steps may autotune Triton kernels while the driver waits in gloo
    eng = engine(model_dir, mtp, tp=tp, pp=pp, dist_timeout_s=300, **CUDA)
    try:
        assert eng.parallel_group.host_staged
        if tp > 1:
            assert not eng.model_runner.graphs, "tp over gloo runs eagerly"
        else:
            assert eng.model_runner.graphs, "CUDA graphs per pipeline stage"
        replays, ahead = count_replays(eng), count_launch_ahead(eng)
        got = run(eng)
        assert got == want
        assert ahead[0] > 0  # overlap scheduling stays on: steps queued before the previous one was read
        if tp == 1:
            assert replays[0] > 0  # stage 0's decode / verify steps replayed its graphs
    finally:
        eng.shutdown()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mtp,tp,pp", [(EAGLE, 1, 2), ({}, 2, 1)], ids=["eagle-tp1-pp2", "plain-tp2-pp1"])
def test_one_gpu_gloo_prefix_cache(mtp, tp, pp, monkeypatch):
    """The prefix cache on every rank (test_prefix_cache_parallel.py's chat): tokens as one process without the cache,
    hits as one process with it; pp=2 with CUDA graphs per stage."""
    from unit_tests.parallel.test_prefix_cache_parallel import CACHE, chat

    want, _ = chat(engine(DENSE, mtp, prefix_cache=False, **CUDA))
    ref, _ = chat(engine(DENSE, mtp, **CACHE, **CUDA))
    monkeypatch.setattr(env, "ENV", dataclasses.replace(env.ENV, dist_backend="gloo"))
    eng = engine(DENSE, mtp, tp=tp, pp=pp, dist_timeout_s=300, **CACHE, **CUDA)
    try:
        got, _ = chat(eng)
    finally:
        eng.shutdown()
    assert [t for t, _ in got] == [t for t, _ in want] and got == ref
    assert sum(c for _, c in got) > 0
