"""The offline API with images, vLLM's way: `generate` with multi_modal_data (every form of the same image gives the
same prompt and tokens, and equals `chat` with an image_url part), limits and bad images refused before anything is
queued; a text-only checkpoint refuses images by name."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.multimodal.content_parts import IMAGE_PLACEHOLDER

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def noise(width=40, height=24, seed=0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def text_llm(trained_dense_dir):
    return LLM(trained_dense_dir, max_model_len=256, max_batch_size=2)


@pytest.mark.parametrize("prompt, error, message", [
    ({"prompt": IMAGE_PLACEHOLDER, "multi_modal_data": {"image": noise()}}, ValueError, "serves text only"),
    ({"prompt": "x", "multi_modal_data": {"video": [b"..."]}}, ValueError, r"multi_modal_data \['video'\]"),
    ({"prompt": "x", "multi_modal_data": [noise()]}, TypeError, "multi_modal_data must be a dict"),
    ({"prompt": "x", "mm_processor_kwargs": {"max_pixels": 4}}, ValueError, "mm_processor_kwargs"),
])  # fmt: skip
def test_a_text_only_model_and_unsupported_fields(text_llm, prompt, error, message):
    with pytest.raises(error, match=message):
        text_llm.generate(["def f():", prompt], GREEDY)
    assert not text_llm.engine.has_unfinished()
    video = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA"}}]}]
    with pytest.raises(ValueError, match="'video_url' are not supported"):
        text_llm.chat(video, GREEDY)
    assert text_llm.generate({"prompt": "def f():", "multi_modal_data": {}}, GREEDY)[0].token_ids  # no images: text


@pytest.fixture(scope="module")
def vision_llm():
    fixture = pytest.importorskip("unit_tests.vision_fixture", reason="needs branch vision's tiny image-text fixture")
    return LLM(fixture.tiny_vision_checkpoint(), max_model_len=512, max_batch_size=2, limit_mm_per_prompt=2)


def test_every_form_of_an_image_is_the_same_prompt(vision_llm, tmp_path):
    image = noise()
    path = tmp_path / "image.png"
    path.write_bytes(png(image))
    uri = "data:image/png;base64," + base64.b64encode(png(image)).decode()
    prompt = f"{IMAGE_PLACEHOLDER}What is this?"
    outs = vision_llm.generate([{"prompt": prompt, "multi_modal_data": {"image": form}}
                                for form in (image, png(image), uri, path, str(path), [image])], GREEDY)  # fmt: skip
    assert len({tuple(o.prompt_token_ids) for o in outs}) == 1 and len({tuple(o.token_ids) for o in outs}) == 1
    image_id = vision_llm.engine.model_config.vision.image_token_id
    assert outs[0].prompt_token_ids.count(image_id) > 1  # the placeholder expanded
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                         {"type": "text", "text": "What is this?"}]}]  # fmt: skip
    text = vision_llm.tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {
        "type": "text", "text": "What is this?"}]}], tokenize=False, add_generation_prompt=True)  # fmt: skip
    by_chat = vision_llm.chat(chat, GREEDY)[0]
    by_generate = vision_llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)[0]
    assert by_chat.prompt_token_ids == by_generate.prompt_token_ids and by_chat.token_ids == by_generate.token_ids
    pil = [{"role": "user", "content": [{"type": "image_pil", "image_pil": image}, {"type": "text", "text": "What is this?"}]}]
    assert vision_llm.chat(pil, GREEDY)[0].token_ids == by_chat.token_ids


@pytest.mark.parametrize("prompt, error, message", [
    ({"prompt": IMAGE_PLACEHOLDER * 3, "multi_modal_data": {"image": [noise()] * 3}}, ValueError,
     "3 images in one request; this server takes at most 2"),
    ({"prompt": "no placeholder", "multi_modal_data": {"image": noise()}}, ValueError, "0 image placeholder"),
    ({"prompt": IMAGE_PLACEHOLDER, "multi_modal_data": {"image": 7}}, TypeError, "got int"),
    ({"prompt": IMAGE_PLACEHOLDER, "multi_modal_data": {"image": b"not an image"}}, ValueError, "Pillow"),
    ({"prompt": IMAGE_PLACEHOLDER, "multi_modal_data": {"image": "https://x.org/a.png"}}, ValueError, "fetch"),
    ({"prompt": IMAGE_PLACEHOLDER}, ValueError, "image"),  # placeholder tokens without an image
])  # fmt: skip
def test_bad_images_queue_nothing(vision_llm, prompt, error, message):
    with pytest.raises(error, match=message):
        vision_llm.generate([{"prompt": IMAGE_PLACEHOLDER, "multi_modal_data": {"image": noise()}}, prompt], GREEDY)
    assert not vision_llm.engine.has_unfinished()
