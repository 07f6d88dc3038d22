"""Times efopt-generated Triton candidates on a GPU against PyTorch.

    python3 python/gpu_bench.py DIR [--only a,b] [--tune 3] [--json OUT]

DIR holds modules written by `scripts/gpu-bench.sh` (`efopt --passes=saturate,extract,lower`),
one per workload, named after the workload. For each module this script

1. builds seeded inputs at the workload's sizes (the `where` clause of `examples/<name>.ef`),
2. runs every candidate host function once and compares it with an f32 PyTorch reference of
   the same formula (relative L2 <= 0.01; a candidate that fails is reported, never timed),
3. times each correct candidate with one default schedule, then tunes the fastest few over a
   fixed-seed sample of schedules (block sizes per axis, num_warps, num_stages),
4. times PyTorch eager, torch.compile and, for attention, SDPA's flash backend.

Timing: median of `triton.testing.do_bench_cudagraph` (CUDA graphs, so Python launch overhead
is not measured). Each timed graph runs the program over enough copies of the inputs to
exceed twice the L2 cache, so weights are read from HBM as in a real model, and the time is
divided by the number of copies. Everything is measured in one process on one GPU.
Needs torch and triton (the GPU machine's image); not used by the CPU test-suite.
"""

import argparse
import ast
import importlib.util
import glob
import inspect
import json
import math
import os
import random
import re
import sys
import time
import traceback

import triton
import triton.testing

try:
    import torch
except ImportError:  # the tile filter and schedule helpers are tested on CPU without torch
    torch = None


def causal(q, k, v):
    s = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    n = s.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
    return p.to(v.dtype) @ v if v.dtype != torch.float32 else p @ v


def rmsnorm(x, gamma, eps=1e-6):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * gamma.float()


def layernorm(x, gamma, beta, eps=1e-5):
    x32 = x.float()
    mean = x32.mean(-1, keepdim=True)
    centered = x32 - mean
    var = centered.square().mean(-1, keepdim=True)
    return centered * torch.rsqrt(var + eps) * gamma.float() + beta.float()


def rownorm(x):
    return x / torch.sqrt(x.square().sum(-1, keepdim=True))


# Each workload: sizes, inputs (shape as dim names, dtype), and the formula written twice: in
# f32 as the reference, and as a PyTorch user would write it in bf16 (eager / torch.compile).
# The formulas follow examples/<name>.ef; outputs are f32 there (acc=f32 matmuls).
WORKLOADS = {
    "attention": dict(
        sizes=dict(Q=8192, K=8192, D=128),
        inputs=[("QD", "bfloat16"), ("KD", "bfloat16"), ("KD", "bfloat16")],
        reference=lambda q, k, v: torch.softmax(q.float() @ k.float().T * 0.25, -1) @ v.float(),
        eager=lambda q, k, v: torch.softmax((q @ k.T).float() * 0.25, -1).to(q.dtype) @ v,
        sdpa=True,
    ),
    "gated_mlp": dict(
        sizes=dict(B=16, H=4096, F=4096),
        inputs=[("BH", "bfloat16"), ("HF", "bfloat16"), ("HF", "bfloat16")],
        reference=lambda x, w1, w2: torch.nn.functional.silu(x.float() @ w1.float())
        * (x.float() @ w2.float()),
        eager=lambda x, w1, w2: torch.nn.functional.silu(x @ w1) * (x @ w2),
    ),
    "rmsnorm_mlp": dict(
        sizes=dict(B=16, H=4096, F=4096),
        inputs=[("BH", "bfloat16"), ("H", "bfloat16"), ("HF", "bfloat16"), ("HF", "bfloat16")],
        reference=lambda x, g, wu, wg: (rmsnorm(x, g) @ wu.float()) * (rmsnorm(x, g) @ wg.float()),
        eager=lambda x, g, wu, wg: (
            lambda n: (n @ wu) * (n @ wg)
        )(rmsnorm(x, g).to(x.dtype)),
    ),
    "rmsnorm_swiglu": dict(
        sizes=dict(B=16, H=4096, F=11008),
        inputs=[("BH", "bfloat16"), ("H", "bfloat16"), ("HF", "bfloat16"), ("HF", "bfloat16")],
        reference=lambda x, g, wg, wu: torch.nn.functional.silu(rmsnorm(x, g) @ wg.float())
        * (rmsnorm(x, g) @ wu.float()),
        eager=lambda x, g, wg, wu: (
            lambda n: torch.nn.functional.silu(n @ wg) * (n @ wu)
        )(rmsnorm(x, g).to(x.dtype)),
    ),
    "rmsnorm_gemm": dict(
        sizes=dict(B=16, H=4096, N=6144),
        inputs=[("BH", "bfloat16"), ("H", "bfloat16"), ("HN", "bfloat16")],
        reference=lambda x, g, w: rmsnorm(x, g) @ w.float(),
        eager=lambda x, g, w: rmsnorm(x, g).to(x.dtype) @ w,
    ),
    "lora": dict(
        sizes=dict(B=16, H=4096, N=4096, R=16),
        inputs=[("BH", "bfloat16"), ("HN", "bfloat16"), ("HR", "bfloat16"), ("RN", "bfloat16")],
        reference=lambda x, w, a, b: x.float() @ w.float() + (x.float() @ a.float()) @ b.float(),
        eager=lambda x, w, a, b: x @ w + (x @ a) @ b,
    ),
    "layernorm_gemm": dict(
        sizes=dict(B=16, H=1024, N=4096),
        inputs=[("BH", "bfloat16"), ("H", "bfloat16"), ("H", "bfloat16"), ("HN", "bfloat16")],
        reference=lambda x, g, b, w: layernorm(x, g, b) @ w.float(),
        eager=lambda x, g, b, w: layernorm(x, g, b).to(x.dtype) @ w,
    ),
    "mha_decode": dict(
        sizes=dict(B=16, NH=32, K=4096, D=128),
        inputs=[("B NH 1 D", "bfloat16"), ("B NH K D", "bfloat16"), ("B NH K D", "bfloat16")],
        reference=lambda q, k, v: torch.softmax(
            q.float() @ k.float().transpose(-1, -2) * 128**-0.5, -1) @ v.float(),
        eager=lambda q, k, v: torch.softmax(
            (q @ k.transpose(-1, -2)).float() * 128**-0.5, -1).to(q.dtype) @ v,
        sdpa="full",
    ),
    "mha_prefill": dict(
        sizes=dict(B=16, NH=32, Q=1024, K=1024, D=128),
        inputs=[("B NH Q D", "bfloat16"), ("B NH K D", "bfloat16"), ("B NH K D", "bfloat16")],
        reference=lambda q, k, v: causal(q.float(), k.float(), v.float()),
        eager=lambda q, k, v: causal(q, k, v),
        sdpa="causal",
    ),
    "ngpt": dict(
        sizes=dict(B=16, H=4096),
        inputs=[("BH", "bfloat16"), ("BH", "bfloat16"), ("BH", "bfloat16")],
        reference=lambda h, x, a: rownorm(
            x.float() + a.float() * (rownorm(h.float()) - x.float())
        ),
        eager=lambda h, x, a: rownorm(x + a * (rownorm(h) - x)),
    ),
}

L2_BYTES = 50 * 2**20


def make_inputs(spec, generator, device):
    out = []
    for dims, dtype in spec["inputs"]:
        # "BH": one letter per dimension; "B NH 1 D": names (or literal sizes) apart.
        names = dims.split() if " " in dims else list(dims)
        shape = [int(d) if d.isdigit() else spec["sizes"][d] for d in names]
        t = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        if len(dims) == 2 and dims[0] in "HK" and dims != "KD":
            t = t / math.sqrt(shape[0])  # weights: keep activations O(1)
        out.append(t.to(getattr(torch, dtype)))
    return out


def rel_l2(got, want):
    got, want = got.float(), want.float()
    return float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want))


def candidates(module, func):
    pattern = re.compile(re.escape(func) + r"_c(\d+)$")
    found = []
    for name, obj in vars(module).items():
        m = pattern.match(name)
        if m and inspect.isfunction(obj):
            found.append((int(m.group(1)), name, obj))
    return [(name, obj) for _, name, obj in sorted(found)]


def default_schedule(fn):
    """The host function's own defaults: `sched = {...}` in its source."""
    m = re.search(r"sched = (\{[^}]*\})", inspect.getsource(fn))
    return ast.literal_eval(m.group(1)) if m else {}


def block_choices(key, sizes, dots=True):
    """Block sizes for axis `key`; below 16 only for kernels without `tl.dot` (its minimum)."""
    dim = sizes.get(key[len("BLOCK_"):].upper())
    cap = max(16, triton.next_power_of_2(dim)) if dim else 256
    smallest = 16 if dots else 1
    return [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if smallest <= b <= cap]


def schedule_space(fn, sizes, count, seed, dots=True):
    base = default_schedule(fn)
    keys = [k for k in base if k.startswith("BLOCK_")]
    start = {k: min(64, block_choices(k, sizes)[-1]) for k in keys}
    start.update(num_warps=4, num_stages=3)
    rng = random.Random(seed)
    seen, out = set(), []
    # The usual hand-tuned shapes first (FlashAttention's 128x64 with 8 warps), then samples.
    shapes = ((None, 4), (128, 8), (64, 8), (32, 4)) if dots else ((None, 4), (1, 4), (2, 8), (4, 8))
    for block, warps in shapes:
        s = dict(start) if block is None else {k: min(block, block_choices(k, sizes, dots)[-1]) for k in keys}
        s.update(num_warps=warps, num_stages=3)
        if tuple(sorted(s.items())) not in seen:
            seen.add(tuple(sorted(s.items())))
            out.append(s)
    for _ in range(count * 20):
        if len(out) >= count:
            break
        s = {k: rng.choice(block_choices(k, sizes, dots)) for k in keys}
        s.update(num_warps=rng.choice([4, 8]), num_stages=rng.choice([2, 3, 4]))
        key = tuple(sorted(s.items()))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def whole_dim_tiles(source, cname, sizes, limit, row_limit=4096):
    """Dimensions that a kernel of candidate `cname` holds whole in one tile: above `limit` in
    a matrix product, or above `row_limit` anywhere.

    Such kernels come from the default tiling of tensor-level operators (one program on whole
    blocks): legal, but not a real GPU schedule at large sizes (Triton took minutes to compile
    an 8192-wide tile), so the bench reports them instead of timing them. Whole rows of a
    normalisation (4096 wide, no product) are fine."""
    big = set()
    for body in re.findall(
        r"def " + re.escape(cname) + r"_k\d+\(.*?(?=\n@triton\.jit|\ndef |\Z)", source, re.S
    ):
        for line in body.splitlines():
            cap = limit if "tl.dot(" in line else row_limit
            for dim in re.findall(r"tl\.arange\(0, P_([A-Z][A-Z0-9_]*)\)", line):
                if sizes.get(dim, 0) > cap:
                    big.add(dim)
    return sorted(big)


def kernels_use_dot(source, cname):
    return any(
        "tl.dot(" in body
        for body in re.findall(
            r"def " + re.escape(cname) + r"_k\d+\(.*?(?=\n@triton\.jit|\ndef |\Z)", source, re.S
        )
    )


def input_copies(inputs):
    per_set = sum(t.numel() * t.element_size() for t in inputs)
    n = max(1, min(64, math.ceil(2 * L2_BYTES / per_set)))
    return [inputs] + [[t.clone() for t in inputs] for _ in range(n - 1)]


def bench(call, copies, rep=100):
    """Median µs of one `call` over `copies`; `rep`: ms of graph replays per measurement."""

    def run():
        for inputs in copies:
            call(inputs)

    run()
    torch.cuda.synchronize()
    try:
        ms = triton.testing.do_bench_cudagraph(run, rep=rep, return_mode="median")
    except Exception:  # some callables cannot be captured; time them with launches
        ms = triton.testing.do_bench(run, warmup=25, rep=rep, return_mode="median")
    return 1000.0 * ms / len(copies)


def run_workload(name, paths, args, device):
    """`paths`: the workload's modules, `<name>.py` and variants `<name>.<variant>.py` (lowered
    with other options); candidates of a variant are labelled `<variant>:<candidate>`."""
    spec = WORKLOADS[name]
    gen = torch.Generator(device=device).manual_seed(0)
    inputs = make_inputs(spec, gen, device)
    reference = spec["reference"](*inputs)
    copies = input_copies(inputs)
    rows = []

    def record(label, call, check=True, schedule=None):
        row = dict(workload=name, impl=label, schedule=schedule)
        try:
            t0 = time.perf_counter()
            out = call(inputs)
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.perf_counter() - t0, 2)
            row["rel_l2"] = rel_l2(out, reference)
            if check:
                if not row["rel_l2"] <= 0.01:
                    row["error"] = "mismatch"
                    return row
            row["us"] = bench(call, copies)
        except Exception as e:  # report and go on: one broken candidate must not stop the run
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            if args.verbose:
                traceback.print_exc()
        return row

    eager = spec["eager"]
    # Baselines are timed whatever their error (bf16 softmax probabilities in eager attention
    # are off by about 1%); the error is reported beside the time.
    rows.append(record("torch-eager", lambda xs: eager(*xs), check=False))
    print(json.dumps(rows[-1]), flush=True)
    compiled = torch.compile(eager)
    rows.append(record("torch.compile", lambda xs: compiled(*xs), check=False))
    print(json.dumps(rows[-1]), flush=True)
    if spec.get("sdpa"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash(xs):
            if spec["sdpa"] is True:  # one head, scale 1/4
                q, k, v = (t[None, None] for t in xs)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, scale=0.25)[0, 0]
            q, k, v = xs
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=spec["sdpa"] == "causal")

        rows.append(record("sdpa-flash", flash, check=False))
        print(json.dumps(rows[-1]), flush=True)

    if args.baselines_only:
        return rows
    first = []
    for path in paths:
        variant = os.path.basename(path)[len(name) : -len(".py")].lstrip(".")
        spec_mod = importlib.util.spec_from_file_location(f"efopt_gpu_{name}_{variant}", path)
        module = importlib.util.module_from_spec(spec_mod)
        spec_mod.loader.exec_module(module)
        source = open(path).read()
        first.extend(time_candidates(name, variant, module, source, spec, record, rows, args))
    timed = sorted((r for r, _, _ in first if "us" in r), key=lambda r: r["us"])
    for row, fn, dots in first:
        if row in timed[: args.tune]:
            space = schedule_space(fn, spec["sizes"], args.schedules, 1, dots)
            for sched in [s for s in space if s != row["schedule"]]:
                tuned = record(
                    row["impl"], lambda xs, fn=fn, s=sched: fn(*xs, schedule=s)[0], schedule=sched
                )
                print(json.dumps(dict(tuned, tuning=True)), flush=True)
                if "us" in tuned and tuned["us"] < row["us"]:
                    row.update(us=tuned["us"], schedule=sched, rel_l2=tuned["rel_l2"])
    rows.extend(r for r, _, _ in first)
    return rows


def time_candidates(name, variant, module, source, spec, record, rows, args):
    """Each candidate once, with the default schedule; returns (row, host function, whether
    its kernels use `tl.dot`) triples."""
    first, kept = [], 0
    for cname, fn in candidates(module, name):
        label = f"{variant}:{cname}" if variant else cname
        big = whole_dim_tiles(source, cname, spec["sizes"], args.max_tile)
        if big or kept >= args.max_candidates:
            why = f"whole-dimension tile of {','.join(big)}" if big else "over --max-candidates"
            rows.append(dict(workload=name, impl=label, skipped=why))
            print(json.dumps(rows[-1]), flush=True)
            continue
        kept += 1
        dots = kernels_use_dot(source, cname)
        sched = schedule_space(fn, spec["sizes"], 1, 0, dots)[0]
        row = record(label, lambda xs, fn=fn, s=sched: fn(*xs, schedule=s)[0], schedule=sched)
        first.append((row, fn, dots))
        print(json.dumps(row), flush=True)
    return first


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--only", default="")
    parser.add_argument("--tune", type=int, default=3, help="candidates to tune per workload")
    parser.add_argument("--schedules", type=int, default=8, help="schedules tried when tuning")
    parser.add_argument("--max-candidates", type=int, default=6, help="timed per workload")
    parser.add_argument("--max-tile", type=int, default=256, help="largest whole-dimension tile")
    parser.add_argument("--json", default="")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--baselines-only", action="store_true",
                        help="time PyTorch only (eager, torch.compile, SDPA); DIR is not read")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a size of every workload (B=1)")
    args = parser.parse_args()
    for kv in args.set:
        k, v = kv.split("=")
        for spec in WORKLOADS.values():
            if k in spec["sizes"]:
                spec["sizes"][k] = int(v)
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cuda"
    names = [n for n in WORKLOADS if not args.only or n in args.only.split(",")]
    print(
        f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}",
        flush=True,
    )
    all_rows = []
    for name in names:
        paths = sorted(glob.glob(os.path.join(args.dir, f"{name}.py")))
        paths += sorted(glob.glob(os.path.join(args.dir, f"{name}.*.py")))
        if not paths and not args.baselines_only:
            print(f"# {name}: no module in {args.dir}, skipped", flush=True)
            continue
        t0 = time.perf_counter()
        rows = run_workload(name, paths, args, device)
        all_rows.extend(rows)
        print(f"# {name}: {len(rows)} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_rows, f, indent=1)
    print_table(all_rows)


def print_table(rows):
    print(f"{'workload':16} {'impl':22} {'median us':>10} {'vs eager':>9} {'vs compile':>10} {'rel L2':>9}  schedule / error")
    by_workload = {}
    for r in rows:
        by_workload.setdefault(r["workload"], []).append(r)
    for name, group in by_workload.items():
        base = {r["impl"]: r.get("us") for r in group}
        is_candidate = lambda r: ":" in r["impl"] or r["impl"].startswith(name)
        best = min((r for r in group if is_candidate(r) and "us" in r), key=lambda r: r["us"], default=None)
        for r in group:
            if "skipped" in r:
                continue
            if is_candidate(r) and r is not best and "error" not in r:
                continue  # one line per workload for efopt: its best candidate (errors listed)
            us = r.get("us")
            ratio = lambda b: f"{b / us:.2f}x" if us and b else "-"
            extra = r.get("error") or (json.dumps(r["schedule"]) if r.get("schedule") else "")
            rel = f"{r['rel_l2']:.1e}" if "rel_l2" in r else "-"
            print(
                f"{name:16} {r['impl']:22} {us if us is None else round(us, 1)!s:>10} "
                f"{ratio(base.get('torch-eager')):>9} {ratio(base.get('torch.compile')):>10} {rel:>9}  {extra}"
            )


if __name__ == "__main__":
    sys.exit(main())
