"""The reference command `python -m lightllm.server.api_server ...` through the optional compat distribution
(compat/lightllm), installed into a scratch folder as the README says; and its refusal to shadow a real LightLLM."""

import os
import subprocess
import sys
from pathlib import Path


COMPAT = Path(__file__).resolve().parents[1] / "compat" / "lightllm"


def pip_install(target: Path, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "--target", str(target), str(COMPAT)]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_the_reference_command_runs_this_server(tmp_path):
    out = pip_install(tmp_path / "site")
    assert out.returncode == 0, out.stderr
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    cmd = [sys.executable, "-m", "lightllm.server.api_server", "--help"]
    helped = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "--mtp_mode" in helped.stdout and "--model_dir" in helped.stdout and "lightllm_mtp" in helped.stdout
    bad = subprocess.run([*cmd[:-1], "--model_dir", str(tmp_path / "nowhere")], capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path)  # fmt: skip
    assert bad.returncode != 0 and "a local checkpoint directory is expected" in bad.stderr


def test_it_refuses_to_shadow_an_installed_lightllm(tmp_path):
    upstream = tmp_path / "upstream" / "lightllm"
    upstream.mkdir(parents=True)
    (upstream / "__init__.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(upstream.parent))
    out = pip_install(tmp_path / "site", env=env)
    assert out.returncode != 0 and "would shadow it" in out.stdout + out.stderr
