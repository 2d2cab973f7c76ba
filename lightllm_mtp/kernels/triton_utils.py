"""When the kernel wrappers dispatch to their Triton implementations (Triton may be absent on CPU machines)."""

from __future__ import annotations

import functools

import torch

from lightllm_mtp import env


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # missing, or broken for this platform
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    """Triton kernels run on CUDA tensors unless LIGHTLLM_MTP_FORCE_REFERENCE_KERNELS is set."""
    return t.is_cuda and triton_available() and not env.ENV.force_reference_kernels


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1); triton.next_power_of_2 without needing triton."""
    return 1 << max(n - 1, 0).bit_length()


def cuda_index(device: torch.device) -> int:
    """The index of a CUDA device ("cuda" alone: the current one)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 132 (an H100/H200) elsewhere, e.g. under the interpreter."""
    if device.type != "cuda":
        return 132
    return sm_count(cuda_index(device))


@functools.cache
def _smem_optin(device_index: int) -> int:
    return getattr(torch.cuda.get_device_properties(device_index), "shared_memory_per_block_optin", 0)


def shared_memory_per_block(device: torch.device) -> int:
    """Bytes of shared memory one block may opt in to on a CUDA device; 0 elsewhere (or when torch does not say)."""
    if device.type != "cuda":
        return 0
    return _smem_optin(cuda_index(device))


def to_device_async(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor made on the host for the next launch -> `device` without waiting for the queued work: on CUDA
    through pinned memory with a non-blocking copy (a pageable copy would sync the stream), elsewhere a plain copy."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def unspecialized(*names: str) -> dict:
    """triton.jit keyword arguments that compile one kernel whatever the values of these arguments: integers not
    specialized on 1 or on divisibility by 16, pointers not on 16-byte alignment (where this triton can say so). For
    index kernels whose runtime counts, offsets and views of packed buffers would otherwise each compile a variant,
    seconds apiece in the middle of serving."""
    import inspect

    import triton

    kw = {"do_not_specialize": list(names)}
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        kw["do_not_specialize_on_alignment"] = list(names)
    return kw
