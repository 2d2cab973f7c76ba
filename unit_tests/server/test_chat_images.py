"""Images through the front (the app over a stand-in pool whose workers answer at once, the image processor stood in
for): an image request reaches the worker with its placeholders expanded and its images intact, its image tokens in
usage; every bad image, a text-only model, and images where they are not taken are 400s naming the problem, after
which the server keeps serving."""

import asyncio
import base64
import dataclasses
import io
import re
from multiprocessing.reduction import ForkingPickler

import httpx
import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer

from lightllm_mtp.chat_templates import chat_template_text
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.multimodal.image_intake import ImageIntake
from lightllm_mtp.server.args import ServerArgs
from lightllm_mtp.server.engine_client import EngineClient
from lightllm_mtp.server.http_app import create_app
from lightllm_mtp.server.messages import AddRequest, TokenDelta, WorkerOutput
from lightllm_mtp.server.metrics import ServerMetrics
from unit_tests.image_inputs import image_text_config_dir, noise_image, png_data_uri, stand_in_preprocess
from unit_tests.server.stand_in_pool import StandInPool, stats

LIMIT = 8


class AnsweringPool(StandInPool):
    """Replicas that take each request through the inbox's pickling and answer it with one token at once."""

    def __init__(self, vocab_size: int, image_token_id: int | None, answer: int):
        super().__init__(dp=1)
        self.ready = [dataclasses.replace(r, vocab_size=vocab_size, image_token_id=image_token_id) for r in self.ready]
        self.answer, self.client = answer, None
        self.added: list[AddRequest] = []

    def send(self, rank, msg):
        msg = ForkingPickler.loads(ForkingPickler.dumps(msg))  # what the worker's inbox would deliver
        super().send(rank, msg)
        if isinstance(msg, AddRequest):
            self.added.append(msg)
            self.client._on_message(WorkerOutput(rank, [TokenDelta(msg.rid, [self.answer], "stop")], stats(rank)))


@pytest.fixture(scope="module")
def vision_dir(trained_dense_dir, tmp_path_factory):
    return image_text_config_dir(trained_dense_dir, tmp_path_factory.mktemp("vision_cfg"))


def front(model_dir, template="qwen3_5", **options):
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if template is not None:
        tokenizer.chat_template = chat_template_text(template)
    args = ServerArgs(engine=EngineArgs(model_dir=str(model_dir), **options), model_name="m")
    cfg = args.engine.model_config()
    image_id = cfg.vision.image_token_id if cfg.vision is not None else None
    pool = AnsweringPool(cfg.vocab_size, image_id, tokenizer.encode("ok")[0])
    client = EngineClient(pool, tokenizer, ServerMetrics(0))
    pool.client = client
    app = create_app(args, client, client.metrics, images=ImageIntake.for_engine(args.engine, stand_in_preprocess))
    return app, client, pool


def post(app, client, path: str, body: dict) -> httpx.Response:
    async def go():
        client._loop = asyncio.get_running_loop()  # where the reader thread would hand deltas over
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            return await asyncio.wait_for(http.post(path, json=body), 30)

    return asyncio.run(go())


def chat(*content, **extra) -> dict:
    return {"messages": [{"role": "user", "content": list(content)}], "max_tokens": 4, **extra}


def image(url: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


@pytest.fixture(scope="module")
def served(vision_dir):
    return front(vision_dir, limit_mm_per_prompt=LIMIT, max_image_bytes=2000, max_image_pixels=64 * 64)


def test_an_image_request_reaches_the_worker_expanded_with_its_images(served):
    app, client, pool = served
    small, wide = noise_image(8, 8), noise_image(32, 16, seed=1)
    r = post(app, client, "/v1/chat/completions", chat(text("look: "), image(png_data_uri(small)), text(" then "),
                                                        {"type": "image", "image": png_data_uri(wide)}))
    assert r.status_code == 200, r.text
    sent = pool.added[-1]
    want_images = [stand_in_preprocess(small), stand_in_preprocess(wide)]
    assert [i.content_hash for i in sent.images] == [i.content_hash for i in want_images]
    assert all(torch.equal(a.pixel_values, b.pixel_values) for a, b in zip(sent.images, want_images))
    tokenizer, image_id = client.tokenizer, client.image_token_id
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": [text("look: "), {"type": "image"}, text(" then "), {"type": "image"}]}],
        tokenize=False, add_generation_prompt=True)  # fmt: skip
    placeholders = tokenizer.encode(rendered, add_special_tokens=False)
    first = placeholders.index(image_id)
    second = placeholders.index(image_id, first + 1)
    want = placeholders[:first] + [image_id] + placeholders[first + 1 : second] + [image_id] * 8
    assert sent.prompt_ids == want + placeholders[second + 1 :]
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == len(sent.prompt_ids) and usage["prompt_tokens_details"]["image_tokens"] == 9
    assert r.json()["choices"][0]["message"]["content"] == "ok"


def test_responses_input_image_is_a_chat_image(served):
    app, client, pool = served
    body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "what is this?"},
                                                   {"type": "input_image", "image_url": png_data_uri(noise_image())}]}],
            "max_output_tokens": 4}  # fmt: skip
    r = post(app, client, "/v1/responses", body)
    assert r.status_code == 200, r.text
    assert len(pool.added[-1].images) == 1 and r.json()["usage"]["input_tokens_details"]["image_tokens"] == 6


def bmp_as_png() -> str:
    out = io.BytesIO()
    noise_image().save(out, format="BMP")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


BAD = [
    ("corrupt base64", chat(image("data:image/png;base64,iVBORw0K@@@")), "base64 data is corrupt"),
    ("unsupported type", chat(image("data:image/bmp;base64,Qk0=")), "image type 'image/bmp' is not supported"),
    ("unsupported bytes", chat(image(bmp_as_png())), "BMP images are not supported"),
    ("undecodable", chat(image("data:image/png;base64,aGVsbG8=")), "not an image Pillow can decode"),
    ("too many", chat(*[image(png_data_uri(noise_image(8, 8)))] * (LIMIT + 1)),
     f"{LIMIT + 1} images in one request; this server takes at most {LIMIT}"),
    ("too many bytes", chat(image(png_data_uri(noise_image(40, 40)))), "takes at most 2000 \\(max_image_bytes\\)"),
    ("too many pixels", chat(image(png_data_uri(Image.new("RGB", (65, 64))))), "max_image_pixels"),
    ("http", chat(image("http://example.com/cat.png")), "does not fetch URLs: send the image as a data: URI"),
    ("file", chat(image("file:///etc/hostname")), "--allowed_local_media_path"),
    ("detail", chat(image(png_data_uri(noise_image()), detail="max")), "detail must be one of"),
    ("video", chat({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}), "'video_url'"),
    ("audio", chat({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}), "'input_audio'"),
    ("no url", chat({"type": "image_url", "image_url": {}}), "needs"),
    # counted as a long text is: the expanded prompt against max_model_len (the stand-in pool's 128)
    ("too long", {**chat(*[image(png_data_uri(Image.new("RGB", (32, 32))))] * LIMIT), "max_tokens": None},
     "the prompt has 159 tokens; this model's maximum context length is 128"),
]  # fmt: skip


@pytest.mark.parametrize("name, body, message", BAD, ids=[b[0] for b in BAD])
def test_bad_images_are_400s_and_the_server_keeps_serving(served, name, body, message):
    app, client, pool = served
    sent = len(pool.added)
    r = post(app, client, "/v1/chat/completions", body)
    param = "prompt" if name == "too long" else "messages"
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert re.search(message, r.json()["error"]["message"]), r.text
    assert len(pool.added) == sent  # nothing reached a worker
    ok = post(app, client, "/v1/chat/completions", chat(text("hi"), image(png_data_uri(noise_image(8, 8)))))
    assert ok.status_code == 200 and len(pool.added) == sent + 1


@pytest.mark.parametrize("path, body, param, message", [
    ("/v1/completions", {"prompt": "x", "multi_modal_data": {"image": "data:"}}, "multi_modal_data",
     "image_url parts of chat messages"),
    ("/v1/completions", {"prompt": "a <|vision_start|><|image_pad|><|vision_end|>"}, "prompt", "1 image tokens"),
    ("/generate", {"inputs": "x", "multimodal_params": {"images": [{"type": "base64", "data": "AAAA"}]}},
     "multimodal_params", "not taken by /generate"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "input",
     "file_id is not supported"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image",
                                                               "image_url": "https://x.org/a.png"}]}]},
     "input", "does not fetch URLs"),
])  # fmt: skip
def test_images_where_they_are_not_taken_are_refused(served, path, body, param, message):
    app, client, pool = served
    sent = len(pool.added)
    r = post(app, client, path, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and message in r.json()["error"]["message"]
    assert len(pool.added) == sent


@pytest.mark.parametrize("which, options, message", [
    ("text", {}, "this model serves text only"),
    ("vision", {"language_model_only": True}, "--language_model_only"),
])  # fmt: skip
def test_a_text_only_server_refuses_images_and_serves_text(trained_dense_dir, vision_dir, which, options, message):
    app, client, pool = front(trained_dense_dir if which == "text" else vision_dir, **options)
    r = post(app, client, "/v1/chat/completions", chat(text("hi"), image(png_data_uri(noise_image()))))
    assert r.status_code == 400 and message in r.json()["error"]["message"] and not pool.added
    assert post(app, client, "/v1/chat/completions", chat(text("hi"))).status_code == 200


def test_a_template_without_image_parts_is_named(vision_dir):
    app, client, pool = front(vision_dir, template=None)  # the fixture's own template: content as a string
    r = post(app, client, "/v1/chat/completions", chat(text("hi"), image(png_data_uri(noise_image()))))
    assert r.status_code == 400 and "does not take image content parts" in r.json()["error"]["message"]
