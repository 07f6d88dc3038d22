//! Rank-bounded extraction (`Extractor::rank_bound`): branch and bound over Algorithm 1. The
//! search takes partial programs in its usual order (cheapest work first, so good candidates
//! come early), scores each complete one with the rank model, and prunes a partial program
//! whose *admissible* bound — a lower bound of the rank model's estimate T̂ of every completion
//! — is above the `top`-th best estimate found so far. When the worklist is empty the best
//! `top` found are the best `top` of all: every program not expanded had a completion set
//! whose estimates were all above them.
//!
//! The rank model (`crate::rank::model`) prices a function as T = Σ_k (launch + max(t_k /
//! u_k, latency_k)), where t_k is the largest of a kernel's resource times (DRAM bytes / BW
//! among them), u_k ≤ 1 its utilisation and latency_k ≥ one DRAM latency. So for any θ,
//! T ≥ K·launch + max(Σ_k DRAM_k / BW, K·latency) with K the kernels, and each kernel's DRAM
//! bytes are at least the distinct bytes of every buffer it loads and every buffer it
//! stores. The bound of a partial program uses that with
//!
//! - K ≥ `kernel_lower_bound` (at least 1);
//! - DRAM ≥ the results' bytes (each is stored by some kernel), plus the bytes of the inputs
//!   every completion reads ([`BoundModel::required_inputs`]; none when the e-graph has a
//!   `slice` or a `select`, as a sliced read or a loop that skips masked tiles may load part
//!   of a buffer), plus the bytes of each tensor-level value the program already stores (a
//!   value a kernel computes or a tiled region combines, read by another operator: written
//!   once, whole).
//!
//! Every term only grows as holes are resolved, so a program pruned on its parent's bound
//! would be pruned on its own. `tests/rank_bounded.rs` checks exactness against
//! exhaustive extraction on every example where that finishes, and that an inadmissible bound
//! is caught.

use super::canon::{is_compute, is_view, WalkFacts};
use super::extract_graph::ExtractGraph;
use super::kernels::{kernel_lower_bound, reshape_view};
use super::reach::class_tiled;
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
    pub score: Scorer,
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
}

impl BoundModel {
    pub(super) fn new(x: &ExtractGraph) -> BoundModel {
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
        let partial_reads = x
            .nodes
            .iter()
            .flatten()
            .any(|(n, _)| matches!(n.op, Op::Slice(..) | Op::Select));
        if !partial_reads {
            let inputs = Self::required_inputs(x, &roots);
            for (c, ns) in x.nodes.iter().enumerate() {
                for (n, _) in ns {
                    if let Op::Input(i, _) = &n.op {
                        if *i < 64 && inputs & (1 << i) != 0 {
                            floor += class_bytes[c];
                        }
                    }
                }
            }
        }
        BoundModel {
            class_bytes,
            floor_bytes: floor,
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
        stored: &mut FxHashSet<u32>,
    ) -> f64 {
        let kernels = kernel_lower_bound(x, choice, &facts.met, &facts.memo).max(1) as f64;
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
            if !(is_compute(&node.op) || is_view(&node.op)) {
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
        rb.scale * (kernels * rb.launch_us + dram.max(kernels * rb.latency_us))
    }
}
