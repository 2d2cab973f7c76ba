"""Chat content parts: the OpenAI, vLLM and SGLang spellings of text and images, what the chat template gets, and
every other part type refused by name."""

import pytest

from lightllm_mtp.multimodal.content_parts import (
    ImagePart,
    content_part,
    message_parts,
    template_content,
    text_segments,
)

URI = "data:image/png;base64,AAAA"


@pytest.mark.parametrize("part, want", [
    ({"type": "text", "text": "hi"}, "hi"),
    ({"type": "image_url", "image_url": {"url": URI}}, ImagePart(URI)),
    ({"type": "image_url", "image_url": {"url": URI, "detail": "low"}}, ImagePart(URI, "low")),
    ({"type": "image_url", "image_url": {"url": URI, "detail": "high"}}, ImagePart(URI, "high")),
    ({"type": "image_url", "image_url": URI}, ImagePart(URI)),
    ({"type": "image", "image": URI}, ImagePart(URI)),
])  # fmt: skip
def test_supported_parts(part, want):
    assert content_part(part) == want


@pytest.mark.parametrize("part, message", [
    ({"type": "video_url", "video_url": {"url": URI}}, "'video_url' are not supported"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "'input_audio' are not supported"),
    ({"type": "audio_url", "audio_url": {"url": URI}}, "'audio_url' are not supported"),
    ({"type": "file", "file": {"file_id": "f"}}, "'file' are not supported"),
    ({"type": "image_pil", "image_pil": "x"}, "unknown content part type 'image_pil'"),  # offline only
    ({"type": "hologram"}, "unknown content part type 'hologram'"),
    ({"type": "image_url"}, "needs {\"image_url\": {\"url\""),
    ({"type": "image_url", "image_url": {"detail": "low"}}, "needs"),
    ({"type": "image_url", "image_url": {"url": URI, "detail": "max"}}, "detail must be one of"),
    ({"type": "image", "image": 3}, "needs a string 'image'"),
    ({"type": "text"}, "needs a string 'text'"),
    ("text", "must be an object"),
])  # fmt: skip
def test_other_parts_are_refused_by_name(part, message):
    with pytest.raises(ValueError, match=message):
        content_part(part)


def test_the_template_sees_strings_without_images_and_parts_with_them():
    plain = message_parts([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert text_segments(plain) == ["ab"] and template_content(plain, iter(["ab"])) == "ab"
    assert message_parts("x") == ["x"] and message_parts(None) == []
    mixed = message_parts([{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": URI}},
                           {"type": "text", "text": " and "}, {"type": "image", "image": URI}])  # fmt: skip
    assert text_segments(mixed) == ["look: ", " and "]
    assert template_content(mixed, iter(["<0>", "<1>"])) == [
        {"type": "text", "text": "<0>"}, {"type": "image"}, {"type": "text", "text": "<1>"}, {"type": "image"}]
    pil = object()
    assert message_parts([{"type": "image_pil", "image_pil": pil}]) == [ImagePart(pil)]  # offline messages
