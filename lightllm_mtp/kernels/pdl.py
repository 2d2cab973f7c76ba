"""Programmatic dependent launch (sm90+): a kernel launched with launch_pdl=True may be scheduled while the kernel
before it on the stream still runs; it must execute `pdl_wait` before reading anything an earlier kernel wrote (the
wait returns once that kernel has finished and its writes are visible). Kernels take a PDL constexpr so the
interpreter and older GPUs compile the plain kernel."""

from __future__ import annotations

import functools

import torch

from lightllm_mtp import env
from lightllm_mtp.kernels.triton_utils import triton_available


def use_pdl(t: torch.Tensor) -> bool:
    """Whether a kernel on tensors like t launches with PDL: CUDA sm90+ with LIGHTLLM_MTP_PDL set."""
    if not (t.is_cuda and env.ENV.pdl):
        return False
    return _capability(t.device.index if t.device.index is not None else torch.cuda.current_device()) >= (9, 0)


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        """First statement of a PDL kernel: wait for the previous kernel, then let the next one be scheduled (it
        waits in turn, so the order of every read after a write is kept)."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()


def pdl_args(t: torch.Tensor) -> dict:
    """Launch keywords of a kernel with a PDL constexpr, for tensors like t."""
    on = use_pdl(t)
    return {"PDL": on, "launch_pdl": on}
