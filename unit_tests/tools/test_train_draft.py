"""train_draft at toy size on CPU: a PARD draft for the shipped trained target (its tokenizer, so its vocabulary)
that the engine loads (mask token from the config) and eval_acceptance measures, greedy-exact."""

import json

from training.train_draft import parse_args, pard_batch, train

TOY = ["--hidden_size", "32", "--num_hidden_layers", "4", "--seq_len", "32", "--batch_size", "2", "--steps", "2",
       "--corpus_chars", "40000", "--log_every", "1", "--dtype_save", "fp32"]  # fmt: skip


def test_pard_batch_masks_after_one_anchor_per_row():
    import torch

    tokens = torch.arange(2 * 21).view(2, 21)
    inputs, labels, is_mask = pard_batch(tokens, mask_token=-5, num_masks=3, gen=torch.Generator().manual_seed(0))
    for row in range(2):
        masked = is_mask[row].nonzero().flatten().tolist()
        a = masked[0] - 1
        assert masked == [a + 1, a + 2, a + 3] and a >= 10
        assert (inputs[row, masked] == -5).all() and (inputs[row, : a + 1] == tokens[row, : a + 1]).all()
        assert labels[row, : a + 4].tolist() == tokens[row, 1 : a + 5].tolist()  # mask row j predicts x_{a+1+j}
        assert (labels[row, a + 4 :] == -100).all()


def test_trained_pard_draft_serves_and_is_measured(trained_dense_dir, tmp_path):
    from lightllm_mtp.tools.eval_acceptance import main

    out = tmp_path / "draft"
    log = train(parse_args(["--target_dir", str(trained_dense_dir), "--out", str(out), "--pard", *TOY]))
    cfg = json.loads((out / "config.json").read_text())["text_config"]
    target = json.loads((trained_dense_dir / "config.json").read_text())["text_config"]
    assert cfg["vocab_size"] == target["vocab_size"] and cfg["pard_token"] == log["pard_token"]
    assert cfg["hidden_size"] == 32 and cfg["tie_word_embeddings"]
    result = main(["--model_dir", str(trained_dense_dir), "--draft_model_dir", str(out), "--mtp_modes", "draft_model",
                   "pard", "--num_prompts", "2", "--prompt_tokens", "16", "--max_new_tokens", "8", "--mtp_steps", "2",
                   "--strict"])  # fmt: skip
    for mode in ("draft_model", "pard"):
        stats = result["by_mode"][mode]["2"]
        assert stats["greedy_equal"] and stats["verify_steps"] > 0 and len(stats["acceptance_per_position"]) == 2
