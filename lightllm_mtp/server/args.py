"""Server command line -> `ServerArgs` (frozen), validated once at start-up.

The flags are derived from the option fields of `EngineArgs` and `ServerArgs` (config/cli.py): each field's name in
`_` and `-` spellings, plus LightLLM's and vLLM's names where they differ (`--running_max_req_size` /
`--max_num_seqs`, `--max_req_total_len`, `--data_type`, `--gpu_memory_utilization`, ...). `mtp_mode` is a string
only here: `EngineArgs` parses it into `MtpMode` / `SpecConfig`.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import torch

from lightllm_mtp.chat_templates import chat_template_text
from lightllm_mtp.config.cli import add_options, values_given
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.options import option

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


SERVER, HTTP, RELIABILITY, CHAT = "model", "HTTP", "reliability", "chat"


@dataclass(frozen=True)
class ServerArgs:
    """The server's own options (declared once, as EngineArgs's are: the flags are derived from both classes)."""

    engine: EngineArgs  # the per-replica engine settings; each worker gets its own device (see worker_engine_args)
    model_name: str | None = option(None, "the name served at /v1/models and checked in every request's `model` "
                                    "(none: --model_dir as given)", group=SERVER, aliases=("served_model_name",))
    host: str = option("127.0.0.1", "bind address (loopback only by default)", group=HTTP)
    port: int = option(8000, "HTTP port", group=HTTP)
    api_key: str | None = option(None, "require 'Authorization: Bearer KEY' on /v1/* and /generate*", group=HTTP)
    dp: int = option(1, "model replicas, each its own worker process (and GPU); requests go to the replica with the "
                     "fewest outstanding", group=HTTP, aliases=("data_parallel_size",))
    log_level: str = option("info", "server log level", group=HTTP, choices=("debug", "info", "warning", "error"))
    enable_api_docs: bool = option(False, "serve /docs, /redoc and /openapi.json (behind --api_key when it is set)",
                                   group=HTTP)
    max_request_body_bytes: int = option(8 * 2**20, "larger request bodies are answered 413 before they are read "
                                         "whole", group=HTTP)
    worker_restart_attempts: int = option(3, "restart a replica whose worker dies, at most this many times per "
                                          "replica (0: never)", group=HTTP)
    shutdown_grace_s: float = option(30.0, "on SIGTERM, running requests get this long to finish before they are "
                                     "failed with an error body", group=HTTP)
    # a replica silent while it has work (a worker reports at least once a second between steps): past stall_s the
    # router sends new requests elsewhere and /health names it "stalled"; past watchdog_s it is declared dead
    worker_stall_s: float = option(60.0, "a replica that sends nothing this long while it has requests is 'stalled' "
                                   "in /health and gets no new requests while another serves", group=RELIABILITY)
    worker_watchdog_s: float = option(300.0, "a replica silent this long while it has requests is declared dead: its "
                                      "processes are killed, its requests fail (or go to another replica if they "
                                      "have produced nothing yet) and it is restarted; above --dist_timeout_s",
                                      group=RELIABILITY)
    header_timeout_s: float = option(30.0, "a connection that does not complete a request's headers within this many "
                                     "seconds is closed (idle and slowloris connections)", group=RELIABILITY)
    body_timeout_s: float = option(120.0, "a request body not received whole within this many seconds gets 408",
                                   group=RELIABILITY)
    limit_concurrency: int | None = option(None, "open connections + running requests past which new requests get "
                                           "503 at once (none: 2048, or fewer under a lower open-file limit)",
                                           group=RELIABILITY)
    chat_template: str | None = option(None, "the chat template instead of the tokenizer's: a Jinja file, or a "
                                       "template shipped in lightllm_mtp/chat_templates (qwen3_5: thinking + tools)",
                                       group=CHAT)
    reasoning_parser: str | None = option(None, "split chat answers into reasoning_content and content (qwen3: at "
                                          "</think>, or at a tool call opened before it)", group=CHAT,
                                          choices=("qwen3",))
    tool_call_parser: str | None = option(None, "parse tool calls of chat answers into tool_calls (qwen3_coder / "
                                          "qwen3_xml: Qwen's XML format)", group=CHAT,
                                          choices=("qwen3_coder", "qwen3_xml"))
    enable_auto_tool_choice: bool = option(False, "allow tool_choice auto (the model decides; needs "
                                           "--tool_call_parser)", group=CHAT)

    def __post_init__(self) -> None:
        if self.model_name is None:
            object.__setattr__(self, "model_name", self.engine.model_dir)
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
        for name in ("worker_stall_s", "worker_watchdog_s", "header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name} must be > 0, got {getattr(self, name)}")
        if self.worker_stall_s > self.worker_watchdog_s:
            raise ValueError(f"--worker_stall_s {self.worker_stall_s:g} exceeds --worker_watchdog_s "
                             f"{self.worker_watchdog_s:g}: a replica is stalled before it is declared dead")
        if self.engine.parallel.world_size > 1 and self.worker_watchdog_s <= self.engine.dist_timeout_s:
            raise ValueError(f"--worker_watchdog_s {self.worker_watchdog_s:g} must exceed --dist_timeout_s "
                             f"{self.engine.dist_timeout_s:g}: a hung tp / pp rank is reported by its group first")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable_auto_tool_choice needs --tool_call_parser")
        if self.chat_template is not None:
            chat_template_text(self.chat_template)  # a missing file is a start-up error
        if self.limit_concurrency is not None and self.limit_concurrency < 1:
            raise ValueError(f"--limit_concurrency must be >= 1, got {self.limit_concurrency}")

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
    p = argparse.ArgumentParser(
        prog="python -m lightllm_mtp.server.api_server",
        usage="%(prog)s --model_dir DIR [options]",
        description="OpenAI-compatible and LightLLM-style HTTP server for Qwen3.5 with optional MTP speculative "
        "decoding. One HTTP front process, --dp model worker processes (continuous batching, chunked prefill). "
        "Every flag also takes its dashed spelling (--model-dir).",
        allow_abbrev=False,
    )
    add_options(p, EngineArgs)
    add_options(p, ServerArgs)
    return p


def parse_server_args(argv: list[str] | None = None) -> ServerArgs:
    """Parses and validates; a bad flag or combination exits with status 2 and one clear message."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return server_args_from_namespace(ns)
    except ValueError as e:
        parser.error(str(e))


def server_args_from_namespace(ns: argparse.Namespace) -> ServerArgs:
    engine = EngineArgs(**values_given(ns, EngineArgs))
    cfg = engine.model_config()  # a missing directory or hub id is named here
    if not any((Path(engine.model_dir) / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"--model_dir {engine.model_dir}: the server needs a tokenizer ({' or '.join(TOKENIZER_FILES)})")
    engine.check_model(cfg)
    server = ServerArgs(engine=engine, **values_given(ns, ServerArgs))
    if engine.device.type == "cpu" and engine.cpu_threads is None:  # replicas x their ranks share the host's cores
        threads = engine.resolved_cpu_threads(cfg.hidden_size, server.dp * engine.parallel.world_size)
        server = dataclasses.replace(server, engine=dataclasses.replace(engine, cpu_threads=threads))
    return server
