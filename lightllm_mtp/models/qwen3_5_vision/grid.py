"""Per-patch tables of a batch of images, from their patch grids alone (no weights): each patch's (row, column)
in its frame, in the tower's input order (merge windows, see multimodal/image_processor.py); the 4 bilinear taps
that resample the learned square position table onto the image's grid; and the attention segments (one per frame:
a patch attends to the patches of its own frame only)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GridTables:
    rows: torch.Tensor  # [N] int64 row of each patch in its frame
    cols: torch.Tensor  # [N] int64 column
    pos_taps: torch.Tensor  # [N, 4] int64 rows of the flattened position table (side x side)
    pos_weights: torch.Tensor  # [N, 4] fp32 their bilinear weights (sum 1)
    segments: tuple[tuple[int, int], ...]  # (first patch, patches) of each frame, in order


def merge_order(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([h * w] rows, [h * w] columns) of a frame's patches in merge-window order. For h = w = 4, merge 2:
    rows 0 0 1 1 0 0 1 1 2 2 3 3 2 2 3 3, columns 0 1 0 1 2 3 2 3 0 1 0 1 2 3 2 3."""
    window = (h // merge, merge, w // merge, merge)  # [window row, row in window, window col, col in window]
    rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(window)
    cols = torch.arange(w).view(1, 1, w // merge, merge).expand(window)
    return rows.transpose(1, 2).flatten(), cols.transpose(1, 2).flatten()


def _axis_taps(size: int, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bilinear resampling of a `side`-long axis onto `size` points, corners aligned (point 0 -> 0, point size-1 ->
    side-1): ([size] lower tap, [size] upper tap (clamped to the table), [size] fp32 weight of the upper one)."""
    source = torch.arange(size, dtype=torch.float32) * (side - 1) / max(size - 1, 1)
    lower = source.floor()
    upper = (lower + 1).clamp(max=side - 1)
    return lower.long(), upper.long(), source - lower


def grid_tables(grids: list[tuple[int, int, int]], merge: int, side: int) -> GridTables:
    """The tables of the images with these (t, h, w) patch grids, concatenated in order (on the CPU)."""
    rows, cols, taps, weights, segments = [], [], [], [], []
    start = 0
    for t, h, w in grids:
        r, c = merge_order(h, w, merge)
        lo_h, hi_h, up_h = (x[r] for x in _axis_taps(h, side))
        lo_w, hi_w, up_w = (x[c] for x in _axis_taps(w, side))
        frame_taps = torch.stack([lo_h * side + lo_w, lo_h * side + hi_w, hi_h * side + lo_w, hi_h * side + hi_w], 1)
        frame_weights = torch.stack([(1 - up_h) * (1 - up_w), (1 - up_h) * up_w, up_h * (1 - up_w), up_h * up_w], 1)
        rows.append(r.repeat(t))
        cols.append(c.repeat(t))
        taps.append(frame_taps.repeat(t, 1))
        weights.append(frame_weights.repeat(t, 1))
        segments += [(start + i * h * w, h * w) for i in range(t)]
        start += t * h * w
    return GridTables(torch.cat(rows), torch.cat(cols), torch.cat(taps), torch.cat(weights), tuple(segments))
