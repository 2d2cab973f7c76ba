"""What a layer declares of each checkpoint tensor it needs: the loader and the random-weight builder read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TpShard:
    """How a tensor splits over tensor-parallel ranks: along `dim`, each of `sections` (consecutive sizes along
    dim, e.g. [q | k | v] rows) split into tp equal contiguous parts, rank r taking part r of every section.
    sections None: the whole dim is one section. heads: per section, the heads it holds; a section with fewer heads
    than ranks is not split below one head: each head is replicated on tp / heads consecutive ranks (KV heads,
    GDN key heads). pad: the dim need not divide (vocab rows): parts are ceil-sized, the last ones zero-padded."""

    dim: int
    sections: tuple[int, ...] | None = None
    pad: bool = False
    heads: tuple[int, ...] | None = None

    def _parts(self, section: int, rank: int, size: int) -> tuple[int, int]:
        """(parts the section splits into, the part this rank holds)."""
        heads = self.heads[section] if self.heads is not None else None
        if heads is not None and size > heads:
            return heads, rank // (size // heads)
        return size, rank

    def ranges(self, full: int, rank: int, size: int) -> list[tuple[int, int]]:
        """(start, stop) along dim of this rank's pieces, in order."""
        out, base = [], 0
        for i, length in enumerate(self.sections or (full,)):
            parts, mine = self._parts(i, rank, size)
            part = -(-length // parts) if self.pad else length // parts
            start = base + min(mine * part, length)
            out.append((start, base + min((mine + 1) * part, length)))
            base += length
        return out

    def local_size(self, full: int, size: int) -> int:
        if self.pad:
            return -(-full // size)
        return sum(length // self._parts(i, 0, size)[0] for i, length in enumerate(self.sections or (full,)))


@dataclass(frozen=True)
class TensorSpec:
    name: str  # checkpoint tensor name
    shape: tuple[int, ...]  # the full (unsharded) shape in the checkpoint
    keep_fp32: bool = False  # stays fp32 whatever the model dtype (e.g. GDN A_log)
    # Alternative source when `name` is absent: rows of each inner tuple are concatenated (dim 0), the
    # results stacked on a new dim 0. Used for per-expert MoE checkpoints: ((e0.gate, e0.up), (e1.gate, ...)).
    stacked_from: tuple[tuple[str, ...], ...] | None = None
    tp: TpShard | None = None  # None: every tp rank holds the whole tensor
    # a projection weight [..., out, in] that may be stored quantized: FP8 when the checkpoint has its scale sidecar
    # (or under online FP8); the published -FP8 checkpoints quantize exactly these (common/quantization/)
    quantizable: bool = False

    def local_shape(self, rank: int, size: int) -> tuple[int, ...]:
        if self.tp is None or size == 1:
            return tuple(self.shape)
        shape = list(self.shape)
        shape[self.tp.dim] = self.tp.local_size(shape[self.tp.dim], size)
        return tuple(shape)
