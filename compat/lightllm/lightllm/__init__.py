"""Not LightLLM: a forwarding shim installed from lightllm_mtp's compat/lightllm, so that the reference command
`python -m lightllm.server.api_server` runs lightllm_mtp's server. See compat/lightllm/setup.py."""

from lightllm.lightllm_mtp_compat_marker import SHIM  # noqa: F401
