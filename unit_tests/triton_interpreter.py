"""Kernel tests under Triton's interpreter on CPU: TRITON_INTERPRET must be set before triton is first imported, so
the checks run in a fresh Python (a script, or a test file run as a program), from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_interpreted(script: str | None = None, *, file: str | Path | None = None, timeout: int = 300) -> str:
    """Runs `script` (python -c) or `file` under the interpreter on one thread; returns its stdout, and fails the
    test with its stderr when it exits non-zero."""
    assert (script is None) != (file is None), "a script or a file"
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env.pop("LIGHTLLM_MTP_FORCE_REFERENCE_KERNELS", None)  # the checks compare the Triton path with the references
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-c", script] if script is not None else [sys.executable, str(file)]
    res = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stdout


def allow_tensor_loop_bounds() -> None:
    """In the interpreted process: numpy >= 2.4 refuses int() of the interpreter's 1-element scalar arrays, which
    `range(start, end, ...)` over loaded values needs (loop bounds): index them by their element."""
    import triton.runtime.interpreter as interp

    patch_tensor = interp._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = _patch_lang_tensor
