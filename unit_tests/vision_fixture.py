"""The tiny image-text checkpoints the tests use, built at test time (never committed) by
lightllm_mtp/tools/make_tiny_vision.py from a trained tiny text fixture: random tower (seeded), text weights the
trained fixture's.

    from unit_tests.vision_fixture import tiny_vision_checkpoint
    model_dir = tiny_vision_checkpoint()            # from tiny_qwen3_5_trained
    model_dir = tiny_vision_checkpoint("qwen3_5_moe")

or the session fixtures `tiny_vision_dir` / `tiny_vision_moe_dir` (import them into a test module or conftest).
Each source is built once per test session into a temporary directory, removed when the session ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from unit_tests.grown_fixtures import grown_checkpoint


def tiny_vision_checkpoint(source: str = "qwen3_5") -> Path:
    """The vision checkpoint grown from the trained fixture `source` (a key of unit_tests/trained_fixtures.py:
    qwen3_5, qwen3_5_moe, qwen3_5_mtp3_ptd); skips the test when that fixture is not there complete."""
    from lightllm_mtp.tools.make_tiny_vision import make_tiny_vision

    return grown_checkpoint("vision", make_tiny_vision, source)


@pytest.fixture(scope="session")
def tiny_vision_dir() -> Path:
    return tiny_vision_checkpoint("qwen3_5")


@pytest.fixture(scope="session")
def tiny_vision_moe_dir() -> Path:
    return tiny_vision_checkpoint("qwen3_5_moe")
