"""A request's images on their way to the engine, the same for the server's front and the offline `LLM`: whether
this engine takes images at all (`EngineArgs.images_refused_because`), at most `limit_mm_per_prompt` of them,
each loaded within the image limits (image_loading.py), OpenAI's `detail: low` applied, preprocessed by the
checkpoint's `ImageProcessor`, and the prompt's placeholders expanded to the images' tokens. Every refusal is an
`ImageInputError` (a ValueError) naming what is wrong; nothing reaches the engine before all of a prompt's images
are loaded."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PIL import Image

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.multimodal.content_parts import ImagePart
from lightllm_mtp.multimodal.image_input import ImageInput, expand_image_tokens
from lightllm_mtp.multimodal.image_loading import ImageInputError, ImageLimits, load_image

LOW_DETAIL_SIDE = 512  # detail "low": OpenAI's low-resolution version fits in 512 x 512 pixels
Preprocess = Callable[[Image.Image], ImageInput]


class ImageIntake:
    def __init__(self, refused_because: str | None, max_images: int, limits: ImageLimits,
                 image_token_id: int | None, preprocess: Preprocess | None):  # fmt: skip
        """refused_because: None when this engine takes images (then image_token_id and preprocess are needed)."""
        if refused_because is None and (image_token_id is None or preprocess is None):
            raise ValueError("an intake that takes images needs the image token id and a preprocessor")
        self.refused_because = refused_because
        self.max_images = max_images
        self.limits = limits
        self.image_token_id = image_token_id
        self.preprocess = preprocess

    @classmethod
    def for_engine(cls, args: EngineArgs, preprocess: Preprocess | None = None) -> "ImageIntake":
        """The intake of an engine with these args; `preprocess` defaults to the checkpoint's ImageProcessor
        (its preprocessor_config.json)."""
        cfg = args.model_config_as_declared()
        refused = args.images_refused_because(cfg)
        limits = ImageLimits(args.max_image_bytes, args.max_image_pixels, args.allowed_local_media_path)
        if refused is not None:
            return cls(refused, args.limit_mm_per_prompt, limits, None, None)
        if preprocess is None:
            from lightllm_mtp.multimodal.image_processor import ImageProcessor

            preprocess = ImageProcessor.load(args.model_dir, cfg.vision).preprocess
        return cls(None, args.limit_mm_per_prompt, limits, cfg.vision.image_token_id, preprocess)

    @classmethod
    def text_only(cls, reason: str = "this server takes no images") -> "ImageIntake":
        return cls(reason, 0, ImageLimits(), None, None)

    def check_count(self, count: int) -> None:
        """Whether a prompt may carry `count` images (cheap: before anything is decoded)."""
        if count == 0:
            return
        if self.refused_because is not None:
            raise ImageInputError(self.refused_because)
        if count > self.max_images:
            raise ImageInputError(f"{count} images in one request; this server takes at most {self.max_images} "
                                  "(--limit_mm_per_prompt)")  # fmt: skip

    def load(self, parts: Sequence[ImagePart], *, bare_paths: bool = False) -> list[ImageInput]:
        """Each image decoded and preprocessed, in order. bare_paths: the offline API's own inputs (local paths
        read without the local-media root)."""
        self.check_count(len(parts))
        images = []
        for i, part in enumerate(parts):
            try:
                image = load_image(part.source, self.limits, bare_paths=bare_paths)
                if part.detail == "low":
                    image = low_detail(image)
                images.append(self.preprocess(image))
            except ValueError as e:  # ImageInputError, or the processor's (an image too elongated)
                where = f"image {i + 1}: " if len(parts) > 1 else ""
                raise ImageInputError(f"{where}{e}") from None
        return images

    def expand(self, prompt_ids: list[int], images: Sequence[ImageInput]) -> list[int]:
        """The prompt with each image placeholder expanded to its image's tokens; the placeholders must pair up
        with the images one to one."""
        if not images:
            if self.image_token_id is not None and self.image_token_id in prompt_ids:
                raise ImageInputError(f"the prompt holds image placeholder tokens (id {self.image_token_id}) but "
                                      "no images")  # fmt: skip
            return list(prompt_ids)
        try:
            return expand_image_tokens(list(prompt_ids), list(images), self.image_token_id)
        except ValueError as e:
            raise ImageInputError(f"{e}: each image needs one <|vision_start|><|image_pad|><|vision_end|> in the "
                                  "prompt") from None  # fmt: skip


def low_detail(image: Image.Image) -> Image.Image:
    """The image downscaled (aspect kept) to fit LOW_DETAIL_SIDE x LOW_DETAIL_SIDE; smaller images as they are."""
    scale = LOW_DETAIL_SIDE / max(image.size)
    if scale >= 1:
        return image
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, resample=Image.Resampling.BICUBIC)
