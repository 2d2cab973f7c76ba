"""One declaration per option: the server's flags, the main job's flags and LLM(...)'s keywords are derived from the
option fields of EngineArgs / ServerArgs, and nothing else exists."""

import argparse
import dataclasses
import inspect

import pytest
import torch

from lightllm_mtp.config.cli import add_options, values_given
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.options import options_of, spellings
from lightllm_mtp.engine.llm import LLM

ENGINE = [o.name for o in options_of(EngineArgs)]


def _parser_dests(parser: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in parser._actions if a.dest != "help"}


def _server_parser():
    pytest.importorskip("fastapi")
    from lightllm_mtp.server.args import ServerArgs, build_parser

    return build_parser(), [o.name for o in options_of(ServerArgs)]


def test_every_server_flag_is_a_declared_option_and_back():
    parser, server = _server_parser()
    assert _parser_dests(parser) == set(ENGINE) | set(server)
    flags = {s for a in parser._actions for s in a.option_strings}
    for name in ENGINE + server:  # both spellings of every name
        assert set(spellings(name)) <= flags, name


def test_every_llm_keyword_is_a_declared_option_and_back():
    params = inspect.signature(LLM.__init__).parameters
    assert set(params) - {"self", "model"} == set(ENGINE)
    for opt in options_of(EngineArgs):
        if not opt.required:
            assert params[opt.name].default == opt.default, opt.name


def test_every_main_job_engine_flag_is_a_declared_option():
    from lightllm_mtp import __main__ as main_job

    parser = argparse.ArgumentParser()
    add_options(parser, EngineArgs, optional=("model_dir",), defaults=dict(mtp_mode="eagle_with_att", mtp_step=2))
    assert _parser_dests(parser) == set(ENGINE)
    assert set(main_job.PLAIN) <= set(ENGINE)


def test_every_option_has_help_and_a_group():
    for cls in [EngineArgs]:
        for opt in options_of(cls):
            assert opt.meta.help and opt.meta.group, opt.name
    fields = {f.name for f in dataclasses.fields(EngineArgs) if f.init}
    assert fields == set(ENGINE)  # no init field escapes the declaration


def test_dash_and_underscore_spellings_and_aliases_land_in_one_field(tiny_dense_dir):
    parser, _ = _server_parser()
    from lightllm_mtp.server.args import server_args_from_namespace

    ns = parser.parse_args(["--model-dir", str(tiny_dense_dir), "--max-batch-size", "4", "--max_model_len", "64",
                            "--data-type", "bf16", "--no-prefix-cache", "--mtp-mode", "eagle_with_att",
                            "--num-speculative-tokens", "2", "--max-num-batched-tokens", "128", "--port", "9"])
    a = server_args_from_namespace(ns)
    e = a.engine
    assert (e.max_batch_size, e.max_model_len, e.dtype, e.prefix_cache) == (4, 64, torch.bfloat16, False)
    assert (e.spec.num_draft_tokens, e.chunked_prefill_size, a.port) == (2, 128, 9)
    legacy = server_args_from_namespace(parser.parse_args(
        ["--model", str(tiny_dense_dir), "--running_max_req_size", "3", "--max_req_total_len", "64",
         "--disable_prefix_cache", "--disable_cudagraph", "--max-num-seqs", "3"]))  # fmt: skip
    assert (legacy.engine.max_batch_size, legacy.engine.prefix_cache, legacy.engine.graph_max_batch_size) == (3, False, 0)


@pytest.mark.parametrize("text, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("half", torch.float16),
                                         ("fp32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_lightllm_short_dtype_names(text, dtype):
    assert EngineArgs(model_dir="-", dtype=text).dtype is dtype


def test_help_shows_user_facing_values_only(capsys):
    parser, _ = _server_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "LoadFormat." not in out and "torch." not in out and "MtpMode." not in out
    assert "(default: auto)" in out and "--model-dir" in out


def test_flags_not_given_keep_the_declared_default():
    parser = argparse.ArgumentParser()
    add_options(parser, EngineArgs)
    given = values_given(parser.parse_args(["--model_dir", "x", "--tp", "2"]), EngineArgs)
    assert given == {"model_dir": "x", "tp": 2}


def test_llm_keyword_errors(tiny_dense_dir):
    with pytest.raises(TypeError, match="did you mean 'max_batch_size'"):
        LLM(tiny_dense_dir, max_batch=4)
    with pytest.raises(TypeError, match="both model and model_dir"):
        LLM(tiny_dense_dir, model=tiny_dense_dir)
    with pytest.raises(TypeError, match="needs a model directory"):
        LLM()


def test_model_alias_and_hub_id_message(tiny_dense_dir):
    llm = LLM(model=tiny_dense_dir, max_model_len=32, max_batch_size=2)
    assert llm.engine.args.model_dir == str(tiny_dense_dir)
    with pytest.raises(ValueError, match="a local checkpoint directory is expected.*hub id"):
        LLM(model="Qwen/Qwen3.5-27B")


def test_mtp_cross_checks_live_in_engine_args():
    with pytest.raises(ValueError, match="needs mtp_step"):
        EngineArgs(model_dir="-", mtp_mode="eagle_with_att")
    with pytest.raises(ValueError, match="need mtp_mode"):
        EngineArgs(model_dir="-", mtp_step=2)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        EngineArgs(model_dir="-", mem_fraction=0.9)
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineArgs(model_dir="-", cpu_threads=0)


def test_flags_page_is_generated_from_the_declarations():
    pytest.importorskip("fastapi")
    from pathlib import Path

    from lightllm_mtp.tools.flags_doc import render

    page = Path(__file__).resolve().parents[2] / "docs" / "flags.md"
    assert page.read_text() == render(), "regenerate: python -m lightllm_mtp.tools.flags_doc > docs/flags.md"
