"""Chat message content parts (OpenAI's, and the vLLM / SGLang spellings): text, or an image to load. Shared by the
server's chat schema and the offline `LLM.chat`; every other part type is refused by name.

The chat template sees an image part as {"type": "image"} (the form HF's Qwen templates render as
`<|vision_start|><|image_pad|><|vision_end|>`), a text part as {"type": "text", "text": ...}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"  # one image in a Qwen3.5 prompt, before expansion
DETAILS = ("auto", "low", "high")
# part types other servers take that this one does not (audio, video, files, precomputed embeddings)
REFUSED_TYPES = ("video_url", "video", "input_audio", "audio_url", "audio", "file", "input_file", "image_embeds",
                 "refusal")  # fmt: skip


@dataclass(frozen=True)
class ImagePart:
    """One image of a message: where it is (a data: / file:// URL; offline also a PIL image) and OpenAI's detail
    (low: downscaled to fit 512 x 512 pixels first; auto / high: as sent)."""

    source: Any
    detail: str = "auto"


def content_part(part: dict, *, python_objects: bool = False) -> str | ImagePart:
    """A content part dict -> its text or its ImagePart; ValueError naming what is wrong. python_objects: also
    vLLM's offline {"type": "image_pil", "image_pil": <PIL image>}."""
    if not isinstance(part, dict):
        raise ValueError(f"a content part must be an object, got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError("a text content part needs a string 'text'")
        return text
    if kind == "image_url":
        value = part.get("image_url")
        if isinstance(value, str):  # a bare URL string (vLLM accepts it too)
            return ImagePart(value)
        if not isinstance(value, dict) or not isinstance(value.get("url"), str):
            raise ValueError("an image_url content part needs {\"image_url\": {\"url\": \"data:image/...;base64,...\"}}")
        return ImagePart(value["url"], _detail(value.get("detail")))
    if kind == "image":  # {"type": "image", "image": url} (vLLM, SGLang)
        value = part.get("image")
        if not isinstance(value, str):
            raise ValueError("an image content part needs a string 'image' (a data: URI)")
        return ImagePart(value)
    if kind == "image_pil" and python_objects:
        return ImagePart(part.get("image_pil"))
    if kind in REFUSED_TYPES:
        raise ValueError(f"content parts of type {kind!r} are not supported: this server takes text and image_url "
                         "parts")  # fmt: skip
    raise ValueError(f"unknown content part type {kind!r} (text and image_url are supported)")


def _detail(value) -> str:
    if value is None:
        return "auto"
    if value not in DETAILS:
        raise ValueError(f"image_url.detail must be one of {list(DETAILS)}, got {value!r}")
    return value


def message_parts(content) -> list[str | ImagePart]:
    """A message's content (a string, None or a list of part dicts) as its texts and images, in order."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise ValueError(f"message content must be a string or a list of content parts, got {type(content).__name__}")
    return [content_part(p, python_objects=True) for p in content]


def text_segments(parts: list[str | ImagePart]) -> list[str]:
    """The texts the chat template places for a message, in order: its whole text when it has no image (one
    string, as before images were served), else each text part."""
    if not any(isinstance(p, ImagePart) for p in parts):
        return ["".join(parts)]
    return [p for p in parts if isinstance(p, str)]


def template_content(parts: list[str | ImagePart], texts: Iterator[str]) -> str | list[dict]:
    """A message's content as the chat template gets it, taking its text segments (text_segments' order) from
    `texts`: one string without images, else the part list with each image as {"type": "image"}."""
    if not any(isinstance(p, ImagePart) for p in parts):
        return next(texts)
    return [{"type": "image"} if isinstance(p, ImagePart) else {"type": "text", "text": next(texts)} for p in parts]
