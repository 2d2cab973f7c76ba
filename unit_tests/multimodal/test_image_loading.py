"""Turning what a user sends into an RGB PIL image: each supported format decodes to the pixels it was made from,
and each way an image can be wrong is an ImageInputError that names it (nothing is fetched, nothing outside the
allowed local media root is read, nothing over the limits is decoded)."""

import base64
import io
import os

import numpy as np
import pytest
from PIL import Image

from lightllm_mtp.multimodal.image_loading import ImageInputError, ImageLimits, load_image

LIMITS = ImageLimits()


def noise(width=24, height=16, mode="RGB", seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    bands = len(mode)
    return Image.fromarray(rng.integers(0, 256, (height, width, bands), dtype=np.uint8).squeeze(), mode)


def encoded(image: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **kw)
    return out.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize("fmt, mime", [("PNG", "image/png"), ("WEBP", "image/webp"), ("GIF", "image/gif")])
def test_lossless_formats_decode_to_the_pixels_they_were_made_from(fmt, mime):
    source = noise()
    kw = {"lossless": True} if fmt == "WEBP" else {}
    if fmt == "GIF":  # a palette image: its RGB form is the oracle
        source = source.quantize(64)
    got = load_image(data_uri(encoded(source, fmt, **kw), mime), LIMITS)
    assert got.mode == "RGB" and got.size == source.size
    assert np.array_equal(np.asarray(got), np.asarray(source.convert("RGB")))


def test_jpeg_decodes_as_pillow_decodes_it():
    data = encoded(noise(), "JPEG", quality=90)
    got = load_image(data_uri(data, "image/jpeg"), LIMITS)
    assert np.array_equal(np.asarray(got), np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    assert load_image(data_uri(data, "image/jpg"), LIMITS).size == (24, 16)  # the common misspelling


def test_an_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (8, 8), color) for color in ((200, 10, 10), (10, 200, 10))]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    got = np.asarray(load_image(data_uri(out.getvalue(), "image/gif"), LIMITS))
    assert (got == np.asarray(frames[0])).all()


def test_transparency_is_composited_onto_white():
    rgba = noise(mode="RGBA")
    alpha = np.asarray(rgba)[..., 3:].astype(np.float64) / 255
    want = np.asarray(rgba)[..., :3] * alpha + 255 * (1 - alpha)
    got = np.asarray(load_image(data_uri(encoded(rgba, "PNG")), LIMITS)).astype(np.float64)
    assert np.abs(got - want).max() <= 1  # Pillow's alpha_composite rounds


def test_line_wrapped_base64_is_still_base64():
    data = encoded(noise(), "PNG")
    b64 = base64.encodebytes(data).decode()  # 76-character lines, as the `base64` tool writes
    assert "\n" in b64
    assert load_image(f"data:image/png;base64,{b64}", LIMITS).size == (24, 16)


@pytest.mark.parametrize("url, message", [
    ("http://example.com/cat.png", "does not fetch URLs: send the image as a data: URI"),
    ("https://example.com/cat.png", "does not fetch URLs"),
    ("data:image/png;base64" + "A" * 8, "no ','"),
    ("data:;base64,AAAA", "names no image type"),
    ("data:text/plain;base64,aGVsbG8=", "image type 'text/plain' is not supported"),
    ("data:image/bmp;base64,AAAA", "image type 'image/bmp' is not supported: send PNG, JPEG, WebP or GIF"),
    ("data:image/png,rawbytes", "must be base64-encoded"),
    ("data:image/png;base64,@@@@not base64", "base64 data is corrupt"),
    ("data:image/png;base64,", "empty"),
    (data_uri(b"hello, not an image"), "not an image Pillow can decode"),
    (data_uri(encoded(noise(), "BMP")), "BMP images are not supported"),
    (data_uri(encoded(noise(), "TIFF")), "TIFF images are not supported"),
    (data_uri(encoded(noise(), "PNG")[:200]), "corrupt or truncated"),
    ("ftp://example.com/cat.png", "must be a data: URI"),
    ("/etc/hostname", "must be a data: URI"),
])  # fmt: skip
def test_each_bad_url_is_named(url, message):
    with pytest.raises(ImageInputError, match=message):
        load_image(url, LIMITS)


def test_the_byte_limit_is_checked_before_decoding():
    data = encoded(noise(64, 64), "PNG")
    small = ImageLimits(max_bytes=len(data) - 1)
    with pytest.raises(ImageInputError, match=f"{len(data)} bytes; this server takes at most {len(data) - 1}"):
        load_image(data_uri(data), small)
    with pytest.raises(ImageInputError, match="max_image_bytes"):  # refused from the URI's length alone
        load_image(data_uri(data * 4), small)
    assert load_image(data_uri(data), ImageLimits(max_bytes=len(data))).size == (64, 64)


def test_the_pixel_limit_is_read_from_the_header():
    bomb = encoded(Image.new("L", (4097, 4097)), "PNG")  # 16.8 Mpx in a few kilobytes
    assert len(bomb) < 100_000
    with pytest.raises(ImageInputError, match=r"4097 x 4097 = 16785409 pixels; this server takes at most 16777216"):
        load_image(data_uri(bomb), LIMITS)
    with pytest.raises(ImageInputError, match="max_image_pixels"):
        load_image(noise(10, 10), ImageLimits(max_pixels=99))


def test_python_inputs(tmp_path):
    image = noise()
    assert np.array_equal(np.asarray(load_image(image, LIMITS)), np.asarray(image))
    assert load_image(encoded(image, "PNG"), LIMITS).size == (24, 16)
    path = tmp_path / "x.png"
    path.write_bytes(encoded(image, "PNG"))
    for source in (path, str(path)):
        assert np.array_equal(np.asarray(load_image(source, LIMITS, bare_paths=True)), np.asarray(image))
    with pytest.raises(ImageInputError, match="no such file"):
        load_image(str(tmp_path / "missing.png"), LIMITS, bare_paths=True)
    with pytest.raises(TypeError, match="got int"):
        load_image(7, LIMITS, bare_paths=True)
    with pytest.raises(TypeError, match="a data: URI"):
        load_image(path, LIMITS)  # a path object where only URLs are taken


def test_file_urls_only_inside_the_allowed_root(tmp_path):
    root, outside = tmp_path / "media", tmp_path / "private"
    root.mkdir()
    outside.mkdir()
    image = encoded(noise(), "PNG")
    (root / "ok.png").write_bytes(image)
    (outside / "secret.png").write_bytes(image)
    os.symlink(outside / "secret.png", root / "link.png")
    with pytest.raises(ImageInputError, match="--allowed_local_media_path"):
        load_image(f"file://{root}/ok.png", LIMITS)  # no root: no local files at all
    limits = ImageLimits(local_media_root=str(root))
    assert load_image(f"file://{root}/ok.png", limits).size == (24, 16)
    assert load_image(f"file://localhost{root}/ok.png", limits).size == (24, 16)
    for escape in (f"file://{outside}/secret.png", f"file://{root}/../private/secret.png",
                   f"file://{root}/link.png", f"file://{root}/..%2Fprivate/secret.png"):  # fmt: skip
        with pytest.raises(ImageInputError, match="outside the allowed local media path"):
            load_image(escape, limits)
    with pytest.raises(ImageInputError, match="no such file"):
        load_image(f"file://{root}/missing.png", limits)
    with pytest.raises(ImageInputError, match="is a directory"):
        load_image(f"file://{root}", limits)
    with pytest.raises(ImageInputError, match="local files only"):
        load_image(f"file://example.com{root}/ok.png", limits)
    with pytest.raises(ImageInputError, match="absolute path"):
        load_image("file:ok.png", limits)
    (root / "big.png").write_bytes(image)
    with pytest.raises(ImageInputError, match="max_image_bytes"):
        load_image(f"file://{root}/big.png", ImageLimits(max_bytes=len(image) - 1, local_media_root=str(root)))
