"""What the seam tells the rest of the engine about block-FP8 weights before they exist: random (dummy) weights in
the published layout, the memory budget's weight bytes, and the benchmark floor's, at the published shapes."""

import dataclasses

import pytest
import torch

from benchmark.floor import step_bytes
from benchmark.model_shapes import MODEL_SHAPES
from lightllm_mtp.common.quantization.methods import Fp8Block, spec_bytes, spec_method
from lightllm_mtp.common.random_weights import random_tensors
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.quant_config import QuantConfig
from lightllm_mtp.engine.memory_budget import weight_bytes
from lightllm_mtp.kernels.quant.fp8_block import Fp8BlockWeight
from lightllm_mtp.models.registry import model_class

FP8 = QuantConfig()


def _cfg(name, quantized=False):
    hf = dict(MODEL_SHAPES[name])
    if quantized:
        hf["quantization_config"] = FP8.to_hf()
    return ModelConfig.from_hf(hf)


def test_published_fp8_modules_are_the_quantizable_specs():
    cfg = _cfg("qwen3.5-35b-a3b")
    quantizable = {s.name.split("layers.")[-1].split(".", 1)[-1] for s in model_class(cfg).weight_specs(cfg)
                   if s.quantizable}  # fmt: skip
    assert quantizable == {
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight", "linear_attn.out_proj.weight",
        "mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.shared_expert.gate_proj.weight",
        "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight",
    }  # router, shared_expert_gate, in_proj_a / b, norms, conv, embeddings, lm_head: 16-bit


@pytest.mark.parametrize("name, bf16_gb, fp8_gb", [("qwen3.5-27b", (48, 58), (26, 31)),
                                                   ("qwen3.5-122b-a10b", (225, 250), (115, 130))])
def test_weight_bytes_halve_under_fp8(name, bf16_gb, fp8_gb):
    """27B-FP8 is ~27 GB (the issue's count) and 122B-A10B-FP8 ~125 GB: one H200 holds it."""
    plain = weight_bytes(EngineArgs(model_dir="-", dtype="bf16"), _cfg(name))
    checkpoint = weight_bytes(EngineArgs(model_dir="-", dtype="bf16"), _cfg(name, quantized=True))
    online = weight_bytes(EngineArgs(model_dir="-", dtype="bf16", quantization="fp8"), _cfg(name))
    assert bf16_gb[0] * 1e9 < plain < bf16_gb[1] * 1e9
    assert fp8_gb[0] * 1e9 < checkpoint < fp8_gb[1] * 1e9 and online == checkpoint


def test_fp8_bytes_count_the_scales():
    cfg = _cfg("qwen3.5-27b", quantized=True)
    spec = next(s for s in model_class(cfg).weight_specs(cfg) if s.name.endswith("mlp.down_proj.weight"))
    assert spec_method(spec, cfg.quantization).name == "fp8"
    assert spec_bytes(spec, torch.bfloat16, cfg.quantization) == 5120 * 17408 + 4 * 40 * 136
    assert spec_bytes(spec, torch.bfloat16, cfg.quantization, tp=2) == 5120 * 8704 + 4 * 40 * 68
    assert spec_bytes(spec, torch.bfloat16, None) == 5120 * 17408 * 2


def test_floor_reads_the_stored_bytes_and_the_kv_dtype():
    cfg = _cfg("qwen3.5-27b", quantized=True)
    specs = model_class(cfg).weight_specs(cfg)
    fp8 = step_bytes(cfg, specs, torch.bfloat16, 1, 1000)
    bf16 = step_bytes(dataclasses.replace(cfg, quantization=None), specs, torch.bfloat16, 1, 1000)
    lm_head = 2 * 248320 * 5120
    assert 26e9 < fp8.weights < 30e9 and fp8.weights - lm_head < 0.52 * (bf16.weights - lm_head)
    fp8_kv = step_bytes(cfg, specs, torch.bfloat16, 1, 1000, kv_dtype=torch.float8_e4m3fn)
    assert fp8_kv.kv_cache * 2 == fp8.kv_cache and fp8_kv.weights == fp8.weights


def test_dummy_weights_are_fp8_where_the_published_layout_is():
    cfg = ModelConfig.from_hf({**MODEL_SHAPES["qwen3.5-35b-a3b"], "num_hidden_layers": 1, "vocab_size": 64,
                               "num_experts": 4, "num_experts_per_tok": 2,
                               "layer_types": ["linear_attention"]})  # fmt: skip
    specs = model_class(cfg).weight_specs(cfg)
    out = random_tensors(specs, torch.bfloat16, "cpu", quant=FP8)
    for spec in specs:
        w = out[spec.name]
        assert isinstance(w, Fp8BlockWeight) == spec.quantizable, spec.name
        assert tuple(w.shape) == spec.shape
        if spec.quantizable:
            assert w.block == (128, 128) and w.dequantize().std() > 0.01
    assert isinstance(spec_method(specs[0], FP8), Fp8Block) == specs[0].quantizable
