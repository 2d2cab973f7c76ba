"""Timing helpers shared by the benchmarks: device sync, percentiles, copy bandwidth, forward timers, versions,
the host lines that wait on the device."""

from __future__ import annotations

import collections
import math
import platform
import re
import time
import traceback
import warnings
from pathlib import Path

import torch

# ---- timing helpers --------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(xs: list[float]) -> dict | None:
    if not xs:
        return None
    return {
        "n": len(xs),
        "median_ms": percentile(xs, 50),
        "p10_ms": percentile(xs, 10),
        "p90_ms": percentile(xs, 90),
        "mean_ms": sum(xs) / len(xs),
        "min_ms": min(xs),
    }


def measure_matmul_peak(device: torch.device, size: int = 8192, repeats: int = 20) -> dict | None:
    """bf16 matmul throughput of one [size x size] @ [size x size] product (cuBLAS), best of `repeats`: the prefill
    floor's peak. None off CUDA."""
    if device.type != "cuda":
        return None
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {"tflops": 2 * size**3 / (min(times) / 1e3) / 1e12, "size": size, "repeats": repeats,
            "method": "best of bf16 torch.matmul, CUDA events"}  # fmt: skip


def measure_copy_bandwidth(device: torch.device, repeats: int) -> dict:
    """Device copy bandwidth: (bytes read + bytes written) / time of dst.copy_(src), median of `repeats`."""
    if device.type == "cuda":
        nbytes = 1 << 30
        src = torch.randn(nbytes // 4, device=device)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        method = "CUDA device-to-device copy (torch copy_), timed with CUDA events"
    else:
        nbytes = 64 << 20
        src = torch.randn(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            dst.copy_(src)
            times.append((time.perf_counter() - t) * 1e3)
        method = "CPU memcpy (torch copy_ of host tensors), perf_counter: NOT an HBM figure"
    ok = torch.equal(dst, src)
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not ok:
        raise RuntimeError("bandwidth copy produced a wrong result")
    med = percentile(times, 50)
    return {
        "bytes_per_s": 2 * nbytes / (med / 1e3),
        "GB_per_s": 2 * nbytes / (med / 1e3) / 1e9,
        "buffer_bytes": nbytes,
        "counted_bytes": 2 * nbytes,
        "median_ms": med,
        "repeats": repeats,
        "method": method,
        "floor_label": floor_label(device_info(device)),
    }


# GPUs whose device memory is HBM (datacenter parts); any other CUDA device's floor is named "device-memory"
_HBM_GPU = re.compile(r"\b(A100|A800|A30|H100|H800|H20|H200|GH200|B100|B200|GB200|B300|MI\d{3}[A-Z]?)\b")


def floor_label(device: dict) -> str:
    """The name of the bytes / copy-bandwidth floor, after the device that measured the bandwidth (device_info):
    "H200 HBM floor" on an H200, "host memory-copy floor (cpu)" on CPU, never an HBM floor measured by a memcpy."""
    if device["type"] != "cuda":
        return f"host memory-copy floor ({device['type']})"
    name = device["name"].removeprefix("NVIDIA ").strip()
    hbm = _HBM_GPU.search(name)
    return f"{hbm.group(1)} HBM floor" if hbm else f"{name} device-memory floor"


class ForwardTimer:
    """Times every call of obj.forward (CUDA events on GPU, perf_counter on CPU) by shadowing the bound method."""

    def __init__(self, obj, device: torch.device):
        self.obj, self.device = obj, device
        self.calls: list = []
        inner = obj.forward

        def timed(*a, **kw):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = inner(*a, **kw)
                end.record()
                self.calls.append((start, end))
            else:
                t = time.perf_counter()
                out = inner(*a, **kw)
                self.calls.append((time.perf_counter() - t) * 1e3)
            return out

        obj.forward = timed

    def take(self) -> list:
        """The calls since the last take; their times are read by `calls_ms` once the device has finished them."""
        calls, self.calls = self.calls, []
        return calls

    def remove(self) -> None:
        del self.obj.forward


def calls_ms(calls: list) -> tuple[float, int]:
    """Total ms and number of timed calls (call after a synchronize: CUDA events must have completed)."""
    return sum(c[0].elapsed_time(c[1]) if isinstance(c, tuple) else c for c in calls), len(calls)


class MultiTimer:
    """One ForwardTimer over several draft modules, read as one."""

    def __init__(self, timers: list[ForwardTimer]):
        self.timers = timers

    def take(self) -> list:
        return [c for t in self.timers for c in t.take()]

    def remove(self) -> None:
        for t in self.timers:
            t.remove()


def graph_replay_ms(run, iters: int) -> float:
    """Milliseconds per replay of a CUDA graph of `run()` (warmed up on a side stream first: Triton compilation and
    cuBLAS workspaces stay out of the capture), timed with CUDA events over `iters` replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("triton", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            out[mod] = None
    return out


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": p.name, "memory_GiB": p.total_memory / 2**30, "cuda": torch.version.cuda}
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}


def result_header(script: str, argv: list[str] | None, args, device: torch.device) -> dict:
    """What every results file starts with: the exact command, the model, the device, versions and settings."""
    import dataclasses
    import os
    import sys

    from lightllm_mtp import env

    return {
        "command": " ".join(["python", script, *(argv if argv is not None else sys.argv[1:])]),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("LIGHTLLM_MTP_")},  # the command's env
        "engine_env": {k: str(v) for k, v in dataclasses.asdict(env.ENV).items()},  # the settings in force, defaults included
        "model": {"shape": getattr(args, "model_shape", None), "model_dir": getattr(args, "model_dir", None)},
        "device": device_info(device),
        "versions": versions(),
        "settings": vars(args),
    }


def write_json(report: dict, out: str | None) -> None:
    if out:
        import json

        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2, default=str))


def sync_sites(fn, depth: int = 4) -> tuple[object, list[tuple[str, int]]]:
    """Runs fn with CUDA's sync debug mode on: where the host waited on the device (the innermost `depth` Python
    frames of each synchronizing call), with counts, most frequent first."""
    if not torch.cuda.is_available():
        return fn(), []
    counts: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename][-depth:]
            counts[" <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames))] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return result, counts.most_common(40)


class TritonCompiles:
    """Records each Triton compilation (a kernel specialization not in memory yet: first use, a new constexpr or
    integer-specialization value, an autotuner trying its configs) with its wall time, through triton's JIT hooks."""

    def __init__(self):
        self.events: list[tuple[str, float]] = []  # kernel with its constexprs, ms
        self._started: dict[object, float] = {}

    def __enter__(self) -> "TritonCompiles":
        try:
            from triton import knobs

            self._saved = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
        except (ImportError, AttributeError):  # a triton without these hooks: nothing is recorded
            self._saved = None
            return self

        def before(*, key, repr, **_):
            self._started[str(key)] = time.perf_counter()
            return False  # go on and compile

        def after(*, key, repr, fn, **_):
            t = self._started.pop(str(key), None)
            ms = (time.perf_counter() - t) * 1e3 if t is not None else float("nan")
            self.events.append((f"{fn.name} {str(key)[:600]}", ms))

        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = before, after
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is None:
            return
        from triton import knobs

        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = self._saved
