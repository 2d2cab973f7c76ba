"""What a layer declares of each checkpoint tensor it needs: the loader and the random-weight builder read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TpShard:
    """How a tensor splits over tensor-parallel ranks: along `dim`, each of `sections` (consecutive sizes along
    dim, e.g. [q | k | v] rows) split into tp equal contiguous parts, rank r taking part r of every section.
    sections None: the whole dim is one section. pad: the dim need not divide (vocab rows): parts are ceil-sized
    and the last ones padded with zeros."""

    dim: int
    sections: tuple[int, ...] | None = None
    pad: bool = False

    def ranges(self, full: int, rank: int, size: int) -> list[tuple[int, int]]:
        """(start, stop) along dim of this rank's pieces, in order."""
        out, base = [], 0
        for length in self.sections or (full,):
            part = -(-length // size) if self.pad else length // size
            start = base + min(rank * part, length)
            out.append((start, base + min((rank + 1) * part, length)))
            base += length
        return out

    def local_size(self, full: int, size: int) -> int:
        if self.pad:
            return -(-full // size)
        return sum(length // size for length in self.sections or (full,))


@dataclass(frozen=True)
class TensorSpec:
    name: str  # checkpoint tensor name
    shape: tuple[int, ...]  # the full (unsharded) shape in the checkpoint
    keep_fp32: bool = False  # stays fp32 whatever the model dtype (e.g. GDN A_log)
    # Alternative source when `name` is absent: rows of each inner tuple are concatenated (dim 0), the
    # results stacked on a new dim 0. Used for per-expert MoE checkpoints: ((e0.gate, e0.up), (e1.gate, ...)).
    stacked_from: tuple[tuple[str, ...], ...] | None = None
    tp: TpShard | None = None  # None: every tp rank holds the whole tensor

    def local_shape(self, rank: int, size: int) -> tuple[int, ...]:
        if self.tp is None or size == 1:
            return tuple(self.shape)
        shape = list(self.shape)
        shape[self.tp.dim] = self.tp.local_size(shape[self.tp.dim], size)
        return tuple(shape)
