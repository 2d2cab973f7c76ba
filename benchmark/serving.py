# Over 500 lines: one load generator (workloads in serving_workloads.py), its launch, client loop and report together.
"""Serving benchmark: a load generator against the HTTP server (streaming /v1/completions).

    python benchmark/serving.py --url http://127.0.0.1:8000 --concurrency 1,8,32 --num_prompts 64 \
        --input_len 512 --output_len 128 [--len_dist uniform --range_ratio 0.5] [--out benchmark/results/NAME.json]
    python benchmark/serving.py --launch --model_dir DIR --device cuda --mtp_configs none,eagle_with_att:1 \
        --concurrency 1,8,32 ...   # starts the server once per config: MTP off vs on in one command

Prompts are token windows of a local text corpus (default: the held-out Python standard library files of
lightllm_mtp/tools/tiny_corpus.py; --corpus DIR for any directory of text files), sent as token ids so their
length is exact; greedy by default, ignore_eos, max_tokens = the output length. At each concurrency level
num_prompts requests run with at most that many in flight. Reported: request and token throughput, TTFT, TPOT
((e2e - TTFT) / (tokens - 1)), inter-chunk latency, MTP acceptance and prefix-cache hits (cached prompt tokens)
from each response's usage block.

Prefix-cache workloads (benchmark/serving_workloads.py): `--workload shared_prefix --shared_prefix_len 2048
--num_groups 4 --question_len 128` (prompts = one of a few long prefixes + a question), `--workload multi_turn
--turns 4 --question_len 64` (num_prompts conversations; each turn resends the conversation so far); a
`--mtp_configs` entry ending in `/nocache` runs that server with --disable_prefix_cache.

Random weights at a published shape (`--model_shape`) draft tokens that real verification almost never accepts; with
`--mtp_force_acceptance mean=2.2` (or per-position rates `0.8,0.6,0.4`) every MTP server accepts drafts unchecked at
that rate (benchmarks only: the text is not the model's), so MTP throughput shows at a realistic acceptance.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmark` and `lightllm_mtp` importable from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from tqdm import tqdm

from benchmark.model_shapes import MODEL_SHAPES
from benchmark.serving_workloads import multi_turn, shared_prefix_prompts
from lightllm_mtp.env import ENV

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ---- prompts ---------------------------------------------------------------------------------------------
def corpus_texts(corpus: str | None) -> list[str]:
    if corpus is None:
        from lightllm_mtp.tools.tiny_corpus import is_heldout, read_stdlib

        return [f.text for f in read_stdlib() if is_heldout(f.path)]  # text the trained tiny model never saw
    root = Path(corpus)
    paths = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".txt", ".md", ".rst"))
    if not paths:
        raise SystemExit(f"--corpus {corpus}: no .py/.txt/.md/.rst files")
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths]


def sample_lengths(n: int, length: int, dist: str, ratio: float, rng: random.Random) -> list[int]:
    if dist == "fixed":
        return [length] * n
    lo, hi = max(1, round(length * (1 - ratio))), max(1, round(length * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def make_prompts(tokenizer, texts: list[str], lengths: list[int], rng: random.Random) -> list[list[int]]:
    """Token windows at random offsets of the concatenated corpus."""
    need = max(lengths) * 4 + sum(lengths)
    ids: list[int] = []
    for text in texts:
        ids += tokenizer.encode(text, add_special_tokens=False, verbose=False)
        if len(ids) >= need:
            break
    if len(ids) <= max(lengths):
        raise SystemExit(f"the corpus has {len(ids)} tokens; prompts of {max(lengths)} asked")
    starts = [rng.randrange(0, len(ids) - n) for n in lengths]
    return [ids[s : s + n] for s, n in zip(starts, lengths)]


# ---- one request -----------------------------------------------------------------------------------------
@dataclass
class RequestRecord:
    input_len: int
    output_len: int = 0  # usage.completion_tokens
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_gaps_s: list[float] = field(default_factory=list)
    mtp: dict | None = None
    error: str | None = None
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens
    text: str = ""
    token_ids: list[int] = field(default_factory=list)  # with return_token_ids: the answer's ids


async def send(http: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int, temperature: float,
               seed: int, return_token_ids: bool = False) -> RequestRecord:  # fmt: skip
    rec = RequestRecord(input_len=len(prompt))
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "return_mtp_stats": True}
    if return_token_ids:
        body["return_token_ids"] = True
    start = last = time.perf_counter()
    try:
        async with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                now = time.perf_counter()
                if "error" in event:
                    rec.error = event["error"]["message"]
                elif event.get("choices"):  # one chunk per model step (several tokens with MTP)
                    rec.text += event["choices"][0].get("text") or ""
                    rec.token_ids += event["choices"][0].get("token_ids") or []
                    if rec.ttft_s is None:
                        rec.ttft_s = now - start
                    else:
                        rec.chunk_gaps_s.append(now - last)
                    last = now
                if event.get("usage"):
                    rec.output_len = event["usage"]["completion_tokens"]
                    rec.mtp = event["usage"].get("mtp")
                    rec.cached_tokens = (event["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        rec.e2e_s = time.perf_counter() - start
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e}"
    return rec


# ---- one concurrency level -------------------------------------------------------------------------------
def stats(xs: list[float], scale: float = 1e3) -> dict | None:
    """mean / median / p90 / p99 (x scale: ms by default)."""
    if not xs:
        return None
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, round(p * (len(s) - 1)))] * scale

    return {"mean": sum(s) / len(s) * scale, "median": q(0.5), "p90": q(0.9), "p99": q(0.99)}


def summarize(records: list[RequestRecord], duration_s: float, concurrency: int) -> dict:
    ok = [r for r in records if r.error is None]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.input_len for r in ok)
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_len - 1) for r in ok if r.output_len > 1 and r.ttft_s is not None]
    spec = [r.mtp for r in ok if r.mtp and r.mtp["verify_steps"]]
    steps = sum(m["verify_steps"] for m in spec)
    acceptance = None
    if steps:
        k = max(len(m["proposed_per_position"]) for m in spec)
        proposed = [sum(m["proposed_per_position"][j] for m in spec if j < len(m["proposed_per_position"]))
                    for j in range(k)]  # fmt: skip
        accepted = [sum(m["accepted_per_position"][j] for m in spec if j < len(m["accepted_per_position"]))
                    for j in range(k)]  # fmt: skip
        acceptance = {
            "verify_steps": steps,
            "mean_accepted_tokens_per_step": (sum(m["accepted_drafts"] for m in spec) + steps) / steps,
            "acceptance_per_position": [a / p if p else 0.0 for a, p in zip(accepted, proposed)],
        }
    return {
        "concurrency": concurrency,
        "num_requests": len(records),
        "completed": len(ok),
        "errors": [r.error for r in records if r.error is not None][:5],
        "duration_s": duration_s,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "request_throughput_per_s": len(ok) / duration_s,
        "output_tokens_per_s": out_tokens / duration_s,
        "total_tokens_per_s": (in_tokens + out_tokens) / duration_s,
        "ttft_ms": stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": stats(tpots),
        "inter_chunk_ms": stats([g for r in ok for g in r.chunk_gaps_s]),
        "e2e_ms": stats([r.e2e_s for r in ok]),
        "mtp": acceptance,
        "cached_tokens": sum(r.cached_tokens for r in ok),
        "prefix_hit_rate": sum(r.cached_tokens for r in ok) / in_tokens if in_tokens else 0.0,
    }


async def run_level(url: str, headers: dict, model: str, prompts: list[list[int]], out_lens: list[int],
                    concurrency: int, temperature: float, bar: tqdm) -> dict:  # fmt: skip
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=httpx.Timeout(3600)) as http:

        async def one(i: int) -> RequestRecord:
            async with sem:
                rec = await send(http, model, prompts[i], out_lens[i], temperature, seed=i)
            bar.update(1)
            return rec

        start = time.perf_counter()
        records = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        return summarize(records, time.perf_counter() - start, concurrency)


# ---- server configs and the run --------------------------------------------------------------------------
def shape_model_dir(shape: str) -> Path:
    """A model directory for the server: the shape's config.json plus the tiny checkpoint's tokenizer (ids it
    does not know decode to nothing: the text is empty-ish, the token counts are exact)."""
    import shutil

    from lightllm_mtp.tools.default_checkpoint import ensure_tiny_checkpoint

    out = Path(tempfile.mkdtemp(prefix=f"serving_{shape}_"))
    (out / "config.json").write_text(json.dumps(MODEL_SHAPES[shape]))
    tiny = ensure_tiny_checkpoint()
    for f in tiny.iterdir():
        if f.name.startswith("tokenizer") or f.suffix == ".jinja" or f.name == "special_tokens_map.json":
            shutil.copy(f, out / f.name)
    return out


def parse_config(text: str) -> tuple[str, list[str]]:
    """'none' -> no MTP; 'eagle_with_att:2' -> --mtp_mode eagle_with_att --mtp_step 2; a '/nocache' suffix adds
    --disable_prefix_cache."""
    if text.endswith("/nocache"):
        label, flags = parse_config(text.removesuffix("/nocache"))
        return f"{label}_nocache", [*flags, "--disable_prefix_cache"]
    if text == "none":
        return "no_mtp", []
    mode, _, step = text.partition(":")
    if not step.isdigit():
        raise SystemExit(f"--mtp_configs entry {text!r}: use none or MODE:STEP, e.g. eagle_with_att:2")
    return f"{mode}_k{step}", ["--mtp_mode", mode, "--mtp_step", step]


def versions() -> dict:
    import subprocess

    import lightllm_mtp

    out = {"python": platform.python_version(), "lightllm_mtp": lightllm_mtp.__version__}
    try:
        git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
        out["git_commit"] = git.stdout.strip() if git.returncode == 0 else None
    except OSError:
        out["git_commit"] = None
    for pkg in ("torch", "transformers", "triton", "httpx", "fastapi", "uvicorn"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


async def run_multi_turn(url: str, headers: dict, model: str, workload: dict, out_len: int, concurrency: int,
                         temperature: float, bar: tqdm) -> dict:  # fmt: skip
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    ids = workload["resend"] == "ids"
    encode = workload["encode"]
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=httpx.Timeout(3600)) as http:
        records, duration = await multi_turn(
            lambda prompt: send(http, model, prompt, out_len, temperature, seed=len(prompt), return_token_ids=ids),
            (lambda rec: rec.token_ids) if ids else (lambda rec: encode(rec.text)),
            workload["first"], workload["user_turns"], concurrency, lambda: bar.update(1),
        )
    return summarize(records, duration, concurrency)


def run_config(url: str, args, prompts, out_lens, label: str, bar: tqdm, level_prompts: list | None = None) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    info = httpx.get(f"{url}/server_info", headers=headers, timeout=30).json()
    longest = prompts["longest"] if isinstance(prompts, dict) else max(len(p) + n for p, n in zip(prompts, out_lens))
    if longest > info["max_model_len"]:
        raise SystemExit(f"prompt + output up to {longest} tokens; the server's max_model_len is "
                         f"{info['max_model_len']}")
    model = info["model_name"]
    warm = min(args.num_warmup, len(prompts)) if not isinstance(prompts, dict) else 0
    if isinstance(prompts, dict) and prompts["warmup"]["first"]:
        # whole conversations of their own (the measured ones are not cached by it): a fresh server JIT-compiles and
        # autotunes the Triton kernels of every path (prompt chunks with snapshots, hits, verify) on first use
        bar.set_description(f"{label} warm-up")
        asyncio.run(run_multi_turn(url, headers, model, {**prompts, **prompts["warmup"]}, args.output_len,
                                   len(prompts["warmup"]["first"]), args.temperature, tqdm(disable=True)))  # fmt: skip
    if warm:  # first requests pay one-off costs (CUDA graph capture is at start-up, allocator growth is not)
        bar.set_description(f"{label} warm-up")
        asyncio.run(run_level(url, headers, model, prompts[:warm], [min(n, 16) for n in out_lens[:warm]], warm,
                              args.temperature, tqdm(disable=True)))  # fmt: skip
    levels = []
    for i, c in enumerate(args.concurrency):
        bar.set_description(f"{label} concurrency {c}")
        before = httpx.get(f"{url}/server_info", headers=headers, timeout=30).json()
        if isinstance(prompts, dict):  # multi-turn conversations
            level = asyncio.run(run_multi_turn(url, headers, model, {**prompts, **level_prompts[i]}, args.output_len, c,
                                               args.temperature, bar))  # fmt: skip
        else:
            these = level_prompts[i] if level_prompts else prompts
            level = asyncio.run(run_level(url, headers, model, these, out_lens, c, args.temperature, bar))
        after = httpx.get(f"{url}/server_info", headers=headers, timeout=30).json()
        level["server_side"] = server_side(before, after, level["duration_s"])
        levels.append(level)
    after = httpx.get(f"{url}/server_info", headers=headers, timeout=30).json()
    return {"label": label, "server": {k: v for k, v in after.items() if k not in ("outstanding",)}, "levels": levels}


def server_side(before: dict, after: dict, duration_s: float) -> dict | None:
    """Where a level's time went on the server, from /server_info around it: engine steps (count, mean step ms,
    share of the wall time inside steps) and the front (outputs read, mean lag from a worker's put to the reader,
    the reader thread's busy share, mean wait of a hand-off to the event loop). None for a server without them."""
    if "front" not in after or not all("steps" in w for w in after["workers"]):
        return None
    steps = sum(w["steps"] for w in after["workers"]) - sum(w["steps"] for w in before["workers"])
    step_s = sum(w["step_s"] for w in after["workers"]) - sum(w["step_s"] for w in before["workers"])
    f0, f1 = before["front"], after["front"]
    outputs = f1["outputs"] - f0["outputs"]
    deliveries = f1["loop_deliveries"] - f0["loop_deliveries"]
    return {
        "engine_steps": steps,
        "engine_step_ms": 1e3 * step_s / steps if steps else None,
        "engine_busy_share": step_s / duration_s / max(len(after["workers"]), 1),
        "front_outputs": outputs,
        "front_reader_lag_ms": 1e3 * (f1["lag_s"] - f0["lag_s"]) / outputs if outputs else None,
        "front_reader_busy_share": (f1["busy_s"] - f0["busy_s"]) / duration_s,
        "front_event_loop_lag_ms": 1e3 * (f1["loop_lag_s"] - f0["loop_lag_s"]) / deliveries if deliveries else None,
    }


def print_table(report: dict) -> None:
    print(f"\n{'config':<18} {'conc':>5} {'ok':>5} {'req/s':>7} {'out tok/s':>10} {'TTFT ms p50/p99':>17} "
          f"{'TPOT ms p50/p99':>17} {'tok/step':>9} {'accept per position':<24}")  # fmt: skip
    for cfg in report["results"]:
        for lv in cfg["levels"]:
            t, p, m = lv["ttft_ms"] or {}, lv["tpot_ms"] or {}, lv["mtp"]
            pos = " ".join(f"{a:.2f}" for a in m["acceptance_per_position"]) if m else "-"
            print(f"{cfg['label']:<18} {lv['concurrency']:>5} {lv['completed']:>5} "
                  f"{lv['request_throughput_per_s']:>7.2f} {lv['output_tokens_per_s']:>10.1f} "
                  f"{t.get('median', 0):>8.1f}/{t.get('p99', 0):<8.1f} "
                  f"{p.get('median', 0):>8.2f}/{p.get('p99', 0):<8.2f} "
                  f"{m['mean_accepted_tokens_per_step'] if m else 0:>9.2f} {pos:<24} "
                  f"cache hit {lv.get('prefix_hit_rate', 0):.2f}")  # fmt: skip
    for row in report.get("speedup_vs_no_mtp", []):
        print(f"{row['label']} vs no_mtp at concurrency {row['concurrency']}: x{row['output_tokens_per_s']:.2f} "
              f"output tok/s, TPOT speedup x{row['tpot_median']:.2f}")


def speedups(results: list[dict]) -> list[dict]:
    base = {lv["concurrency"]: lv for cfg in results if cfg["label"] == "no_mtp" for lv in cfg["levels"]}
    rows = []
    for cfg in results:
        for lv in cfg["levels"] if cfg["label"] != "no_mtp" else []:
            b = base.get(lv["concurrency"])
            if b and b["output_tokens_per_s"] and lv["tpot_ms"] and b["tpot_ms"]:
                rows.append({"label": cfg["label"], "concurrency": lv["concurrency"],
                             "output_tokens_per_s": lv["output_tokens_per_s"] / b["output_tokens_per_s"],
                             "tpot_median": b["tpot_ms"]["median"] / lv["tpot_ms"]["median"]})  # fmt: skip
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="a running server (ignored with --launch)")
    p.add_argument("--api_key", default=None)
    p.add_argument("--launch", action="store_true", help="start the server here, once per --mtp_configs entry")
    p.add_argument("--model_dir", default=None, help="with --launch: the checkpoint; also the default tokenizer")
    p.add_argument("--model_shape", default=None, choices=sorted(MODEL_SHAPES),
                   help="with --launch, instead of --model_dir: random weights at a published shape "
                   "(benchmark/model_shapes.py) and the tiny checkpoint's tokenizer; for timing only")
    p.add_argument("--device", default="cuda", help="with --launch: cpu or cuda")
    p.add_argument("--dp", type=int, default=1, help="with --launch: replicas")
    p.add_argument("--mtp_configs", default="none,eagle_with_att:1",
                   help="with --launch: comma list of none or MODE:STEP (e.g. none,eagle_with_att:2)")
    p.add_argument("--server_args", default="", help="with --launch: more api_server flags, one quoted string")
    p.add_argument("--mtp_force_acceptance", default=None,
                   help="with --launch: every MTP config's server accepts drafts without checking them, at these "
                        "per-position rates ('0.8,0.6,0.4') or this mean accept length ('mean=2.2'); benchmarks only, "
                        "the text is not the model's (its label gets '_forced')")
    p.add_argument("--start_timeout", type=float, default=1800, help="with --launch: seconds to wait for /health")
    p.add_argument("--tokenizer", default=None, help="tokenizer dir (default: --model_dir, else the server's)")
    p.add_argument("--corpus", default=None, help="directory of text files (default: held-out Python stdlib)")
    p.add_argument("--concurrency", default="1,8,32", help="comma list of in-flight request limits")
    p.add_argument("--num_prompts", type=int, default=64, help="requests per concurrency level")
    p.add_argument("--num_warmup", type=int, default=2,
                   help="short warm-up requests per server config (multi_turn: whole conversations of their own)")
    p.add_argument("--input_len", type=int, default=512)
    p.add_argument("--output_len", type=int, default=128)
    p.add_argument("--len_dist", choices=["fixed", "uniform"], default="fixed",
                   help="uniform: lengths drawn from [len*(1-range_ratio), len*(1+range_ratio)]")
    p.add_argument("--range_ratio", type=float, default=0.5)
    p.add_argument("--workload", choices=["random", "shared_prefix", "multi_turn"], default="random",
                   help="random windows, shared prefixes + questions, or multi-turn chats (prefix cache)")
    p.add_argument("--shared_prefix_len", type=int, default=2048, help="shared_prefix: tokens of each prefix")
    p.add_argument("--num_groups", type=int, default=4, help="shared_prefix: distinct prefixes")
    p.add_argument("--question_len", type=int, default=128, help="shared_prefix / multi_turn: tokens of a question")
    p.add_argument("--turns", type=int, default=4, help="multi_turn: turns per conversation")
    p.add_argument("--resend", choices=["text", "ids"], default="text",
                   help="multi_turn: the answer goes into the next turn re-tokenized from its text (a chat client) or "
                   "as the server's token ids (return_token_ids; random weights, whose text does not round-trip)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON path (default: benchmark/results/serving_<model>_<...>.json)")
    args = p.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    if args.launch and not (args.model_dir or args.model_shape):
        p.error("--launch needs --model_dir or --model_shape")
    if args.model_shape and (args.model_dir or not args.launch):
        p.error("--model_shape goes with --launch and without --model_dir")
    if args.mtp_force_acceptance and not args.launch:
        p.error("--mtp_force_acceptance goes with --launch (a running server shows its own in /server_info)")
    return args  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    argv_used = sys.argv if argv is None else ["benchmark/serving.py", *argv]
    command = "python " + " ".join(shlex.quote(a) for a in argv_used)
    from transformers import AutoTokenizer

    configs = [parse_config(c) for c in args.mtp_configs.split(",")] if args.launch else [("server", [])]
    if args.mtp_force_acceptance:  # benchmarks: drafts accepted unchecked at this rate by every MTP server
        configs = [(f"{label}_forced", [*flags, "--mtp_force_acceptance", args.mtp_force_acceptance])
                   if "--mtp_mode" in flags else (label, flags) for label, flags in configs]  # fmt: skip
    extra_flags = []
    if args.model_shape:
        args.model_dir = str(shape_model_dir(args.model_shape))
        extra_flags = ["--load_format", "dummy", "--model_name", args.model_shape]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    tok_dir = args.tokenizer or args.model_dir
    if tok_dir is None:  # the server's own checkpoint directory (same machine)
        tok_dir = httpx.get(f"{args.url}/server_info", headers=headers, timeout=30).json()["model_dir"]
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    rng = random.Random(args.seed)
    in_lens = sample_lengths(args.num_prompts, args.input_len, args.len_dist, args.range_ratio, rng)
    out_lens = sample_lengths(args.num_prompts, args.output_len, args.len_dist, args.range_ratio, rng)
    texts = corpus_texts(args.corpus)
    level_prompts = None  # prefix-cache workloads: fresh questions / conversations per concurrency level, so that a
    # level does not hit what the levels before it cached
    if args.workload == "shared_prefix":
        prefixes = make_prompts(tokenizer, texts, [args.shared_prefix_len] * args.num_groups, rng)
        level_prompts = [shared_prefix_prompts(prefixes, make_prompts(tokenizer, texts, [args.question_len] *
                                                                      args.num_prompts, rng), rng)
                         for _ in args.concurrency]  # fmt: skip
        prompts = level_prompts[0]
        out_lens = [args.output_len] * args.num_prompts
    elif args.workload == "multi_turn":
        def conversations(lens):
            first = make_prompts(tokenizer, texts, lens, rng)
            return first, [make_prompts(tokenizer, texts, [args.question_len] * (args.turns - 1), rng)
                           if args.turns > 1 else [] for _ in first]  # fmt: skip

        level_prompts = [dict(zip(("first", "user_turns"), conversations(in_lens))) for _ in args.concurrency]
        warm_first, warm_turns = conversations(in_lens[: args.num_warmup])
        prompts = {**level_prompts[0], "warmup": {"first": warm_first, "user_turns": warm_turns},
                   "encode": lambda text: tokenizer.encode(text, add_special_tokens=False), "resend": args.resend,
                   "longest": max(in_lens) + (args.turns - 1) * (args.question_len + 2 * args.output_len) + args.output_len}
    else:
        prompts = make_prompts(tokenizer, texts, in_lens, rng)
    report: dict = {
        "command": command,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": versions(),
        "settings": {k: v for k, v in vars(args).items() if k != "api_key" and not callable(v)},
        "results": [],
    }
    total = len(configs) * len(args.concurrency) * args.num_prompts * (args.turns if args.workload == "multi_turn" else 1)
    bar = tqdm(total=total, desc="serving benchmark", disable=ENV.disable_progress_bars)
    for label, flags in configs:
        if not args.launch:
            report["results"].append(run_config(args.url, args, prompts, out_lens, label, bar, level_prompts))
            continue
        from lightllm_mtp.server.launcher import ServerProcess

        bar.set_description(f"{label} starting server")
        server_flags = ["--model_dir", args.model_dir, "--device", args.device, "--dp", str(args.dp), *flags,
                        *extra_flags, "--log_level", "warning", *shlex.split(args.server_args)]  # fmt: skip
        log = Path(tempfile.mkdtemp(prefix="serving_bench_")) / f"{label}.log"
        with ServerProcess(server_flags, log).start(timeout_s=args.start_timeout) as server:
            result = run_config(server.url, args, prompts, out_lens, label, bar, level_prompts)
        result["server_command"] = " ".join(shlex.quote(a) for a in server.cmd)
        report["results"].append(result)
    bar.close()
    devices = report["results"][0]["server"]["devices"]
    report["device"] = {"type": "cuda" if devices[0].startswith("cuda") else "cpu", "workers": devices}
    report["speedup_vs_no_mtp"] = speedups(report["results"])
    out = Path(args.out) if args.out else default_out(args, report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print_table(report)
    print(f"\nwrote {out}")
    return report


def default_out(args, report: dict) -> Path:
    model = report["results"][0]["server"]["model_name"]
    labels = "-".join(r["label"] for r in report["results"])
    conc = "-".join(map(str, args.concurrency))
    name = f"serving_{model}_{report['device']['type']}_{labels}_in{args.input_len}_out{args.output_len}_c{conc}"
    return RESULTS_DIR / f"{name}.json"


if __name__ == "__main__":
    main()
