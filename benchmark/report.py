"""Printed tables and the PNG plot of a static-benchmark report."""

from __future__ import annotations

from pathlib import Path

PLOT_INSTALL = 'pip install -e ".[bench]"'


def plot_unavailable() -> str | None:
    """Why --plot cannot work here (matplotlib is not importable), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return f"--plot needs matplotlib, which is not importable here ({e}); install it with {PLOT_INSTALL}"
    return None


# ---- output ----------------------------------------------------------------------------------------------
def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_tables(report: dict) -> None:
    bw = report["bandwidth"]
    print(f"\n{report['model']['name']}  in={report['settings']['input_len']} out={report['settings']['output_len']}"
          f"  {report['device']['name']}  copy bw {bw['GB_per_s']:.0f} GB/s")  # fmt: skip
    print(f"floor = {bw['floor_label']}: bytes a step must move / the copy bandwidth above")
    head = (f"{'bs':>4} {'prefill ms':>11} {'prefill tok/s':>14} {'step ms':>9} {'p10-p90 ms':>15} "
            f"{'tok/s':>10} {'GB/step':>8} {'floor ms':>9} {'% floor':>8}")  # fmt: skip
    print(head)
    for r in report["results"]:
        d, f = r["decode"] or {}, r["floor"] or {}
        spread = f"{_fmt(d.get('p10_ms'))}-{_fmt(d.get('p90_ms'))}" if d else "-"
        gb = f.get("bytes_per_step")
        print(f"{r['batch_size']:>4} {_fmt(r['prefill']['ms'], '.1f'):>11} {_fmt(r['prefill']['tokens_per_s'], '.0f'):>14} "
              f"{_fmt(d.get('median_ms')):>9} {spread:>15} {_fmt(d.get('tokens_per_s'), '.1f'):>10} "
              f"{_fmt(gb / 1e9 if gb else None, '.3f'):>8} {_fmt(f.get('floor_ms')):>9} {_fmt(f.get('pct_of_floor'), '.1f'):>8}")  # fmt: skip
    for r in report["results"]:
        if r.get("decode_note"):
            print(f"bs={r['batch_size']}: {r['decode_note']}")
    for r in report["results"]:
        g = r.get("floor_per_gpu")
        if g:
            print(f"bs={r['batch_size']} per GPU (tp={g['tp']}, pp={g['pp']}): "
                  f"{'+'.join(f'{b / 1e9:.3f}' for b in g['stage_bytes_per_gpu'])} GB a stage, floor "
                  f"{g['floor_ms']:.2f} ms = {g['pct_of_floor']:.1f}%, GPU busy "
                  f"{'/'.join(f'{p:.0f}' for p in g['gpu_busy_pct'])}%")  # fmt: skip
    peak = report["bandwidth"].get("matmul_peak")
    for r in report["results"]:
        if r["prefill"].get("gemm_pct_of_matmul_peak") is not None:
            print(f"prefill bs={r['batch_size']}: GEMM {r['prefill']['gemm_flops'] / 1e12:.1f} TFLOP in "
                  f"{r['prefill']['ms']:.1f} ms = {r['prefill']['gemm_pct_of_matmul_peak']:.1f}% of the measured "
                  f"{peak['tflops']:.0f} TFLOP/s bf16 matmul peak")  # fmt: skip
    mtp = report.get("mtp")
    if mtp and mtp.get("results"):
        print(f"\nMTP {mtp['mode']} k={mtp['mtp_step']} (simulated acceptance)")
        print(f"{'bs':>4} {'step ms':>9} {'verify ms':>10} {'draft ms':>9} {'cost x':>7} {'rate':>5} "
              f"{'tok/step':>9} {'eff tok/s':>10} {'speedup':>8}")  # fmt: skip
        for r in mtp["results"]:
            step = (r.get("spec_step") or {}).get("median_ms")
            for s in r.get("simulated", [{}]):
                print(f"{r['batch_size']:>4} {_fmt(step):>9} {_fmt(r.get('verify_ms')):>10} {_fmt(r.get('draft_ms')):>9} "
                      f"{_fmt(r.get('step_cost_vs_decode')):>7} {_fmt(s.get('accept_rate')):>5} "
                      f"{_fmt(s.get('tokens_per_step')):>9} {_fmt(s.get('effective_tokens_per_s'), '.1f'):>10} "
                      f"{_fmt(s.get('speedup_vs_no_spec')):>8}")  # fmt: skip
        for r in mtp["results"]:
            if r.get("note"):
                print(f"bs={r['batch_size']}: {r['note']}")
            f = r.get("forced")
            if f:
                print(f"bs={r['batch_size']}: forced acceptance {f['setting']} (drafts unchecked): "
                      f"{f['tokens_per_step']:.3f} tok/step -> {f['effective_tokens_per_s']:.1f} tok/s, speedup "
                      f"{_fmt(f['speedup_vs_no_spec'])}x")  # fmt: skip
        for r in mtp["results"]:
            g = r.get("verify_floor_per_gpu")
            if g:
                print(f"bs={r['batch_size']} verify per GPU (tp={g['tp']}, pp={g['pp']}): floor {g['floor_ms']:.2f} ms "
                      f"= {g['pct_of_floor']:.1f}% of the verify forward")  # fmt: skip
    real = report.get("real_acceptance")
    if real:
        print("\nReal MTP acceptance on held-out text (eagle, greedy)")
        print(f"{'k':>2} {'tok/step':>9} {'per-position acceptance'}")
        for k, m in real["mtp"].items():
            print(f"{k:>2} {m['tokens_per_step']:>9.3f} {m['acceptance_per_position']}")
        for r in (mtp or {}).get("results", []):
            if r.get("real"):
                print(f"bs={r['batch_size']}: k={mtp['mtp_step']} real {r['real']['tokens_per_step']:.3f} tok/step -> "
                      f"{r['real']['effective_tokens_per_s']:.1f} tok/s, speedup {r['real']['speedup_vs_no_spec']:.2f}x")
    hf = report.get("hf_peer")
    if hf:
        print("\nHF transformers generate (same weights)")
        if "error" in hf:
            print(f"  {hf['error']}")
        for r in hf.get("runs", []):
            if "error" in r:
                print(f"{r['batch_size']:>4}  error: {r['error']}")
                continue
            print(f"{r['batch_size']:>4} e2e {r['e2e_output_tokens_per_s']:.1f} tok/s, decode step "
                  f"{_fmt(r.get('decode_step_ms'))} ms; ours x{_fmt(r.get('speedup_e2e'))} e2e, "
                  f"x{_fmt(r.get('speedup_decode'))} decode; greedy match {_fmt(r.get('greedy_tokens_equal_frac'))}")  # fmt: skip


def write_plot(report: dict, path: Path) -> str:
    """Decode (and MTP) step time against batch size, with the floor named after its device; returns the path.
    Callers check plot_unavailable() first (static_inference refuses --plot before any work)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if r["decode"]]
    bss = [r["batch_size"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    med = [r["decode"]["median_ms"] for r in rows]
    err = [[m - r["decode"]["p10_ms"] for m, r in zip(med, rows)], [r["decode"]["p90_ms"] - m for m, r in zip(med, rows)]]
    ax.errorbar(bss, med, yerr=err, marker="o", capsize=3, label="decode step (median, p10-p90)")
    ax.plot(bss, [r["floor"]["floor_ms"] for r in rows], "k--", marker=".", label=report["bandwidth"]["floor_label"])
    mtp = (report.get("mtp") or {}).get("results") or []
    spec = [(r["batch_size"], r["spec_step"]["median_ms"]) for r in mtp if r.get("spec_step")]
    if spec:
        ax.plot(*zip(*spec), marker="s", label=f"MTP step (k={report['mtp']['mtp_step']})")
    ax.set_xscale("log", base=2)
    ys = med + [ms for _, ms in spec]
    if max(ys) > 20 * min(ys):
        ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("ms per step")
    ax.set_title(f"{report['model']['name']} in={report['settings']['input_len']} {report['device']['name']}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
