"""The tower of an -FP8 checkpoint loads unquantized: the checkpoint's quantization_config is for the language
model (tools/quantize_fp8.py leaves model.visual.* as it is, as Qwen's -FP8 checkpoints do); a tower tensor stored
with an FP8 scale is refused, named."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from lightllm_mtp.common.weight_loader import WeightLoadError
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.models.qwen3_5_vision.tower import VisionTower
from lightllm_mtp.tools.make_tiny_vision import TOWER_SHARD
from lightllm_mtp.tools.quantize_fp8 import quantize_checkpoint
from unit_tests.vision_fixture import tiny_vision_dir  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def fp8_vision_dir(tiny_vision_dir, tmp_path_factory):
    return quantize_checkpoint(tiny_vision_dir, tmp_path_factory.mktemp("fp8_vision") / "ckpt")


def vision_config(model_dir):
    return ModelConfig.from_hf(json.loads((model_dir / "config.json").read_text())).vision


def test_fp8_checkpoint_tower_is_bf16(tiny_vision_dir, fp8_vision_dir):
    cfg = vision_config(fp8_vision_dir)
    assert ModelConfig.from_hf(json.loads((fp8_vision_dir / "config.json").read_text())).quantization is not None
    plain = VisionTower.load(tiny_vision_dir, cfg, torch.bfloat16, "cpu")
    tower = VisionTower.load(fp8_vision_dir, cfg, torch.bfloat16, "cpu")
    assert tower.patch_embed[0].dtype == torch.bfloat16
    for ours, ref in zip(tower.blocks, plain.blocks):
        assert type(ours.qkv[0]) is torch.Tensor and torch.equal(ours.qkv[0], ref.qkv[0])
        assert torch.equal(ours.fc2[0], ref.fc2[0])
    assert torch.equal(tower.merger_fc1[0], plain.merger_fc1[0])


def test_fp8_tower_tensor_refused(fp8_vision_dir, tmp_path):
    model_dir = tmp_path / "ckpt"
    shutil.copytree(fp8_vision_dir, model_dir)
    name = "model.visual.blocks.0.attn.qkv.weight"
    tensors = load_file(str(model_dir / TOWER_SHARD))
    q = quantize_fp8_block(tensors[name].float(), (128, 128))
    tensors[name], tensors[name + "_scale_inv"] = q.qweight, q.scale.to(torch.bfloat16)
    save_file(tensors, str(model_dir / TOWER_SHARD))
    index_path = model_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"][name + "_scale_inv"] = TOWER_SHARD
    index_path.write_text(json.dumps(index))
    with pytest.raises(WeightLoadError, match=f"{name}: has the scale {name}_scale_inv, but this engine reads"):
        VisionTower.load(model_dir, vision_config(model_dir), torch.bfloat16, "cpu")
