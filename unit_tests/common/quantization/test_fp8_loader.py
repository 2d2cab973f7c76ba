"""The loader's block-FP8 rules (common/quantization/fp8_loading.py): a tensor is FP8 exactly when it has a
`_scale_inv` sidecar; every FP8 tensor consumes its one scale and every scale is consumed, or the load fails naming
the tensor; bf16 and fp32 scales load alike; mis-shaped scales are refused; tp shards too small for the kernels fail
at start-up with one message."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from lightllm_mtp import LLM
from lightllm_mtp.common.tensor_spec import TensorSpec, TpShard
from lightllm_mtp.common.weight_loader import WeightLoadError, load_tensors
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.quant_config import QuantConfig
from lightllm_mtp.kernels.quant.fp8_block import MIN_BLOCK, Fp8BlockWeight, quantize_fp8_block
from lightllm_mtp.models.registry import model_class

FP8 = QuantConfig()
PROJ = TensorSpec("p.weight", (256, 384), tp=TpShard(0), quantizable=True)
NORM = TensorSpec("n.weight", (384,))


def _write(tmp_path, tensors):
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def _fp8(rows=256, cols=384, scale_dtype=torch.float32, seed=0):
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05
    q = quantize_fp8_block(w, (128, 128), scale_dtype)
    return q.qweight, q.scale.to(scale_dtype)


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
def test_bf16_and_fp32_scales_load(tmp_path, scale_dtype):
    q, s = _fp8(scale_dtype=scale_dtype)
    path = _write(tmp_path, {"p.weight": q, "p.weight_scale_inv": s, "n.weight": torch.ones(384)})
    out = load_tensors(path, [PROJ, NORM], torch.bfloat16, "cpu", quant=FP8)
    w = out["p.weight"]
    assert isinstance(w, Fp8BlockWeight) and w.scale.dtype == torch.float32 and torch.equal(w.scale, s.float())
    assert torch.equal(w.qweight.view(torch.uint8), q.view(torch.uint8))
    assert out["n.weight"].dtype == torch.bfloat16


def test_fp8_weight_without_its_scale_is_named(tmp_path):
    q, _ = _fp8()
    path = _write(tmp_path, {"p.weight": q, "n.weight": torch.ones(384)})
    with pytest.raises(WeightLoadError, match=r"p\.weight: stored as float8_e4m3fn but the checkpoint has no scale "
                                              r"p\.weight_scale_inv"):  # fmt: skip
        load_tensors(path, [PROJ, NORM], torch.float32, "cpu", quant=FP8)


def test_unconsumed_scales_are_named(tmp_path):
    q, s = _fp8()
    # a scale on a tensor the engine reads unquantized, and a scale whose weight is not there
    path = _write(tmp_path, {"p.weight": q, "p.weight_scale_inv": s, "n.weight": torch.ones(384),
                             "n.weight_scale_inv": torch.ones(1, 3), "gone.weight_scale_inv": torch.ones(2, 3)})
    with pytest.raises(WeightLoadError) as e:
        load_tensors(path, [PROJ, NORM], torch.float32, "cpu", quant=FP8)
    message = str(e.value)
    assert "gone.weight_scale_inv: a scale whose weight gone.weight is not in the checkpoint" in message
    assert "n.weight: has the scale n.weight_scale_inv, but this engine reads n.weight unquantized" in message


def test_misshaped_scale_is_refused(tmp_path):
    q, s = _fp8()
    path = _write(tmp_path, {"p.weight": q, "p.weight_scale_inv": s[:, :2].contiguous(), "n.weight": torch.ones(384)})
    with pytest.raises(WeightLoadError, match=r"p\.weight_scale_inv: expected shape \(2, 3\) .* found \(2, 2\)"):
        load_tensors(path, [PROJ, NORM], torch.float32, "cpu", quant=FP8)


def test_scale_on_a_16_bit_weight_and_scales_without_a_config(tmp_path):
    _, s = _fp8()
    path = _write(tmp_path, {"p.weight": torch.randn(256, 384), "p.weight_scale_inv": s})
    with pytest.raises(WeightLoadError, match=r"p\.weight: has the scale p\.weight_scale_inv but is stored as float32"):
        load_tensors(path, [PROJ], torch.float32, "cpu", quant=FP8)
    with pytest.raises(WeightLoadError, match="no quantization_config"):
        load_tensors(path, [PROJ], torch.float32, "cpu", quant=None)


def test_per_expert_parts_partly_fp8_are_refused(tmp_path):
    spec = TensorSpec("e.gate_up", (2, 256, 384), quantizable=True,
                      stacked_from=(("e.0.g", "e.0.u"), ("e.1.g", "e.1.u")))  # fmt: skip
    q, s = _fp8(128, 384)
    parts = {n: t.clone() for n, t in (("e.0.g", q), ("e.0.g_scale_inv", s), ("e.0.u", q), ("e.0.u_scale_inv", s),
                                       ("e.1.g", q), ("e.1.g_scale_inv", s), ("e.1.u", torch.randn(128, 384)))}
    with pytest.raises(WeightLoadError, match=r"e\.gate_up: its parts are FP8 .* except e\.1\.u"):
        load_tensors(_write(tmp_path, parts), [spec], torch.float32, "cpu", quant=FP8)


def test_tp_shards_cut_weights_and_scales_alike(tmp_path):
    q, s = _fp8()
    path = _write(tmp_path, {"p.weight": q, "p.weight_scale_inv": s})
    full = load_tensors(path, [PROJ], torch.float32, "cpu", quant=FP8)["p.weight"].dequantize()
    for size in (2, 4):  # 128- and 64-row shards
        for rank in range(size):
            local = load_tensors(path, [PROJ], torch.float32, "cpu", rank, size, quant=FP8)["p.weight"]
            rows = 256 // size
            torch.testing.assert_close(local.dequantize(), full[rank * rows : (rank + 1) * rows], rtol=0, atol=0)


def test_a_shard_too_small_for_the_kernels_fails_at_start_up_with_one_message(fp8_moe_dir):
    """tp=8 would give each rank 8 of an expert's 64 gate rows, inside one 128-row scale block."""
    cfg = ModelConfig.from_model_dir(fp8_moe_dir)
    specs = [s for s in model_class(cfg).weight_specs(cfg) if s.name.endswith("layers.0.mlp.experts.gate_up_proj")]
    with pytest.raises(WeightLoadError) as e:
        load_tensors(fp8_moe_dir, specs, torch.float32, "cpu", tp_rank=0, tp_size=8, quant=cfg.quantization)
    assert str(e.value).count(f"sub-blocks of 8 < {MIN_BLOCK}") >= 1 and "smaller tensor-parallel size" in str(e.value)


def test_dropped_mtp_scale_fails_the_mtp_load_by_name(fp8_dense_dir, tmp_path):
    """A peer bug: a loader that skips mtp.* scales serves an MTP head whose weights are off by their scales."""
    broken = tmp_path / "broken"
    shutil.copytree(fp8_dense_dir, broken)
    index_path = broken / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = "mtp.layers.0.self_attn.q_proj.weight_scale_inv"
    shard = broken / index["weight_map"].pop(name)
    tensors = load_file(str(shard))
    del tensors[name]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))
    LLM(str(broken), max_model_len=32)  # the main model does not read mtp.*
    with pytest.raises(WeightLoadError, match=r"mtp\.layers\.0\.self_attn\.q_proj\.weight: stored as "
                                              "float8_e4m3fn but the checkpoint has no scale"):  # fmt: skip
        LLM(str(broken), max_model_len=32, mtp_mode="eagle_with_att", mtp_step=1)
