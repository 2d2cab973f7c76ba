"""A request's images as the engine keeps them: where their tokens sit in the prompt, the prompt's M-RoPE positions
and rope delta, the prompt's prefix-cache key ids, and the tower's embeddings while its prefill still needs them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lightllm_mtp.multimodal.image_input import ImageInput, ImageSpan, image_spans, mrope_positions


@dataclass
class PromptImages:
    spans: tuple[ImageSpan, ...]
    positions: torch.Tensor  # [3, prompt_len] int64 host: the prompt's t / h / w rope positions
    delta: int  # rope position of a token past the prompt (and of text after the last image) = index + delta
    key_ids: list[int]  # the prompt with each image token replaced by its image's stand-in (ImageInput.cache_keys)
    embeds: dict[int, torch.Tensor] = field(default_factory=dict)  # span index -> [tokens, H] on the device

    @classmethod
    def of(cls, prompt_ids: list[int], images: list[ImageInput] | tuple[ImageInput, ...],
           image_token_id: int) -> "PromptImages":  # fmt: skip
        spans = image_spans(prompt_ids, list(images), image_token_id)
        positions, delta = mrope_positions(len(prompt_ids), spans)
        key_ids = list(prompt_ids)
        for span in spans:
            key_ids[span.start : span.end] = span.image.cache_keys()
        return cls(tuple(spans), positions, delta, key_ids)

    @property
    def images(self) -> tuple[ImageInput, ...]:
        return tuple(s.image for s in self.spans)

    @property
    def num_image_tokens(self) -> int:
        return sum(s.image.num_tokens for s in self.spans)

    @property
    def end(self) -> int:
        """The row after the last image token: rows from here on need only the rope delta."""
        return self.spans[-1].end if self.spans else 0

    def rope_positions(self, start: int, end: int) -> torch.Tensor:
        """[3, end - start] int64: positions of rows start..end-1 (prompt rows as computed, later ones + delta)."""
        n = self.positions.shape[1]
        inside = self.positions[:, start:min(end, n)]
        if end <= n:
            return inside
        tail = torch.arange(max(start, n), end, dtype=torch.int64) + self.delta
        return torch.cat([inside, tail.expand(3, -1)], dim=1)

    def overlapping(self, start: int, end: int) -> list[int]:
        """Indices of the spans with a token among rows start..end-1."""
        return [i for i, s in enumerate(self.spans) if s.start < end and start < s.end]

    def drop_embeds_before(self, row: int) -> None:
        """Frees the embeddings of images wholly before `row` (their tokens computed, no later row reads them)."""
        for i in [i for i in self.embeds if self.spans[i].end <= row]:
            del self.embeds[i]
