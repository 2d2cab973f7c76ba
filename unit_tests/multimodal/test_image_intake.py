"""A request's images before the engine: refused where the engine takes none (the reason named), counted against
limit_mm_per_prompt before any is decoded, loaded with their position in the error, detail low downscaled, and the
prompt's placeholders expanded to the images' tokens."""

import pytest

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.multimodal.content_parts import ImagePart
from lightllm_mtp.multimodal.image_intake import ImageIntake, low_detail
from lightllm_mtp.multimodal.image_loading import ImageInputError
from unit_tests.image_inputs import image_text_config_dir, noise_image, png_data_uri, stand_in_preprocess


@pytest.fixture(scope="module")
def vision_dir(trained_dense_dir, tmp_path_factory):
    return image_text_config_dir(trained_dense_dir, tmp_path_factory.mktemp("vision_cfg"))


def intake(model_dir, **options):
    return ImageIntake.for_engine(EngineArgs(model_dir=str(model_dir), **options), preprocess=stand_in_preprocess)


@pytest.mark.parametrize("which, options, reason", [
    ("text", {}, "serves text only"),
    ("vision", {"language_model_only": True}, "--language_model_only"),
    ("vision", {"limit_mm_per_prompt": 0}, "--limit_mm_per_prompt 0"),
])  # fmt: skip
def test_an_engine_without_images_refuses_them_by_reason(trained_dense_dir, vision_dir, which, options, reason):
    got = intake(trained_dense_dir if which == "text" else vision_dir, **options)
    got.check_count(0)
    with pytest.raises(ImageInputError, match=reason):
        got.check_count(1)
    with pytest.raises(ImageInputError, match=reason):
        got.load([ImagePart(png_data_uri(noise_image()))])


def test_images_load_in_order_and_expand_their_placeholders(vision_dir):
    take = intake(vision_dir, limit_mm_per_prompt=2)
    image_id = take.image_token_id
    small, large = noise_image(8, 8), noise_image(32, 16, seed=1)
    images = take.load([ImagePart(png_data_uri(small)), ImagePart(png_data_uri(large))])
    assert [i.num_tokens for i in images] == [1, 4 * 2]
    assert images[0].content_hash == stand_in_preprocess(small).content_hash  # the decoded pixels, exactly
    prompt = [5, image_id, 6, image_id, 7]
    assert take.expand(prompt, images) == [5, image_id, 6] + [image_id] * 8 + [7]
    with pytest.raises(ImageInputError, match="1 image placeholder.*for 2 image"):
        take.expand([5, image_id], images)
    with pytest.raises(ImageInputError, match="placeholder tokens .* but no images"):
        take.expand(prompt, [])
    assert take.expand([5, 6], []) == [5, 6]


def test_the_count_is_checked_before_anything_is_decoded(vision_dir):
    take = intake(vision_dir, limit_mm_per_prompt=2)
    corrupt = ImagePart("data:image/png;base64,@@@")
    with pytest.raises(ImageInputError, match="3 images in one request; this server takes at most 2"):
        take.load([corrupt] * 3)
    with pytest.raises(ImageInputError, match="^image 2: the data: URI's base64 data is corrupt"):
        take.load([ImagePart(png_data_uri(noise_image())), corrupt])
    with pytest.raises(ImageInputError, match="^this server does not fetch URLs"):  # one image: no position
        take.load([ImagePart("https://example.com/x.png")])


def test_detail_low_fits_the_image_in_512_pixels(vision_dir):
    seen = []
    take = ImageIntake.for_engine(EngineArgs(model_dir=str(vision_dir)),
                                  preprocess=lambda image: seen.append(image.size) or stand_in_preprocess(image))
    wide = png_data_uri(noise_image(1024, 300))
    take.load([ImagePart(wide, "low"), ImagePart(wide, "high"), ImagePart(wide, "auto")])
    assert seen == [(512, 150), (1024, 300), (1024, 300)]
    small = noise_image(100, 60)
    assert low_detail(small) is small


def test_the_limits_come_from_the_engine_options(vision_dir, tmp_path):
    take = intake(vision_dir, max_image_bytes=100, max_image_pixels=50, allowed_local_media_path=str(tmp_path))
    assert (take.limits.max_bytes, take.limits.max_pixels) == (100, 50)
    assert take.limits.local_media_root == str(tmp_path.resolve())
    with pytest.raises(ValueError, match="allowed_local_media_path .* is not a directory"):
        EngineArgs(model_dir=str(vision_dir), allowed_local_media_path=str(tmp_path / "none"))
    for name in ("max_image_bytes", "max_image_pixels", "limit_mm_per_prompt"):
        with pytest.raises(ValueError, match=name):
            EngineArgs(model_dir=str(vision_dir), **{name: -1})
