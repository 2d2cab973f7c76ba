"""Flag parsing and start-up validation: every bad combination exits with status 2 and a clear message."""

import pytest
import torch

from lightllm_mtp.server.args import build_parser, parse_server_args
from lightllm_mtp.config.spec_config import MtpMode


def parse_error(capsys, argv):
    with pytest.raises(SystemExit) as e:
        parse_server_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_defaults_and_lightllm_flag_names(tiny_dense_dir):
    a = parse_server_args(["--model_dir", str(tiny_dense_dir)])
    assert (a.host, a.port, a.dp, a.api_key, a.is_loopback) == ("127.0.0.1", 8000, 1, None, True)
    assert a.model_name == str(tiny_dense_dir)  # served under --model_dir as given, as vLLM serves --model
    e = a.engine
    assert (e.device, e.max_batch_size, e.mtp_mode, e.spec) == (torch.device("cpu"), 32, None, None)
    a = parse_server_args(["--model_dir", str(tiny_dense_dir), "--mtp_mode", "eagle_with_att", "--mtp_step", "3",
                           "--running_max_req_size", "4", "--max_req_total_len", "256", "--max_total_token_num",
                           "512", "--chunked_prefill_size", "64", "--disable_cudagraph", "--data_type", "float32",
                           "--dp", "2", "--model_name", "tiny", "--api_key", "k", "--host", "0.0.0.0"])  # fmt: skip
    e = a.engine
    assert e.spec.mode is MtpMode.EAGLE_WITH_ATT and e.spec.num_draft_tokens == 3
    assert (e.max_batch_size, e.max_model_len, e.max_total_token_num, e.chunked_prefill_size) == (4, 256, 512, 64)
    assert (e.graph_max_batch_size, e.dtype, a.dp, a.model_name, a.is_loopback) == (0, torch.float32, 2, "tiny", False)
    assert [a.worker_engine_args(r).device for r in range(2)] == [torch.device("cpu")] * 2
    # vLLM-style aliases land in the same fields
    b = parse_server_args(["--model_dir", str(tiny_dense_dir), "--max_model_len", "256", "--max_batch_size", "4"])
    assert (b.engine.max_model_len, b.engine.max_batch_size) == (256, 4)
    d = parse_server_args(["--model_dir", str(tiny_dense_dir), "--mtp_mode", "draft_model", "--mtp_step", "3",
                           "--mtp_draft_model_dir", str(tiny_dense_dir), "--parallel_drafting",
                           "--mtp_mask_token_id", "7"]).engine.spec  # fmt: skip
    assert (d.mode.value, d.num_draft_tokens, d.parallel_drafting, d.mask_token_id) == ("draft_model", 3, True, 7)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--mtp_mode", "eagle_with_att"], "mtp_mode eagle_with_att needs mtp_step"),
        (["--mtp_step", "2"], "need mtp_mode"),
        (["--mtp_mode", "eagle_with_att", "--mtp_step", "9"], "mtp_step must be an int in [1, 7]"),
        (["--mtp_mode", "medusa", "--mtp_step", "1"], "invalid choice: 'medusa'"),
        (["--mtp_mode", "eagle_with_att", "--mtp_step", "1", "--mtp_draft_model_dir", "/nonexistent"],
         "is not a directory"),
        (["--mtp_mode", "draft_model", "--mtp_step", "2"], "needs mtp_draft_model_dir"),
        (["--mtp_mode", "draft_model", "--mtp_step", "2", "--mtp_draft_model_dir", "/tmp", "--mtp_mask_token_id", "5"],
         "it needs mtp_mode draft_model with parallel_drafting"),
        (["--dp", "0"], "--dp must be >= 1"),
        (["--device", "cuda"], "CUDA is not available"),
        (["--device", "tpu"], "device must be 'cpu' or 'cuda[:N]'"),
        (["--data_type", "int8"], "invalid choice: 'int8'"),
        (["--port", "70000"], "--port must be in [1, 65535]"),
        (["--running_max_req_size", "0"], "max_batch_size must be >= 1"),
        (["--max_req_total_len", "100000"], "exceeds the model's max_position_embeddings"),
        (["--max_req_total_len", "256", "--max_total_token_num", "100"], "below max_model_len 256"),
        (["--api_key", ""], "--api_key is empty"),
        (["--tp", "0"], "tp must be a positive int"),
        (["--tp", "3", "--pp", "64"], "is not divisible by tp=3"),
        (["--pp", "64"], "stages for"),
        (["--dist_timeout_s", "0"], "dist_timeout_s must be > 0"),
        (["--worker_stall_s", "0"], "--worker_stall_s must be > 0"),
        (["--header_timeout_s", "-1"], "--header_timeout_s must be > 0"),
        (["--worker_stall_s", "20", "--worker_watchdog_s", "10"], "exceeds --worker_watchdog_s"),
        (["--tp", "2", "--dist_timeout_s", "400"], "--worker_watchdog_s 300 must exceed --dist_timeout_s 400"),
        (["--limit_concurrency", "0"], "--limit_concurrency must be >= 1"),
        (["--mtp_force_acceptance", "mean=2"], "mtp_force_acceptance is set but mtp_mode is not"),
        (["--mtp_mode", "eagle_with_att", "--mtp_step", "2", "--mtp_force_acceptance", "mean=3.5"],
         "must be in [1, 3] for mtp_step 2"),
        (["--mtp_mode", "eagle_with_att", "--mtp_step", "2", "--mtp_force_acceptance", "0.9,0.8,0.7"],
         "3 per-position rates for mtp_step 2"),
    ],
)  # fmt: skip
def test_bad_combinations_exit_with_a_clear_message(capsys, tiny_dense_dir, flags, message):
    if flags == ["--device", "cuda"]:
        pytest.importorskip("torch").cuda.is_available() and pytest.skip("CUDA is available here")
    assert message in parse_error(capsys, ["--model_dir", str(tiny_dense_dir), *flags])


def test_model_dir_must_hold_a_config_and_a_tokenizer(capsys, tmp_path, tiny_dense_dir):
    assert "config.json not found" in parse_error(capsys, ["--model_dir", str(tmp_path)])
    (tmp_path / "config.json").write_text((tiny_dense_dir / "config.json").read_text())
    assert "needs a tokenizer" in parse_error(capsys, ["--model_dir", str(tmp_path)])


def test_force_acceptance_flag_reaches_the_engine(tiny_dense_dir):
    base = ["--model_dir", str(tiny_dense_dir), "--mtp_mode", "eagle_with_att", "--mtp_step", "3"]
    assert parse_server_args(base).engine.spec.force_acceptance is None  # off by default
    e = parse_server_args([*base, "--mtp_force_acceptance", "0.8,0.6"]).engine
    assert (e.mtp_force_acceptance, e.spec.force_acceptance.rates) == ("0.8,0.6", (0.8, 0.6, 0.0))


def test_tp_pp_compose_with_dp(tiny_dense_dir):
    a = parse_server_args(["--model_dir", str(tiny_dense_dir), "--dp", "2", "--tp", "2", "--pp", "2"])
    assert (a.dp, a.engine.parallel.tp, a.engine.parallel.pp) == (2, 2, 2)
    assert a.worker_engine_args(1).parallel.world_size == 4


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for action in build_parser()._actions:
        assert action.help, action.option_strings
        assert action.option_strings[0] in out


def test_the_model_is_served_under_model_dir_exactly_as_given(tiny_dense_dir, monkeypatch):
    """Issue 19 item 15: a relative path with its trailing slash stays as typed (no resolving, no base name), so a
    client can load the tokenizer from the served name; --model_name overrides."""
    monkeypatch.chdir(tiny_dense_dir.parent)
    given = f"./{tiny_dense_dir.name}/"
    assert parse_server_args(["--model_dir", given]).model_name == given
    named = parse_server_args(["--model_dir", given, "--model_name", "Qwen/Qwen3.5-27B"])
    assert named.model_name == "Qwen/Qwen3.5-27B"


def test_request_body_cap_and_api_docs_flags(tiny_dense_dir):
    a = parse_server_args(["--model_dir", str(tiny_dense_dir)])
    assert (a.max_request_body_bytes, a.enable_api_docs) == (8 * 2**20, False)  # docs off by default (item 9)
    b = parse_server_args(["--model_dir", str(tiny_dense_dir), "--max_request_body_bytes", "4096", "--enable_api_docs"])
    assert (b.max_request_body_bytes, b.enable_api_docs) == (4096, True)


def test_reliability_flags(tiny_dense_dir):
    """Issue 35: the tp / pp collective timeout, the stall and watchdog bounds, the connection limits."""
    a = parse_server_args(["--model_dir", str(tiny_dense_dir)])
    assert (a.engine.dist_timeout_s, a.worker_stall_s, a.worker_watchdog_s) == (120.0, 60.0, 300.0)
    assert (a.header_timeout_s, a.body_timeout_s, a.limit_concurrency) == (30.0, 120.0, None)
    b = parse_server_args(["--model_dir", str(tiny_dense_dir), "--tp", "2", "--dist_timeout_s", "5",
                           "--worker_stall_s", "2", "--worker_watchdog_s", "9", "--header_timeout_s", "3",
                           "--body_timeout_s", "4", "--limit_concurrency", "64"])  # fmt: skip
    assert (b.engine.dist_timeout_s, b.worker_stall_s, b.worker_watchdog_s) == (5.0, 2.0, 9.0)
    assert (b.header_timeout_s, b.body_timeout_s, b.limit_concurrency) == (3.0, 4.0, 64)
