"""`python -m lightllm.server.api_server --model_dir DIR --mtp_mode eagle_with_att --mtp_step 2 ...`: the reference
command, served by lightllm_mtp (same flags: lightllm_mtp's server takes LightLLM's flag names)."""

from lightllm_mtp.server.api_server import main

if __name__ == "__main__":
    main()
