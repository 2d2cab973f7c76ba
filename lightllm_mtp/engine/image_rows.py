"""The image side of prompt forwards: runs the vision tower on the images a prompt chunk reaches and gives the
EXTEND batch its vision embeddings (the target's rows, and the MTP modules' rows that read an image token ahead) and
every row's M-RoPE position; keeps each request slot's rope delta on the device, which decode, verify and drafting
add to their positions (common/layers/rope_positions.py)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from lightllm_mtp.engine.request import Request
from lightllm_mtp.multimodal.image_input import ImageInput

Tower = Callable[[Sequence[ImageInput]], list[torch.Tensor]]  # images -> [tokens, H] each, on the device


class ImageRows:
    def __init__(self, tower: Tower, rope_delta: torch.Tensor, device: torch.device, lookahead: int = 0):
        """lookahead: the positions ahead whose tokens the MTP modules read in a prompt pass (0: no MTP)."""
        self.tower = tower
        self.rope_delta = rope_delta
        self.device = device
        self.lookahead = lookahead

    def admit(self, req: Request) -> None:
        """A request took slot req.req_idx: its rope delta (0 without images) replaces the slot's previous one."""
        self.rope_delta[req.req_idx] = req.images.delta if req.images is not None else 0

    def batch_fields(self, chunks: list[tuple[Request, int, int]]) -> dict:
        """ForwardBatch fields of an EXTEND batch whose rows are `chunks` (request, first position, rows) in order:
        none when no chunk reaches an image (the rope delta covers text), else input_embeds, ahead_embeds (one per
        lookahead distance) and mrope_positions of every row."""
        if not any(r.images is not None and start < r.images.end for r, start, _ in chunks):
            return {}
        self._embed_missing(chunks)
        positions, offset = [], 0
        rows: list[list[int]] = [[] for _ in range(self.lookahead + 1)]  # distance 0 (the row's own input), 1, ..
        vectors: list[list[torch.Tensor]] = [[] for _ in range(self.lookahead + 1)]
        for req, start, n in chunks:
            images = req.images
            if images is None:
                positions.append(torch.arange(start, start + n, dtype=torch.int64).expand(3, -1))
            else:
                positions.append(images.rope_positions(start, start + n))
                for d in range(self.lookahead + 1):
                    for i in images.overlapping(start + d, start + n + d):
                        span = images.spans[i]
                        lo, hi = max(start, span.start - d), min(start + n, span.end - d)  # rows p, p + d in the span
                        rows[d].extend(range(offset + lo - start, offset + hi - start))
                        vectors[d].append(images.embeds[i][lo + d - span.start : hi + d - span.start])
            offset += n
        embeds = [self._pair(r, v) for r, v in zip(rows, vectors)]
        return {
            "input_embeds": embeds[0],
            "ahead_embeds": tuple(embeds[1:]),
            "mrope_positions": torch.cat(positions, dim=1).to(self.device, non_blocking=True),
        }

    def _pair(self, rows: list[int], vectors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not rows:
            return None
        return torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True), torch.cat(vectors)

    def _embed_missing(self, chunks: list[tuple[Request, int, int]]) -> None:
        """One tower pass over every image the chunks' rows (and their lookahead) reach that has no embedding yet."""
        missing = []
        for req, start, n in chunks:
            if req.images is not None:
                missing += [(req, i) for i in req.images.overlapping(start, start + n + self.lookahead)
                            if i not in req.images.embeds]  # fmt: skip
        if not missing:
            return
        outputs = self.tower([req.images.spans[i].image for req, i in missing])
        for (req, i), out in zip(missing, outputs):
            req.images.embeds[i] = out
