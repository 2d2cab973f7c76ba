"""tp=2 on CPU (gloo, spawned processes) with block-FP8 checkpoints: greedy tokens identical to one process.

Each rank reads its slices of the FP8 tensors and cuts the scales to them; the tiny fixtures' 64-row KV / GDN key
shards and 32-row expert shards sit inside 128-row scale blocks and are regrouped onto 64- / 32-row sub-blocks that
carry their checkpoint block's scale (common/quantization/fp8_blocks.py), so every rank multiplies by exactly the
weights one process does; the only difference is tp's summation order (test_tp_pp_greedy.py: ~1e-6 relative)."""

import pytest

from unit_tests.parallel.workload import engine, run

EAGLE = dict(mtp_mode="eagle_with_att", mtp_step=2)


@pytest.mark.parametrize("which,mtp", [("dense", EAGLE), ("moe", {})], ids=["dense-eagle", "moe-plain"])
def test_fp8_tp2_tokens_identical_to_one_process(which, mtp, fp8_dense_dir, fp8_moe_dir):
    model_dir = {"dense": fp8_dense_dir, "moe": fp8_moe_dir}[which]
    want = run(engine(model_dir, mtp))
    eng = engine(model_dir, mtp, tp=2)
    try:
        got = run(eng)
    finally:
        eng.shutdown()
    assert got == want
    assert {"abort", "length", "stop"} <= {reason for _, reason in want}
