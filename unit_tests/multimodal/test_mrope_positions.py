"""The prompt's M-RoPE positions and rope delta against HF's Qwen3.5 get_rope_index, and the per-row rope tables of
image rows against HF's interleaved recomposition of t / h / w frequencies."""

from types import SimpleNamespace

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch, ForwardMode
from lightllm_mtp.common.layers.rope_positions import mrope_axis, rope_inputs
from lightllm_mtp.kernels.attention.rotary import build_rope_cache
from lightllm_mtp.multimodal.image_input import ImageInput, expand_image_tokens, image_spans, mrope_positions
from lightllm_mtp.multimodal.prompt_images import PromptImages

IMAGE = 7


def _image(t, h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ImageInput.of(torch.randn(t * h * w, 12, generator=g), (t, h, w), merge_size=2)


def _hf_rope_index(ids: list[int], images: list[ImageInput]):
    model = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2)))
    model.get_vision_position_ids = lambda *a, **k: hf.Qwen3_5Model.get_vision_position_ids(model, *a, **k)
    input_ids = torch.tensor([ids])
    types = (input_ids == IMAGE).int()
    grid = torch.tensor([im.grid_thw for im in images]) if images else None
    pos, delta = hf.Qwen3_5Model.get_rope_index(model, input_ids, types, image_grid_thw=grid)
    return pos[:, 0], int(delta[0, 0])


@pytest.mark.parametrize("layout", [
    [3, (1, 4, 6), 5],  # text, one non-square image, text
    [(1, 2, 2), 4],  # an image first
    [2, (1, 6, 4), 3, (1, 4, 4), 2],  # two images
    [2, (1, 4, 4), 1, (1, 2, 8)],  # the prompt ends in an image (HF merges adjacent image runs: always a token between)
])
def test_positions_and_delta_equal_hf(layout):
    ids, images = [], []
    for piece in layout:
        if isinstance(piece, int):
            ids += list(range(10, 10 + piece))
        else:
            ids.append(IMAGE)
            images.append(_image(*piece, seed=len(images)))
    ids = expand_image_tokens(ids, images, IMAGE)
    ours, delta = mrope_positions(len(ids), image_spans(ids, images, IMAGE))
    theirs, their_delta = _hf_rope_index(ids, images)
    assert torch.equal(ours, theirs)
    assert delta == their_delta
    prompt = PromptImages.of(ids, images, IMAGE)
    # rows past the prompt continue at index + delta on all three axes
    tail = prompt.rope_positions(len(ids) - 2, len(ids) + 3)
    assert torch.equal(tail[:, :2], theirs[:, -2:])
    assert torch.equal(tail[:, 2:], (torch.arange(len(ids), len(ids) + 3) + their_delta).expand(3, -1))


def test_placeholders_and_images_must_pair():
    with pytest.raises(ValueError, match="2 image placeholder"):
        expand_image_tokens([1, IMAGE, 2, IMAGE], [_image(1, 2, 2)], IMAGE)
    ids = expand_image_tokens([1, IMAGE, 2], [_image(1, 4, 4)], IMAGE)
    with pytest.raises(ValueError, match="do not match"):
        image_spans(ids[:-2], [_image(1, 4, 4)], IMAGE)


def test_cache_keys_follow_content():
    a, b = _image(1, 4, 4, seed=1), _image(1, 4, 4, seed=2)
    same = ImageInput.of(a.pixel_values.clone(), a.grid_thw, 2)
    assert a.cache_keys() == same.cache_keys()
    assert not set(a.cache_keys()) & set(b.cache_keys())
    assert all(k < 0 for k in a.cache_keys())


def test_image_rows_take_hf_interleaved_tables():
    section = [3, 3, 2]
    text = Qwen3_5TextConfig(head_dim=64, partial_rotary_factor=0.25, max_position_embeddings=512,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": section,
                                              "mrope_interleaved": True, "partial_rotary_factor": 0.25})  # fmt: skip
    rotary = hf.Qwen3_5TextRotaryEmbedding(text)
    ids = expand_image_tokens([10, 11, IMAGE, 12, 13], [_image(1, 6, 4)], IMAGE)
    prompt = PromptImages.of(ids, [_image(1, 6, 4)], IMAGE)
    n = len(ids)
    cos, sin = build_rope_cache(16, 512, 1e4)
    batch = ForwardBatch(
        mode=ForwardMode.EXTEND, input_ids=torch.tensor(ids), positions=torch.arange(n), mem_index=torch.zeros(n),
        b_req_idx=torch.tensor([0], dtype=torch.int32), b_seq_len=torch.tensor([n], dtype=torch.int32),
        b1_cu_q_len=torch.tensor([0, n], dtype=torch.int32), b_has_initial_state=torch.tensor([False]),
        b_logits_index=torch.tensor([n - 1]), max_q_len=n, mrope_positions=prompt.rope_positions(0, n),
    )
    rows, row_cos, row_sin = rope_inputs(batch, cos, sin, torch.zeros(2, dtype=torch.int64), mrope_axis(tuple(section)))
    hf_cos, hf_sin = rotary(torch.zeros(1, dtype=torch.float32), prompt.positions[:, None, :])
    torch.testing.assert_close(row_cos[rows], hf_cos[0, :, :8], rtol=0, atol=1e-6)
    torch.testing.assert_close(row_sin[rows], hf_sin[0, :, :8], rtol=0, atol=1e-6)


def test_text_rows_add_their_request_delta():
    cos, sin = build_rope_cache(16, 64, 1e4)
    delta = torch.tensor([0, -5, 3], dtype=torch.int64)
    batch = ForwardBatch(  # request slot 1 with 3 rows, slot 2 with 2 rows
        mode=ForwardMode.EXTEND, input_ids=torch.zeros(5, dtype=torch.int64),
        positions=torch.tensor([20, 21, 22, 7, 8]), mem_index=torch.zeros(5),
        b_req_idx=torch.tensor([1, 2], dtype=torch.int32), b_seq_len=torch.tensor([23, 9], dtype=torch.int32),
        b1_cu_q_len=torch.tensor([0, 3, 5], dtype=torch.int32), b_has_initial_state=torch.tensor([True, True]),
        b_logits_index=torch.tensor([2, 4]), max_q_len=3,
    )
    positions, _, _ = rope_inputs(batch, cos, sin, delta, None)
    assert positions.tolist() == [15, 16, 17, 10, 11]
    same, _, _ = rope_inputs(batch, cos, sin, None, None)
    assert same is batch.positions
