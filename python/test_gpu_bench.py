"""CPU tests of gpu_bench.py's helpers (no torch, no GPU): which candidates the tile filter
keeps, and the schedule space. Run by `cargo test --test triton_check` (gpu_bench_helpers)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gpu_bench as g  # noqa: E402

SOURCE = """
@triton.jit
def f_c0_k0(x):
    t = tl.load(x + (tl.arange(0, P_B))[:, None] * H + (tl.arange(0, P_H))[None, :])
    u = tl.dot(t, tl.load(w + (tl.arange(0, P_H))[:, None]), out_dtype=tl.float32)

@triton.jit
def f_c1_k0(x):
    t = tl.load(x + (tl.arange(0, P_B))[:, None] * H + (tl.arange(0, P_H))[None, :])
    s = tl.sum(t, axis=1)

@triton.jit
def f_c1_k1(x):
    for c_h in range(0, EXT_h):
        u = tl.dot(a, b, out_dtype=tl.float32)
"""


def main():
    sizes = {"B": 16, "H": 4096}
    # A product over the whole of H is refused; a whole row without a product is kept.
    assert g.whole_dim_tiles(SOURCE, "f_c0", sizes, 256) == ["H"], "product over whole H"
    assert g.whole_dim_tiles(SOURCE, "f_c1", sizes, 256) == [], "normalisation rows"
    assert g.whole_dim_tiles(SOURCE, "f_c1", {"B": 16, "H": 8192}, 256) == ["H"], "row limit"
    assert g.kernels_use_dot(SOURCE, "f_c1") and g.kernels_use_dot(SOURCE, "f_c0")
    assert not g.kernels_use_dot(SOURCE.replace("tl.dot(", "tl.sum("), "f_c1")
    # tl.dot needs blocks of at least 16; other kernels may use smaller ones.
    assert min(g.block_choices("BLOCK_b", sizes, True)) == 16
    assert min(g.block_choices("BLOCK_b", sizes, False)) == 1
    assert max(g.block_choices("BLOCK_b", sizes, True)) == 16, "capped by B"

    def host(in0, *, schedule=None):
        sched = {"BLOCK_b": 16, "BLOCK_h": 16, "num_warps": 4, "num_stages": 2}
        return sched

    space = g.schedule_space(host, sizes, 8, 1)
    assert len(space) == 8, space
    assert len({tuple(sorted(s.items())) for s in space}) == 8, "distinct schedules"
    assert all(set(s) == {"BLOCK_b", "BLOCK_h", "num_warps", "num_stages"} for s in space)
    assert space == g.schedule_space(host, sizes, 8, 1), "fixed seed"
    print("gpu_bench helpers ok")


if __name__ == "__main__":
    main()
