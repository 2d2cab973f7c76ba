"""What a layer declares of each checkpoint tensor it needs: the loader and the random-weight builder read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str  # checkpoint tensor name
    shape: tuple[int, ...]
    keep_fp32: bool = False  # stays fp32 whatever the model dtype (e.g. GDN A_log)
    # Alternative source when `name` is absent: rows of each inner tuple are concatenated (dim 0), the
    # results stacked on a new dim 0. Used for per-expert MoE checkpoints: ((e0.gate, e0.up), (e1.gate, ...)).
    stacked_from: tuple[tuple[str, ...], ...] | None = None
