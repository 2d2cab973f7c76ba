"""One preprocessed image of a request, the prompt's image placeholders expanded to its tokens, and the prompt's
M-RoPE positions (Qwen3.5: text at t = h = w = its index, an image's tokens at their (t, h, w) grid cell after the
running position; text after an image resumes at the largest position + 1, so each request keeps a position
delta that decode and drafting add)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class ImageInput:
    """The processor's output for one image: its patches in the tower's input order and the patch grid."""

    pixel_values: torch.Tensor  # [t * h * w, channels * temporal_patch * patch * patch] fp32
    grid_thw: tuple[int, int, int]  # patch grid before the spatial merge
    merge_size: int  # patches per token along each side (2)
    content_hash: str  # sha256 hex of the patches: equal images share prefix-cache entries, others never do

    @classmethod
    def of(cls, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int], merge_size: int) -> "ImageInput":
        t, h, w = grid_thw
        if pixel_values.dim() != 2 or pixel_values.shape[0] != t * h * w:
            raise ValueError(f"pixel_values {tuple(pixel_values.shape)} do not hold the {t * h * w} patches of grid "
                             f"{grid_thw}")  # fmt: skip
        if h % merge_size or w % merge_size:
            raise ValueError(f"grid {grid_thw} is not a multiple of the merge size {merge_size}")
        values = pixel_values.detach().to("cpu", torch.float32).contiguous()
        digest = hashlib.sha256(repr((grid_thw, merge_size)).encode())
        digest.update(values.numpy().tobytes())
        return cls(values, (int(t), int(h), int(w)), merge_size, digest.hexdigest())

    @property
    def llm_grid(self) -> tuple[int, int, int]:
        t, h, w = self.grid_thw
        return t, h // self.merge_size, w // self.merge_size

    @property
    def num_tokens(self) -> int:
        t, h, w = self.llm_grid
        return t * h * w

    def cache_keys(self) -> list[int]:
        """Stand-ins for the image's token ids in prefix-cache keys: negative (never a vocabulary id), from the
        content hash and the token's index, so two images behind the same placeholder ids never share entries."""
        base = int(self.content_hash[:15], 16) << 20
        return [-(base + i) - 1 for i in range(self.num_tokens)]


def expand_image_tokens(token_ids: list[int], images: list[ImageInput], image_token_id: int) -> list[int]:
    """The prompt with each image's single placeholder (`<|image_pad|>`, as the chat template writes it) repeated to
    the image's token count. Placeholders and images must pair up one to one, in order."""
    count = sum(1 for t in token_ids if t == image_token_id)
    if count != len(images):
        raise ValueError(f"the prompt has {count} image placeholder(s) (token {image_token_id}) for {len(images)} "
                         "image(s)")  # fmt: skip
    out: list[int] = []
    pending = iter(images)
    for t in token_ids:
        out += [t] * next(pending).num_tokens if t == image_token_id else [t]
    return out


@dataclass(frozen=True)
class ImageSpan:
    """Where one image's tokens sit in the (expanded) prompt."""

    start: int
    image: ImageInput

    @property
    def end(self) -> int:
        return self.start + self.image.num_tokens


def image_spans(token_ids: list[int], images: list[ImageInput], image_token_id: int) -> list[ImageSpan]:
    """The expanded prompt's image runs, paired with `images` in order; each run must be exactly one image's
    token count (two adjacent images are two runs back to back)."""
    spans, pos = [], 0
    n = len(token_ids)
    for image in images:
        while pos < n and token_ids[pos] != image_token_id:
            pos += 1
        end = pos + image.num_tokens
        if end > n or any(t != image_token_id for t in token_ids[pos:end]):
            raise ValueError(f"the prompt's image tokens do not match image {len(spans)}'s {image.num_tokens} tokens")
        spans.append(ImageSpan(pos, image))
        pos = end
    if any(t == image_token_id for t in token_ids[pos:]):
        raise ValueError("the prompt has more image tokens than its images")
    return spans


def mrope_positions(num_tokens: int, spans: list[ImageSpan]) -> tuple[torch.Tensor, int]:
    """([3, num_tokens] int64 t / h / w positions of the prompt, the position delta of what follows it): the
    rope position of a later token p is p + delta on all three axes."""
    pos = torch.empty(3, num_tokens, dtype=torch.int64)
    cursor = index = 0  # next rope position, next prompt row
    for span in spans:
        text = span.start - index
        pos[:, index : span.start] = torch.arange(cursor, cursor + text)
        cursor += text
        t, h, w = span.image.llm_grid
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
        pos[0, span.start : span.end] = cursor + tt.flatten()
        pos[1, span.start : span.end] = cursor + hh.flatten()
        pos[2, span.start : span.end] = cursor + ww.flatten()
        cursor += max(h, w)
        index = span.end
    pos[:, index:] = torch.arange(cursor, cursor + num_tokens - index)
    delta = cursor + (num_tokens - index) - num_tokens
    return pos, delta
