"""Image input: decoding and preprocessing (CPU), the prompt's image tokens and their M-RoPE positions."""
