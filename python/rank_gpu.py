"""Measures how well `rank` orders candidates: times its top candidates on a GPU.

    python3 python/rank_gpu.py DIR [--only a,b] [--json OUT] [--dry]

DIR holds what `scripts/rank-gpu.sh` writes: for each workload and batch size,
`<workload>.B<b>.py` (`efopt --set B=<b> --passes=saturate,extract,rank,lower`, one host
function per kept candidate) and `<workload>.B<b>.stats.json` (efopt's stderr with
`--stats=json`: the rank pass's counters list the candidates in rank order with
`predicted_us`). For each module this script

1. builds seeded inputs at the workload's sizes (the `where` clause of `examples/<name>.ef`,
   B from the file name), one per `name: tensor<...> = input` line, in order,
2. runs each ranked candidate once with its default schedule (the one rank chose) and
   compares it with an f32 PyTorch reference (relative L2 <= 0.01; a candidate that fails
   is reported, never timed),
3. times each correct candidate like `gpu_bench.py` (its `bench`: CUDA graphs, median, enough
   input copies to miss L2), and PyTorch eager for context,
4. reports per module Spearman's rho between predicted and measured latency (correct
   candidates only), the measured time of the top-ranked candidate against the fastest.

Time: compiling the kernels is most of it (seconds to minutes per candidate for big tiles), so
--jobs processes first run every candidate once, untimed, to fill Triton's on-disk cache
(--warm-timeout); the timing worker then loads them. --budget-s bounds the whole run: each
module gets an equal share of what compiling left and reports the candidates it had no time
for as skipped. Progress goes to stderr; --json is rewritten as results come.

Robustness: the GPU work runs in worker processes that log each candidate before running it;
when a candidate kills its worker (a crash, a lost CUDA context) or outlasts
--candidate-timeout, the driver records it as failed and starts a new worker on the rest.
SIGTERM/SIGINT kill the workers and print the results so far (exit status 2).
`--dry` only parses modules and stats (no torch, no GPU) and prints what it would time.
Run it with a Python that has triton (gpu_bench imports it): the GPU machine's python3, or
.venv/bin/python here for --dry.
"""

import argparse
import ast
import glob
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
# what the driver runs as `--worker JOB` and `--warm JOB` (the CPU test puts a stand-in here)
WORKER_SCRIPT = os.path.abspath(__file__)
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import gpu_bench  # noqa: E402  (reference formulas, bench, rel_l2, the tile filter)

torch = None  # imported by the worker only: the driver and --dry run without torch

WORKLOAD_ORDER = [
    "ngpt",
    "rmsnorm_mlp",
    "rmsnorm_swiglu",
    "gated_mlp",
    "rmsnorm_gemm",
    "lora",
    "layernorm_gemm",
    "mha_decode",
    "mha_prefill",
]

DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "i32": "int32"}


def log(msg):
    print(f"[rank-gpu] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Pure helpers (tested on CPU by test_rank_gpu.py)


def parse_ef(text):
    """The parts of an .ef source the bench needs: function name, `where` sizes, the inputs in
    order (name, dims, dtype) and scalar f32 constants. Dims are names or ints (a literal 1)."""
    m = re.search(r"\bfunc\s+(\w+)\s*(?:where\s+(.*?))?\{", text, re.S)
    if not m:
        raise ValueError("no `func NAME where ... {` header")
    sizes = {}
    for item in (m.group(2) or "").split(","):
        if item.strip():
            k, _, v = item.partition("=")
            sizes[k.strip()] = int(v.strip())
    inputs = []
    for name, ty in re.findall(r"^\s*(\w+)\s*:\s*tensor<([^>]*)>\s*=\s*input\b", text, re.M):
        shape, _, dtype = ty.rpartition(",")
        if not _:
            shape, dtype = "", ty
        dims = [int(d) if d.strip().isdigit() else d.strip() for d in shape.split("x") if d.strip()]
        dtype = dtype.strip()
        inputs.append((name, dims, DTYPES.get(dtype, dtype)))
    constants = {
        name: float(value)
        for name, value in re.findall(
            r"^\s*(\w+)\s*:\s*tensor<\s*f32\s*>\s*=\s*constant\s+(\S+)", text, re.M
        )
    }
    return dict(func=m.group(1), sizes=sizes, inputs=inputs, constants=constants)


def shape_of(dims, sizes):
    return [d if isinstance(d, int) else sizes[d] for d in dims]


def stats_document(text):
    """The JSON document in efopt's stderr under --stats=json: it starts at the first line
    that starts with "{" (remarks and warnings come before it)."""
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.startswith("{"):
            doc, _ = json.JSONDecoder().raw_decode(text[offset:])
            return doc
        offset += len(line)
    raise ValueError("no JSON document (no line starts with '{')")


def ranked_candidates(doc, func=None):
    """The rank pass's candidates in rank order (every chunk, every `rank...` pass; nested
    `candidates` lists found wherever they sit in its counters), those of `func` if given."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            cands = node.get("candidates")
            if isinstance(cands, list) and all(isinstance(c, dict) and "predicted_us" in c for c in cands):
                found.extend(cands)
            for key, value in node.items():
                if key != "candidates":
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    passes = [p for chunk in doc.get("chunks", []) for p in chunk.get("passes", [])]
    ranks = [p for p in passes if str(p.get("pass", "")).split("{")[0].strip() == "rank"]
    if not ranks:
        raise ValueError("no rank pass in the stats (passes: %s)" % ", ".join(str(p.get("pass")) for p in passes))
    for p in ranks:
        walk(p.get("counters", {}))
    if func is not None:
        found = [c for c in found if str(c.get("name", "")).split(".")[0] == func]
    return found


def average_ranks(values):
    """Ranks 1..n, ties sharing the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs, ys):
    """Spearman's rho (Pearson's correlation of average ranks); None when undefined (fewer
    than 2 points, or all of one side tied)."""
    if len(xs) != len(ys):
        raise ValueError("spearman: lengths differ")
    if len(xs) < 2:
        return None
    rx, ry = average_ranks(xs), average_ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def host_functions(source, func):
    """Host functions of `func`'s candidates in a lowered module: {python name: default
    schedule}, without importing it."""
    out = {}
    pattern = re.compile(r"^def (" + re.escape(func) + r"_c\d+)\(.*?^    sched = (\{[^}\n]*\})", re.M | re.S)
    for m in pattern.finditer(source):
        out[m.group(1)] = ast.literal_eval(m.group(2))
    # host functions without a schedule (no blocked axis) still count
    for name in re.findall(r"^def (" + re.escape(func) + r"_c\d+)\(", source, re.M):
        out.setdefault(name, {})
    return out


MODULE_NAME = re.compile(r"^(\w+)\.B(\d+)\.py$")


def plan_module(path, examples, max_tile):
    """Everything the worker needs for one module, or an `error` saying why it cannot run."""
    base = os.path.basename(path)
    m = MODULE_NAME.match(base)
    plan = dict(module=base, path=path, workload=m.group(1) if m else base, batch=int(m.group(2)) if m else None)
    try:
        if not m:
            raise ValueError("module name is not <workload>.B<b>.py")
        with open(os.path.join(examples, plan["workload"] + ".ef")) as f:
            ef = parse_ef(f.read())
        sizes = dict(ef["sizes"], B=plan["batch"])
        plan.update(func=ef["func"], sizes=sizes, inputs=ef["inputs"], constants=ef["constants"])
        for _, dims, _ in ef["inputs"]:
            shape_of(dims, sizes)  # every dimension has a size
        with open(path) as f:
            source = f.read()
        with open(path[: -len(".py")] + ".stats.json") as f:
            ranked = ranked_candidates(stats_document(f.read()), ef["func"])
        if not ranked:
            raise ValueError("the rank pass lists no candidate of " + ef["func"])
        funcs = host_functions(source, ef["func"])
        cands = []
        for i, c in enumerate(ranked):
            name = str(c.get("name"))
            pyname = name.replace(".", "_")
            row = dict(
                name=name,
                pyname=pyname,
                rank=i + 1,
                predicted_us=c.get("predicted_us"),
                bottleneck=c.get("bottleneck"),
                kernels=c.get("kernels"),
                dram_bytes=c.get("dram_bytes"),
                ranked_schedule=c.get("schedule"),
            )
            if pyname not in funcs:
                row["error"] = "not in module"
            else:
                row["schedule"] = funcs[pyname]
                if c.get("schedule") is not None and c["schedule"] != funcs[pyname]:
                    row["note"] = "module default schedule differs from rank's"
                big = gpu_bench.whole_dim_tiles(source, pyname, sizes, max_tile) if max_tile else []
                if big:
                    row["skipped"] = "whole-dimension tile of " + ",".join(big)
            if not isinstance(row["predicted_us"], (int, float)):
                row["error"] = "no predicted_us"
            cands.append(row)
        plan["candidates"] = cands
    except (OSError, ValueError, KeyError, SyntaxError) as e:
        plan["error"] = f"{type(e).__name__}: {e}"
    return plan


def find_modules(directory, only):
    paths = []
    for path in sorted(glob.glob(os.path.join(directory, "*.B*.py"))):
        m = MODULE_NAME.match(os.path.basename(path))
        if m and (not only or m.group(1) in only):
            paths.append(path)
    order = {w: i for i, w in enumerate(WORKLOAD_ORDER)}

    def key(p):
        m = MODULE_NAME.match(os.path.basename(p))
        return (order.get(m.group(1), len(order)), m.group(1), int(m.group(2)))

    return sorted(paths, key=key)


def summarise(plan, rows):
    """One table line's numbers for a module from its candidate rows (rank order)."""
    timed = [r for r in rows if isinstance(r.get("us"), (int, float))]
    s = dict(workload=plan["workload"], batch=plan.get("batch"), ranked=len(rows), timed=len(timed))
    s["failed"] = sum(1 for r in rows if "error" in r and r["error"] != "not run")
    s["not_run"] = sum(1 for r in rows if r.get("error") == "not run")
    s["skipped"] = sum(1 for r in rows if "skipped" in r)
    s["rho"] = spearman([r["predicted_us"] for r in timed], [r["us"] for r in timed])
    if timed:
        top = min(timed, key=lambda r: r["rank"])
        best = min(timed, key=lambda r: r["us"])
        s.update(top1_rank=top["rank"], top1_name=top["name"], top1_us=top["us"])
        s.update(best_rank=best["rank"], best_name=best["name"], best_us=best["us"])
        s["top1_over_best"] = top["us"] / best["us"] if best["us"] > 0 else None
    return s


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(summaries):
    head = (
        f"{'workload':15} {'B':>3} {'timed':>7} {'rho':>6} {'top1 us':>9} {'#':>2} "
        f"{'best us':>9} {'#':>2} {'best':18} {'top1/best':>9} {'eager us':>9}  notes"
    )
    lines = [head]
    for s in summaries:
        notes = []
        if s.get("error"):
            notes.append(s["error"])
        if s.get("failed"):
            notes.append(f"{s['failed']} failed")
        if s.get("skipped"):
            notes.append(f"{s['skipped']} skipped")
        if s.get("not_run"):
            notes.append(f"{s['not_run']} not run")
        if s.get("top1_rank", 1) != 1:
            notes.append("rank-1 candidate not timed")
        lines.append(
            f"{s['workload']:15} {s.get('batch') or '-'!s:>3} {str(s.get('timed', 0)) + '/' + str(s.get('ranked', 0)):>7} "
            f"{fmt(s.get('rho'), 2):>6} {fmt(s.get('top1_us')):>9} {s.get('top1_rank', '-')!s:>2} "
            f"{fmt(s.get('best_us')):>9} {s.get('best_rank', '-')!s:>2} {str(s.get('best_name', '-')):18} "
            f"{fmt(s.get('top1_over_best'), 2):>9} {fmt(s.get('eager_us')):>9}  {'; '.join(notes)}"
        )
    return "\n".join(lines)


def dry_report(plan):
    lines = [f"{plan['module']}: workload {plan['workload']} B={plan.get('batch')}"]
    if "error" in plan:
        lines.append(f"  error: {plan['error']}")
        return "\n".join(lines)
    lines.append("  sizes " + " ".join(f"{k}={v}" for k, v in plan["sizes"].items()))
    lines.append(
        "  inputs "
        + ", ".join(f"{n}{shape_of(d, plan['sizes'])}:{t}" for n, d, t in plan["inputs"])
    )
    lines.append(f"  reference: {'yes' if reference_known(plan['workload']) else 'NONE (candidates would not be checked)'}")
    for c in plan["candidates"]:
        what = c.get("error") or c.get("skipped") and "skip: " + c["skipped"] or "time"
        note = f" ({c['note']})" if c.get("note") else ""
        lines.append(
            f"  #{c['rank']:<2} {c['name']:22} predicted {fmt(c['predicted_us'], 2):>9} us  "
            f"{json.dumps(c.get('schedule'))}  -> {what}{note}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# References (f32) and PyTorch eager, by workload


def attention_reference(q, k, v, scale, causal):
    s = q.float() @ k.float().transpose(-1, -2) * scale
    if causal:
        nq, nk = s.shape[-2], s.shape[-1]
        # query i sees keys j <= i (mha_prefill.ef: less_equal(col, row))
        hidden = torch.ones(nq, nk, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(hidden, float("-inf"))
    return torch.softmax(s, -1) @ v.float()


def attention_eager(q, k, v, scale, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal)


def reference_known(workload):
    return workload in gpu_bench.WORKLOADS or workload in ("mha_decode", "mha_prefill")


def formulas(plan):
    """(f32 reference, eager) callables of the inputs for the module's workload."""
    w = plan["workload"]
    if w in ("mha_decode", "mha_prefill"):
        d = plan["sizes"]["D"]
        scale = plan["constants"].get("scale", 1 / math.sqrt(d))
        causal = w == "mha_prefill"
        return (
            lambda q, k, v: attention_reference(q, k, v, scale, causal),
            lambda q, k, v: attention_eager(q, k, v, scale, causal),
        )
    spec = gpu_bench.WORKLOADS[w]
    if len(spec["inputs"]) != len(plan["inputs"]):
        raise ValueError(f"gpu_bench's {w} takes {len(spec['inputs'])} inputs, the .ef {len(plan['inputs'])}")
    return spec["reference"], spec["eager"]


def make_inputs(plan, device):
    """Seeded normal inputs; matrices whose rows are not the batch (weights) are scaled by
    1/sqrt(rows) so that products stay O(1)."""
    gen = torch.Generator(device=device).manual_seed(0)
    out = []
    for _, dims, dtype in plan["inputs"]:
        shape = shape_of(dims, plan["sizes"])
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        if len(dims) == 2 and dims[0] != "B":
            t = t / math.sqrt(shape[0])
        out.append(t.to(getattr(torch, dtype)))
    return out


# ---------------------------------------------------------------------------------------------
# Worker: the GPU part. Writes one JSON event per line to --events, flushed, so that the
# driver knows which candidate was running when it died.


def worker(args):
    global torch
    import torch as _torch

    torch = _torch
    gpu_bench.torch = _torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(args.worker) as f:
        job = json.load(f)
    done = {tuple(x) for x in job["done"]}
    events = open(job["events"], "a")

    def emit(**e):
        events.write(json.dumps(e) + "\n")
        events.flush()

    if not job.get("header_done"):
        emit(event="header", device=torch.cuda.get_device_name(), torch=torch.__version__, triton=gpu_bench.triton.__version__)
    for plan in job["plans"]:
        if (plan["module"], "") in done:
            continue
        run_module(plan, job, done, emit)
        emit(event="module_done", module=plan["module"])
    return 0


def warm(args):
    """Runs its share of candidates once each, untimed, so that their kernels compile."""
    global torch
    import torch as _torch

    torch = _torch
    with open(args.warm) as f:
        job = json.load(f)
    plans = {p["module"]: p for p in job["plans"]}
    events = open(job["events"], "a")

    def emit(**e):
        events.write(json.dumps(e) + "\n")
        events.flush()

    current, inputs, module = None, None, None
    for mod, name, pyname in job["tasks"]:
        emit(event="start", module=mod, name=name, t=time.time())
        try:
            if mod != current:
                current, inputs, module = None, None, None
                inputs = make_inputs(plans[mod], "cuda")
                spec = importlib.util.spec_from_file_location("efopt_warm_" + re.sub(r"\W", "_", mod), plans[mod]["path"])
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                current = mod
            getattr(module, pyname)(*inputs)
            torch.cuda.synchronize()
            emit(event="warm", module=mod, name=name)
        except Exception as e:
            # reported by the timing worker, which runs it again
            emit(event="fail", module=mod, name=name, error=f"{type(e).__name__}: {str(e)[:200]}")
            if not cuda_alive():
                os._exit(4)  # the driver starts a new process on the rest
    events.close()
    os._exit(0)  # skip interpreter teardown


def cuda_alive():
    try:
        torch.cuda.synchronize()
        return float((torch.ones(1, device="cuda") + 1).item()) == 2.0
    except Exception:
        return False


def run_module(plan, job, done, emit):
    mod = plan["module"]
    device = "cuda"
    # name "": the module's own work (reference, eager, import); a death there ends the module
    emit(event="start", module=mod, name="", t=time.time())
    try:
        reference_fn, eager_fn = formulas(plan)
        inputs = make_inputs(plan, device)
        reference = reference_fn(*inputs)
        torch.cuda.synchronize()
        copies = gpu_bench.input_copies(inputs)
    except Exception as e:
        emit(event="module_error", module=mod, error=f"{type(e).__name__}: {str(e)[:200]}")
        return
    if (mod, "eager") not in done:
        row = dict(module=mod)
        try:
            out = eager_fn(*inputs)
            row["rel_l2"] = gpu_bench.rel_l2(out, reference)
            row["us"] = gpu_bench.bench(lambda xs: eager_fn(*xs), copies, rep=job["rep"])
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        emit(event="eager", **row)
    emit(event="start", module=mod, name="", t=time.time())
    spec = importlib.util.spec_from_file_location("efopt_rank_" + re.sub(r"\W", "_", mod), plan["path"])
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:
        emit(event="module_error", module=mod, error=f"import: {type(e).__name__}: {str(e)[:200]}")
        return
    n = len(plan["candidates"])
    for c in plan["candidates"]:
        if (mod, c["name"]) in done or "error" in c or "skipped" in c:
            continue
        deadline = job["deadlines"].get(mod)
        if deadline and time.time() > deadline:
            emit(event="row", module=mod, name=c["name"], skipped="over --budget-s")
            continue
        emit(event="start", module=mod, name=c["name"], t=time.time())
        row = dict(module=mod, name=c["name"])
        fn = getattr(module, c["pyname"])
        try:
            t0 = time.perf_counter()
            out = fn(*inputs)[0]
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.perf_counter() - t0, 2)
            if tuple(out.shape) != tuple(reference.shape):
                row["error"] = f"shape {list(out.shape)} != {list(reference.shape)}"
            else:
                row["rel_l2"] = gpu_bench.rel_l2(out, reference)
                if not row["rel_l2"] <= 0.01:
                    row["error"] = "mismatch"
            if "error" not in row:
                # one plain call first: a pathologically slow schedule is not worth a graph
                t0 = time.perf_counter()
                fn(*inputs)
                torch.cuda.synchronize()
                once_us = 1e6 * (time.perf_counter() - t0)
                if once_us > 1e6 * job["slow_s"]:
                    row.update(us=once_us, timing="one call (slow)")
                else:
                    row["us"] = gpu_bench.bench(lambda xs: fn(*xs), copies, rep=job["rep"])
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            if job.get("verbose"):
                traceback.print_exc()
        emit(event="row", **row)
        what = f"{row['us']:.1f} us" if "us" in row else row.get("error")
        log(f"{plan['workload']} B={plan['batch']} #{c['rank']}/{n} {c['name']}: {what} (predicted {fmt(c['predicted_us'], 1)} us)")
        if "error" in row and not cuda_alive():
            log("CUDA context lost; the driver restarts the worker")
            os._exit(3)  # no interpreter teardown: it can hang on a faulted context


# ---------------------------------------------------------------------------------------------
# Driver


def read_events(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by a killed worker
    except OSError:
        pass
    return out


LIVE = set()  # worker processes to kill if the driver is interrupted


class Interrupted(Exception):
    pass


def on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def spawn(cmd, stdout):
    # its own process group: a kill takes Triton's compiler children with it (a killed
    # worker's orphan kept the output pipe open); so a signal to the driver does not reach
    # them, and main() kills them when it is interrupted
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stdout, start_new_session=True)
    LIVE.add(proc)
    return proc


def kill_group(proc):
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    LIVE.discard(proc)


def warm_up(plans, args, tmp):
    """Compiles every candidate to time before timing starts: --jobs processes run each once
    (untimed, unchecked) so that Triton's on-disk cache holds their kernels and the timing
    worker only loads them: compiling is most of the run's time and takes one core per
    process. Returns {(module, candidate name): why} for candidates that killed a process or
    outlasted --candidate-timeout here (they are reported, not retried); a process that dies
    is restarted on the rest of its share. What --warm-timeout leaves uncompiled, the timing
    worker compiles."""
    runnable = [p for p in plans if "error" not in p]
    tasks = [
        (p["module"], c["name"], c["pyname"])
        for p in runnable
        for c in p["candidates"]
        if not ("error" in c or "skipped" in c)
    ]
    bad = {}
    if not tasks or args.jobs <= 0:
        return bad
    n = min(args.jobs, len(tasks))
    t0 = time.time()
    shards = [dict(todo=tasks[i::n], proc=None, events=None, spawns=0) for i in range(n)]
    log(f"compiling {len(tasks)} candidates in {n} processes")
    compiled = 0

    def start(i, shard):
        shard["spawns"] += 1
        stem = os.path.join(tmp, f"warm{i}.{shard['spawns']}")
        job = dict(plans=runnable, tasks=shard["todo"], events=stem + ".jsonl")
        with open(stem + ".json", "w") as f:
            json.dump(job, f)
        shard["events"] = job["events"]
        shard["reason"] = None
        with open(stem + ".log", "w") as log_file:
            shard["proc"] = spawn([sys.executable, WORKER_SCRIPT, "--warm", stem + ".json"], log_file)

    for i, shard in enumerate(shards):
        start(i, shard)
    while any(sh["proc"] is not None for sh in shards):
        time.sleep(0.2)
        over = time.time() - t0 > args.warm_timeout
        for i, shard in enumerate(shards):
            proc = shard["proc"]
            if proc is None:
                continue
            events = read_events(shard["events"])
            last = events[-1] if events else None
            if proc.poll() is None:
                if last and last["event"] == "start" and time.time() - last["t"] > args.candidate_timeout:
                    shard["reason"] = f"timeout: over {args.candidate_timeout:.0f} s (compiling)"
                    kill_group(proc)
                elif over:
                    kill_group(proc)  # what it did not compile, the timing worker compiles
                else:
                    continue
            rc = proc.returncode
            kill_group(proc)
            shard["proc"] = None
            finished = {(e["module"], e["name"]) for e in events if e["event"] in ("warm", "fail")}
            compiled += sum(1 for e in events if e["event"] == "warm")
            if last and last["event"] == "start" and not over:
                why = shard["reason"] or f"worker died while compiling (exit {rc})"
                bad[(last["module"], last["name"])] = why
                finished.add((last["module"], last["name"]))
                log(f"{last['module']} {last['name']}: {why}")
            shard["todo"] = [t for t in shard["todo"] if (t[0], t[1]) not in finished]
            if shard["todo"] and not over and shard["spawns"] <= args.max_restarts:
                start(i, shard)
    log(f"compiled {compiled}/{len(tasks)} candidates in {time.time() - t0:.0f} s")
    return bad


def drive(plans, args, tmp):
    """Compiles, then runs timing workers until every module is done; returns the events
    (also in `tmp`/events.jsonl as they come)."""
    t_start = time.time()
    events_path = os.path.join(tmp, "events.jsonl")
    runnable = [p for p in plans if "error" not in p]
    bad = warm_up(plans, args, tmp)
    with open(events_path, "a") as f:
        for (mod, name), why in bad.items():
            f.write(json.dumps(dict(event="row", module=mod, name=name, error=why)) + "\n")
    # Each module gets an equal share of what is left of --budget-s; time a module does not
    # use passes to the next.
    deadlines = {}
    if args.budget_s:
        t_timing, end = time.time(), t_start + args.budget_s
        for i, p in enumerate(runnable):
            deadlines[p["module"]] = t_timing + (end - t_timing) * (i + 1) / len(runnable)
    def finished():
        events = read_events(events_path)
        done = {(e["module"], e.get("name", "")) for e in events if e["event"] in ("row", "module_done", "module_error")}
        done |= {(e["module"], "eager") for e in events if e["event"] == "eager"}
        done |= {(e["module"], "") for e in events if e["event"] in ("module_done", "module_error")}
        return events, done, all((p["module"], "") in done for p in runnable)

    for attempt in range(args.max_restarts + 1):
        events, done, complete = finished()
        if complete:
            break
        job = dict(
            plans=runnable,
            done=sorted(done),
            events=events_path,
            deadlines=deadlines,
            rep=args.rep,
            slow_s=args.slow_s,
            verbose=args.verbose,
            header_done=any(e["event"] == "header" for e in events),
        )
        job_path = os.path.join(tmp, f"job{attempt}.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        proc = spawn([sys.executable, WORKER_SCRIPT, "--worker", job_path], sys.stderr)
        seen = len(events)
        reason = None
        while proc.poll() is None:
            time.sleep(0.5)
            events = read_events(events_path)
            last = events[-1] if events else None
            if last and last["event"] == "start" and time.time() - last["t"] > args.candidate_timeout:
                kill_group(proc)
                reason = f"timeout: over {args.candidate_timeout:.0f} s"
            if len(events) != seen:
                seen = len(events)
                write_json(args, plans, events)
        rc = proc.returncode
        kill_group(proc)
        if rc != 0:
            events = read_events(events_path)
            last = events[-1] if events else None
            reason = reason or f"worker died (exit {rc})"
            # The candidate (or the module's own work) that was running when it died is
            # recorded as failed; after a row (exit 3: the CUDA context was lost after a
            # failed candidate) there is nothing to record, the next worker goes on.
            if last and last["event"] == "start":
                with open(events_path, "a") as f:
                    if last["name"]:
                        f.write(json.dumps(dict(event="row", module=last["module"], name=last["name"], error=reason)) + "\n")
                    else:
                        f.write(json.dumps(dict(event="module_error", module=last["module"], error=reason)) + "\n")
                log(f"{last['module']} {last['name'] or '(reference/eager/import)'}: {reason}")
    events, _, complete = finished()
    if not complete:
        log(f"gave up after {args.max_restarts} restarts; the rest is reported as not run")
    return events


def collect(plans, events):
    header = next((e for e in events if e["event"] == "header"), {})
    rows_by = {}
    for e in events:
        if e["event"] == "row":
            rows_by[(e["module"], e["name"])] = e
    eager = {e["module"]: e for e in events if e["event"] == "eager"}
    errors = {e["module"]: e["error"] for e in events if e["event"] == "module_error"}
    all_rows, summaries = [], []
    for p in plans:
        rows = []
        for c in p.get("candidates", []):
            row = {k: v for k, v in c.items() if k not in ("pyname",)}
            row.update(workload=p["workload"], batch=p["batch"])
            got = rows_by.get((p["module"], c["name"]), {})
            row.update({k: v for k, v in got.items() if k not in ("event", "module", "name")})
            if not any(k in row for k in ("us", "error", "skipped")):
                row["error"] = errors.get(p["module"], "not run")
            rows.append(row)
        s = summarise(p, rows)
        if "error" in p:
            s["error"] = p["error"]
        elif p["module"] in errors:
            s["error"] = errors[p["module"]]
        e = eager.get(p["module"], {})
        s["eager_us"] = e.get("us")
        s["eager_rel_l2"] = e.get("rel_l2")
        summaries.append(s)
        all_rows.extend(rows)
    return header, all_rows, summaries


def write_json(args, plans, events):
    if not args.json:
        return
    header, rows, summaries = collect(plans, events)
    tmp = args.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(header=header, summaries=summaries, candidates=rows), f, indent=1)
    os.replace(tmp, args.json)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?")
    parser.add_argument("--only", default="", help="workloads, comma-separated")
    parser.add_argument("--json", default="", help="write per-candidate rows and summaries here")
    parser.add_argument("--dry", action="store_true", help="parse modules and stats; time nothing")
    parser.add_argument("--examples", default=os.path.join(ROOT, "examples"))
    parser.add_argument("--max-tile", type=int, default=256, help="gpu_bench's whole-dimension tile filter (0: off)")
    parser.add_argument("--rep", type=int, default=20, help="ms of graph replays per timing")
    parser.add_argument("--slow-s", type=float, default=0.05, help="a call slower than this is timed once")
    parser.add_argument("--candidate-timeout", type=float, default=90, help="s per candidate (compile included)")
    parser.add_argument(
        "--budget-s", type=float, default=330,
        help="whole run's time; each module gets an equal share of what compiling leaves, and "
        "skips the candidates it has no time for (0: no limit)",
    )
    parser.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="compiling processes (0: none)")
    parser.add_argument("--warm-timeout", type=float, default=200, help="s for the compiling phase")
    parser.add_argument("--max-restarts", type=int, default=8)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--warm", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.warm:
        return warm(args)
    if not args.dir:
        parser.error("DIR is required")
    only = [w for w in re.split(r"[,\s]+", args.only) if w]
    paths = find_modules(args.dir, only)
    if not paths:
        log(f"no <workload>.B<b>.py module in {args.dir}")
        return 1
    plans = [plan_module(p, args.examples, args.max_tile) for p in paths]
    if args.dry:
        for p in plans:
            print(dry_report(p))
        n = sum(1 for p in plans for c in p.get("candidates", []) if not ("error" in c or "skipped" in c))
        print(f"# would time {n} candidates in {sum(1 for p in plans if 'error' not in p)} of {len(plans)} modules")
        return 1 if any("error" in p for p in plans) else 0
    t0 = time.time()
    status = 0
    tmp = tempfile.mkdtemp(prefix="rank-gpu-")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        events = drive(plans, args, tmp)
    except Interrupted as e:
        log(f"interrupted ({e}): the results so far")
        events = read_events(os.path.join(tmp, "events.jsonl"))
        status = 2
    finally:
        for proc in list(LIVE):
            kill_group(proc)
    write_json(args, plans, events)
    header, _, summaries = collect(plans, events)
    if header:
        print(f"# {header.get('device')} torch {header.get('torch')} triton {header.get('triton')}")
    print(format_table(summaries))
    print(f"# {time.time() - t0:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
