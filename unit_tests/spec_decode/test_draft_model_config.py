"""Start-up errors of the draft-model modes: each names the problem before any request runs."""

import json
import shutil

import pytest

from lightllm_mtp import LLM
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.spec_config import MtpMode, SpecConfig
from unit_tests.spec_decode.draft_model_fixtures import edit_config


@pytest.fixture(scope="module")
def draft_copy(tiny_dense_dir, tmp_path_factory):
    def make(name):
        return shutil.copytree(tiny_dense_dir, tmp_path_factory.mktemp("bad") / name)

    return make


def _llm(target, draft, **kw):
    return LLM(target, max_model_len=64, mtp_mode="draft_model", mtp_step=2, mtp_draft_model_dir=draft, **kw)


def test_config_errors():
    with pytest.raises(ValueError, match="needs mtp_draft_model_dir"):
        SpecConfig(MtpMode.DRAFT_MODEL, 2)
    with pytest.raises(ValueError, match="mtp_mask_token_id is PARD's mask token"):
        SpecConfig(MtpMode.DRAFT_MODEL, 2, "/d", mask_token_id=3)
    with pytest.raises(ValueError, match="parallel_drafting needs"):
        SpecConfig(MtpMode.VANILLA_WITH_ATT, 2, parallel_drafting=True)
    with pytest.raises(ValueError, match="mtp_mask_token_id is set but mtp_mode is not"):
        EngineArgs("/m", mtp_mask_token_id=3)
    spec = EngineArgs("/m", mtp_mode="draft_model", mtp_step=3, mtp_draft_model_dir="/d", parallel_drafting=True).spec
    assert spec.mode is MtpMode.DRAFT_MODEL and spec.num_draft_modules == 0 and spec.num_context_rows == 0


def test_missing_directory(tiny_dense_dir, tmp_path):
    with pytest.raises(ValueError, match="no such directory"):
        _llm(tiny_dense_dir, tmp_path / "absent")


def test_other_vocabulary(tiny_dense_dir, draft_copy):
    draft = draft_copy("vocab")
    cfg = json.loads((draft / "config.json").read_text())
    edit_config(draft, vocab_size=cfg["text_config"]["vocab_size"] + 64)
    with pytest.raises(ValueError, match=r"vocab_size \d+, the target .* has \d+"):
        _llm(tiny_dense_dir, draft)


def test_other_tokenizer(tiny_dense_dir, draft_copy):
    draft = draft_copy("tokenizer")
    tok = json.loads((draft / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = "def", "class"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="different tokenizers: '(def|class)' is id"):
        _llm(tiny_dense_dir, draft)


def test_draft_context_too_short(tiny_dense_dir, draft_copy):
    draft = draft_copy("context")
    edit_config(draft, max_position_embeddings=32)
    with pytest.raises(ValueError, match="max_position_embeddings 32 < max_model_len 64"):
        _llm(tiny_dense_dir, draft)


def test_pard_needs_a_mask_token(tiny_dense_dir, draft_copy):
    draft = draft_copy("no_mask")
    with pytest.raises(ValueError, match="needs a mask token id"):
        _llm(tiny_dense_dir, draft, parallel_drafting=True)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        _llm(tiny_dense_dir, draft, parallel_drafting=True, mtp_mask_token_id=10**6)
