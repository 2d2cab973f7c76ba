"""tools/quantize_fp8.py writes the published -FP8 layout, checked against transformers' own FineGrainedFP8 code
(its quantizer, `Fp8Quantize`, and its dequantizer, `Fp8Dequantize`, the load path of -FP8 checkpoints)."""

import json
import re
import types

import pytest
import torch
from safetensors import safe_open

from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.tools.quantize_fp8 import main, quantize_checkpoint

# what the published -FP8 checkpoints keep in 16-bit (issue 31, the peers' header audits)
KEPT = re.compile(r"(embed_tokens|lm_head|norm|conv1d|A_log|dt_bias|in_proj_a|in_proj_b|mlp\.gate\.weight|"
                  r"shared_expert_gate|mtp\.fc|visual)")  # fmt: skip


def _tensors(model_dir):
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for name, shard in index.items():
        with safe_open(str(model_dir / shard), "pt") as f:
            out[name] = (shard, f.get_slice(name).get_dtype(), tuple(f.get_slice(name).get_shape()))
    return out


@pytest.mark.parametrize("which", ["dense", "moe", "mtp3_ptd"])
def test_layout_is_the_published_one(which, fp8_dense_dir, fp8_moe_dir, fp8_mtp3_ptd_dir):
    model_dir = {"dense": fp8_dense_dir, "moe": fp8_moe_dir, "mtp3_ptd": fp8_mtp3_ptd_dir}[which]
    tensors = _tensors(model_dir)
    scale_dtype = "F32" if which == "mtp3_ptd" else "BF16"
    fp8 = {n for n, (_, dtype, _) in tensors.items() if dtype == "F8_E4M3"}
    assert fp8 and all(not KEPT.search(n) for n in fp8)
    for name, (shard, dtype, shape) in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        scale = tensors.get(name + "_scale_inv")
        if name in fp8:  # exactly one sidecar, same shard, [ceil(out/128), ceil(in/128)]
            assert scale is not None and scale[0] == shard and scale[1] == scale_dtype, name
            assert scale[2] == (*shape[:-2], -(-shape[-2] // 128), -(-shape[-1] // 128)), name
        else:
            assert scale is None and (KEPT.search(name) or len(shape) < 2), name
    assert any(n.startswith("mtp.layers.") for n in fp8)  # the MTP modules are FP8 too
    if which == "mtp3_ptd":
        assert {"mtp.layers.2.mlp.down_proj.weight", "mtp.layers.1.self_attn.q_proj.weight"} <= fp8
        assert tensors["mtp.mask_embedding"][1] == "BF16"
    config = json.loads((model_dir / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "fp8" and config["fmt"] == "e4m3" and config["weight_block_size"] == [128, 128]
    assert config["activation_scheme"] == "dynamic" and "lm_head" in config["modules_to_not_convert"]


def test_quantization_matches_transformers_finegrained_fp8():
    """transformers' quantizer gives the same e4m3 values and (to an fp32 ulp) the same scales, fused 3-D experts
    included, and its dequantizer reads ours back exactly: W = fp8 * weight_scale_inv."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize
    from transformers.utils.quantization_config import FineGrainedFP8Config

    hf = types.SimpleNamespace(quantization_config=FineGrainedFP8Config(weight_block_size=[128, 128]))
    gen = torch.Generator().manual_seed(0)
    for name, w in (("x.weight", torch.randn(384, 256, generator=gen)),
                    ("mlp.experts.gate_up_proj", torch.randn(3, 256, 384, generator=gen) * 0.02)):  # fmt: skip
        theirs = Fp8Quantize(hf)._quantize_one(name, w)
        ours = quantize_fp8_block(w, (128, 128))
        assert set(theirs) == {name, name + "_scale_inv"}
        assert torch.equal(theirs[name].view(torch.uint8), ours.qweight.view(torch.uint8))
        torch.testing.assert_close(theirs[name + "_scale_inv"], ours.scale, rtol=1e-6, atol=0)
        back = Fp8Dequantize(hf)._dequantize_one(ours.qweight, ours.scale, torch.float32)
        assert torch.equal(back, ours.dequantize())


def test_cli_and_refusals(trained_dense_dir, fp8_dense_dir, tmp_path, capsys):
    main(["--model_dir", str(trained_dense_dir), "--out", str(tmp_path / "q"), "--scale_dtype", "float32"])
    assert "wrote" in capsys.readouterr().out
    assert _tensors(tmp_path / "q")["lm_head.weight"][1] == "BF16"
    assert (tmp_path / "q" / "tokenizer.json").is_file() and not (tmp_path / "q" / "train_log.json").exists()
    with pytest.raises(SystemExit, match="already quantized"):
        quantize_checkpoint(fp8_dense_dir, tmp_path / "again")
    with pytest.raises(SystemExit, match="not empty"):
        quantize_checkpoint(trained_dense_dir, tmp_path / "q")
