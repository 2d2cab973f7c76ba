"""PDL launch keywords: never on CPU tensors (the interpreter and CPU CI launch the plain kernels), off with
LIGHTLLM_MTP_PDL=0, and `launch_pdl` passed only when on (Tritons without the option reject the keyword)."""

import torch

from lightllm_mtp import env
from lightllm_mtp.kernels import pdl


def test_off_on_cpu_and_without_the_keyword():
    assert not pdl.use_pdl(torch.zeros(1))
    assert pdl.pdl_args(torch.zeros(1)) == {"PDL": False}


def test_env_default_on_and_zero_turns_it_off(monkeypatch):
    monkeypatch.delenv("LIGHTLLM_MTP_PDL", raising=False)
    assert env._read_env().pdl
    monkeypatch.setenv("LIGHTLLM_MTP_PDL", "0")
    assert not env._read_env().pdl


def test_on_only_when_the_device_and_triton_allow(monkeypatch):
    class FakeCuda:  # what use_pdl reads of a tensor
        is_cuda = True
        device = torch.device("cuda", 0)

    monkeypatch.setattr(pdl, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(pdl, "_triton_launches_pdl", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    assert pdl.pdl_args(FakeCuda()) == {"PDL": True, "launch_pdl": True}
    monkeypatch.setattr(pdl, "_capability", lambda index: (8, 0))
    assert not pdl.use_pdl(FakeCuda())
    monkeypatch.setattr(pdl, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(pdl, "_triton_launches_pdl", lambda: False)
    assert not pdl.use_pdl(FakeCuda())
    monkeypatch.setattr(pdl, "_triton_launches_pdl", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.0")
    assert not pdl.use_pdl(FakeCuda())
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(env, "ENV", env._read_env().__class__(**{**env.ENV.__dict__, "pdl": False}))
    assert not pdl.use_pdl(FakeCuda())
