"""benchmark/multi_turn_steps.py on CPU with the trained tiny checkpoint: the trace runs to its end with and without
the prefix cache, every turn after the first resumes from the cache, and the report holds its command."""

import json

from benchmark.multi_turn_steps import main


def test_multi_turn_trace_with_and_without_the_cache(tmp_path):
    out = tmp_path / "trace.json"
    main(["--model_dir", "lightllm_mtp/fixtures/tiny_qwen3_5_trained", "--device", "cpu", "--mtp_mode",
          "eagle_with_att", "--mtp_step", "1", "--num_conversations", "2", "--concurrency", "2", "--turns", "2",
          "--input_len", "96", "--question_len", "16", "--output_len", "8", "--max_model_len", "512",
          "--prefix_cache_interval", "32", "--passes", "1", "--out", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["command"].startswith("python benchmark/multi_turn_steps.py --model_dir")
    cache, no_cache = report["results"]["cache"], report["results"]["no_cache"]
    for row in (cache, no_cache):
        trace = row["pass0"]
        assert trace["ttft_ms"]["n"] == 4  # 2 conversations x 2 turns
        assert trace["steps"] > 0 and trace["decode_rows"] > 0
    assert no_cache["pass0"]["prompt_tokens_computed"] == 2 * 96 + 2 * (96 + 8 + 16)
    assert cache["prefix_cache"]["hits"] >= 2  # each second turn resumed from its first
    assert cache["pass0"]["prompt_tokens_computed"] < no_cache["pass0"]["prompt_tokens_computed"]
