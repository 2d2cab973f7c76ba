"""The same checks on GPUs (NCCL, CUDA graphs per rank under tp and per stage under pp): run on a machine with 2+ GPUs
(`pytest -m gpu unit_tests/parallel`; skipped elsewhere). fp32 so that the all-reduce order cannot flip a greedy
token of the tiny checkpoints (bf16 rounding could)."""

import pytest
import torch

from unit_tests.parallel.workload import DENSE, MOE, engine, run

EAGLE = dict(mtp_mode="eagle_with_att", mtp_step=2)
needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@pytest.mark.gpu
@needs_two
@pytest.mark.parametrize("model_dir,mtp,tp,pp", [(DENSE, {}, 2, 1), (DENSE, EAGLE, 2, 1), (MOE, EAGLE, 2, 1),
                                                 (DENSE, EAGLE, 1, 2)], ids=["dense-tp2", "dense-eagle-tp2",
                                                                             "moe-eagle-tp2", "dense-eagle-pp2"])
def test_gpu_greedy_tokens_identical_to_one_gpu(model_dir, mtp, tp, pp):
    kw = dict(device="cuda", dtype="float32")
    want = run(engine(model_dir, mtp, **kw))
    torch.cuda.empty_cache()
    eng = engine(model_dir, mtp, tp=tp, pp=pp, **kw)
    try:
        assert eng.model_runner.graphs, "CUDA graphs per rank (tp: all-reduces captured; pp: per stage)"
        assert run(eng) == want
    finally:
        eng.shutdown()


@pytest.mark.gpu
@needs_two
@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["eagle-tp2", "eagle-pp2"])
def test_gpu_prefix_cache(tp, pp):
    """The prefix cache on every rank over NCCL with CUDA graphs (test_prefix_cache_parallel.py's chat): tokens as one
    GPU without the cache, hits as one GPU with it."""
    from unit_tests.parallel.test_prefix_cache_parallel import CACHE, chat

    kw = dict(device="cuda", dtype="float32")
    want, _ = chat(engine(DENSE, EAGLE, prefix_cache=False, **kw))
    ref, _ = chat(engine(DENSE, EAGLE, **CACHE, **kw))
    torch.cuda.empty_cache()
    eng = engine(DENSE, EAGLE, tp=tp, pp=pp, **CACHE, **kw)
    try:
        got, _ = chat(eng)
    finally:
        eng.shutdown()
    assert [t for t, _ in got] == [t for t, _ in want] and got == ref
    assert sum(c for _, c in got) > 0
