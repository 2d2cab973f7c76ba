"""Repository-wide pytest hooks: GPU-marked tests are skipped (and reported as skipped) without CUDA."""

import importlib.util
import os

import pytest
import torch

os.environ.setdefault("LIGHTLLM_MTP_DISABLE_PROGRESS_BARS", "1")
# The tiny test models are dominated by thread start-up costs: one intra-op thread is ~20x faster on CPU.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


# The server's tests need the `server` extra (and the official `openai` client for the e2e tests). Where it is absent
# (a GPU machine running `pytest -m gpu` with the engine's dependencies only) they are not collected.
SERVER_EXTRA = ("fastapi", "uvicorn", "pydantic", "httpx", "prometheus_client", "openai")
MISSING_SERVER_EXTRA = [name for name in SERVER_EXTRA if importlib.util.find_spec(name) is None]
SERVER_TESTS = ["unit_tests/server/*", "test/test_server*", "unit_tests/benchmark/test_serving*"]
collect_ignore_glob = SERVER_TESTS if MISSING_SERVER_EXTRA else []


def pytest_report_header(config):
    if MISSING_SERVER_EXTRA:
        return f"server tests not collected: {', '.join(MISSING_SERVER_EXTRA)} not installed (pip install -e '.[test]')"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _tiny(tmp_path_factory, name, **kwargs):
    from lightllm_mtp.tools.make_tiny_checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(out_dir=tmp_path_factory.mktemp(name), mtp_layers=1, seed=0, **kwargs)


@pytest.fixture(scope="session")
def tiny_dense_dir(tmp_path_factory):
    return _tiny(tmp_path_factory, "tiny_dense", arch="qwen3_5")


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory):
    return _tiny(tmp_path_factory, "tiny_moe", arch="qwen3_5_moe")


@pytest.fixture(scope="session")
def tiny_dense_tied_dir(tmp_path_factory):
    return _tiny(tmp_path_factory, "tiny_dense_tied", arch="qwen3_5", tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tiny_yarn_dir(tmp_path_factory, tiny_dense_dir):
    """tiny_dense_dir with a 64-position native window and YaRN factor 4 over it (unit_tests/rope_fixtures.py)."""
    from unit_tests.rope_fixtures import YARN, with_rope

    return with_rope(tiny_dense_dir, tmp_path_factory.mktemp("tiny_yarn") / "ckpt", YARN)


@pytest.fixture(scope="session")
def tiny_dense_mtp3_dir(tmp_path_factory):
    from lightllm_mtp.tools.make_tiny_checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(arch="qwen3_5", out_dir=tmp_path_factory.mktemp("dense_mtp3"), mtp_layers=3, seed=1,
                                 ptd=True)


@pytest.fixture(scope="session")
def tiny_moe_mtp3_dir(tmp_path_factory):
    from lightllm_mtp.tools.make_tiny_checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(arch="qwen3_5_moe", out_dir=tmp_path_factory.mktemp("moe_mtp3"), mtp_layers=3, seed=1,
                                 ptd=True)


def _trained(arch):
    from unit_tests.trained_fixtures import trained_fixture, trained_fixture_path

    model_dir = trained_fixture(arch)
    if model_dir is None:
        where = trained_fixture_path(arch)
        pytest.skip(f"trained {arch} checkpoint not there complete at {where} (recipe: fixtures/README.md)")
    return model_dir


@pytest.fixture(scope="session")
def trained_dense_dir():
    return _trained("qwen3_5")


@pytest.fixture(scope="session")
def trained_moe_dir():
    return _trained("qwen3_5_moe")


@pytest.fixture(scope="session")
def trained_draft_dir():
    """A small draft model for the trained dense target (same tokenizer)."""
    return _trained("qwen3_5_draft")


@pytest.fixture(scope="session")
def trained_pard_draft_dir():
    """The PARD variant (mask-token training; pard_token in its config)."""
    return _trained("qwen3_5_draft_pard")


@pytest.fixture(scope="session")
def trained_mtp3_ptd_dir():
    """Dense, 3 trained MTP modules and trained parallel-drafting mask inputs."""
    return _trained("qwen3_5_mtp3_ptd")


def _fp8(tmp_path_factory, arch, name, **kwargs):
    """A block-FP8 copy of a trained fixture in the published -FP8 layout, built at test time (never committed)."""
    from lightllm_mtp.tools.quantize_fp8 import quantize_checkpoint

    return quantize_checkpoint(_trained(arch), tmp_path_factory.mktemp(name) / "ckpt", **kwargs)


@pytest.fixture(scope="session")
def fp8_dense_dir(tmp_path_factory):
    """tiny_qwen3_5_trained quantized by tools/quantize_fp8.py (bf16 scales, as Qwen3.5 -FP8 ships them)."""
    return _fp8(tmp_path_factory, "qwen3_5", "fp8_dense")


@pytest.fixture(scope="session")
def fp8_moe_dir(tmp_path_factory):
    """tiny_qwen3_5_moe_trained quantized (per-expert experts, each with its own scale)."""
    return _fp8(tmp_path_factory, "qwen3_5_moe", "fp8_moe")


@pytest.fixture(scope="session")
def fp8_mtp3_ptd_dir(tmp_path_factory):
    """tiny_qwen3_5_mtp3_ptd_trained quantized: 3 FP8 MTP modules, fp32 scales (as Qwen3-Next -FP8 ships them)."""
    import torch

    return _fp8(tmp_path_factory, "qwen3_5_mtp3_ptd", "fp8_mtp3_ptd", scale_dtype=torch.float32)
