"""lightllm-mtp-compat: the reference command `python -m lightllm.server.api_server ...` for users without the
upstream LightLLM (which is not on the package index). It forwards to lightllm_mtp's server.

    pip install --no-build-isolation ./compat/lightllm

It refuses to install where a `lightllm` package is importable already, so it never shadows the real LightLLM.
"""

import sys
from importlib.machinery import PathFinder
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
installed_paths = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # not this source tree's own package
existing = PathFinder.find_spec("lightllm", installed_paths)
if existing is not None:
    location = list(existing.submodule_search_locations or [existing.origin])
    ours = any((Path(loc) / "lightllm_mtp_compat_marker.py").is_file() for loc in location)
    if not ours:
        raise SystemExit(
            f"a `lightllm` package is installed already ({location[0]}): lightllm-mtp-compat would shadow it; "
            "run `python -m lightllm_mtp.server.api_server` instead"
        )

setup(
    name="lightllm-mtp-compat",
    version="0.1.0",
    description="`python -m lightllm.server.api_server` forwarding to lightllm_mtp's server",
    packages=["lightllm", "lightllm.server"],
    install_requires=["lightllm_mtp"],
)
