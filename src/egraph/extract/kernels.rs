//! Kernels of partial programs: regions, the kernel graph, launch order and kernel-count
//! bounds.

use super::canon::{is_compute, is_pointwise, is_view};
use super::extract_graph::ExtractGraph;
use super::reach::{class_tiled, Marks};
use super::{Choice, NONE};
use crate::egraph::lang::{ENode, Op};
use rustc_hash::{FxHashMap, FxHashSet};

/// Pointwise work or data movement; tuple plumbing is no computation at all (`is_compute`).
pub(super) fn light(op: &Op) -> bool {
    is_pointwise(op) || matches!(op, Op::Transpose(_) | Op::Reshape(_) | Op::Broadcast(_))
}

/// Whether e-node `node` (with operand classes `kids`) of class `c` is a reshape *view*, as
/// `lower::reshape_views` makes it: a tensor-level `reshape` of a tensor-level value that is
/// no constant expression and, for a result, no input. No kernel computes it; its readers
/// (and the host, for a result) read the value it views. A result reshape of a view chain
/// down to an input is copied by a kernel, and a slice or concat a reshape reads is stored
/// by one (`lower::views::virtual_views`), which the bound does not count here: fewer
/// kernels than the program has keeps the bound admissible.
pub(super) fn reshape_view(x: &ExtractGraph, c: u32, node: &ENode, kids: &[u32]) -> bool {
    matches!(node.op, Op::Reshape(_))
        && !class_tiled(x, c)
        && kids.first().is_some_and(|&k| {
            !class_tiled(x, k)
                && !x.constant[k as usize]
                && (!x.roots.contains(&c) || !x.input[k as usize])
        })
}

/// Whether a partial program has a *pointwise kernel*: a kernel that only loads, applies
/// pointwise operators or moves data (transpose, reshape, broadcast) and stores a value that
/// is not a result — work its readers could do on their own loads. It is a tensor-level
/// pointwise operator (a kernel of its own by default tiling) or a stored tile computation
/// without a reduction or a matrix product. Judged on resolved classes, and on holes only
/// where every completion agrees (`pointwise_only`, `heavy_tile`): a tile computation that
/// reaches a hole which may still compute a reduction is not judged yet, so the verdict holds
/// for every completion. Moving a pointwise tail across a store keeps it (`Key::Epilogue`), so
/// ≈ programs share it.
pub(super) fn has_pointwise_kernel(
    x: &ExtractGraph,
    choice: &Choice,
    met: &[u32],
    seen: &mut Marks,
) -> bool {
    for &c in met {
        let pick = choice[c as usize];
        if pick == NONE && x.pointwise_only[c as usize] {
            return true; // a value every e-node of which stores pointwise work
        }
        if pick == NONE || class_tiled(x, c) || x.constant[c as usize] || x.roots.contains(&c) {
            continue;
        }
        let (node, kids) = &x.nodes[c as usize][pick as usize];
        if light(&node.op) && is_compute(&node.op) && !reshape_view(x, c, node, kids) {
            return true;
        }
        if !matches!(node.op, Op::Combination(..) | Op::Collection(_)) {
            continue;
        }
        // The stored tile computation, down to its loads.
        seen.clear();
        let mut stack: Vec<u32> = kids.to_vec();
        let mut only_light = true;
        while let Some(k) = stack.pop() {
            if !class_tiled(x, k) || !seen.mark(k) {
                continue; // a load's source, a literal, or met before
            }
            let pick = choice[k as usize];
            if pick == NONE && x.heavy_tile[k as usize] {
                only_light = false; // a hole decides
                break;
            }
            if pick == NONE {
                continue; // light however it is resolved
            }
            let (op, grandkids) = (
                &x.nodes[k as usize][pick as usize].0.op,
                &x.nodes[k as usize][pick as usize].1,
            );
            if is_compute(op) && !light(op) {
                only_light = false;
                break;
            }
            stack.extend(grandkids.iter().copied());
        }
        if only_light {
            return true;
        }
    }
    false
}

/// A lower bound on the kernels of any completion of a partial program: each picked
/// tensor-level operator on tensor-level operands is a kernel of its own (default tiling), a
/// tiled region is at least one more, and a computed tensor-level value read by another
/// operator was written by one kernel and read by another. Classes with one canonical form
/// (`memo`) are one node of the program, so they count once.
pub(super) fn kernel_lower_bound(
    x: &ExtractGraph,
    choice: &Choice,
    met: &[u32],
    memo: &[u32],
) -> usize {
    let (mut default_tiled, mut region, mut stored_read) = (FxHashSet::default(), false, false);
    for c in met.iter().map(|c| *c as usize) {
        if choice[c] == NONE {
            continue;
        }
        let (node, kids) = &x.nodes[c][choice[c] as usize];
        // A stored value some kernel computes: not a reshape view, nor possibly one.
        let computed = |k: u32| {
            let ku = k as usize;
            let view = |(n, kids): &(ENode, Vec<u32>)| reshape_view(x, k, n, kids);
            !class_tiled(x, k)
                && !x.constant[ku]
                && !x.input[ku]
                && match choice[ku] {
                    NONE => !x.nodes[ku].iter().any(view),
                    p => !view(&x.nodes[ku][p as usize]),
                }
        };
        if class_tiled(x, c as u32) {
            region = true;
        } else if is_compute(&node.op)
            && !x.constant[c]
            && kids.iter().all(|k| !class_tiled(x, *k))
            && !reshape_view(x, c as u32, node, kids)
        {
            default_tiled.insert(memo[c]);
        }
        // (A result that is a reshape view is read by the host, not by a kernel.)
        if (is_compute(&node.op) || is_view(&node.op))
            && kids.iter().any(|k| computed(*k))
            && !(x.roots.contains(&(c as u32)) && reshape_view(x, c as u32, node, kids))
        {
            stored_read = true;
        }
    }
    let lb = default_tiled.len() + usize::from(region);
    if stored_read {
        lb.max(2)
    } else {
        lb
    }
}

/// How a program's resolved classes form kernels, as far as they decide it
/// (`launch_order_impossible`, `hole_context`).
pub(super) struct KernelView<'p> {
    pub(super) x: &'p ExtractGraph<'p>,
    pub(super) choice: &'p Choice,
    pub(super) visited: &'p [bool],
    /// `load` per class, for this program only: the region context and the launch-order
    /// test ask for the same chains many times over.
    pub(super) loads: &'p Memo,
}

/// A u32 per slot, all forgotten at once in constant time (like `Marks`): a slot counts only
/// if it carries the current generation, in its upper half. Interior mutability lets a
/// memoised function read and write it through a shared view of the program.
pub(super) struct Memo {
    pub(super) generation: u32,
    pub(super) slots: Vec<std::cell::Cell<u64>>,
}

impl Memo {
    pub(super) fn new(len: usize) -> Memo {
        Memo {
            generation: 1,
            slots: vec![std::cell::Cell::new(0); len],
        }
    }

    /// Forgets every slot.
    pub(super) fn clear(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // The generations wrapped around: slots from long ago would count again.
            self.slots.iter().for_each(|s| s.set(0));
            self.generation = 1;
        }
    }

    pub(super) fn get(&self, i: usize) -> Option<u32> {
        let s = self.slots[i].get();
        ((s >> 32) as u32 == self.generation).then_some(s as u32)
    }

    pub(super) fn set(&self, i: usize, value: u32) {
        self.slots[i].set(u64::from(self.generation) << 32 | u64::from(value));
    }
}

/// What a picked class reads through views (`KernelView::load`).
#[derive(PartialEq)]
pub(super) enum Load {
    /// Not a view chain: computed here.
    No,
    /// A load of this tensor-level value.
    From(u32),
    /// The chain meets a class not resolved yet.
    Unknown,
}

impl KernelView<'_> {
    pub(super) fn picked(&self, c: u32) -> bool {
        self.visited[c as usize] && self.choice[c as usize] != NONE
    }

    pub(super) fn op(&self, c: u32) -> &(ENode, Vec<u32>) {
        &self.x.nodes[c as usize][self.choice[c as usize] as usize]
    }

    /// A picked view chain down to a tensor-level value is a load of that value.
    pub(super) fn load(&self, c: u32) -> Load {
        if let Some(code) = self.loads.get(c as usize) {
            return match code {
                0 => Load::No,
                1 => Load::Unknown,
                o => Load::From(o - 2),
            };
        }
        let load = self.load_uncached(c);
        let code = match load {
            Load::No => 0,
            Load::Unknown => 1,
            Load::From(o) => o + 2,
        };
        self.loads.set(c as usize, code);
        load
    }

    pub(super) fn load_uncached(&self, mut c: u32) -> Load {
        loop {
            let (node, kids) = self.op(c);
            if !matches!(node.op, Op::Partition(..) | Op::Replicate(_)) {
                return Load::No;
            }
            let o = kids[0];
            if !class_tiled(self.x, o) {
                return Load::From(o);
            }
            if !self.picked(o) {
                return Load::Unknown;
            }
            c = o;
        }
    }

    /// A class that is some kernel's work: not a leaf, a constant, an input, a load or a
    /// reshape view.
    pub(super) fn computed(&self, c: u32) -> bool {
        self.picked(c)
            && !matches!(
                self.op(c).0.op,
                Op::Input(..) | Op::Constant(..) | Op::Fill(..) | Op::Iota(..)
            )
            && !self.x.constant[c as usize]
            && !self.x.input[c as usize]
            && self.load(c) == Load::No
            && !self.is_reshape_view(c)
    }

    pub(super) fn is_reshape_view(&self, c: u32) -> bool {
        let (node, kids) = self.op(c);
        reshape_view(self.x, c, node, kids)
    }

    /// The value whose buffer a read of tensor-level class `c` reads: `c`, or what the picked
    /// reshape views from `c` view; `None` where a view's operand is not resolved yet.
    pub(super) fn through_reshape_views(&self, mut c: u32) -> Option<u32> {
        while self.picked(c) && self.is_reshape_view(c) {
            c = self.op(c).1[0];
            if !self.picked(c) {
                return None;
            }
        }
        Some(c)
    }

    pub(super) fn region(&self, c: u32) -> bool {
        class_tiled(self.x, c) || self.op(c).1.iter().any(|k| class_tiled(self.x, *k))
    }

    /// Outside a region a `tuple` is plumbing (no kernel of its own), and a `get` belongs to
    /// its tuple's kernel.
    pub(super) fn plumbing(&self, c: u32) -> bool {
        !self.region(c) && matches!(self.op(c).0.op, Op::Tuple | Op::Get(_))
    }

    /// The kernel graph of the resolved classes into `scratch.edges` (writer kernel, reader
    /// kernel; sorted, deduplicated), regions joined into `scratch.parent` unless `joined`
    /// says they are already. True when a kernel reads a value it writes itself. Reads of
    /// stored values only: a `get` reading its own kernel's tuple reads no global memory (once
    /// kernels join, its read may vanish, so it proves nothing here).
    pub(super) fn kernel_edges(
        &self,
        picks: &[u32],
        scratch: &mut LaunchScratch,
        joined: bool,
    ) -> bool {
        let LaunchScratch {
            parent,
            reads,
            edges,
        } = scratch;
        reads.clear();
        edges.clear();
        for &j in picks {
            if !self.computed(j) || self.plumbing(j) || matches!(self.op(j).0.op, Op::Get(_)) {
                continue;
            }
            for &o in &self.op(j).1 {
                if !self.picked(o) {
                    continue;
                }
                let value = match self.load(o) {
                    Load::From(b) => b,
                    Load::No => o,
                    Load::Unknown => continue,
                };
                let Some(value) = self.through_reshape_views(value) else {
                    continue;
                };
                if !class_tiled(self.x, value) && self.computed(value) {
                    reads.push((j, value));
                }
            }
        }
        if reads.is_empty() {
            return false;
        }
        if !joined {
            self.join_regions(picks, parent);
        }
        for &(j, value) in reads.iter() {
            let (reader, writer) = (self.kernel(parent, j), self.kernel(parent, value));
            if writer == NONE {
                continue;
            }
            if reader == writer {
                return true;
            }
            edges.push((writer, reader));
        }
        edges.sort_unstable();
        edges.dedup();
        false
    }

    /// A region class's kernel is its region's; another class is a kernel of its own (its
    /// default tiling), but a `get` outside a region is its tuple's, and a `tuple` outside a
    /// region none, as far as the picks decide (`NONE` otherwise).
    pub(super) fn kernel(&self, parent: &mut [u32], mut c: u32) -> u32 {
        loop {
            if self.region(c) {
                return find_root(parent, c);
            }
            if !self.plumbing(c) {
                return c;
            }
            match (&self.op(c).0.op, self.op(c).1.first()) {
                (Op::Get(_), Some(&t)) if self.computed(t) => c = t,
                _ => return NONE,
            }
        }
    }

    /// Regions as a union-find over classes in `parent` (`find_root`): a computed region class
    /// joins each tiled operand that is not a load.
    pub(super) fn join_regions(&self, picks: &[u32], parent: &mut Vec<u32>) {
        parent.resize(self.choice.len(), 0);
        for &c in picks {
            parent[c as usize] = c;
        }
        for &c in picks {
            if !self.computed(c) || !self.region(c) {
                continue;
            }
            for &o in &self.op(c).1 {
                if class_tiled(self.x, o) && self.picked(o) && self.load(o) == Load::No {
                    let (a, b) = (find_root(parent, c), find_root(parent, o));
                    parent[a as usize] = b;
                }
            }
        }
    }
}

pub(super) fn find_root(p: &mut [u32], mut i: u32) -> u32 {
    while p[i as usize] != i {
        p[i as usize] = p[p[i as usize] as usize];
        i = p[i as usize];
    }
    i
}

/// Whether no completion of a partial program has a kernel launch order: the kernels its
/// resolved classes already form read each other's stored values in a cycle, or one reads a
/// value it writes itself. This is `lower::kernel_graph`'s test on what is known so far. A
/// completion only adds e-nodes, so it adds read edges and joins regions (a class's type
/// fixes whether it is tiled); joining the kernels of a cycle leaves a cycle or a kernel
/// reading itself, so the verdict holds for every completion. What a hole could still decide
/// is left out, which can only miss a cycle: a view chain into a hole (load or computed
/// tile?), the kernel of a `get` whose tuple is a hole or plumbing, and reads by `tuple` and
/// `get` (outside a region a tuple's readers read its parts; a get's read of its own kernel's
/// tuple is none, and may become so when kernels join).
pub(super) fn launch_order_impossible(
    kv: &KernelView,
    picks: &[u32],
    scratch: &mut LaunchScratch,
) -> bool {
    // A kernel reading what it writes, or a cycle.
    kv.kernel_edges(picks, scratch, false) || kernel_cycle(&scratch.edges)
}

/// Whether kernel read edges (writer, reader; sorted) form a cycle.
pub(super) fn kernel_cycle(edges: &[(u32, u32)]) -> bool {
    edges.len() >= 2 && kernel_chain(edges).is_none()
}

/// Orders a kernel graph (writer, reader; sorted) by Kahn's algorithm: the kernels on its
/// longest chain, each reading a value the one before it stored, or None for a cycle (some
/// kernel left unordered). In a completion with a launch order the kernels of a chain stay
/// distinct, since joining two of them makes a kernel read what it writes or a cycle, so
/// every valid completion has at least that many. 0 without edges.
pub(super) fn kernel_chain(edges: &[(u32, u32)]) -> Option<usize> {
    // (unordered writers left, kernels on the longest chain ending here) per kernel.
    let mut at: FxHashMap<u32, (usize, usize)> = FxHashMap::default();
    for &(a, b) in edges {
        at.entry(a).or_insert((0, 1));
        at.entry(b).or_insert((0, 1)).0 += 1;
    }
    let mut ready: Vec<u32> = at
        .iter()
        .filter(|(_, (d, _))| *d == 0)
        .map(|(k, _)| *k)
        .collect();
    let (mut ordered, mut longest) = (0, 0);
    while let Some(k) = ready.pop() {
        ordered += 1;
        let chain = at[&k].1;
        longest = longest.max(chain);
        let from = edges.partition_point(|e| e.0 < k);
        for &(_, b) in edges[from..].iter().take_while(|e| e.0 == k) {
            let (d, c) = at.entry(b).or_default();
            *c = (*c).max(chain + 1);
            *d -= 1;
            if *d == 0 {
                ready.push(b);
            }
        }
    }
    (ordered == at.len()).then_some(longest)
}

/// Buffers `launch_order_impossible` reuses from one program to the next.
#[derive(Default)]
pub(super) struct LaunchScratch {
    pub(super) parent: Vec<u32>,
    pub(super) reads: Vec<(u32, u32)>,
    pub(super) edges: Vec<(u32, u32)>,
}

#[cfg(test)]
mod tests {
    use super::{kernel_chain, kernel_cycle};

    #[test]
    fn a_kernel_chain_counts_the_kernels_on_the_longest_path() {
        let sorted = |mut e: Vec<(u32, u32)>| {
            e.sort_unstable();
            e
        };
        assert_eq!(kernel_chain(&[]), Some(0));
        assert_eq!(kernel_chain(&[(5, 9)]), Some(2));
        // 1 → 2 → 3 → 4 beside 1 → 4: four kernels in a row.
        assert_eq!(
            kernel_chain(&sorted(vec![(1, 2), (2, 3), (3, 4), (1, 4)])),
            Some(4)
        );
        // Two writers feeding one reader, then a reader of that: three.
        assert_eq!(kernel_chain(&sorted(vec![(7, 3), (8, 3), (3, 1)])), Some(3));
        // A cycle has no launch order.
        let cycle = sorted(vec![(1, 2), (2, 1), (2, 3)]);
        assert_eq!(kernel_chain(&cycle), None);
        assert!(kernel_cycle(&cycle));
    }
}
