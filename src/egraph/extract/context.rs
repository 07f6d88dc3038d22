//! The hole context: what ≈ₚ compares besides canonical forms.

use super::canon::is_view;
use super::kernels::{find_root, KernelView, LaunchScratch, Load};
use super::reach::{class_tiled, has};
use super::{HoleContext, NONE};
use rustc_hash::{FxHashMap, FxHashSet};

/// What a partial program fixes, beyond its canonical form, that can still change how its
/// holes are completed: the resolved classes that a completion can read (`reach`: by default
/// `readable_resolved`, else every class the holes reach through any e-node) and that had a
/// choice (more than one valid e-node), each with its canonical id under the walk (`memo`;
/// chain intermediates, which have none, with their pick). A completion only ever reads such
/// classes, and normalisation only looks at the canonical forms of operands, so two partial
/// programs with equal forms and equal contexts allow the same completions and complete to the
/// same classes: Algorithm 1 prunes the second (≈ₚ). Picks that differ only in how they write
/// a class's form (`a * b` against `b * a`, views in another order) give equal contexts;
/// `HoleContext::Picks` keeps them apart. Other resolved classes, such as the intermediate
/// class of a view chain or of an associative chain written in another order, are left out;
/// that is what lets differently written partial programs meet.
///
/// Why the readable classes suffice. Let P be taken first and Q later, with equal forms (so
/// the same holes) and equal contexts, and let a completion of Q resolve a class v that P has
/// resolved. The completion's picks reach v from a hole through classes Q leaves open. On that
/// path, the first class w that P resolved is read by a class P leaves open, so it is readable
/// in P; Q leaves it open, so it is not named in Q's context. If w had a choice it is named in
/// P's context, and the contexts differ. If it has one e-node, both programs pick it alike, and
/// its resolved operands are readable in P as well (`readable_resolved` goes through it), so
/// the argument goes on down the path (a class P leaves open below it is one of the common
/// holes, from which it starts again). So a completion of Q picks nothing that P picked
/// otherwise, and completes P too, to the same form. On RMSNorm–SwiGLU this context, against
/// every class the holes reach, expanded 590,794 states instead of 824,563 for the same 24,404
/// classes: an associative chain grouped two ways, `x * (r * w)` against `(x * r) * w`, names
/// its inner class as long as a hole could read it through any e-node, and such programs met
/// only once the last such hole was resolved.
///
/// The context also names the classes whose values the program stores (resolved tensor-level
/// classes other than inputs and constants): `computed_once` judges a completion by which
/// classes hold stored values, and ≈ does not see it. A pointwise tail moved across a store
/// (`square` applied before the store, or after the load) gives equal forms with different
/// stored classes, and a completion that computes the unsquared value again is refused in one
/// program and not the other. Without them, forcing past e-nodes that close a cycle made walk
/// order keep the refused program and lose 3 of layernorm_gemm's 1,455 classes. With the
/// readable context (`stored_read`), only the stored values a completion can meet are named:
/// those at the end of a chain of picked views from a readable class. `computed_once` finds
/// the stored value a completion's class could be a view of by following view e-nodes from
/// it: through classes the completion resolves, then, from the first resolved class (a
/// readable one, as above), through the program's picked views only; so no other stored class
/// can change its verdict. On RMSNorm–SwiGLU this took the expanded states from 590,794 (every
/// stored class named) to 382,817, LayerNorm+GEMM from 28,301 to 15,251, the same classes.
///
/// It also names how the resolved classes a completion can attach to (those a hole reaches,
/// and those with a hole operand) share kernel regions: a tiled class read by two others
/// joins their kernels, which ≈ does not see either (forms are trees). On RMSNorm–MLP a
/// program T whose `c29 = c80 * c81` shares the tile `c80 = w * x` with the tile matmul of a
/// fused reduction pruned a program S writing `c29 = w * (c81 * x)`: equal forms, but in T
/// the kernel around hole `c81` is the one that writes the stored reduction `c81`'s
/// completion reads back, so every completion of T had no launch order while S's did, and
/// four classes were lost (fewest-first with holes that reach unread fused components first,
/// and walk order at the start of 2026-11-24). For the same reason it names which of those
/// kernels reach which others through the kernels the resolved classes form: a completion
/// closes a cycle through them exactly when such a path exists. Both use the kernel model of
/// `launch_order_impossible`, not the lowering's own.
pub(super) fn hole_context(
    kv: &KernelView,
    sorted_picks: &[u32],
    reach: &[u64],
    memo: &[u32],
    (by, stored_read): (HoleContext, bool),
    regions: &mut RegionScratch,
    context: &mut Vec<u64>,
) {
    let (x, s) = (kv.x, kv.choice);
    let stored = |c: u32| {
        let cu = c as usize;
        !class_tiled(x, c) && !x.constant[cu] && !x.input[cu]
    };
    // Canonical ids and pick indices both stay below 2^31: the top bit tells them apart.
    const FORM: u64 = 1 << 31;
    // A stored class: its id alone, tagged by the top bit (class ids stay below 2^31).
    const STORED: u64 = 1 << 63;
    // A region class a completion can attach to, with the least such class of its region.
    const REGION: u64 = 1 << 62;
    let RegionScratch {
        launch,
        least,
        labels,
        stack,
        seen,
        stored: met_stored,
        attachable,
        self_read,
    } = regions;
    kv.join_regions(sorted_picks, &mut launch.parent);
    let parent = &mut launch.parent;
    // A class a completion can attach to: one a hole reaches, or one with an operand that is
    // a hole or views of one (a tile the completion may compute, joining its kernel).
    let interface = |c: u32| {
        let cu = c as usize;
        kv.computed(c)
            && kv.region(c)
            && (has(reach, cu)
                || kv.op(c).1.iter().any(|&k| {
                    s[k as usize] == NONE
                        || class_tiled(x, k) && kv.picked(k) && kv.load(k) == Load::Unknown
                }))
    };
    attachable.clear();
    attachable.extend(sorted_picks.iter().copied().filter(|c| interface(*c)));
    least.clear();
    for &c in attachable.iter() {
        let r = find_root(parent, c);
        let l = least.entry(r).or_insert(c);
        *l = (*l).min(c);
    }
    context.clear();
    context.extend(
        sorted_picks
            .iter()
            .map(|c| (*c as usize, s[*c as usize]))
            .filter(|(c, _)| x.nodes[*c].len() > 1 && has(reach, *c))
            .map(|(c, n)| {
                let value = match (by, memo[c]) {
                    (HoleContext::Forms, id) if id != NONE => FORM | u64::from(id),
                    _ => u64::from(n),
                };
                ((c as u64) << 32) | value
            })
            .chain(
                sorted_picks
                    .iter()
                    .filter(|c| !stored_read && stored(**c))
                    .map(|c| STORED | u64::from(*c)),
            ),
    );
    if stored_read {
        // The stored values a completion can meet: at the end of a chain of picked views from
        // a class it can read (what `computed_once`'s `source` follows), each named once.
        met_stored.clear();
        for &c in sorted_picks {
            let cu = c as usize;
            if !has(reach, cu) {
                continue;
            }
            let mut k = c;
            while let Some((_, kids)) = x.op(k, s).filter(|(n, _)| is_view(&n.op)) {
                k = kids[0];
            }
            if s[k as usize] != NONE && stored(k) {
                met_stored.push(STORED | u64::from(k));
            }
        }
        met_stored.sort_unstable();
        met_stored.dedup();
        context.extend_from_slice(met_stored);
    }
    for &c in attachable.iter() {
        let l = least[&find_root(parent, c)];
        context.push(REGION | (u64::from(c) << 31) | u64::from(l));
    }
    // Paths between those kernels through the resolved ones: a completion that joins or links
    // two of them closes a cycle exactly when such a path exists. Kernels are named by their
    // least attachable class, or, for a class a hole reaches that is a kernel of its own, by
    // that class.
    const PATH: u64 = 1 << 61;
    labels.clear();
    for (&root, &l) in least.iter() {
        labels.insert(root, l);
    }
    for &c in sorted_picks {
        let cu = c as usize;
        if has(reach, cu) && kv.computed(c) && !kv.region(c) && !kv.plumbing(c) {
            labels.insert(c, c);
        }
    }
    // Also the launch-order test's graph (`RegionScratch::self_read`).
    *self_read = kv.kernel_edges(sorted_picks, launch, true);
    let edges = &launch.edges;
    let start = context.len();
    if !edges.is_empty() {
        for (&k, &from) in labels.iter() {
            seen.clear();
            stack.clear();
            stack.push(k);
            while let Some(a) = stack.pop() {
                let first = edges.partition_point(|e| e.0 < a);
                for &(_, b) in edges[first..].iter().take_while(|e| e.0 == a) {
                    if seen.insert(b) {
                        stack.push(b);
                        if let Some(&to) = labels.get(&b) {
                            context.push(PATH | (u64::from(from) << 30) | u64::from(to));
                        }
                    }
                }
            }
        }
    }
    context[start..].sort_unstable();
}

/// Scratch space for the kernels of `hole_context`.
#[derive(Default)]
pub(super) struct RegionScratch {
    /// Regions (`KernelView::join_regions`) and the kernel graph (`KernelView::kernel_edges`).
    pub(super) launch: LaunchScratch,
    /// Per region root, its least class a completion can attach to.
    pub(super) least: FxHashMap<u32, u32>,
    /// The kernels a completion can attach to, by their names in the context.
    pub(super) labels: FxHashMap<u32, u32>,
    pub(super) stack: Vec<u32>,
    pub(super) seen: FxHashSet<u32>,
    /// The stored values a completion can meet (`stored_read`).
    pub(super) stored: Vec<u64>,
    /// The resolved classes a completion can attach to, in class order.
    pub(super) attachable: Vec<u32>,
    /// Whether a kernel reads what it writes. With `launch.edges`, the kernel graph
    /// `launch_order_impossible` builds (up to the names of regions, which `kernel_cycle` does
    /// not see), so the test reuses them for a program it looked up.
    pub(super) self_read: bool,
}
