"""A free-list of integer slots on the host (KV token slots, request slots)."""

from __future__ import annotations

import torch


class OutOfSlotsError(RuntimeError):
    pass


class SlotAllocator:
    def __init__(self, size: int, name: str):
        self.size = size
        self.name = name
        self._stack = torch.arange(size, dtype=torch.int32)
        self._top = size  # _stack[:_top] are free
        self._in_use = torch.zeros(size, dtype=torch.bool)

    @property
    def num_free(self) -> int:
        return self._top

    def alloc(self, n: int) -> torch.Tensor:
        """[n] int32 slot ids (host)."""
        if n > self._top:
            raise OutOfSlotsError(f"{self.name}: asked for {n} slots, {self._top} free of {self.size}")
        out = self._stack[self._top - n : self._top].clone()
        self._top -= n
        self._in_use[out.long()] = True
        return out

    def free(self, slots: torch.Tensor) -> None:
        slots = slots.to(device="cpu", dtype=torch.int32).flatten()
        n = slots.numel()
        if n == 0:
            return
        idx = slots.long()
        if not bool(self._in_use[idx].all()) or idx.unique().numel() != n:
            raise RuntimeError(f"{self.name}: double free or foreign slot in {slots.tolist()[:16]}")
        self._in_use[idx] = False
        self._stack[self._top : self._top + n] = slots
        self._top += n
