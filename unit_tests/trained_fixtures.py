"""The trained tiny checkpoints the tests use: the main job's, shipped in the runtime package
(lightllm_mtp/fixtures/), and the test-only ones under fixtures/ at the repository root (recipes: fixtures/README.md)."""

from pathlib import Path

from lightllm_mtp.tools.default_checkpoint import FIXTURES_DIR, TRAINED_CHECKPOINTS, complete_checkpoint

TEST_FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"
TEST_CHECKPOINTS = {
    "qwen3_5_moe": "tiny_qwen3_5_moe_trained",
    # dense, 3 MTP modules (multi-layer MTP) and parallel-drafting mask inputs on one target
    "qwen3_5_mtp3_ptd": "tiny_qwen3_5_mtp3_ptd_trained",
    # small draft models for tiny_qwen3_5_trained (mtp_mode=draft_model): autoregressive, and PARD
    "qwen3_5_draft": "tiny_qwen3_5_draft_trained",
    "qwen3_5_draft_pard": "tiny_qwen3_5_draft_pard_trained",
}


def trained_fixture_path(name: str) -> Path:
    """Where the trained checkpoint `name` (a key of TRAINED_CHECKPOINTS or TEST_CHECKPOINTS) lives."""
    if name in TRAINED_CHECKPOINTS:
        return FIXTURES_DIR / TRAINED_CHECKPOINTS[name]
    if name in TEST_CHECKPOINTS:
        return TEST_FIXTURES_DIR / TEST_CHECKPOINTS[name]
    raise KeyError(f"no trained fixture {name!r}; known: {sorted(TRAINED_CHECKPOINTS) + sorted(TEST_CHECKPOINTS)}")


def trained_fixture(name: str) -> Path | None:
    """The trained checkpoint `name` when it is there complete, else None."""
    return complete_checkpoint(trained_fixture_path(name))


DENSE = trained_fixture_path("qwen3_5")
MOE = trained_fixture_path("qwen3_5_moe")
MTP3_PTD = trained_fixture_path("qwen3_5_mtp3_ptd")
DRAFT = trained_fixture_path("qwen3_5_draft")
PARD_DRAFT = trained_fixture_path("qwen3_5_draft_pard")
