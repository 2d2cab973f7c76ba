"""mem_fraction's plan (engine/memory_budget.py): the weights a rank loads, the request slots' state and the reserve
come off the GPU's share; checked at published shapes with a pretend GPU (the sizes are pure arithmetic)."""

import pytest

from benchmark.model_shapes import MODEL_SHAPES
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.engine.cache_budget import snapshot_bytes
from lightllm_mtp.engine.memory_budget import memory_plan, weight_bytes

GIB = 2**30
H200 = 141 * 10**9


def _cfg(name):
    return ModelConfig.from_hf(MODEL_SHAPES[name])


@pytest.mark.parametrize("name, low, high", [("qwen3.5-27b", 48, 58), ("qwen3.5-35b-a3b", 62, 74)])
def test_weights_are_the_models_bf16_bytes(name, low, high):
    """27B / 35B parameters in bf16: the plan counts each tensor once, at the model's dtype."""
    args = EngineArgs(model_dir="-", dtype="bf16")
    assert low * 10**9 < weight_bytes(args, _cfg(name)) < high * 10**9


def test_tp_and_pp_divide_the_weights():
    cfg = _cfg("qwen3.5-27b")
    one = weight_bytes(EngineArgs(model_dir="-", dtype="bf16"), cfg)
    two = weight_bytes(EngineArgs(model_dir="-", dtype="bf16", tp=2), cfg)
    assert 0.49 < two / one < 0.56  # norms and the replicated key heads stay whole


def test_the_plan_leaves_less_cache_at_a_lower_fraction_and_counts_mtp():
    cfg = _cfg("qwen3.5-27b")
    args = EngineArgs(model_dir="-", dtype="bf16", max_batch_size=32)
    mtp = EngineArgs(model_dir="-", dtype="bf16", max_batch_size=32, mtp_mode="eagle_with_att", mtp_step=3)
    snap = snapshot_bytes(cfg, 2)
    plan = memory_plan(args, cfg, snap, 0.9, total=H200, free=H200)
    assert 55 * GIB < plan.cache_bytes < 75 * GIB  # 127 GB usable - 54 GB weights - 5 GB state - reserve
    assert memory_plan(args, cfg, snap, 0.5, total=H200, free=H200).cache_bytes < plan.cache_bytes - 50 * GIB
    with_mtp = memory_plan(mtp, cfg, snap, 0.9, total=H200, free=H200)
    assert with_mtp.weights > plan.weights and with_mtp.request_state > plan.request_state
    busy = memory_plan(args, cfg, snap, 0.9, total=H200, free=H200 - 10 * GIB)  # another process holds 10 GiB
    assert busy.cache_bytes == plan.cache_bytes - 10 * GIB


def test_moe_plan_and_one_long_request():
    """The MoE shape's reserve (its feed-forward: top-k experts per row), and a 1M-token request on one H200
    (docs/long_context.md): 35B-A3B at 0.9 holds its KV (20 KiB/token) twice over; 27B bf16 (53.8 GB of weights) at 0.9
    holds a plain request's 1M x 64 KiB but not MTP's 1M x 68 KiB (its draft layer), which 0.95 holds."""
    moe = _cfg("qwen3.5-35b-a3b")
    args = EngineArgs(model_dir="-", dtype="bf16", max_batch_size=1, chunked_prefill_size=4096)
    plan = memory_plan(args, moe, snapshot_bytes(moe, 2), 0.9, total=H200, free=H200)
    assert 2 * GIB < plan.reserve < 4 * GIB and plan.cache_bytes > 2 * 1048576 * 22528
    dense = _cfg("qwen3.5-27b")

    def cache(fraction):
        return memory_plan(args, dense, snapshot_bytes(dense, 2), fraction, total=H200, free=H200).cache_bytes

    assert 1048576 * 65536 < cache(0.9) < 1048576 * 69632 < cache(0.95)


def test_the_vision_tower_counts_when_images_are_served(tmp_path):
    """The tower loads beside the language model (replicated, never quantized): its bytes come off the cache too,
    and only when this engine serves images (otherwise it is not loaded)."""
    from benchmark.image_ttft import image_checkpoint
    from lightllm_mtp.common.quantization.methods import spec_bytes
    from lightllm_mtp.models.qwen3_5_vision.tower import VisionTower

    model_dir = str(image_checkpoint("qwen3.5-27b", tmp_path))
    served = EngineArgs(model_dir=model_dir, dtype="bf16")
    text_only = EngineArgs(model_dir=model_dir, dtype="bf16", language_model_only=True)
    tower = sum(spec_bytes(s, served.dtype, None) for s in VisionTower.specs(served.model_config().vision))
    assert 0.8e9 < tower < 1.0e9  # ~0.46B parameters in bf16
    assert weight_bytes(served, served.model_config()) == weight_bytes(text_only, text_only.model_config()) + tower
