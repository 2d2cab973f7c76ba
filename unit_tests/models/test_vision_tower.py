"""models/qwen3_5_vision against transformers' Qwen3_5VisionModel (fp32, CPU): the same random weights saved as a
tiny `model.visual.*` checkpoint, loaded by HF directly and by VisionTower.load through the one loader."""

import json

import pytest
import torch
from safetensors.torch import save_file

from lightllm_mtp.common.weight_loader import WeightLoadError
from lightllm_mtp.config.runtime import LoadFormat
from lightllm_mtp.config.vision_config import VisionConfig
from lightllm_mtp.models.qwen3_5_vision.grid import merge_order
from lightllm_mtp.models.qwen3_5_vision.tower import PREFIX, VisionTower
from lightllm_mtp.multimodal.image_input import ImageInput

SHAPE = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
             spatial_merge_size=2, num_position_embeddings=36, out_hidden_size=48)  # fmt: skip


def vision_config(**overrides) -> VisionConfig:
    shape = {**SHAPE, **overrides}
    return VisionConfig(**shape, in_channels=3, hidden_act="gelu_pytorch_tanh", rope_theta=10000.0, image_token_id=1,
                        vision_start_token_id=2, vision_end_token_id=3, mrope_section=(2, 1, 1))  # fmt: skip


@pytest.fixture(scope="module")
def hf_tower():
    """HF's tower with every parameter drawn at a scale that keeps each step's contribution visible."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    config = Qwen3_5VisionConfig(**SHAPE, rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    model = Qwen3_5VisionModel(config).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() > 1:
                p.copy_(noise / p[0].numel() ** 0.5)
            else:
                p.copy_((1.0 if "norm" in name and name.endswith("weight") else 0.0) + 0.1 * noise)
    return model


@pytest.fixture(scope="module")
def checkpoint(hf_tower, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tiny_tower")
    tensors = {PREFIX + k: v.contiguous() for k, v in hf_tower.state_dict().items()}
    save_file(tensors, str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    return model_dir


def images(grids, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [ImageInput.of(torch.randn(t * h * w, 96, generator=gen), (t, h, w), 2) for t, h, w in grids]


@torch.no_grad()
def hf_embeddings(hf_tower, batch):
    grids = torch.tensor([im.grid_thw for im in batch])
    merged = hf_tower(torch.cat([im.pixel_values for im in batch]), grids).pooler_output
    return list(merged.split([im.num_tokens for im in batch]))


def test_specs_are_transformers_tensors(hf_tower):
    specs = {s.name: s for s in VisionTower.specs(vision_config())}
    assert {n: tuple(s.shape) for n, s in specs.items()} == {
        PREFIX + k: tuple(v.shape) for k, v in hf_tower.state_dict().items()}  # fmt: skip
    assert not any(s.quantizable or s.tp for s in specs.values())


@pytest.mark.parametrize("grids", [
    [(1, 6, 8)],  # one image, a grid larger than the 6 x 6 position table on one side
    [(1, 4, 6), (1, 10, 8)],  # two images of different grids
    [(1, 4, 6), (1, 12, 2), (1, 4, 6), (2, 4, 4)],  # equal grids apart (batched attention), a 2-frame input
])  # fmt: skip
def test_matches_transformers(hf_tower, checkpoint, grids):
    tower = VisionTower.load(checkpoint, vision_config(), torch.float32, "cpu")
    batch = images(grids)
    got = tower.forward(batch)
    expected = hf_embeddings(hf_tower, batch)
    assert [tuple(g.shape) for g in got] == [(im.num_tokens, 48) for im in batch]
    for g, e in zip(got, expected):
        assert g.dtype == torch.float32
        assert (g - e).abs().max().item() < 2e-5 * max(1.0, e.abs().max().item())


def test_images_do_not_see_each_other(checkpoint):
    tower = VisionTower.load(checkpoint, vision_config(), torch.float32, "cpu")
    a, b = images([(1, 4, 4), (1, 6, 4)], seed=1)
    together = tower.forward([a, b])
    assert torch.allclose(together[0], tower.forward([a])[0], atol=1e-6)
    assert torch.allclose(together[1], tower.forward([b])[0], atol=1e-6)
    changed = ImageInput.of(a.pixel_values + 1.0, a.grid_thw, 2)
    assert torch.equal(tower.forward([changed, b])[1], together[1])


def test_bf16_close_to_fp32(checkpoint):
    batch = images([(1, 4, 6), (1, 6, 6)], seed=2)
    ref = VisionTower.load(checkpoint, vision_config(), torch.float32, "cpu").forward(batch)
    low = VisionTower.load(checkpoint, vision_config(), torch.bfloat16, "cpu").forward(batch)
    for r, x in zip(ref, low):
        assert x.dtype == torch.bfloat16
        assert (x.float() - r).norm() / r.norm() < 0.05


def test_merge_order():
    rows, cols = merge_order(4, 4, 2)
    assert rows.tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3]
    assert cols.tolist() == [0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3]


def test_dummy_weights_and_empty_batch():
    tower = VisionTower.load(None, vision_config(), torch.float32, "cpu", load_format=LoadFormat.DUMMY)
    assert tower.forward([]) == []
    assert tower.forward(images([(1, 2, 2)]))[0].shape == (1, 48)


def test_wrong_patches_refused(checkpoint):
    tower = VisionTower.load(checkpoint, vision_config(), torch.float32, "cpu")
    with pytest.raises(ValueError, match="96 values a patch"):
        tower.forward([ImageInput.of(torch.zeros(4, 48), (1, 2, 2), 2)])


def test_missing_and_misshaped_tensors_named(checkpoint):
    with pytest.raises(WeightLoadError, match=r"missing tensors: model\.visual\.blocks\.2\."):
        VisionTower.load(checkpoint, vision_config(depth=3), torch.float32, "cpu")
    with pytest.raises(WeightLoadError, match=r"model\.visual\.pos_embed\.weight: expected shape \(64, 32\)"):
        VisionTower.load(checkpoint, vision_config(num_position_embeddings=64), torch.float32, "cpu")


def test_matches_transformers_at_published_width():
    """One block of the published tower (hidden 1152, 16 heads of 72, 48 x 48 position table, 16-pixel patches),
    HF's own initialisation, two images."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    shape = dict(depth=1, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                 num_position_embeddings=2304, out_hidden_size=2048)  # fmt: skip
    torch.manual_seed(0)
    hf = Qwen3_5VisionModel(Qwen3_5VisionConfig(**{**SHAPE, **shape})).eval()
    tower = VisionTower(vision_config(**shape), {PREFIX + k: v.detach() for k, v in hf.state_dict().items()})
    gen = torch.Generator().manual_seed(3)
    batch = [ImageInput.of(torch.randn(h * w, 1536, generator=gen), (1, h, w), 2) for h, w in [(16, 20), (8, 8)]]
    for got, expected in zip(tower.forward(batch), hf_embeddings(hf, batch)):
        assert (got - expected).abs().max().item() < 2e-5 * max(1.0, expected.abs().max().item())


@pytest.mark.gpu
def test_bf16_on_the_gpu_close_to_fp32(checkpoint):
    """The CUDA path (SDPA's fused kernels, bf16) against the fp32 CPU forward."""
    batch = images([(1, 4, 6), (1, 10, 8), (1, 4, 6)], seed=4)
    ref = VisionTower.load(checkpoint, vision_config(), torch.float32, "cpu").forward(batch)
    got = VisionTower.load(checkpoint, vision_config(), torch.bfloat16, "cuda").forward(batch)
    for r, x in zip(ref, got):
        assert x.device.type == "cuda" and x.dtype == torch.bfloat16
        assert (x.float().cpu() - r).norm() / r.norm() < 0.05
