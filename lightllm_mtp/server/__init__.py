"""HTTP server: `python -m lightllm_mtp.server.api_server --model_dir DIR` (see api_server.py and README)."""
