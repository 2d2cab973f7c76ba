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
