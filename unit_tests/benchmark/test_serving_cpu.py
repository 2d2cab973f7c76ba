"""CPU smoke test of benchmark/serving.py --launch on the tiny checkpoint: MTP off and on in one command, every
figure lands in the JSON."""

import json

import pytest

from benchmark import serving


def test_launch_compares_configs_and_writes_json(tmp_path, tiny_dense_dir):
    out = tmp_path / "serving.json"
    argv = ["--launch", "--model_dir", str(tiny_dense_dir), "--device", "cpu", "--mtp_configs", "none,eagle_with_att:2",
            "--server_args", "--max_req_total_len 256 --running_max_req_size 4", "--concurrency", "1,3",
            "--num_prompts", "5", "--num_warmup", "1", "--input_len", "24", "--output_len", "6", "--len_dist",
            "uniform", "--range_ratio", "0.5", "--out", str(out)]  # fmt: skip
    report = serving.main(argv)
    on_disk = json.loads(out.read_text())
    assert on_disk["command"] == report["command"] and on_disk["command"].startswith("python benchmark/serving.py ")
    assert "--mtp_configs none,eagle_with_att:2" in on_disk["command"]
    assert on_disk["versions"]["python"] and on_disk["versions"]["httpx"]
    assert on_disk["device"]["type"] == "cpu" and len(on_disk["device"]["workers"]) == 1
    assert [r["label"] for r in on_disk["results"]] == ["no_mtp", "eagle_with_att_k2"]
    for cfg in on_disk["results"]:
        assert "--running_max_req_size 4" in cfg["server_command"]
        assert cfg["server"]["mtp_step"] == (2 if cfg["label"] != "no_mtp" else 0)
        assert [lv["concurrency"] for lv in cfg["levels"]] == [1, 3]
        for lv in cfg["levels"]:
            assert lv["completed"] == lv["num_requests"] == 5 and not lv["errors"]
            assert 12 * 5 <= lv["input_tokens"] <= 36 * 5 and 3 * 5 <= lv["output_tokens"] <= 9 * 5
            assert lv["output_tokens_per_s"] > 0 and lv["request_throughput_per_s"] > 0
            assert lv["ttft_ms"]["median"] > 0 and lv["tpot_ms"]["p99"] >= lv["tpot_ms"]["median"] > 0
            side = lv["server_side"]  # where the level's time went: engine steps, the front's reader and event loop
            assert side["engine_steps"] > 0 and side["engine_step_ms"] > 0 and 0 < side["engine_busy_share"] <= 1
            assert side["front_outputs"] > 0 and side["front_reader_lag_ms"] >= 0
            assert 0 <= side["front_reader_busy_share"] <= 1 and side["front_event_loop_lag_ms"] >= 0
            if cfg["label"] == "no_mtp":
                assert lv["mtp"] is None
            else:
                m = lv["mtp"]
                assert m["verify_steps"] > 0 and m["mean_accepted_tokens_per_step"] >= 1.0
                assert len(m["acceptance_per_position"]) == 2
        assert all(w["kv_used"] == 0 and w["req_slots_used"] == 0 for w in cfg["server"]["workers"])
    assert [row["concurrency"] for row in on_disk["speedup_vs_no_mtp"]] == [1, 3]


def test_forced_acceptance_reaches_every_mtp_server(tmp_path, tiny_dense_dir):
    """--mtp_force_acceptance 1,1: the random tiny drafts, which real verification almost never accepts, are all
    accepted (3 tokens per verify step at k = 2); the server's /server_info shows the setting; the no-MTP server runs
    without it."""
    argv = ["--launch", "--model_dir", str(tiny_dense_dir), "--device", "cpu", "--mtp_configs", "none,eagle_with_att:2",
            "--mtp_force_acceptance", "1,1", "--server_args", "--max_req_total_len 256 --running_max_req_size 2",
            "--concurrency", "2", "--num_prompts", "2", "--num_warmup", "0", "--input_len", "16", "--output_len", "12",
            "--out", str(tmp_path / "forced.json")]  # fmt: skip
    plain, forced = serving.main(argv)["results"]
    assert [plain["label"], forced["label"]] == ["no_mtp", "eagle_with_att_k2_forced"]
    assert "--mtp_force_acceptance 1,1" in forced["server_command"] and "force" not in plain["server_command"]
    assert forced["server"]["mtp_force_acceptance"]["setting"] == "1,1"
    assert plain["server"]["mtp_force_acceptance"] is None
    assert forced["levels"][0]["mtp"]["mean_accepted_tokens_per_step"] == 3.0


def test_forced_acceptance_needs_launch():
    with pytest.raises(SystemExit):
        serving.parse_args(["--url", "http://127.0.0.1:1", "--mtp_force_acceptance", "mean=2"])


@pytest.mark.parametrize("resend", ["text", "ids"])
def test_multi_turn_workload_hits_the_prefix_cache(tmp_path, tiny_dense_dir, resend):
    """Each turn resends the conversation (the answer re-tokenized, or its ids from return_token_ids): with the cache
    later turns resume past earlier ones (with ids past the previous answer too); /nocache: none."""
    out = tmp_path / "multi_turn.json"
    argv = ["--launch", "--model_dir", str(tiny_dense_dir), "--device", "cpu", "--mtp_configs",
            "eagle_with_att:2,eagle_with_att:2/nocache", "--server_args",
            "--max_req_total_len 256 --running_max_req_size 4 --prefix_cache_interval 16 --prefix_cache_state_share 0.5",
            "--concurrency", "2", "--num_prompts", "2", "--input_len", "40", "--output_len", "6", "--workload",
            "multi_turn", "--turns", "3", "--question_len", "8", "--resend", resend, "--out", str(out)]  # fmt: skip
    report = serving.main(argv)
    cached, nocache = report["results"]
    assert [cached["label"], nocache["label"]] == ["eagle_with_att_k2", "eagle_with_att_k2_nocache"]
    for cfg in report["results"]:
        lv = cfg["levels"][0]
        assert lv["completed"] == lv["num_requests"] == 6 and not lv["errors"]
    assert cached["levels"][0]["prefix_hit_rate"] > (0.5 if resend == "ids" else 0.3)
    assert nocache["levels"][0]["cached_tokens"] == 0
    assert cached["server"]["prefix_cache"] and not nocache["server"]["prefix_cache"]


def test_shared_prefix_levels_ask_fresh_questions(tmp_path, tiny_dense_dir):
    """Each concurrency level sends the same prefixes with new questions: a level hits the prefixes (the levels
    before it cached them too) but never a whole earlier prompt."""
    out = tmp_path / "shared_prefix.json"
    prefix_len, n = 48, 4
    argv = ["--launch", "--model_dir", str(tiny_dense_dir), "--device", "cpu", "--mtp_configs", "none", "--server_args",
            "--max_req_total_len 256 --running_max_req_size 4 --prefix_cache_interval 16", "--concurrency", "2,2",
            "--num_prompts", str(n), "--workload", "shared_prefix", "--shared_prefix_len", str(prefix_len),
            "--num_groups", "2", "--question_len", "8", "--output_len", "4", "--out", str(out)]  # fmt: skip
    first, second = serving.main(argv)["results"][0]["levels"]
    assert 0 < second["cached_tokens"] <= n * prefix_len and first["cached_tokens"] <= n * prefix_len
