"""Programmatic dependent launch (CUDA sm90+): a kernel launched with launch_pdl=True may be scheduled while the
kernel before it on the stream still runs; it must execute `pdl_wait` before reading anything an earlier kernel
wrote, or writing anything an earlier kernel reads (the wait returns once that kernel has finished and its writes
are visible). The kernels that take it (a PDL constexpr, `pdl_wait(PDL)` first): rmsnorm, gated rmsnorm, the conv
update, the GDN decode, q/k norm + RoPE, split-K decode attention, the output gate, SiLU-mul, the GEMV, route_align
and the MoE expert pass. The interpreter, ROCm, older GPUs and a Triton without the launch option compile the plain
kernel."""

from __future__ import annotations

import functools

import torch

from lightllm_mtp import env
from lightllm_mtp.kernels.triton_utils import cuda_index, triton_available


def use_pdl(t: torch.Tensor) -> bool:
    """Whether a kernel on tensors like t launches with PDL: CUDA (not ROCm) sm90+, a Triton with the launch option,
    and LIGHTLLM_MTP_PDL not 0."""
    if not (t.is_cuda and env.ENV.pdl and torch.version.hip is None and _triton_launches_pdl()):
        return False
    return _capability(cuda_index(t.device)) >= (9, 0)


def pdl_args(t: torch.Tensor) -> dict:
    """Launch keywords of a kernel with a PDL constexpr, for tensors like t (launch_pdl only when on: Tritons
    without the option reject the keyword)."""
    return {"PDL": True, "launch_pdl": True} if use_pdl(t) else {"PDL": False}


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


@functools.cache
def _triton_launches_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        """First statement of a PDL kernel: wait for the previous kernel, then let the next one be scheduled (it
        waits in turn, so every kernel's reads and writes stay ordered after its predecessors')."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
