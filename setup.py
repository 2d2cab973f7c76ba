from setuptools import find_packages, setup

setup(
    name="lightllm_mtp",
    version="0.1.0",
    description="LightLLM-style inference engine for Qwen3.5 (dense and MoE) with MTP speculative decoding",
    packages=find_packages(include=["lightllm_mtp", "lightllm_mtp.*"]),
    # the main job's trained tiny checkpoint; the shipped chat templates
    package_data={"lightllm_mtp": ["fixtures/*.md", "fixtures/*/*", "chat_templates/*.jinja"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",
        "safetensors>=0.4",
        "transformers>=5.17,<6",  # Qwen3.5 reference modeling code, tokenizers, chat templates
        "tokenizers>=0.21",
        "tqdm>=4.60",
        "numpy>=1.24",
        "Pillow>=10",  # image input: decoding and the processor's resize (lightllm_mtp/multimodal/)
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "openai>=1.40",  # the e2e tests drive the server with the official client
            "httpx>=0.27",
            "fastapi>=0.110",
            "uvicorn>=0.29",
            "prometheus_client>=0.20",
            "triton>=3.0; platform_system == 'Linux'",  # the Triton kernels run under TRITON_INTERPRET=1 on CPU
            "xgrammar>=0.2.8",  # structured outputs (the `structured` extra): their tests run in CI
        ],
        # structured outputs (response_format, guided_*, regex / json_schema / ebnf): xgrammar, vLLM's and SGLang's
        # default grammar engine, with CPU wheels for Python 3.11 / 3.12 (docs/openai_api.md says why)
        "structured": ["xgrammar>=0.2.8"],
        "server": ["fastapi>=0.110", "uvicorn>=0.29", "prometheus_client>=0.20", "httpx>=0.27", "xgrammar>=0.2.8"],
        "gpu": ["triton>=3.0", "fla-core>=0.6"],
        "bench": ["matplotlib>=3.5"],  # benchmark/static_inference.py --plot
    },
    entry_points={
        "console_scripts": [
            "lightllm-mtp=lightllm_mtp.__main__:main",
            "lightllm-mtp-server=lightllm_mtp.server.api_server:main",
        ]
    },
)
