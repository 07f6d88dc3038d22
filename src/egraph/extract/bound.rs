//! Rank-bounded extraction (`Extractor::rank_bound`): branch and bound over Algorithm 1. The
//! search takes partial programs from two orders in turn (`worklist`: cheapest work first, so
//! good candidates come early, and lowest bound first, so the programs that can still tie the
//! best are settled early), scores each complete one with the rank model, and prunes a
//! partial program whose *admissible* bound — a lower bound of the rank model's estimate T̂ of
//! every completion — reaches the `top`-th best estimate found so far (its completions could
//! at best tie). When the worklist is empty the best `top` found are the best `top` of all:
//! every program not expanded had a completion set whose estimates were all at least theirs.
//!
//! The rank model (`crate::rank::model`) prices a function as T = Σ_k (launch + max(t_k /
//! u_k, latency_k)), where t_k is the largest of a kernel's resource times (DRAM bytes / BW
//! among them), u_k ≤ 1 its utilisation and latency_k ≥ one DRAM latency. So for any θ,
//! T ≥ K·launch + max(Σ_k DRAM_k / BW, Σ_k TC_k, K·latency) with K the kernels and TC_k a
//! kernel's tensor-core time; each kernel's DRAM bytes are at least the distinct bytes of
//! every buffer it loads and every buffer it stores. The bound of a partial program uses that
//! with
//!
//! - K ≥ `kernel_lower_bound` and ≥ the longest chain of kernels the resolved classes form
//!   (`kernel_chain`: the kernels of a chain stay distinct in every completion), at least 1;
//! - DRAM ≥ the results' bytes (each is stored by some kernel), plus the bytes of the inputs
//!   every completion reads ([`BoundModel::required_inputs`]; none when the e-graph has a
//!   `slice`, which may read part of a buffer, and the share of positions its masks show
//!   when a loop may skip masked tiles: [`BoundModel::input_share`]), plus the bytes of each
//!   tensor-level value the program already stores (a value a kernel computes or a tiled
//!   region combines, read by another operator: written once, whole);
//! - Σ TC ≥ the least tensor-core time of any complete program (`work_floor`: its products
//!   at full extents, on the masked share a skipping loop must visit). Without it a
//!   compute-bound program (causal prefill) had a bound of its output's bytes, a sixth of its
//!   best estimate, and nothing was pruned.
//!
//! Apart from the bound, a partial program is pruned when a resolved tile value is larger
//! than any kernel holds ([`BoundModel::too_large_value`]): such a program has no legal
//! schedule, so it is never among the ranked best.
//!
//! Every term only grows as holes are resolved, so a program pruned on its parent's bound
//! would be pruned on its own. `tests/rank_bounded.rs` checks exactness against
//! exhaustive extraction on every example where that finishes, and that an inadmissible bound
//! is caught.

use super::canon::{is_compute, is_view, WalkFacts};
use super::extract_graph::ExtractGraph;
use super::kernels::reshape_view;
use super::reach::class_tiled;
use super::work_floor::{tensor_floor_us, Masks, TensorRates};
use super::{Choice, NONE};
use crate::egraph::lang::Op;
use crate::ir::Function;
use rustc_hash::FxHashSet;
use std::sync::Arc;

/// A complete program's estimate: `Err(reason)` when the backend cannot lower it, `Ok(None)`
/// when no schedule is legal, else T̂ in µs.
pub type Scorer = Arc<dyn Fn(&Function) -> Result<Option<f64>, String> + Send + Sync>;

/// What rank-bounded extraction needs of the device and the ranking.
#[derive(Clone)]
pub struct RankBound {
    /// Candidates wanted: the search stops once it holds this many with estimates no larger
    /// than any bound left.
    pub top: usize,
    pub launch_us: f64,
    pub latency_us: f64,
    pub dram_bytes_per_us: f64,
    /// Tensor-core rates (flops per µs): bf16/f16 operands of one dtype, and others.
    pub tensor_bf16_flops_per_us: f64,
    pub tensor_tf32_flops_per_us: f64,
    /// Rows a tensor-core product multiplies at least (`Device::tensor_min_rows`).
    pub tensor_min_rows: f64,
    pub score: Scorer,
    /// The most 32-bit values a kernel can keep live under any schedule
    /// (`rank::model::max_live_words`): a program computing a larger tile has no legal
    /// schedule, and is pruned.
    pub max_live_words: f64,
    /// Multiplies every bound (1.0). Only tests set another, to show that an inadmissible
    /// bound is caught.
    pub scale: f64,
}

/// The parts of the bound fixed by the e-graph.
pub(super) struct BoundModel {
    /// Bytes of each untiled tensor-typed class (0 for tuples and tiles).
    class_bytes: Vec<f64>,
    /// Bytes every complete program moves: the results and the inputs all of them read.
    floor_bytes: f64,
    /// For each tiled class, the fewest elements its value holds under any blocks: its
    /// dimensions no parallel axis splits, each padded to a power of two as the backend
    /// pads them (a split dimension counts 1).
    value_words: Vec<f64>,
    /// As `value_words` for a tile a matrix product reads or computes: its last two
    /// dimensions, where split, are `tl.dot` axes, whose blocks are at least 16
    /// (`lower::plan`'s schedule space) in every schedule.
    dot_words: Vec<f64>,
    /// The least tensor-core time of every complete program (`work_floor`).
    tensor_floor_us: f64,
}

impl BoundModel {
    pub(super) fn new(x: &ExtractGraph, rb: &RankBound) -> BoundModel {
        let bindings = &x.g.bindings;
        let class_bytes: Vec<f64> = (0..x.ids.len())
            .map(|c| {
                if class_tiled(x, c as u32) {
                    0.0
                } else {
                    crate::partition::type_bytes(x.g.egraph[x.ids[c]].data.as_ref(), bindings)
                }
            })
            .collect();
        let mut roots = x.roots.clone();
        roots.sort_unstable();
        roots.dedup();
        let mut floor: f64 = roots
            .iter()
            .filter(|r| !x.input[**r as usize])
            .map(|r| class_bytes[*r as usize])
            .sum();
        let masks = Masks::of(x);
        let share = Self::input_share(x, &masks);
        if share > 0.0 {
            let inputs = Self::required_inputs(x, &roots);
            for (c, ns) in x.nodes.iter().enumerate() {
                for (n, _) in ns {
                    if let Op::Input(i, _) = &n.op {
                        if *i < 64 && inputs & (1 << i) != 0 {
                            floor += share * class_bytes[c];
                        }
                    }
                }
            }
        }
        // Each tiled class's fewest elements, a split dimension counting `split_block(i, n)`
        // (dimension i of n).
        let words = |split_block: &dyn Fn(usize, usize) -> f64| -> Vec<f64> {
            (0..x.ids.len())
                .map(|c| {
                    if !class_tiled(x, c as u32) {
                        return 0.0;
                    }
                    let t = x.g.egraph[x.ids[c]].data.as_ref();
                    let Ok((fields, _)) = crate::lower::walk::field_types(t) else {
                        return 0.0;
                    };
                    let none = std::collections::BTreeSet::new();
                    fields
                        .iter()
                        .map(|t| {
                            let bs = crate::lower::walk::blocks(t, &none);
                            let n = bs.len();
                            bs.iter()
                                .enumerate()
                                .map(|(i, b)| match b {
                                    crate::lower::walk::Block::Whole(d) => {
                                        let n =
                                            crate::partition::dim_size(d, bindings).unwrap_or(1.0);
                                        (n.max(1.0) as u64).next_power_of_two() as f64
                                    }
                                    crate::lower::walk::Block::Split(_) => split_block(i, n),
                                    crate::lower::walk::Block::One => 1.0,
                                })
                                .product::<f64>()
                        })
                        .fold(0.0, f64::max)
                })
                .collect()
        };
        let value_words = words(&|_, _| 1.0);
        let dot_words = words(&|i, n| {
            if i + 2 >= n {
                crate::lower::plan::MIN_BLOCK as f64
            } else {
                1.0
            }
        });
        let rates = TensorRates {
            bf16: rb.tensor_bf16_flops_per_us,
            tf32: rb.tensor_tf32_flops_per_us,
            min_rows: rb.tensor_min_rows,
        };
        BoundModel {
            class_bytes,
            floor_bytes: floor,
            value_words,
            dot_words,
            tensor_floor_us: tensor_floor_us(x, rates, &masks),
        }
    }

    /// A resolved tiled class whose value no kernel can hold (`RankBound::max_live_words`):
    /// no completion has a legal schedule. The values counted are those the rank model
    /// holds: a tile a picked operator computes, and a tile it reads through a chain of
    /// loads (`partition`, `replicate`, `transpose`, `reshape`: as many elements as the
    /// tile loaded; a `broadcast` may hold fewer, so it is not judged).
    pub(super) fn too_large_value(
        &self,
        rb: &RankBound,
        x: &ExtractGraph,
        choice: &Choice,
        met: &[u32],
    ) -> Option<u32> {
        let too_large =
            |c: u32| self.value_words[c as usize] > rb.max_live_words && !x.constant[c as usize];
        for &c in met {
            let p = choice[c as usize];
            if p == NONE {
                continue;
            }
            let (node, kids) = &x.nodes[c as usize][p as usize];
            let computes = matches!(
                node.op,
                Op::Unary(_)
                    | Op::Binary(_)
                    | Op::Select
                    | Op::Cast(_)
                    | Op::TileMatMul(_)
                    | Op::ReduceAxis { .. }
            );
            if !computes || !class_tiled(x, c) {
                continue;
            }
            if too_large(c) {
                return Some(c);
            }
            // A product's result and operands are `tl.dot` tiles.
            let product = matches!(node.op, Op::TileMatMul(_));
            let too_large_dot = |c: u32| {
                product && self.dot_words[c as usize] > rb.max_live_words && !x.constant[c as usize]
            };
            if too_large_dot(c) {
                return Some(c);
            }
            for &k in kids {
                let kp = choice[k as usize];
                if kp == NONE {
                    continue;
                }
                let loaded = matches!(
                    x.nodes[k as usize][kp as usize].0.op,
                    Op::Partition(..) | Op::Replicate(_) | Op::Transpose(_) | Op::Reshape(_)
                );
                if loaded && (too_large(k) || too_large_dot(k)) {
                    return Some(k);
                }
            }
        }
        None
    }

    /// The least share of each input's bytes a program that reads it loads: 0 where a `slice`
    /// may read part of a buffer; else the least share of positions the masks show
    /// (`work_floor::Masks`; 1 without masks, 0 where one cannot be evaluated): a loop that
    /// skips a mask's hidden tiles loads its inputs' tiles on the visited iterations, which
    /// hold every shown position, and an input indexed by fewer of the mask's dimensions
    /// loses no more than its share. A select on values (a repair's
    /// `select(v == -inf, 0, v)`) skips nothing.
    fn input_share(x: &ExtractGraph, masks: &Masks) -> f64 {
        let sliced = x
            .nodes
            .iter()
            .flatten()
            .any(|(n, _)| matches!(n.op, Op::Slice(..)));
        if sliced {
            0.0
        } else {
            masks.global
        }
    }

    /// The inputs (a bitset by argument position) that every program of the roots reads: the
    /// greatest fixpoint of L(c) = ∩ over c's e-nodes n of U(n), with U(input i) = {i} and
    /// U(n) = ∪ over n's operands k of L(k). Sound by induction on a program's height: a
    /// program of c picks some n, and reads what its operands' programs read.
    pub(super) fn required_inputs(x: &ExtractGraph, roots: &[u32]) -> u64 {
        let mut l = vec![u64::MAX; x.ids.len()];
        loop {
            let mut changed = false;
            for (c, ns) in x.nodes.iter().enumerate() {
                let mut all = u64::MAX;
                for (n, kids) in ns {
                    let u = match &n.op {
                        Op::Input(i, _) if *i < 64 => 1u64 << i,
                        _ => kids.iter().fold(0, |u, k| u | l[*k as usize]),
                    };
                    all &= u;
                }
                if ns.is_empty() {
                    all = 0;
                }
                if all != l[c] {
                    l[c] = all;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        roots.iter().fold(0, |u, r| u | l[*r as usize])
    }

    /// The bound (µs) of the partial program `choice` whose walk gave `facts`.
    pub(super) fn bound(
        &self,
        rb: &RankBound,
        x: &ExtractGraph,
        choice: &Choice,
        facts: &WalkFacts,
        kernels: usize,
        stored: &mut FxHashSet<u32>,
    ) -> f64 {
        let kernels = kernels.max(1) as f64;
        // Tensor-level values a picked operator computes and another picked one reads: one
        // kernel writes each whole (counted once per canonical form, as one node).
        stored.clear();
        let mut bytes = self.floor_bytes;
        for &c in &facts.met {
            let p = choice[c as usize];
            if p == NONE {
                continue;
            }
            let (node, kids) = &x.nodes[c as usize][p as usize];
            // A result that is a reshape view is its operand's buffer: those bytes are the
            // result's, in the floor already.
            if !(is_compute(&node.op) || is_view(&node.op))
                || (x.roots.contains(&c) && reshape_view(x, c, node, kids))
            {
                continue;
            }
            for &k in kids {
                let ku = k as usize;
                let kp = choice[ku];
                if kp == NONE || class_tiled(x, k) || x.constant[ku] || x.input[ku] {
                    continue;
                }
                let (kn, kk) = &x.nodes[ku][kp as usize];
                // Computed by a kernel of its own, or stored by a tiled region.
                let written = (is_compute(&kn.op) && !reshape_view(x, k, kn, kk))
                    || matches!(kn.op, Op::Combination(..));
                if !written || x.roots.contains(&k) {
                    continue;
                }
                if stored.insert(facts.memo[ku]) {
                    bytes += self.class_bytes[ku];
                }
            }
        }
        let dram = bytes / rb.dram_bytes_per_us;
        let busy = dram.max(kernels * rb.latency_us).max(self.tensor_floor_us);
        rb.scale * (kernels * rb.launch_us + busy)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::egraph::rules::all_rules;
    use crate::egraph::runner::Runner;
    use crate::egraph::TypedEGraph;

    /// The e-graph of the first function of `text`, saturated with every rule.
    pub(in crate::egraph::extract) fn saturated(text: &str) -> TypedEGraph {
        let mut m = crate::parse::parse_module(text, 0).expect("parses");
        crate::verify::verify_module(&mut m).expect("verifies");
        let mut g = TypedEGraph::from_function(&m.funcs[0], &m.reducers).expect("e-graph");
        Runner::default()
            .with_time_limit(std::time::Duration::from_secs(10))
            .run(&mut g, &all_rules());
        g
    }

    /// The rank bound on an H100, top `top`, scored by the rank model.
    pub(in crate::egraph::extract) fn h100_bound(g: &TypedEGraph, top: usize) -> RankBound {
        let dev = crate::rank::device::device("h100").expect("a known device");
        crate::passes::extract::rank_bound_on(&g.egraph.analysis.env, dev, top)
    }

    /// A batched product's operand tile whose contraction dimension is whole (8 × 512 × a
    /// block of the split output axis) fits only at one-element blocks; the output axis is a
    /// `tl.dot` axis, whose blocks are at least 16, so no schedule holds it: a program that
    /// loads it is pruned as soon as the product and the load are picked. Each product in
    /// the e-graph, with its operands picked as loads, is pruned exactly when some tile
    /// counted with `tl.dot` blocks of 16 is too large — and one such (the case that was
    /// missed, counting those blocks as 1) and one that fits are among them.
    #[test]
    fn a_product_operand_too_large_at_dot_blocks_is_pruned() {
        let g = saturated(
            "func f where B = 12, H = 512, E = 8, F = 256 {
  x: tensor<BxH, bf16> = input
  w: tensor<ExHxF, bf16> = input
  return matmul(x, w) acc=f32
}
",
        );
        let x = ExtractGraph::new(&g).expect("extractable");
        let rb = h100_bound(&g, 1);
        let b = BoundModel::new(&x, &rb);
        let max = rb.max_live_words;
        let (mut pruned, mut kept, mut missed_before) = (0, 0, 0);
        for (c, ns) in x.nodes.iter().enumerate() {
            for (p, (n, kids)) in ns.iter().enumerate() {
                if !matches!(n.op, Op::TileMatMul(_)) {
                    continue;
                }
                let mut choice = vec![NONE; x.ids.len()];
                choice[c] = p as u32;
                let mut met = vec![c as u32];
                for &k in kids {
                    let load = x.nodes[k as usize]
                        .iter()
                        .position(|(kn, _)| matches!(kn.op, Op::Partition(..) | Op::Replicate(_)));
                    if let Some(l) = load {
                        choice[k as usize] = l as u32;
                        met.push(k);
                    }
                }
                let words = |w: &[f64]| met.iter().map(|&k| w[k as usize]).fold(0.0, f64::max);
                let large = words(&b.dot_words) > max || words(&b.value_words) > max;
                let got = b.too_large_value(&rb, &x, &choice, &met);
                assert_eq!(got.is_some(), large, "product e-node {p} of class {c}");
                if large {
                    pruned += 1;
                    if words(&b.value_words) <= max {
                        missed_before += 1;
                    }
                } else {
                    kept += 1;
                }
            }
        }
        assert!(missed_before > 0, "no product the old count missed");
        assert!(
            pruned >= missed_before && kept > 0,
            "{pruned} pruned, {kept} kept"
        );
    }

    fn input_share_of(text: &str) -> f64 {
        let g = saturated(text);
        let x = ExtractGraph::new(&g).expect("extractable");
        BoundModel::input_share(&x, &Masks::of(&x))
    }

    /// A softmax whose fused fold gets a repair guard (`select(v == -inf, 0, v)`, a select of
    /// values) reads its input whole in every program: the input floor stands. A causal mask
    /// (a select on `iota` positions) may skip tiles: the floor is the share it shows. A
    /// slice may read part of a buffer: no floor.
    #[test]
    fn masks_scale_and_slices_withhold_the_input_floor() {
        let softmax = "func f where R = 4, N = 64 {
  x: tensor<RxN, f32> = input
  m = reduce x axis=N reducer=@max keep_dims
  e = exp(x - m)
  return e / reduce e axis=N reducer=@add keep_dims
}
";
        let causal = "func f where Q = 32, K = 32 {
  s: tensor<QxK, f32> = input
  row: tensor<QxK, i32> = iota[Q]
  col: tensor<QxK, i32> = iota[K]
  neg: tensor<f32> = constant -inf
  masked = select(less_equal(col, row), s, neg)
  m = reduce masked axis=K reducer=@max keep_dims
  e = exp(masked - m)
  return e / reduce e axis=K reducer=@add keep_dims
}
";
        let sliced = "func f where N = 64 {
  x: tensor<N, f32> = input
  return exp(slice[0, 0, 32](x))
}
";
        assert_eq!(input_share_of(softmax), 1.0);
        // Of the 32 × 32 positions, 496 lie above the diagonal (and 528 on or below it).
        assert_eq!(input_share_of(causal), 496.0 / 1024.0);
        assert_eq!(input_share_of(sliced), 0.0);
    }
}
