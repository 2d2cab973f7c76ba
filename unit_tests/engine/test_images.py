"""Image prompts through the engine on the tiny image-text fixture (unit_tests/vision_fixture.py: the trained text
model, a seeded random tower): greedy tokens and logprobs equal to HF's Qwen3.5 (uncached forward over the whole
sequence each step, fp32) with one and two images; MTP (eagle, multi-layer, parallel drafting) equal to plain
decoding; chunked prefill splitting an image; prefix-cache hits with the same image and none with a different one
of the same size; a text request reusing an image request's slot."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.multimodal.image_input import expand_image_tokens
from lightllm_mtp.multimodal.image_processor import ImageProcessor
from lightllm_mtp.sampling_params import SamplingParams
from unit_tests.vision_fixture import tiny_vision_checkpoint

NEW = 6


def picture(width, height, seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def prompt_of(model_dir, n_images, seed=0, sizes=((40, 56), (64, 48))):
    """(expanded prompt ids, images): text, then per image <|vision_start|><|image_pad|><|vision_end|> and text."""
    engine_cfg = EngineArgs(model_dir=str(model_dir)).model_config()
    vision = engine_cfg.vision
    processor = ImageProcessor.load(model_dir, vision)
    images = [processor.preprocess(picture(*sizes[i], seed + i)) for i in range(n_images)]
    ids = [11, 250, 31, 7]
    for i in range(n_images):
        ids += [vision.vision_start_token_id, vision.image_token_id, vision.vision_end_token_id, 90 + i, 14]
    ids += [401, 13, 222]
    return expand_image_tokens(ids, images, vision.image_token_id), images


def run(engine, requests, new=NEW, logprobs=None):
    """[(prompt ids, images)] -> the finished requests, in order."""
    params = SamplingParams(temperature=0.0, max_new_tokens=new, ignore_eos=True, logprobs=logprobs)
    reqs = [engine.add_request(ids, params, images=images) for ids, images in requests]
    while engine.has_unfinished():
        engine.step()
    return reqs


def engine(model_dir, **kw):
    kw.setdefault("max_model_len", 256)
    kw.setdefault("max_batch_size", 4)
    return LLMEngine(EngineArgs(model_dir=str(model_dir), **kw))


@torch.no_grad()
def hf_greedy_uncached(model_dir, ids, images, new):
    """HF Qwen3_5ForConditionalGeneration, the whole sequence each step (no cache): tokens and each step's
    log-softmax."""
    import transformers

    moe = json.loads((Path(model_dir) / "config.json").read_text())["model_type"] == "qwen3_5_moe"
    cls = transformers.Qwen3_5MoeForConditionalGeneration if moe else transformers.Qwen3_5ForConditionalGeneration
    model = cls.from_pretrained(model_dir, dtype=torch.float32).eval()
    image_id = model.config.image_token_id
    pixels = torch.cat([im.pixel_values for im in images])
    grids = torch.tensor([im.grid_thw for im in images])
    seq, out, logps = list(ids), [], []
    for _ in range(new):
        input_ids = torch.tensor([seq])
        logits = model(input_ids=input_ids, pixel_values=pixels, image_grid_thw=grids, use_cache=False,
                       mm_token_type_ids=(input_ids == image_id).int()).logits[0, -1]  # fmt: skip
        logps.append(torch.log_softmax(logits.float(), -1))
        out.append(int(logits.argmax()))
        seq.append(out[-1])
    return out, logps


@pytest.fixture(scope="module")
def dense():
    return tiny_vision_checkpoint("qwen3_5")


@pytest.mark.parametrize("n_images", [1, 2])
def test_greedy_and_logprobs_equal_hf(dense, n_images):
    ids, images = prompt_of(dense, n_images)
    want, logps = hf_greedy_uncached(dense, ids, images, NEW)
    (req,) = run(engine(dense), [(ids, images)], logprobs=3)
    assert req.output_ids == want
    for (lp, top), hf_lp in zip(req.output_logprobs, logps):
        ids_top = [t for t, _ in top]
        assert ids_top == hf_lp.topk(3).indices.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in top], dtype=torch.float64), hf_lp.topk(3).values.double(), rtol=0,
                                   atol=2e-4)  # fmt: skip


def test_moe_greedy_equals_hf_with_an_image():
    moe = tiny_vision_checkpoint("qwen3_5_moe")
    ids, images = prompt_of(moe, 1, seed=21)
    want, _ = hf_greedy_uncached(moe, ids, images, NEW)
    assert run(engine(moe, chunked_prefill_size=8), [(ids, images)])[0].output_ids == want


def test_chunked_prefill_splits_images(dense):
    requests = [prompt_of(dense, 2, seed=3)]
    whole = run(engine(dense, chunked_prefill_size=256), requests)[0].output_ids
    assert run(engine(dense, chunked_prefill_size=8), requests)[0].output_ids == whole
    assert run(engine(dense, chunked_prefill_size=8, prefix_cache=False), requests)[0].output_ids == whole


@pytest.mark.parametrize("chunk", [256, 8])
def test_eagle_equals_plain_with_images(dense, chunk):
    requests = [prompt_of(dense, 1, seed=5), prompt_of(dense, 2, seed=6)]
    plain = [r.output_ids for r in run(engine(dense), requests, new=16)]
    spec = run(engine(dense, mtp_mode="eagle_with_att", mtp_step=2, chunked_prefill_size=chunk), requests, new=16)
    assert [r.output_ids for r in spec] == plain
    assert sum(r.spec_stats.accepted_drafts for r in spec) > 0


@pytest.mark.parametrize("mode", [
    dict(mtp_mode="vanilla_with_att", mtp_step=3),  # multi-layer MTP: 3 modules
    dict(mtp_mode="eagle_with_att", mtp_step=3, parallel_drafting=True),
])  # fmt: skip
def test_multi_layer_and_parallel_drafting_equal_plain_with_images(mode):
    model_dir = tiny_vision_checkpoint("qwen3_5_mtp3_ptd")
    requests = [prompt_of(model_dir, 2, seed=8), prompt_of(model_dir, 1, seed=9)]
    plain = [r.output_ids for r in run(engine(model_dir), requests, new=12)]
    spec = run(engine(model_dir, chunked_prefill_size=8, **mode), requests, new=12)
    assert [r.output_ids for r in spec] == plain


def test_prefix_cache_keys_images_by_content(dense):
    ids, images = prompt_of(dense, 1, seed=10)
    other_ids, other = prompt_of(dense, 1, seed=11)  # same sizes: the same token ids, another image
    assert other_ids == ids
    eng = engine(dense, mtp_mode="eagle_with_att", mtp_step=2, prefix_cache_interval=8)
    first = run(eng, [(ids, images)])[0]
    again = run(eng, [(ids, images)])[0]
    different = run(eng, [(other_ids, other)])[0]
    start = ids.index(eng.model_config.vision.image_token_id)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens > start  # shared past the image
    assert different.num_cached_tokens <= start  # never past the first image token
    assert again.output_ids == first.output_ids
    fresh = run(engine(dense, mtp_mode="eagle_with_att", mtp_step=2, prefix_cache=False), [(other_ids, other)])[0]
    assert different.output_ids == fresh.output_ids


def test_text_request_after_an_image_request_in_its_slot(dense):
    text = ([11, 250, 31, 7, 401, 13, 222, 9, 15], [])
    alone = run(engine(dense, max_batch_size=1), [text])[0].output_ids
    eng = engine(dense, max_batch_size=1, prefix_cache=False)
    run(eng, [prompt_of(dense, 1, seed=12)])
    assert run(eng, [text])[0].output_ids == alone  # the slot's rope delta was reset


def test_refusals(dense):
    ids, images = prompt_of(dense, 2, seed=13)
    with pytest.raises(ValueError, match="limit_mm_per_prompt"):
        run(engine(dense, limit_mm_per_prompt=1), [(ids, images)])
    with pytest.raises(ValueError, match="language_model_only"):
        run(engine(dense, language_model_only=True), [(ids, images)])
    with pytest.raises(ValueError, match="image placeholder|do not match|image tokens"):
        run(engine(dense), [(ids, images[:1])])


def test_prefix_cache_resumes_inside_an_image(dense):
    """Two prompts with the same image whose text parts right after it: the deepest shared snapshot falls inside the
    image, so the second request's recompute starts mid-image (the tower runs again for its remaining rows)."""
    ids, images = prompt_of(dense, 1, seed=30)
    vision = EngineArgs(model_dir=str(dense)).model_config().vision
    end = len(ids) - 1 - ids[::-1].index(vision.image_token_id) + 1  # one past the last image token
    start = ids.index(vision.image_token_id)
    other = ids[: end + 1] + [77, 78, 79, 80]  # same prefix through the image and <|vision_end|>, then other text
    mode = dict(mtp_mode="eagle_with_att", mtp_step=2)
    # positions 0..end-1 are shared (position end's key, under eagle's lookahead of 1, holds the diverging token):
    # the deepest snapshot, a multiple of the interval, must fall strictly inside the image
    interval = next(i for i in (6, 7, 9, 11, 13) if start < end // i * i < end)
    eng = engine(dense, prefix_cache_interval=interval, **mode)
    run(eng, [(ids, images)])
    second = run(eng, [(other, images)])[0]
    assert start < second.num_cached_tokens < end
    fresh = run(engine(dense, prefix_cache=False, **mode), [(other, images)])[0]
    assert second.output_ids == fresh.output_ids


@pytest.mark.parametrize("mode", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)])
def test_one_row_prompt_chunks_through_images(dense, mode):
    """A token budget of 1 cuts the prompt into one-row chunks: each is a batch of one row with a cached prefix (the
    shape of a decode step) whose row may be an image token; it must still get its vision embedding and grid
    position (and under MTP the ahead embedding)."""
    requests = [prompt_of(dense, 2, seed=41)]
    whole = run(engine(dense, prefix_cache=False), requests)[0].output_ids
    assert run(engine(dense, prefix_cache=False, chunked_prefill_size=1, **mode), requests)[0].output_ids == whole


def test_prefill_graph_padding_rows_stay_inside_the_rope_tables(dense, monkeypatch):
    """A warm hit on an image prompt resumes past the image: its short text chunk runs in a prefill graph bucket
    (padded; eagerly on CPU) whose padding rows belong to the request, so they get its (negative) rope delta too; no
    row may index the rope tables below 0 (the GPU kernel would read before the table)."""
    from lightllm_mtp.common.basemodel.prefill_graph import PrefillGraphSet
    from lightllm_mtp.common.layers import gated_attention

    requests = [prompt_of(dense, 1, seed=42)]
    fresh = run(engine(dense, prefix_cache=False), requests)[0].output_ids
    eng = engine(dense, prefix_cache_interval=2)
    runner = eng.model_runner
    graphs = PrefillGraphSet(runner.model.forward, runner.model.caches, keep_all_hidden=False, pool=None,
                             sizes=(16, 32), capture=False)  # fmt: skip
    padded_runs = []
    run_graph = graphs.run
    graphs.run = lambda batch: (padded_runs.append(batch.num_tokens), run_graph(batch))[1]
    runner.graphed.graph_sets.append(graphs)
    lowest, inputs = [], gated_attention.rope_inputs

    def recorded(batch, *args):
        out = inputs(batch, *args)
        lowest.append(int(out[0].min()))
        return out

    monkeypatch.setattr(gated_attention, "rope_inputs", recorded)
    assert run(eng, requests)[0].output_ids == fresh
    lowest.clear()
    again = run(eng, requests)[0]
    assert again.num_cached_tokens > requests[0][0].index(eng.model_config.vision.image_token_id)
    assert padded_runs and again.output_ids == fresh
    assert min(lowest) >= 0


def test_images_the_tower_cannot_take_are_refused_at_admission(dense):
    """An ImageInput made for another processor (patch size, merge size) is a ValueError at add_request, not a
    tower error inside every later step."""
    from lightllm_mtp.multimodal.image_input import ImageInput

    ids, images = prompt_of(dense, 1, seed=43)
    good = images[0]
    t, h, w = good.grid_thw
    wider = ImageInput.of(torch.randn(t * h * w, good.pixel_values.shape[1] + 3), good.grid_thw, good.merge_size)
    unmerged = ImageInput.of(good.pixel_values, good.grid_thw, 1)  # 1 x 1 merge windows: 4x the tokens
    eng = engine(dense)
    image_id = eng.model_config.vision.image_token_id
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="values a patch"):
        eng.add_request(ids, params, images=[wider])
    with pytest.raises(ValueError, match="merge"):
        eng.add_request(expand_image_tokens([11, image_id, 13], [unmerged], image_id), params, images=[unmerged])
    assert not eng.has_unfinished()
    assert run(eng, [(ids, images)])[0].output_ids == run(engine(dense), [(ids, images)])[0].output_ids
