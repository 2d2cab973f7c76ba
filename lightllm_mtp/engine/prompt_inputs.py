"""What `LLM.generate` and `LLM.chat` take as prompts, read before anything is queued: strings, token-id lists,
vLLM's dicts ({"prompt": str} / {"prompt_token_ids": [...]}, with "multi_modal_data": {"image": one or a list}),
and chat messages whose content may hold image parts. A wrong type is a TypeError, an unsupported field a
ValueError naming it."""

from __future__ import annotations

from typing import Any

from lightllm_mtp.multimodal.content_parts import ImagePart, message_parts, template_content, text_segments

PromptInput = str | list[int] | dict  # dict: vLLM's {"prompt": str} or {"prompt_token_ids": list[int]}


def as_prompt_list(prompts) -> list:
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]  # one prompt
    if isinstance(prompts, (list, tuple)):
        return list(prompts)
    raise TypeError(f"prompts must be a prompt or a list of prompts, got {describe(prompts)}")


def from_dict(prompt: dict) -> tuple[str | list[int], list[ImagePart]]:
    """(the prompt text or ids, its images) of a vLLM dict prompt. The prompt holds one
    <|vision_start|><|image_pad|><|vision_end|> per image, in order."""
    keys = set(prompt) & {"prompt", "prompt_token_ids"}
    if len(keys) != 1:
        raise TypeError(f"a dict prompt needs exactly one of 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")
    extra = set(prompt) - keys - {"multi_modal_data"}
    if extra:  # vLLM's mm_processor_kwargs, prompt embeddings and friends: refused, never dropped
        raise ValueError(f"dict prompt fields {sorted(extra)} are not supported")
    value = prompt[keys.pop()]
    if "prompt" in prompt and not isinstance(value, str):
        raise TypeError(f"'prompt' must be a str, got {describe(value)}")
    if "prompt_token_ids" in prompt and isinstance(value, str):
        raise TypeError("'prompt_token_ids' must be a list of ints, got a str")
    return value, _image_items(prompt.get("multi_modal_data"))


def _image_items(data) -> list[ImagePart]:
    if data is None:
        return []
    if not isinstance(data, dict):
        raise TypeError(f"multi_modal_data must be a dict such as {{'image': image or [images]}}, got {describe(data)}")
    other = sorted(set(data) - {"image"})
    if other:
        raise ValueError(f"multi_modal_data {other} is not supported: images only ('image')")
    items = data.get("image")
    if items is None:
        return []
    return [ImagePart(item) for item in (items if isinstance(items, (list, tuple)) else [items])]


def chat_messages(messages: list[dict]) -> tuple[list[dict], list[ImagePart]]:
    """(the messages as the chat template takes them, their images in order): content parts read as the server
    reads them (text, image_url, image, and vLLM's offline image_pil), each image given to the template as
    {"type": "image"}."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TypeError(f"a conversation must be a list of message dicts, got {describe(messages)}")
    out: list[dict] = []
    images: list[ImagePart] = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            out.append(m)
            continue
        parts = message_parts(content)
        images += [p for p in parts if isinstance(p, ImagePart)]
        out.append({**m, "content": template_content(parts, iter(text_segments(parts)))})
    return out, images


def describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.60}"
