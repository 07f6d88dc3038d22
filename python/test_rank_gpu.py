"""CPU tests of rank_gpu.py's helpers (no torch, no GPU): Spearman's rho, the stats-JSON
parser, the .ef parser on the real examples, the module/stats planner and the summary.

    .venv/bin/python python/test_rank_gpu.py
"""

import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import rank_gpu as r  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def close(a, b, eps=1e-12):
    return a is not None and abs(a - b) <= eps


def test_spearman():
    assert r.average_ranks([10, 20, 20, 30]) == [1, 2.5, 2.5, 4]
    assert r.average_ranks([3, 1, 2]) == [3, 1, 2]
    assert r.average_ranks([5, 5, 5]) == [2, 2, 2]
    assert close(r.spearman([1, 2, 3, 4], [10, 20, 30, 40]), 1.0), "perfect"
    assert close(r.spearman([1, 2, 3, 4], [0.4, 0.3, 0.2, 0.1]), -1.0), "reversed"
    # monotone but not linear: rank correlation is still 1
    assert close(r.spearman([1, 2, 3, 4, 5], [1, 8, 27, 1000, 1e6]), 1.0)
    # ties, worked by hand: ranks x = [1, 2.5, 2.5, 4], y = [1, 2, 3, 4]
    # dx = [-1.5, 0, 0, 1.5], dy = [-1.5, -.5, .5, 1.5]: sxy = 4.5, sxx = 4.5, syy = 5
    assert close(r.spearman([1, 2, 2, 3], [1, 2, 3, 4]), 4.5 / math.sqrt(4.5 * 5)), "ties"
    # one swap among five: 1 - 6*sum(d^2)/(n(n^2-1)) = 1 - 6*2/120 = 0.9 (no ties)
    assert close(r.spearman([1, 2, 3, 4, 5], [1, 2, 4, 3, 5]), 0.9)
    assert r.spearman([1], [2]) is None, "one point"
    assert r.spearman([], []) is None
    assert r.spearman([1, 1, 1], [1, 2, 3]) is None, "all predictions tied"
    try:
        r.spearman([1, 2], [1])
    except ValueError:
        pass
    else:
        raise AssertionError("lengths differ")


def rank_doc(cands, func="f"):
    return {
        "chunks": [
            {
                "passes": [
                    {"pass": "saturate", "counters": {"egraphs": [{"egraph": func}]}, "wall_ms": 1.0},
                    {
                        "pass": "extract",
                        # extract's own candidates (no predicted_us) must not be taken for rank's
                        "counters": {"egraphs": [{"candidates": [{"name": f"{func}.c9", "estimated_cost": 1}]}]},
                        "wall_ms": 1.0,
                    },
                    {"pass": "rank", "counters": {"candidates": cands}, "wall_ms": 1.0},
                    {"pass": "lower", "counters": {}, "wall_ms": 1.0},
                ]
            }
        ]
    }


def cand(name, us, sched=None):
    return {
        "name": name,
        "predicted_us": us,
        "dram_bytes": 1000,
        "flops": {"fma": 10},
        "bottleneck": "dram",
        "kernels": 1,
        "schedule": sched if sched is not None else {"BLOCK_b": 16, "num_warps": 4, "num_stages": 2},
    }


def test_stats():
    doc = rank_doc([cand("f.c3", 1.5), cand("f.c0", 2.0), cand("f.c7", 9.0)])
    text = (
        "remark: extract @f: stopped: candidate limit (2) reached\n"
        "warning: something { with a brace\n"
        + json.dumps(doc, indent=2)
        + "\n"
    )
    got = r.ranked_candidates(r.stats_document(text))
    assert [c["name"] for c in got] == ["f.c3", "f.c0", "f.c7"], "rank order kept"
    assert got[0]["predicted_us"] == 1.5
    # nested under per-egraph counters, as extract's are, and filtered by function
    nested = rank_doc([])
    nested["chunks"][0]["passes"][2]["counters"] = {
        "egraphs": [{"egraph": "f", "candidates": [cand("f.c1", 3.0)]}, {"egraph": "g", "candidates": [cand("g.c0", 1.0)]}]
    }
    assert [c["name"] for c in r.ranked_candidates(nested, "f")] == ["f.c1"]
    assert [c["name"] for c in r.ranked_candidates(nested)] == ["f.c1", "g.c0"]
    # the pass may be printed with its options
    doc["chunks"][0]["passes"][2]["pass"] = "rank{device=h100 top=10}"
    assert len(r.ranked_candidates(doc)) == 3
    for bad, why in [
        ("remark: only remarks\n", "no JSON"),
        (json.dumps({"chunks": [{"passes": [{"pass": "extract", "counters": {}}]}]}), "no rank pass"),
    ]:
        try:
            r.ranked_candidates(r.stats_document(bad))
        except ValueError as e:
            assert why in str(e), e
        else:
            raise AssertionError(why)


def test_ef_parser():
    got = {}
    for name in r.WORKLOAD_ORDER:
        with open(os.path.join(EXAMPLES, name + ".ef")) as f:
            got[name] = r.parse_ef(f.read())
        assert got[name]["func"] == name
        assert got[name]["sizes"].get("B") == 16, name
    assert got["rmsnorm_swiglu"]["sizes"] == {"B": 16, "H": 4096, "F": 11008}
    assert got["lora"]["inputs"] == [
        ("x", ["B", "H"], "bfloat16"),
        ("w", ["H", "N"], "bfloat16"),
        ("a", ["H", "R"], "bfloat16"),
        ("bm", ["R", "N"], "bfloat16"),
    ], got["lora"]["inputs"]
    # gamma is a vector; `ones` is a fill, not an input
    assert [n for n, _, _ in got["rmsnorm_gemm"]["inputs"]] == ["x", "gamma", "w"]
    assert got["rmsnorm_gemm"]["inputs"][1] == ("gamma", ["H"], "bfloat16")
    # a literal 1 in a shape, multi-letter dimension names
    assert got["mha_decode"]["inputs"][0] == ("q", ["B", "NH", 1, "D"], "bfloat16")
    assert got["mha_decode"]["sizes"] == {"B": 16, "NH": 32, "K": 4096, "D": 128}
    assert r.shape_of(["B", "NH", 1, "D"], dict(got["mha_decode"]["sizes"], B=1)) == [1, 32, 1, 128]
    assert close(got["mha_decode"]["constants"]["scale"], 0.08838834764)
    assert [(n, d) for n, d, _ in got["mha_prefill"]["inputs"]] == [
        ("q", ["B", "NH", "Q", "D"]),
        ("k", ["B", "NH", "K", "D"]),
        ("v", ["B", "NH", "K", "D"]),
    ]
    assert got["mha_prefill"]["constants"]["neg_inf"] == float("-inf")
    # every workload without its own reference here has one in gpu_bench, with as many inputs
    for name in r.WORKLOAD_ORDER:
        assert r.reference_known(name), name
        spec = r.gpu_bench.WORKLOADS.get(name)
        if spec:
            assert len(spec["inputs"]) == len(got[name]["inputs"]), name
    # a header over several lines, a scalar input
    src = "func g where\n  M = 3,\n  N = 1 {\n  s: tensor<f32> = input\n  t: tensor<MxN, f16> = input\n  return t\n}\n"
    p = r.parse_ef(src)
    assert p["sizes"] == {"M": 3, "N": 1} and p["inputs"] == [("s", [], "float32"), ("t", ["M", "N"], "float16")], p


MODULE = '''
import triton

def lora_c0(in0, in1, in2, in3, *, schedule=None, empty=None):
    """Candidate `lora.c0`."""
    sched = {"BLOCK_h": 64, "BLOCK_n": 128, "num_warps": 8, "num_stages": 3}
    return (in0,)


def lora_c4(in0, in1, in2, in3, *, schedule=None, empty=None):
    """Candidate `lora.c4`."""
    sched = {"BLOCK_n": 64, "num_warps": 4, "num_stages": 3}
    return (in0,)
'''


def test_plan_and_summary():
    assert r.host_functions(MODULE, "lora") == {
        "lora_c0": {"BLOCK_h": 64, "BLOCK_n": 128, "num_warps": 8, "num_stages": 3},
        "lora_c4": {"BLOCK_n": 64, "num_warps": 4, "num_stages": 3},
    }
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "lora.B1.py"), "w") as f:
            f.write(MODULE)
        stats = rank_doc(
            [
                cand("lora.c4", 2.0, {"BLOCK_n": 64, "num_warps": 4, "num_stages": 3}),
                cand("lora.c0", 3.0, {"BLOCK_h": 64, "BLOCK_n": 128, "num_warps": 8, "num_stages": 3}),
                cand("lora.c2", 4.0),
            ],
            "lora",
        )
        with open(os.path.join(d, "lora.B1.stats.json"), "w") as f:
            f.write("remark: x\n" + json.dumps(stats))
        with open(os.path.join(d, "ngpt.B16.py"), "w") as f:
            f.write("")  # no stats beside it
        assert [os.path.basename(p) for p in r.find_modules(d, [])] == ["ngpt.B16.py", "lora.B1.py"]
        assert [os.path.basename(p) for p in r.find_modules(d, ["lora"])] == ["lora.B1.py"]
        plan = r.plan_module(os.path.join(d, "lora.B1.py"), EXAMPLES, 256)
        assert "error" not in plan, plan
        assert plan["batch"] == 1 and plan["sizes"] == {"B": 1, "H": 4096, "N": 4096, "R": 16}
        names = [(c["rank"], c["name"], c["pyname"]) for c in plan["candidates"]]
        assert names == [(1, "lora.c4", "lora_c4"), (2, "lora.c0", "lora_c0"), (3, "lora.c2", "lora_c2")]
        assert plan["candidates"][2]["error"] == "not in module"
        assert "note" not in plan["candidates"][0], "rank's schedule is the module's default"
        bad = r.plan_module(os.path.join(d, "ngpt.B16.py"), EXAMPLES, 256)
        assert "stats.json" in bad["error"], bad
        assert "error" in r.dry_report(bad)

    # summary: rank 1 failed, so the top-ranked timed one is rank 2
    rows = [
        dict(rank=1, name="w.c0", predicted_us=1.0, error="mismatch"),
        dict(rank=2, name="w.c1", predicted_us=2.0, us=30.0),
        dict(rank=3, name="w.c2", predicted_us=3.0, us=10.0),
        dict(rank=4, name="w.c3", predicted_us=4.0, us=20.0),
        dict(rank=5, name="w.c4", predicted_us=5.0, skipped="whole-dimension tile of H"),
    ]
    s = r.summarise(dict(workload="w", batch=16), rows)
    assert (s["timed"], s["failed"], s["skipped"], s["ranked"]) == (3, 1, 1, 5)
    assert (s["top1_rank"], s["top1_us"], s["best_rank"], s["best_name"]) == (2, 30.0, 3, "w.c2")
    assert close(s["top1_over_best"], 3.0)
    assert close(s["rho"], -0.5), s["rho"]  # ranks (1,2,3) vs (3,1,2)
    table = r.format_table([dict(s, eager_us=12.0), dict(workload="x", batch=1, error="no stats")])
    assert "rank-1 candidate not timed" in table and "no stats" in table, table


# A stand-in for the GPU worker, speaking the same event protocol: candidate c11 dies, c12
# hangs, c13 loses the CUDA context (exits after its row); the others take `us` from their
# number. Lets the driver's restarts and timeouts run without torch.
FAKE_WORKER = r"""
import json, os, sys, time
mode, path = sys.argv[1], sys.argv[2]
job = json.load(open(path))
events = open(job["events"], "a")
def emit(**e):
    events.write(json.dumps(e) + "\n"); events.flush()
def behaviour(name):
    return {"11": "crash", "12": "hang", "13": "lost"}.get(name.split(".c")[1], "")
if mode == "--warm":
    for mod, name, pyname in job["tasks"]:
        emit(event="start", module=mod, name=name, t=time.time())
        b = behaviour(name)
        if b == "crash": os._exit(7)
        if b == "hang": time.sleep(1000)
        if b == "lost": emit(event="fail", module=mod, name=name, error="lost"); os._exit(4)
        emit(event="warm", module=mod, name=name)
    sys.exit(0)
done = {tuple(x) for x in job["done"]}
open(job["events"] + ".spawns", "a").write("x")
if not job["header_done"]:
    emit(event="header", device="fake")
for plan in job["plans"]:
    mod = plan["module"]
    if (mod, "") in done:
        continue
    emit(event="start", module=mod, name="", t=time.time())
    if (mod, "eager") not in done:
        emit(event="eager", module=mod, us=100.0, rel_l2=0.003)
    for c in plan["candidates"]:
        if (mod, c["name"]) in done or "error" in c or "skipped" in c:
            continue
        emit(event="start", module=mod, name=c["name"], t=time.time())
        b = behaviour(c["name"])
        if b == "crash": os._exit(7)
        if b == "hang": time.sleep(1000)
        if b == "lost":
            emit(event="row", module=mod, name=c["name"], error="illegal memory access"); os._exit(3)
        emit(event="row", module=mod, name=c["name"], us=float(c["name"].split(".c")[1]), rel_l2=1e-7)
    emit(event="module_done", module=mod)
"""


def host(name):
    return f'def {name}(in0, in1, in2, *, schedule=None, empty=None):\n    sched = {{"num_warps": 4}}\n    return (in0,)\n\n'


def test_driver():
    """The driver's bookkeeping with a stand-in worker: a crash, a hang and a lost context,
    each during compilation (warm-up) or timing, are recorded against their candidate and the
    others are still timed."""
    import argparse

    with tempfile.TemporaryDirectory() as d:
        fake = os.path.join(d, "fake_worker.py")
        with open(fake, "w") as f:
            f.write(FAKE_WORKER)
        # (name, predicted us); measured us is the candidate number
        ranked = [("gated_mlp.c30", 1.0), ("gated_mlp.c11", 2.0), ("gated_mlp.c20", 3.0),
                  ("gated_mlp.c12", 4.0), ("gated_mlp.c10", 5.0), ("gated_mlp.c13", 6.0),
                  ("gated_mlp.c40", 7.0)]
        with open(os.path.join(d, "gated_mlp.B1.py"), "w") as f:
            f.write("".join(host(n.replace(".", "_")) for n, _ in ranked))
        with open(os.path.join(d, "gated_mlp.B1.stats.json"), "w") as f:
            f.write(json.dumps(rank_doc([cand(n, us, {"num_warps": 4}) for n, us in ranked], "gated_mlp")))
        plans = [r.plan_module(os.path.join(d, "gated_mlp.B1.py"), EXAMPLES, 256)]
        assert "error" not in plans[0], plans[0]
        saved = r.WORKER_SCRIPT
        r.WORKER_SCRIPT = fake
        try:
            for jobs in (2, 0):  # with warm-up (failures found there) and without (found timing)
                args = argparse.Namespace(
                    jobs=jobs, warm_timeout=30, candidate_timeout=1.0, budget_s=0, rep=20,
                    slow_s=0.05, verbose=False, max_restarts=8, json=os.path.join(d, "out.json"),
                )
                events = r.drive(plans, args, tempfile.mkdtemp(dir=d))
                header, rows, summaries = r.collect(plans, events)
                got = {row["name"]: row.get("us", row.get("error")) for row in rows}
                assert header.get("device") == "fake", header
                assert got["gated_mlp.c30"] == 30.0 and got["gated_mlp.c40"] == 40.0, got
                assert got["gated_mlp.c10"] == 10.0 and got["gated_mlp.c20"] == 20.0, got
                assert "died" in got["gated_mlp.c11"] and "exit 7" in got["gated_mlp.c11"], got
                assert "timeout" in got["gated_mlp.c12"], got
                if jobs == 0:
                    assert got["gated_mlp.c13"] == "illegal memory access", got
                else:  # compiled with a fail event; the timing worker reports it
                    assert got["gated_mlp.c13"] == "illegal memory access", got
                s = summaries[0]
                assert (s["timed"], s["failed"], s["top1_rank"], s["best_name"]) == (4, 3, 1, "gated_mlp.c10"), s
                # ranks by prediction 1,3,5,7 measure 30,20,10,40
                assert abs(s["rho"] - r.spearman([1, 3, 5, 7], [30, 20, 10, 40])) < 1e-12
                assert s["eager_us"] == 100.0
                with open(args.json) as f:
                    assert len(json.load(f)["candidates"]) == len(ranked)
        finally:
            r.WORKER_SCRIPT = saved


def main():
    test_spearman()
    test_stats()
    test_ef_parser()
    test_plan_and_summary()
    test_driver()
    print("rank_gpu helpers ok")


if __name__ == "__main__":
    main()
