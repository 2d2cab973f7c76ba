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


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 132 (an H100/H200) elsewhere, e.g. under the interpreter."""
    if device.type != "cuda":
        return 132
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def attend_paged_range(
        q, m_i, l_i, acc,  # q [BLOCK_M, BLOCK_D]; running max / sum [BLOCK_M] (log2 domain); acc [BLOCK_M, BLOCK_DV]
        K, V, token_row,  # token_row: req_to_token row of the request (pool slot of each position)
        kvh, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh, stride_vd,
        pos, start, end, qk_scale,  # pos [BLOCK_M]: absolute position of each q row; keys start..end-1
        D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
        MASKED: tl.constexpr, COMPUTE_FP32: tl.constexpr,
    ):
        """Online-softmax pass of a q tile over the keys start..end-1 of one request and KV head, rows read through
        the page table. MASKED applies the length and causal masks (a row may then see no key of a tile: guarded);
        unmasked ranges must be whole BLOCK_N tiles every row may attend to."""
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_d = offs_d < D
        mask_dv = offs_dv < DV
        k_base = K + kvh * stride_kh + offs_d[None, :] * stride_kd
        v_base = V + kvh * stride_vh + offs_dv[None, :] * stride_vd
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + offs_n
            if MASKED:
                mask_n = offs < end
                slot = tl.load(token_row + offs, mask=mask_n, other=0).to(tl.int64)
                k = tl.load(k_base + slot[:, None] * stride_kp, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
                v = tl.load(v_base + slot[:, None] * stride_vp, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
            else:
                slot = tl.load(token_row + offs).to(tl.int64)
                k = tl.load(k_base + slot[:, None] * stride_kp, mask=mask_d[None, :], other=0.0)
                v = tl.load(v_base + slot[:, None] * stride_vp, mask=mask_dv[None, :], other=0.0)
            if COMPUTE_FP32:
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * qk_scale
            if MASKED:
                allowed = mask_n[None, :] & (offs[None, :] <= pos[:, None])
                s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if MASKED:  # a row that has seen no key yet keeps m = -inf: shift by 0 instead (its p is 0)
                m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            else:
                m_new_safe = m_new
            alpha = tl.exp2(m_i - m_new_safe)
            p = tl.exp2(s - m_new_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if COMPUTE_FP32:
                pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        return m_i, l_i, acc
