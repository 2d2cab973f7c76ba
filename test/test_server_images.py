"""Issue 34 through the official openai client against a real server on CPU: the tiny image-text fixture (the trained
text model with a seeded random tower, unit_tests/vision_fixture.py), MTP (eagle, k=2) and the prefix cache on.
An image chat answers as the offline engine without MTP does (greedy, same tokens), with the images' tokens in
usage; the same image again is served from the prefix cache, another image of the same size is not past its first
token; bad images are 400s naming the problem and the server keeps serving."""

import base64
import io

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.server.launcher import ServerProcess

vision_fixture = pytest.importorskip("unit_tests.vision_fixture", reason="needs branch vision's tiny image-text fixture")
from lightllm_mtp.multimodal.image_processor import ImageProcessor  # noqa: E402  (branch vision's, with the fixture)

MAX_PIXELS = 128 * 128


def image_uri(seed: int, size=(48, 32), fmt="PNG", mime="image/png") -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return f"data:{mime};base64,{base64.b64encode(out.getvalue()).decode()}"


def messages(*uris: str, question: str = "Describe the picture.") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in uris]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]


@pytest.fixture(scope="module")
def model_dir():
    return vision_fixture.tiny_vision_checkpoint()


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    flags = ["--model_dir", str(model_dir), "--device", "cpu", "--max_req_total_len", "1024", "--log_level", "warning",
             "--running_max_req_size", "4", "--mtp_mode", "eagle_with_att", "--mtp_step", "2",
             "--limit_mm_per_prompt", "2", "--max_image_pixels", str(MAX_PIXELS),
             "--prefix_cache_interval", "16"]  # fmt: skip  (GDN snapshots every 16 tokens: short prompts hit)
    with ServerProcess(flags, tmp_path_factory.mktemp("images") / "server.log") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def ask(client, msgs, max_tokens=12):
    return client.chat.completions.create(model=client.models.list().data[0].id, messages=msgs, max_tokens=max_tokens,
                                          temperature=0, extra_body={"ignore_eos": True})  # fmt: skip


def test_an_image_chat_answers_as_the_offline_engine(client, model_dir):
    msgs = messages(image_uri(0, size=(48, 32)), image_uri(1, size=(32, 64)))
    out = ask(client, msgs)
    llm = LLM(model_dir, max_model_len=1024, max_batch_size=2, prefix_cache=False)
    want = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    processor = ImageProcessor.load(model_dir, llm.engine.model_config.vision)
    assert out.choices[0].message.content == want.text and len(want.token_ids) == 12
    assert out.usage.prompt_tokens == len(want.prompt_token_ids)
    assert out.usage.prompt_tokens_details.image_tokens == processor.num_tokens(48, 32) + processor.num_tokens(32, 64)


def test_the_prefix_cache_keys_images_by_content(server, client):
    question = "What colour dominates?"
    ids = httpx.post(f"{server.url}/tokenize", json={"messages": messages(image_uri(5), question=question)}).json()
    first_image = ids["tokens"].index(image_token_id(server))
    first = ask(client, messages(image_uri(5), question=question), max_tokens=2)
    again = ask(client, messages(image_uri(5), question=question), max_tokens=2)
    other = ask(client, messages(image_uri(6), question=question), max_tokens=2)  # same size, other pixels
    assert first.usage.prompt_tokens == again.usage.prompt_tokens == other.usage.prompt_tokens == ids["count"]
    image_end = first_image + first.usage.prompt_tokens_details.image_tokens
    assert again.usage.prompt_tokens_details.cached_tokens > image_end
    assert other.usage.prompt_tokens_details.cached_tokens <= first_image


def image_token_id(server) -> int:
    tokens = httpx.post(f"{server.url}/tokenize", json={"prompt": "<|image_pad|>"}).json()["tokens"]
    assert len(tokens) == 1
    return tokens[0]


BAD = [
    ("corrupt base64", image_uri(0)[:40] + "@@@", "base64 data is corrupt"),
    ("unsupported format", image_uri(0, fmt="BMP", mime="image/bmp"), "'image/bmp' is not supported"),
    ("too large", image_uri(0, size=(129, 128)), "max_image_pixels"),
    ("http", "https://example.com/cat.png", "does not fetch URLs"),
]  # fmt: skip


@pytest.mark.parametrize("name, uri, message", BAD, ids=[b[0] for b in BAD])
def test_bad_images_are_400s_and_the_server_keeps_serving(client, name, uri, message):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, messages(uri))
    assert e.value.status_code == 400 and message in str(e.value)
    assert ask(client, messages(image_uri(2)), max_tokens=2).usage.completion_tokens == 2
    assert ask(client, [{"role": "user", "content": "hi"}], max_tokens=2).usage.completion_tokens == 2


def test_too_many_images_and_a_video_are_400s(client):
    with pytest.raises(openai.BadRequestError, match="3 images in one request; this server takes at most 2"):
        ask(client, messages(image_uri(0), image_uri(1), image_uri(2)))
    video = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]}]
    with pytest.raises(openai.BadRequestError, match="'video_url' are not supported"):
        ask(client, video)
