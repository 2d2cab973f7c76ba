"""GPU timing of the flash prefill attention kernel at the 27B shape (24 query heads, 4 KV heads of 256, bf16, a
paged pool with scattered slots): the four 4096-row chunks of a 16k prompt (prefixes 0, 4k, 8k, 12k), per launch
configuration (BLOCK_M, BLOCK_N, warps, stages); each output checked against the default configuration's.

    python benchmark/check_prefill_attention_gpu.py [--out benchmark/results/prefill_attention_tiles_h100.json]

Prints ms per chunk, the 16 layers' total per 16k prefill and TFLOP/s (causal FLOPs: 4 * Hq * D * sum of the rows'
key counts); a configuration that fails to compile (shared memory, registers) is reported and skipped.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from lightllm_mtp.kernels.attention.prefill_attention import flash_attention_triton

CONFIGS = [  # (block_m, block_n, num_warps, num_stages); the first is the default of the 27B shape on sm90 (it was
    # (64, 64, 8, 2) until the sweep of results/prefill_attention_tiles_qwen3.5-27b_h100.json: 233 -> 119.5 ms per 16k)
    (128, 64, 8, 2), (64, 64, 8, 2), (64, 64, 4, 2), (64, 64, 8, 3), (64, 32, 4, 2), (64, 128, 8, 2),
    (128, 32, 8, 2), (128, 64, 8, 1), (128, 32, 8, 3), (32, 64, 4, 2),
]


def _time_ms(fn, iters=10):
    fn()
    if not torch.cuda.is_available():  # the interpreter smoke run (TRITON_INTERPRET=1 on a CPU): no timing
        return float("nan")
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--prompt", type=int, default=16384)
    p.add_argument("--layers", type=int, default=16, help="full-attention layers of the model (27B: 16)")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (tiny --chunk)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    dev, dt, hq, hkv, d = args.device, torch.bfloat16, 24, 4, 256
    pool = args.prompt + 8
    k_buf = torch.randn(pool, hkv, d, device=dev, dtype=dt)
    v_buf = torch.randn(pool, hkv, d, device=dev, dtype=dt)
    req_to_token = torch.randperm(pool, device=dev)[: args.prompt].to(torch.int32)[None]  # scattered slots
    b_req_idx = torch.zeros(1, dtype=torch.int32, device=dev)
    cu = torch.tensor([0, args.chunk], dtype=torch.int32, device=dev)
    q = torch.randn(args.chunk, hq, d, device=dev, dtype=dt)
    prefixes = list(range(0, args.prompt, args.chunk))
    flops = sum(4 * hq * d * sum(p + i + 1 for i in range(args.chunk)) for p in prefixes)
    results = []
    ref = {}
    for bm, bn, nw, ns in CONFIGS:
        row = {"block_m": bm, "block_n": bn, "num_warps": nw, "num_stages": ns, "chunk_ms": []}
        try:
            for prefix in prefixes:
                seq = torch.tensor([prefix + args.chunk], dtype=torch.int32, device=dev)

                def run():
                    return flash_attention_triton(q, k_buf, v_buf, req_to_token, b_req_idx, cu, seq, d**-0.5,
                                                  max_q_len=args.chunk, block_m=bm, block_n=bn, num_warps=nw,
                                                  num_stages=ns)  # fmt: skip

                out = run()
                if prefix not in ref:
                    ref[prefix] = out
                err = (out.float() - ref[prefix].float()).abs().max().item()
                assert err < 2e-2, f"differs from the default configuration by {err}"
                row["chunk_ms"].append(_time_ms(run))
        except Exception as e:  # noqa: BLE001  (compile failures: out of shared memory / registers)
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print(f"BLOCK_M {bm:3d} BLOCK_N {bn:3d} warps {nw} stages {ns}: {row['error']}")
            results.append(row)
            continue
        total = sum(row["chunk_ms"])
        row["prefill_ms"] = total * args.layers
        row["tflops"] = flops / (total / 1e3) / 1e12
        chunks = " ".join(f"{x:.2f}" for x in row["chunk_ms"])
        print(f"BLOCK_M {bm:3d} BLOCK_N {bn:3d} warps {nw} stages {ns}: chunks {chunks} ms; "
              f"{args.layers} layers {row['prefill_ms']:.1f} ms per {args.prompt} prompt, {row['tflops']:.0f} TFLOP/s")
        results.append(row)
    report = {
        "command": "python "
        + " ".join(sys.argv if argv is None else ["benchmark/check_prefill_attention_gpu.py", *argv]),
        "device": torch.cuda.get_device_name() if dev != "cpu" else "cpu (interpreter)",
        "shape": {"hq": hq, "hkv": hkv, "head_dim": d, "chunk": args.chunk, "prompt": args.prompt},
        "results": results,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
