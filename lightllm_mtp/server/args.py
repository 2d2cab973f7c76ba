"""Server command line -> `ServerArgs` (frozen), validated once at start-up.

Flag names follow LightLLM where it has one (`--running_max_req_size`, `--max_req_total_len`, `--data_type`,
`--mtp_mode`, ...); vLLM-style aliases are accepted for the common ones. `mtp_mode` is a string only here: the
engine gets it through `EngineArgs` and parses it into `MtpMode` / `SpecConfig`.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import torch

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.spec_config import MAX_MTP_STEP, MtpMode

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class ServerArgs:
    engine: EngineArgs  # the per-replica engine settings; each worker gets its own device (see worker_engine_args)
    model_name: str  # the name served at /v1/models and checked in every request's `model`
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, /v1/* and /generate* need "Authorization: Bearer <api_key>"
    dp: int = 1  # model replicas (worker processes), one GPU each on CUDA
    log_level: str = "info"
    enable_api_docs: bool = False  # /docs, /redoc, /openapi.json (behind the API key when one is set)
    max_request_body_bytes: int = 8 * 2**20  # larger bodies get 413 before they are read whole
    worker_restart_attempts: int = 3  # per replica: a worker that dies is started again this many times
    shutdown_grace_s: float = 30.0  # SIGTERM: running requests get this long to finish, then fail

    def __post_init__(self) -> None:
        if self.dp < 1:
            raise ValueError(f"--dp must be >= 1, got {self.dp}")
        if self.dp > 1 and self.engine.device.index is not None:
            raise ValueError(f"--dp {self.dp} spreads replicas over cuda:0..{self.dp - 1}: pass --device cuda")
        if self.engine.device.type == "cuda":
            n, per_replica = torch.cuda.device_count(), self.engine.parallel.world_size
            if self.dp * per_replica > n:
                raise ValueError(
                    f"--dp {self.dp} x --tp {self.engine.parallel.tp} x --pp {self.engine.parallel.pp} needs "
                    f"{self.dp * per_replica} GPUs, {n} visible"
                )
        if not self.shutdown_grace_s >= 0:
            raise ValueError(f"--shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        if self.worker_restart_attempts < 0:
            raise ValueError(f"--worker_restart_attempts must be >= 0, got {self.worker_restart_attempts}")
        if self.max_request_body_bytes < 1024:
            raise ValueError(f"--max_request_body_bytes must be >= 1024, got {self.max_request_body_bytes}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--port must be in [1, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("--api_key is empty")

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def worker_engine_args(self, rank: int) -> EngineArgs:
        """Replica `rank`'s EngineArgs: device cuda -> its first GPU, cuda:rank * tp * pp (its tp x pp ranks take the
        GPUs after it); CPU replicas share the host."""
        if self.engine.device == torch.device("cuda"):
            return dataclasses.replace(self.engine, device=f"cuda:{rank * self.engine.parallel.world_size}")
        return self.engine


def build_parser() -> argparse.ArgumentParser:
    d = EngineArgs.__dataclass_fields__
    p = argparse.ArgumentParser(
        prog="python -m lightllm_mtp.server.api_server",
        description="OpenAI-compatible and LightLLM-style HTTP server for Qwen3.5 with optional MTP speculative "
        "decoding. One HTTP front process, --dp model worker processes (continuous batching, chunked prefill).",
    )
    m = p.add_argument_group("model")
    m.add_argument("--model_dir", required=True, help="checkpoint directory (config.json, safetensors, tokenizer)")
    m.add_argument("--model_name", default=None, help="served model name (default: --model_dir as given)")
    m.add_argument("--device", default="cpu",
                   help="cpu or cuda (with --dp N: replica i on cuda:i; default: %(default)s)")
    m.add_argument("--data_type", "--dtype", dest="data_type", default=d["dtype"].default,
                   help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16 or float16")
    m.add_argument("--load_format", default=d["load_format"].default,
                   help="auto: the checkpoint's safetensors; dummy: random weights (benchmarks); default: %(default)s")
    b = p.add_argument_group("batching and memory (per replica)")
    b.add_argument("--running_max_req_size", "--max_batch_size", dest="running_max_req_size", type=int, default=32,
                   help="concurrent requests per replica (request slots); more wait in the queue "
                   "(default: %(default)s)")
    b.add_argument("--max_req_total_len", "--max_model_len", dest="max_req_total_len", type=int, default=None,
                   help="prompt + generated tokens per request (default: min(max_position_embeddings, 4096))")
    b.add_argument("--max_total_token_num", type=int, default=None,
                   help="KV pool size in tokens (default: running_max_req_size * max_req_total_len)")
    b.add_argument("--chunked_prefill_size", type=int, default=d["chunked_prefill_size"].default,
                   help="token budget of one forward: decode rows (1 + mtp_step each) then prompt chunks "
                   "(default: %(default)s)")
    b.add_argument("--graph_max_batch_size", type=int, default=d["graph_max_batch_size"].default,
                   help="largest decode / verify batch replayed from a CUDA graph (CUDA only; default: %(default)s)")
    b.add_argument("--disable_cudagraph", action="store_true", help="run every step eagerly (same as "
                   "--graph_max_batch_size 0)")
    b.add_argument("--disable_overlap", action="store_true", help="read each step's tokens before queuing the next "
                   "step (by default the next decode / verify step is queued on the device while the host handles "
                   "the current one's tokens)")
    b.add_argument("--disable_prefill_cudagraph", action="store_true", help="run every prompt chunk eagerly (by "
                   "default, with the prefix cache on a dense model, one request's chunk of up to 512 tokens replays "
                   "a CUDA graph)")
    b.add_argument("--disable_warm_up", action="store_true", help="take requests right after loading (by default a "
                   "worker on CUDA first runs a few synthetic requests, so that compiling the prompt-chunk and "
                   "prefix-cache kernels does not fall on the first users)")
    c = p.add_argument_group("prefix cache")
    c.add_argument("--disable_prefix_cache", action="store_true", help="no sharing of cached prompt prefixes")
    c.add_argument("--prefix_cache_interval", type=int, default=d["prefix_cache_interval"].default,
                   help="tokens between GDN state snapshots taken during prefill (default: %(default)s)")
    c.add_argument("--prefix_cache_state_share", type=float, default=d["prefix_cache_state_share"].default,
                   help="share of the memory budget (the bytes of --max_total_token_num KV slots) held by GDN state "
                   "snapshots, the KV pool gets the rest; at least 4 snapshots (default: room for 4 snapshots per "
                   "request slot, between 0.1 and 0.5 of the budget)")
    c.add_argument("--prefix_cache_host_gb", type=float, default=d["prefix_cache_host_gb"].default,
                   help="pinned host memory (GiB) that evicted GDN state snapshots move to, brought back on a hit "
                   "(default: %(default)s, off)")
    s = p.add_argument_group("MTP speculative decoding")
    s.add_argument("--mtp_mode", default=None, choices=[mode.value for mode in MtpMode],
                   help="draft with the checkpoint's MTP head: eagle_with_att runs mtp.layers.0 mtp_step times; "
                   "vanilla_with_att uses mtp.layers.j for draft j; draft_model: a smaller checkpoint of the same "
                   "vocabulary (--mtp_draft_model_dir) drafts (default: no speculation)")
    s.add_argument("--mtp_step", type=int, default=0,
                   help=f"draft tokens per step, 1..{MAX_MTP_STEP} (needs --mtp_mode)")
    s.add_argument("--parallel_drafting", action="store_true", help="with --mtp_mode eagle_with_att: one MTP "
                   "forward drafts all mtp_step tokens from [next token, MASK x (mtp_step - 1)] (PTD; needs a "
                   "checkpoint with mtp.mask_embedding and mtp.mask_hidden); with draft_model: PARD, the draft "
                   "model does the same with its mask token")
    s.add_argument("--mtp_mask_token_id", type=int, default=None, help="PARD's mask token id (default: the "
                   "draft config's pard_token / mask_token_id)")
    s.add_argument("--mtp_draft_vocab_file", default=None, help="JSON of frequency-ranked token ids "
                   "(python -m lightllm_mtp.tools.build_draft_vocab): the draft's logits cover only those ids")
    s.add_argument("--mtp_draft_vocab_size", type=int, default=None, help="use the first N ids of "
                   "--mtp_draft_vocab_file (eos and special ids always included)")
    s.add_argument("--mtp_adaptive", action="store_true", help="each step drafts 0..--mtp_step tokens, the number "
                   "with the most expected tokens per ms from live acceptance and the step cost measured at start-up")
    s.add_argument("--mtp_force_acceptance", default=None, help="BENCHMARKS ONLY, changes outputs: accept drafts "
                   "without checking them, at per-position rates (e.g. 0.8,0.6,0.4: draft i accepted with that "
                   "probability given drafts before it were) or at a mean accept length (e.g. mean=2.2: accepted "
                   "drafts + 1 per verify step, from one constant rate), so that random weights (--load_format dummy) "
                   "run MTP at a realistic acceptance; shown in /server_info and /metrics (default: off)")
    s.add_argument("--mtp_draft_model_dir", default=None, help="directory holding the mtp.* tensors (default: "
                   "model_dir); with --mtp_mode draft_model, the draft checkpoint")
    h = p.add_argument_group("HTTP")
    h.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s, loopback only)")
    h.add_argument("--port", type=int, default=8000, help="default: %(default)s")
    h.add_argument("--api_key", default=None, help="require 'Authorization: Bearer KEY' on /v1/* and /generate*")
    h.add_argument("--max_request_body_bytes", type=int, default=8 * 2**20, help="larger request bodies are "
                   "answered 413 (default: %(default)s, 8 MiB)")
    h.add_argument("--worker_restart_attempts", type=int, default=3, help="restart a replica whose worker dies, "
                   "at most this many times per replica (0: never; default: %(default)s)")
    h.add_argument("--shutdown_grace_s", type=float, default=30.0, help="on SIGTERM, running requests get this "
                   "long to finish before they are failed with an error body (default: %(default)s)")
    h.add_argument("--enable_api_docs", action="store_true", help="serve /docs, /redoc and /openapi.json (off by "
                   "default; behind --api_key when it is set)")
    h.add_argument("--dp", type=int, default=1, help="model replicas, each its own worker process (and GPU); "
                   "requests go to the replica with the fewest outstanding")
    h.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per replica (one process each, NCCL on "
                   "CUDA, gloo on CPU; heads, GDN heads, MLP / experts and the vocabulary split over them)")
    h.add_argument("--pp", type=int, default=1, help="pipeline stages per replica (layers split into stages; the "
                   "last stage samples, verifies and drafts)")
    h.add_argument("--log_level", default="info", choices=["debug", "info", "warning", "error"],
                   help="default: %(default)s")
    return p  # fmt: skip


def parse_server_args(argv: list[str] | None = None) -> ServerArgs:
    """Parses and validates; a bad flag or combination exits with status 2 and one clear message."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return server_args_from_namespace(ns)
    except ValueError as e:
        parser.error(str(e))


def server_args_from_namespace(ns: argparse.Namespace) -> ServerArgs:
    model_dir = Path(ns.model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"--model_dir {ns.model_dir}: no config.json there")
    if not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"--model_dir {ns.model_dir}: the server needs a tokenizer ({' or '.join(TOKENIZER_FILES)})")
    if ns.mtp_mode is not None and ns.mtp_step == 0:
        raise ValueError(f"--mtp_mode {ns.mtp_mode} needs --mtp_step (draft tokens per step, 1..{MAX_MTP_STEP})")
    if ns.mtp_mode is None and (ns.mtp_step or ns.mtp_draft_model_dir):
        raise ValueError("--mtp_step / --mtp_draft_model_dir need --mtp_mode (eagle_with_att, vanilla_with_att or "
                         "draft_model)")
    if ns.mtp_draft_model_dir is not None and not Path(ns.mtp_draft_model_dir).is_dir():
        raise ValueError(f"--mtp_draft_model_dir {ns.mtp_draft_model_dir} is not a directory")
    engine = EngineArgs(
        model_dir=str(model_dir),
        device=ns.device,
        dtype=ns.data_type,
        max_model_len=ns.max_req_total_len,
        max_batch_size=ns.running_max_req_size,
        max_total_token_num=ns.max_total_token_num,
        chunked_prefill_size=ns.chunked_prefill_size,
        load_format=ns.load_format,
        graph_max_batch_size=0 if ns.disable_cudagraph else ns.graph_max_batch_size,
        disable_overlap=ns.disable_overlap,
        warm_up=not ns.disable_warm_up,
        prefill_cuda_graphs=not ns.disable_prefill_cudagraph,
        prefix_cache=not ns.disable_prefix_cache,
        prefix_cache_interval=ns.prefix_cache_interval,
        prefix_cache_state_share=ns.prefix_cache_state_share,
        prefix_cache_host_gb=ns.prefix_cache_host_gb,
        mtp_mode=ns.mtp_mode,
        mtp_step=ns.mtp_step,
        mtp_draft_model_dir=ns.mtp_draft_model_dir,
        parallel_drafting=ns.parallel_drafting,
        mtp_draft_vocab_file=ns.mtp_draft_vocab_file,
        mtp_draft_vocab_size=ns.mtp_draft_vocab_size,
        mtp_adaptive=ns.mtp_adaptive,
        mtp_mask_token_id=ns.mtp_mask_token_id,
        mtp_force_acceptance=ns.mtp_force_acceptance,
        tp=ns.tp,
        pp=ns.pp,
    )
    cfg = ModelConfig.from_model_dir(model_dir)
    engine.parallel.check_model(cfg)
    max_len = engine.resolved_max_model_len(cfg.max_position_embeddings)
    if engine.resolved_kv_pool_size(max_len) < max_len:
        raise ValueError(
            f"--max_total_token_num {engine.max_total_token_num} is below max_req_total_len {max_len}: a request of "
            "full length could never be admitted; raise it or lower --max_req_total_len"
        )
    return ServerArgs(
        engine=engine,
        model_name=ns.model_name or ns.model_dir,
        host=ns.host,
        port=ns.port,
        api_key=ns.api_key,
        dp=ns.dp,
        log_level=ns.log_level,
        enable_api_docs=ns.enable_api_docs,
        max_request_body_bytes=ns.max_request_body_bytes,
        worker_restart_attempts=ns.worker_restart_attempts,
        shutdown_grace_s=ns.shutdown_grace_s,
    )
