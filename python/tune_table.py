"""The table of scripts/gpu-bench-tune.sh: efopt's tuned latency per workload and batch size
beside PyTorch eager, torch.compile and SDPA flash, with geometric means.

    python3 python/tune_table.py target/gpu-bench-tune

Reads `<workload>.B<b>.json` (efopt's stderr with --stats=json: the tune pass's counters hold
the chosen candidate and its median) and `torch.B<b>.json` (gpu_bench.py --baselines-only).
"""

import json
import math
import os
import sys


def tuned_us(path):
    """The chosen latency (µs) in an efopt --stats=json stderr file, or None."""
    try:
        text = open(path).read()
    except OSError:
        return None
    start = text.find("{")
    if start < 0:
        return None
    try:
        stats = json.loads(text[start:text.rfind("}") + 1])
    except ValueError:
        return None
    for chunk in stats.get("chunks", []):
        for p in chunk.get("passes", []):
            if p.get("pass") == "tune":
                for g in p.get("counters", {}).get("groups", []):
                    if g.get("chosen"):
                        return g["chosen"]["us"]
    return None


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(out):
    rows, plain, flash = [], [], []
    for name in sorted(f for f in os.listdir(out) if f.startswith("torch.B")):
        b = name[len("torch.B"):-len(".json")]
        base = {}
        for r in json.load(open(os.path.join(out, name))):
            base.setdefault(r["workload"], {})[r["impl"]] = r.get("us")
        for w, impls in sorted(base.items()):
            us = tuned_us(os.path.join(out, f"{w}.B{b}.json"))
            eager, comp, sdpa = impls.get("torch-eager"), impls.get("torch.compile"), impls.get("sdpa-flash")
            fastest = min(x for x in (eager, comp, sdpa) if x) if any((eager, comp, sdpa)) else None
            speedup = fastest / us if us and fastest else None
            rows.append((w, b, us, eager, comp, sdpa, speedup))
            if w.startswith("mha"):
                if us and sdpa:
                    flash.append((w, sdpa / us))
            elif speedup:
                plain.append(speedup)
    fmt = lambda x: "-" if x is None else f"{x:.1f}"
    print(f"{'workload':16} {'B':>3} {'efopt tuned':>12} {'eager':>9} {'compile':>9} {'sdpa':>9} {'vs fastest':>10}")
    for w, b, us, e, c, s, sp in rows:
        print(f"{w:16} {b:>3} {fmt(us):>12} {fmt(e):>9} {fmt(c):>9} {fmt(s):>9} {('-' if sp is None else f'{sp:.2f}x'):>10}")
    print(f"geometric mean over the {len(plain)} non-attention configurations vs the fastest PyTorch: {geomean(plain):.2f}x")
    for w in ("mha_decode", "mha_prefill"):
        ratios = [r for n, r in flash if n == w]
        if ratios:
            print(f"{w} vs SDPA flash: min {min(ratios):.2f}x, geometric mean {geomean(ratios):.2f}x")


if __name__ == "__main__":
    main(sys.argv[-1])
