"""The only module that reads environment variables. Every variable is prefixed LIGHTLLM_MTP_."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _get_str(name: str, default: str) -> str:
    return os.environ.get(f"LIGHTLLM_MTP_{name}", default)


def _get_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(f"LIGHTLLM_MTP_{name}")
    if raw is None:
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _get_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _get_str(name, default).strip().lower()
    if value not in choices:
        raise ValueError(f"LIGHTLLM_MTP_{name} must be one of {list(choices)}, got {value!r}")
    return value


@dataclass(frozen=True)
class Env:
    # Where built-on-first-use artefacts (the tiny default checkpoint) are kept.
    cache_dir: Path
    # Force the PyTorch reference kernels even on GPU (debugging / oracle runs).
    force_reference_kernels: bool
    # Hide the tqdm progress bars (weight loading, benchmarks).
    disable_progress_bars: bool
    # Serving diagnostics: each model worker runs under cProfile and writes its stats to this path + ".rank<N>"
    # when it shuts down (None: off).
    worker_profile: str | None
    # torch.distributed backend of the tp / pp forwards: "auto" (NCCL on CUDA, gloo on CPU), "nccl", or "gloo".
    # gloo on CUDA stages every tensor through host memory and puts all ranks on the driver's GPU: tp / pp tests on
    # one GPU (two NCCL ranks cannot share one); CUDA graphs only under pp alone there (tp collectives run eagerly).
    dist_backend: str
    # Programmatic dependent launch for the Triton kernels listed in kernels/pdl.py (CUDA sm90+): each kernel's
    # launch overlaps its predecessor's tail and waits (griddepcontrol.wait) before touching memory. On by default
    # (35B-A3B B=1 decode 3.42 -> 3.12 ms on the H100, benchmark/results/stop27_h100_log.txt); 0 turns it off.
    pdl: bool


def _read_env() -> Env:
    default_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lightllm_mtp"
    return Env(
        cache_dir=Path(_get_str("CACHE_DIR", str(default_cache))),
        force_reference_kernels=_get_bool("FORCE_REFERENCE_KERNELS", False),
        disable_progress_bars=_get_bool("DISABLE_PROGRESS_BARS", False),
        worker_profile=_get_str("WORKER_PROFILE", "") or None,
        dist_backend=_get_choice("DIST_BACKEND", "auto", ("auto", "nccl", "gloo")),
        pdl=_get_bool("PDL", True),
    )


ENV = _read_env()
