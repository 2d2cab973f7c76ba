"""Repository-wide pytest hooks: GPU-marked tests are skipped (and reported as skipped) without CUDA."""

import os

import pytest
import torch

os.environ.setdefault("LIGHTLLM_MTP_DISABLE_PROGRESS_BARS", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
