"""Marks this `lightllm` package as lightllm_mtp's forwarding shim (reinstalling over it is allowed)."""

SHIM = True
