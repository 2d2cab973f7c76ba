"""Checkpoints grown at test time from a trained tiny fixture (lightllm_mtp/tools/grow_vocab.py and the tools built on
it): each (tool, source) built once per test session into a temporary directory, removed when the session ends;
vision_fixture.py and chat_fixture.py name them."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from unit_tests.trained_fixtures import trained_fixture, trained_fixture_path

_BUILT: dict[tuple[str, str], Path] = {}


def grown_checkpoint(kind: str, make: Callable[..., Path], source: str) -> Path:
    """`make(out_dir, source_dir, seed=0)` over the trained fixture `source` (a key of unit_tests/trained_fixtures.py),
    cached per (kind, source); skips the test when that fixture is not there complete."""
    if (kind, source) not in _BUILT:
        model_dir = trained_fixture(source)
        if model_dir is None:
            pytest.skip(f"trained {source} checkpoint not there complete at {trained_fixture_path(source)}")
        root = Path(tempfile.mkdtemp(prefix=f"tiny_{kind}_{source}_"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _BUILT[kind, source] = make(root / "ckpt", model_dir, seed=0)
    return _BUILT[kind, source]


def assert_regrown_identically(make: Callable[..., Path], grown: Path, out: Path, source: str = "qwen3_5") -> None:
    """A grow tool's contract: `make` over the trained fixture `source` with seed 0 writes `grown`'s files byte for
    byte again (into `out`/again), and refuses a source that already has its tokens (into `out`/twice)."""
    again = make(out / "again", trained_fixture_path(source), seed=0)
    for path in grown.iterdir():
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name
    with pytest.raises(SystemExit, match="already has"):
        make(out / "twice", grown)
