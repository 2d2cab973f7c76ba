"""Entry point: `python -m lightllm_mtp.server.api_server --model_dir DIR [...]` (see --help).

Start-up: parse and validate the flags, bind the HTTP port (a port in use fails here, before any model loads), load
the tokenizer, start the --dp model workers and wait until each has loaded its model, then serve HTTP (uvicorn) on
the bound socket until SIGINT / SIGTERM, then stop the workers.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys

from lightllm_mtp.chat_templates import chat_template_text
from lightllm_mtp.server.args import ServerArgs, parse_server_args

logger = logging.getLogger("lightllm_mtp.server")


def main(argv: list[str] | None = None) -> None:
    args = parse_server_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.is_loopback and args.api_key is None:
        logger.warning("binding %s without --api_key: anyone who can reach this port can use the model", args.host)
    # uvicorn shuts down on SIGINT / SIGTERM, then re-raises the signal: end as a normal exit, not a kill
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        code = serve(args)
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


def serve(args: ServerArgs) -> int:
    import uvicorn
    from transformers import AutoTokenizer

    from lightllm_mtp.server.draining import DrainingServer
    from lightllm_mtp.server.engine_client import EngineClient
    from lightllm_mtp.server.http_app import create_app
    from lightllm_mtp.server.http_limits import default_limit_concurrency, http_protocol
    from lightllm_mtp.server.metrics import ServerMetrics
    from lightllm_mtp.server.worker_pool import WorkerPool, WorkerStartError

    try:
        sock = bind_port(args.host, args.port)
    except OSError as e:
        logger.error("cannot listen on %s:%d: %s", args.host, args.port, e)
        return 1
    tokenizer = AutoTokenizer.from_pretrained(args.engine.model_dir)
    if args.chat_template is not None:
        tokenizer.chat_template = chat_template_text(args.chat_template)
    pool = WorkerPool(args)
    try:
        try:
            ready = pool.start()
        except WorkerStartError as e:
            logger.error("%s", e)
            return 1
        spec = args.engine.spec
        forced = spec.force_acceptance if spec is not None else None
        client = EngineClient(pool, tokenizer, ServerMetrics(ready[0].mtp_step, forced))
        app = create_app(args, client, client.metrics, on_shutdown=pool.shutdown)
        mtp = f"{args.engine.mtp_mode.value} x{args.engine.mtp_step}" if args.engine.mtp_mode else "off"
        logger.info("serving %s on http://%s:%d (dp=%d, mtp=%s)", args.model_name, args.host, args.port, args.dp, mtp)
        if forced is not None:
            logger.warning("--mtp_force_acceptance %s: drafts are accepted without checking; outputs are NOT the "
                           "model's (benchmarks only)", forced.setting)  # fmt: skip
        limit = args.limit_concurrency or default_limit_concurrency()
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                access_log=args.log_level == "debug", timeout_graceful_shutdown=5,
                                http=http_protocol(args.header_timeout_s), limit_concurrency=limit)  # fmt: skip
        server = DrainingServer(config, client, args.shutdown_grace_s)
        server.run(sockets=[sock])
        return 0 if server.started else 1
    finally:
        pool.shutdown()
        sock.close()


def bind_port(host: str, port: int) -> socket.socket:
    """The listening socket, taken before the model loads so that a busy port is reported at once."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


if __name__ == "__main__":
    main()
