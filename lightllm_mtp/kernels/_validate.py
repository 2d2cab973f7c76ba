"""Cheap argument checks shared by the kernel wrappers: metadata only, never a host sync."""

from __future__ import annotations

from collections.abc import Sequence

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def check_ndim(op: str, name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: {name} must be a tensor {layout}, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D {layout}, got shape {_fmt(t.shape)}")


def check_shape(op: str, name: str, t: torch.Tensor, shape: Sequence[int | None], layout: str) -> None:
    """shape entries of None match any size."""
    check_ndim(op, name, t, len(shape), layout)
    if any(want is not None and got != want for got, want in zip(t.shape, shape)):
        expected = _fmt(["*" if s is None else s for s in shape])
        raise ValueError(f"{op}: {name} must have shape {layout} = {expected}, got {_fmt(t.shape)}")


def check_dtype(op: str, name: str, t: torch.Tensor, dtypes: Sequence[torch.dtype]) -> None:
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{op}: {name} must have dtype in ({allowed}), got {str(t.dtype).replace('torch.', '')}")


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    check_dtype(op, name, t, FLOAT_DTYPES)


def check_index(op: str, name: str, t: torch.Tensor) -> None:
    check_dtype(op, name, t, INDEX_DTYPES)


def check_same_dtype(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.dtype != ref.dtype:
            raise ValueError(f"{op}: {name} dtype {t.dtype} differs from {ref_name} dtype {ref.dtype}")


def check_device(op: str, **tensors: torch.Tensor) -> None:
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{op}: {name} is on {t.device} but {first_name} is on {first.device}")
