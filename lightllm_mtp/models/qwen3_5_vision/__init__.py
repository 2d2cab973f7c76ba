"""Qwen3.5's vision tower (`model.visual.*`)."""
