"""Every benchmark script imports on CPU (the GPU ones only run their main on the device): a renamed or removed name
they import is caught here, not in the next GPU session."""

import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "benchmark").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports(name):
    importlib.import_module(f"benchmark.{name}")
