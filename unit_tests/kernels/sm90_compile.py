"""Compile a Triton kernel for the H100 / H200 (sm_90) on a CPU machine, specialized as the launcher would specialize
it: what the interpreter cannot check (lowering of e4m3 conversions and tensor-core dots, dtype mismatches in tl.dot,
shared memory over the SM's 227 KB). Shared by the kernels' compile tests."""

import pytest

SMEM_LIMIT = 227 * 1024


def compile_sm90(fn, args, constexprs, **options):
    """fn for sm_90. args: pointers as type strings ("*bf16"), floats as fp32 scalars, ints as i32 with the launcher's
    16-divisibility hint when divisible by 16; ints equal to 1 (unit strides) become constexprs, as the launcher
    specializes them (without that the loads are neither vectorized nor pipelined and shared memory is
    under-reported). Skips where this triton cannot compile ahead of time or has no ptxas; fails above the SM's
    shared memory."""
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        pytest.skip("this triton has no ASTSource / GPUTarget")
    signature, attrs, constexprs = {}, {}, dict(constexprs)
    for i, name in enumerate(fn.arg_names):
        value = args.get(name)
        if name in constexprs or (isinstance(value, int) and value == 1):
            signature[name] = "constexpr"
            constexprs.setdefault(name, value)
            continue
        signature[name] = value if isinstance(value, str) else "fp32" if isinstance(value, float) else "i32"
        if isinstance(value, str) or (isinstance(value, int) and value % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    try:
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    except RuntimeError as err:  # no ptxas on this machine (not a kernel error)
        if "ptxas" in str(err).lower() and "not found" in str(err).lower():
            pytest.skip(str(err))
        raise
    assert kernel.metadata.shared <= SMEM_LIMIT, (fn.__name__, kernel.metadata.shared)
    return kernel
