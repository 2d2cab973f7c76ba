"""The tiny chat checkpoints the tests use, built at test time (never committed) by
lightllm_mtp/tools/make_tiny_chat.py from a trained tiny text fixture: Qwen3.5's chat tokens (`<think>`, `</think>`,
`<tool_call>`, ... as single, non-special added tokens, as the published tokenizer has them) and the shipped Qwen3.5
chat template, so that the reasoning, tool-call and structured-output tests run through the tokens users get.

    from unit_tests.chat_fixture import tiny_chat_checkpoint
    model_dir = tiny_chat_checkpoint()                    # from tiny_qwen3_5_trained
    model_dir = tiny_chat_checkpoint("qwen3_5_mtp3_ptd")  # 3 MTP modules, parallel drafting

or the session fixture `tiny_chat_dir` (import it into a test module or conftest). Each source is built once per
test session into a temporary directory, removed when the session ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from unit_tests.grown_fixtures import grown_checkpoint


def tiny_chat_checkpoint(source: str = "qwen3_5") -> Path:
    """The chat checkpoint grown from the trained fixture `source` (a key of unit_tests/trained_fixtures.py);
    skips the test when that fixture is not there complete."""
    from lightllm_mtp.tools.make_tiny_chat import make_tiny_chat

    return grown_checkpoint("chat", make_tiny_chat, source)


@pytest.fixture(scope="session")
def tiny_chat_dir() -> Path:
    return tiny_chat_checkpoint("qwen3_5")
