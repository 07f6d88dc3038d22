//! Validity of partial programs: each value computed once, no dead component of a fused
//! reduction, partitions that read only loads.

use super::canon::{associative, chain_link, is_view};
use super::extract_graph::{ComponentReaders, ExtractGraph};
use super::kernels::Memo;
use super::reach::{class_tiled, has, loadable, reaches, Marks};
use super::{Choice, NONE};
use crate::egraph::lang::{ENode, Op};
use crate::ir::{ExprKind, Function, Type};
use rustc_hash::FxHashSet;

/// A tuple reduction picked in the program one of whose components no completion reads:
/// the class holding `get[i](t)` picked another e-node, or no e-node reads it. Product fusion
/// would compute that component for nothing, which `no_dead_components` refuses in every
/// completion; found here, the branch ends before its holes are resolved. A class that holds
/// `get[i](t)` but is not in the program and that no hole reaches (`hole_reach`, a bitset
/// over classes) never will be: no completion reads that component either. (A component that
/// a repair-fused reduction only carries for the next, its first, needs no reader.)
pub(super) fn dead_component(
    x: &ExtractGraph,
    choice: &Choice,
    met: &[u32],
    hole_reach: &[u64],
) -> bool {
    let unreached = |b: u32| {
        let b = b as usize;
        hole_reach
            .get(b / 64)
            .is_some_and(|w| w >> (b % 64) & 1 == 0)
    };
    met.iter()
        .any(|&t| leaves_component_dead(x, choice, t, unreached))
}

/// Whether class `t`, as picked, is a fused reduction one of whose needed components no
/// completion reads: the class holding its `get` picked another e-node, or is unresolved and
/// `unreached` (no hole can resolve it), or no e-node reads it at all.
pub(super) fn leaves_component_dead(
    x: &ExtractGraph,
    choice: &Choice,
    t: u32,
    mut unreached: impl FnMut(u32) -> bool,
) -> bool {
    let Some((readers, first)) = readers_needed(x, choice, t) else {
        return false;
    };
    readers.gets.iter().skip(first).any(|g| match g {
        None => true,
        Some((b, j)) => match choice[*b as usize] {
            NONE => unreached(*b),
            picked => picked != *j,
        },
    })
}

/// Whether no completion of a program can resolve the unresolved class `b`: no hole reaches
/// it through unresolved classes (`open_reach`'s relation, searched backwards from `b`).
/// `is_hole` says which classes are holes. `within` (a bitset over classes) holds every
/// unresolved class a hole reaches, or more: an earlier program's `open_reach`, which picks
/// since then only shrink. The search stays inside it, which on a large e-graph keeps it off
/// the many classes outside the program.
pub(super) fn unreachable_from_holes(
    x: &ExtractGraph,
    choice: &Choice,
    b: u32,
    is_hole: impl Fn(u32) -> bool,
    within: &[u64],
    marks: &mut Marks,
    stack: &mut Vec<u32>,
) -> bool {
    let inside = |c: u32| has(within, c as usize);
    if is_hole(b) {
        return false;
    }
    if !inside(b) {
        return true;
    }
    marks.clear();
    marks.mark(b);
    stack.clear();
    stack.push(b);
    while let Some(c) = stack.pop() {
        for &p in &x.parents[c as usize] {
            if choice[p as usize] != NONE || !inside(p) || !marks.mark(p) {
                continue;
            }
            if is_hole(p) {
                return false;
            }
            stack.push(p);
        }
    }
    true
}

/// `leaves_component_dead` judged before the push: a needed component's unresolved `get`
/// class is dead when no hole reaches it (`unreachable_from_holes`).
pub(super) fn leaves_component_unreachable(
    x: &ExtractGraph,
    choice: &Choice,
    t: u32,
    is_hole: impl Fn(u32) -> bool,
    within: &[u64],
    marks: &mut Marks,
    stack: &mut Vec<u32>,
) -> bool {
    leaves_component_dead(x, choice, t, |b| {
        unreachable_from_holes(x, choice, b, &is_hole, within, marks, stack)
    })
}

/// Adds to `out` the unresolved classes holding the `get` of a component that a fused
/// reduction among `met` needs read.
pub(super) fn unread_components(
    x: &ExtractGraph,
    choice: &Choice,
    met: &[u32],
    out: &mut Vec<u32>,
) {
    for &t in met {
        if let Some((readers, first)) = readers_needed(x, choice, t) {
            out.extend(
                readers
                    .gets
                    .iter()
                    .skip(first)
                    .flatten()
                    .map(|(b, _)| *b)
                    .filter(|b| choice[*b as usize] == NONE),
            );
        }
    }
}

/// For a tuple-typed class `t` picked as a reduction and not read whole, its component
/// readers and the first component that needs one (`dead_component`).
pub(super) fn readers_needed<'x>(
    x: &'x ExtractGraph,
    choice: &Choice,
    t: u32,
) -> Option<(&'x ComponentReaders, usize)> {
    let readers = x.components[t as usize].as_ref().filter(|r| !r.whole)?;
    let reducer = match x.op(t, choice) {
        Some((
            ENode {
                op: Op::ReduceAxis { reducer, .. } | Op::ReduceParallel { reducer, .. },
                ..
            },
            _,
        )) => reducer,
        _ => return None,
    };
    let first = usize::from(!independent(reducer, &x.g.egraph.analysis.env));
    Some((readers, first))
}

/// Whether the tuple-typed class `t`, as picked, is a reduction whose component `i` some
/// `get[i](t)` must read (`dead_component`).
pub(super) fn component_needs_reader(x: &ExtractGraph, choice: &Choice, t: u32, i: usize) -> bool {
    readers_needed(x, choice, t).is_some_and(|(r, first)| i >= first && i < r.gets.len())
}

/// The e-node class `b` must pick, if any, for the program not to have a dead component: the
/// `get[i](t)` of a picked tuple reduction `t` whose component `i` needs a reader (the one
/// e-node of the e-graph that reads it). `Err` when two such e-nodes are required.
pub(super) fn required_get(x: &ExtractGraph, choice: &Choice, b: u32) -> Option<Result<u32, ()>> {
    let mut required = None;
    for &(t, i, j) in &x.gets_held[b as usize] {
        if choice[t as usize] == NONE || !component_needs_reader(x, choice, t, i) {
            continue;
        }
        match required {
            Some(r) if r != j => return Some(Err(())),
            _ => required = Some(j),
        }
    }
    required.map(Ok)
}

/// A reducer over a tuple whose components fold independently (a product of reducers), so
/// that every component is a result of its own.
pub(super) fn independent(
    reducer: &crate::ir::ReducerRef,
    env: &crate::verify::typing::TypeEnv,
) -> bool {
    match reducer {
        crate::ir::ReducerRef::User(name) => env
            .reducer(name.as_str())
            .is_some_and(|def| def.as_product().is_some()),
        crate::ir::ReducerRef::Builtin(_) => false,
    }
}

/// No dead fused results. A tuple-valued reduction is used whole, or each of its components
/// is read by some `get` — except the first component of a reduction that is not a product of
/// independent folds (a repair's running statistic, which the other components' updates read).
/// The components of a product fusion are independent folds: one nobody reads is work done
/// for nothing, and the candidate that does not fuse it is in the e-graph too (product fusion
/// puts each component in the class of its unfused reduction). Likewise a candidate that fuses
/// a value into a reduction and then computes it again elsewhere does the work twice. Judged
/// on the reconstructed program, where equal values are one node, so that ≈ candidates agree.
pub(super) fn no_dead_components(f: &Function, env: &crate::verify::typing::TypeEnv) -> bool {
    let nodes = &f.body.nodes;
    let mut read: FxHashSet<(usize, usize)> = FxHashSet::default();
    let mut whole: FxHashSet<usize> = FxHashSet::default();
    for node in nodes {
        match &node.kind {
            ExprKind::Get(crate::ir::FieldRef::Index(i), t) => {
                read.insert((t.index(), *i));
            }
            k => whole.extend(k.operands().iter().map(|o| o.index())),
        }
    }
    whole.extend(f.body.results.iter().map(|r| r.index()));
    nodes
        .iter()
        .enumerate()
        .all(|(c, node)| match (&node.kind, &node.ty) {
            (ExprKind::Reduce { reducer, .. }, Some(Type::Tuple(ts))) => {
                let first = usize::from(!independent(reducer, env));
                whole.contains(&c) || (first..ts.len()).all(|i| read.contains(&(c, i)))
            }
            _ => true,
        })
}

/// Lowerability of views: a `partition` slices what it reads from global memory (a kernel
/// region is entered through loads), so its operand must be a tensor-level value or views of
/// one — never a tile computed inside a kernel, which no program could slice by its grid
/// coordinate. (`replicate` of a computed tile is a loop-invariant value and stays allowed.)
pub(super) fn loads_only(x: &ExtractGraph, choice: &Choice) -> bool {
    choice.iter().enumerate().all(|(c, &n)| {
        if n == NONE {
            return true;
        }
        let (node, kids) = &x.nodes[c][n as usize];
        !matches!(node.op, Op::Partition(..)) || loadable(x, choice, kids[0]) != Some(false)
    })
}

/// `loads_only` of `choice` just after hole `h` was picked, for a program that was
/// `loads_only` before (every program in the worklist is): only partitions whose operand's
/// view chain ran into the hole `h` can change their verdict.
pub(super) fn loads_only_after_pick(x: &ExtractGraph, choice: &Choice, h: u32) -> bool {
    let Some((node, kids)) = x.op(h, choice) else {
        return true;
    };
    if matches!(node.op, Op::Partition(..)) && loadable(x, choice, kids[0]) == Some(false) {
        return false;
    }
    if loadable(x, choice, h) != Some(false) {
        return true;
    }
    // `h` is now a computed tile, or views of one: so is every tiled view picked above it.
    let mut stack = vec![h];
    while let Some(c) = stack.pop() {
        for &(q, j) in &x.view_users[c as usize] {
            if choice[q as usize] != j {
                continue;
            }
            if matches!(x.nodes[q as usize][j as usize].0.op, Op::Partition(..)) {
                return false;
            }
            if class_tiled(x, q) {
                stack.push(q);
            }
        }
    }
    true
}

/// Each value is computed once. A class that can be written as views of a value the program
/// computes anyway — a computed tensor-level value (stored, so loaded), or a tile computed in
/// a kernel (replicated) — is written so, unless that value is computed from this very class.
/// A program that recomputes such a value elsewhere does the work twice; the programs that
/// compute it one way or the other are candidates of their own. Judged on resolved classes, so
/// a partial program that breaks it is pruned before it is expanded.
///
/// On a partial program the verdict must hold for every completion (pruning is sound only
/// then): a view chain through a class not resolved yet that a hole reaches (`hole_reach`, a
/// bitset over classes) proves nothing, since the class may still be resolved to a
/// computation, and a hole may still make the value depend on the class. A class no hole
/// reaches stays unresolved in every completion, so it is judged as in the complete program:
/// nGPT 223 → 221 expanded states, RMSNorm+GEMM 9,439 → 8,541, LayerNorm+GEMM 46,150 →
/// 41,273, the same classes.
pub(super) fn computed_once(
    x: &ExtractGraph,
    choice: &Choice,
    (visited, met): (&[bool], &[u32]),
    hole_reach: &[u64],
    scratch: &mut OnceScratch,
) -> bool {
    let picked = |k: usize| visited[k] && choice[k] != NONE;
    // A class no hole reaches is never picked by a completion: judged as in the complete
    // program already, so that a failure fixed by the resolved part shows now, not only once
    // the holes are filled (≈ₚ programs may differ there: they only agree on forms).
    let open = |k: usize| {
        hole_reach
            .get(k / 64)
            .is_some_and(|w| w >> (k % 64) & 1 == 1)
    };
    // What class `k` can be read from through views (`replicated`: the view above it is a
    // replicate), memoised per (class, replicated) in `memo[2k + replicated]`: a `Source`
    // encoded by `Source::code`.
    struct Program<'p> {
        x: &'p ExtractGraph<'p>,
        choice: &'p Choice,
        picked: &'p dyn Fn(usize) -> bool,
        open: &'p dyn Fn(usize) -> bool,
    }
    pub(super) fn source(p: &Program, k: u32, replicated: bool, memo: &Memo) -> Source {
        let Program {
            x,
            choice,
            picked,
            open,
        } = *p;
        let slot = 2 * k as usize + usize::from(replicated);
        if let Some(code) = memo.get(slot) {
            return Source::decode(code);
        }
        let ku = k as usize;
        let r = if picked(ku) {
            let (n, kids) = &x.nodes[ku][choice[ku] as usize];
            if !class_tiled(x, k) {
                if x.constant[ku] || x.input[ku] {
                    Source::Nothing
                } else {
                    Source::Value(k)
                }
            } else if is_view(&n.op) {
                source(p, kids[0], matches!(n.op, Op::Replicate(_)), memo)
            } else if replicated {
                Source::Value(k)
            } else {
                // A tile computed in a kernel is only ever replicated, never sliced.
                Source::Nothing
            }
        } else if open(ku) {
            Source::Open
        } else if !class_tiled(x, k) {
            // Not in the program, so not computed.
            Source::Nothing
        } else {
            // Not in the program: any of its views may be written; the first that reads a
            // computed value counts, so one still undecided before it leaves this undecided
            // too. Until the alternatives are judged, a view cycle back here reads as
            // undecided.
            memo.set(slot, Source::Open.code());
            x.nodes[ku]
                .iter()
                .filter(|(n, _)| is_view(&n.op))
                .map(|(n, kids)| source(p, kids[0], matches!(n.op, Op::Replicate(_)), memo))
                .find(|s| *s != Source::Nothing)
                .unwrap_or(Source::Nothing)
        };
        memo.set(slot, r.code());
        r
    }
    let program = Program {
        x,
        choice,
        picked: &picked,
        open: &open,
    };
    scratch.next_call();
    let OnceScratch {
        memo,
        chain_use,
        other_use,
        seen,
        ..
    } = scratch;
    // ≈ does not see how a chain of one associative operator is grouped in a kernel, so
    // neither may this check: a class that is only an intermediate of such a chain (never
    // used otherwise, not a result) is no value of its own. (Judging it made validity differ
    // between ≈ programs, and which one early compaction kept decided whether the class
    // survived.)
    for r in &x.roots {
        other_use.mark(*r);
    }
    for p in met.iter().map(|p| *p as usize) {
        if choice[p] == NONE {
            continue;
        }
        let (node, kids) = &x.nodes[p][choice[p] as usize];
        for &k in kids {
            let ku = k as usize;
            let link = picked(ku)
                && chain_link(
                    &node.op,
                    class_tiled(x, p as u32),
                    &x.nodes[ku][choice[ku] as usize].0.op,
                    class_tiled(x, k),
                );
            if link {
                chain_use.mark(k);
            } else {
                other_use.mark(k);
            }
        }
    }
    for c in met.iter().map(|c| *c as usize) {
        let n = choice[c];
        let chain_only = chain_use.contains(c as u32) && !other_use.contains(c as u32);
        if n == NONE || !class_tiled(x, c as u32) || chain_only {
            continue;
        }
        let (node, kids) = &x.nodes[c][n as usize];
        let views_of = |n: &ENode, kids: &[u32], memo: &Memo| {
            source(&program, kids[0], matches!(n.op, Op::Replicate(_)), memo)
        };
        if is_view(&node.op) && views_of(node, kids, memo) != Source::Nothing {
            continue; // written as views of a computed value, or may still be
        }
        for (alt, kids) in &x.nodes[c] {
            if !is_view(&alt.op) {
                continue;
            }
            if let Source::Value(t) = views_of(alt, kids, memo) {
                if t as usize != c && !reaches(x, choice, &[t], c as u32, true, seen) {
                    return false;
                }
            }
        }
    }
    true
}

/// The failures of `computed_once` that a step's new picks (`new`: the branching pick and the
/// picks unit propagation forced with it) make directly, without a walk: a new pick computes a
/// tiled class that one view of a computed value could write, or computes the value that a
/// view e-node of a resolved, computing tiled class reads. Each is exactly what
/// `computed_once` refuses on the walked program (every pick of a program is in it, so
/// "picked" is "resolved" here), restricted to a view that reads the value itself rather than
/// through further views, and leaving out classes an associative chain may use as a mere
/// link; what it misses, the check after the walk finds.
pub(super) fn computes_twice_directly(
    x: &ExtractGraph,
    choice: &Choice,
    new: &[u32],
    seen: &mut Marks,
) -> bool {
    // The computed value a view e-node reads directly, if it reads one (`source` for a
    // resolved class).
    let value_read = |alt: &Op, t: u32| -> bool {
        let tu = t as usize;
        let Some((n, _)) = x.op(t, choice) else {
            return false;
        };
        if !class_tiled(x, t) {
            !(x.constant[tu] || x.input[tu])
        } else {
            !is_view(&n.op) && matches!(alt, Op::Replicate(_))
        }
    };
    // A resolved tiled class computed (not written as views) and not a chain's mere link.
    let computing = |c: u32| {
        x.op(c, choice)
            .is_some_and(|(n, _)| class_tiled(x, c) && !is_view(&n.op) && !associative(&n.op))
    };
    for &c in new {
        // The new pick computes `c` though a view of a computed value could write it.
        if computing(c) {
            for (alt, kids) in &x.nodes[c as usize] {
                if is_view(&alt.op)
                    && kids[0] != c
                    && value_read(&alt.op, kids[0])
                    && !reaches(x, choice, &kids[0..1], c, true, seen)
                {
                    return true;
                }
            }
        }
        // The new pick computes `c`, which a view e-node of a computing class reads.
        for &(u, j) in &x.view_users[c as usize] {
            let alt = &x.nodes[u as usize][j as usize].0.op;
            if u != c
                && computing(u)
                && value_read(alt, c)
                && !reaches(x, choice, &[c], u, true, seen)
            {
                return true;
            }
        }
    }
    false
}

/// What a view chain reads (`computed_once`).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Source {
    /// This computed value.
    Value(u32),
    /// No computed value (an input, a constant, a tile that is sliced).
    Nothing,
    /// Not decided yet: the chain meets a class not resolved yet.
    Open,
}

impl Source {
    /// Dense encoding for the memo: class indices stay below `u32::MAX - 2`.
    pub(super) fn code(self) -> u32 {
        match self {
            Source::Value(k) => k,
            Source::Nothing => u32::MAX - 1,
            Source::Open => u32::MAX - 2,
        }
    }

    pub(super) fn decode(code: u32) -> Source {
        match code {
            c if c == u32::MAX - 1 => Source::Nothing,
            c if c == u32::MAX - 2 => Source::Open,
            k => Source::Value(k),
        }
    }
}

/// Scratch space for `computed_once`, reused across calls so that no call clears arrays the
/// size of the e-graph: `memo` entries count only with the current call's generation, and
/// the use sets are `Marks`.
pub(super) struct OnceScratch {
    /// Per (class, replicated): `Source::code`.
    pub(super) memo: Memo,
    pub(super) chain_use: Marks,
    pub(super) other_use: Marks,
    /// For `reaches`.
    pub(super) seen: Marks,
}

impl OnceScratch {
    pub(super) fn new(classes: usize) -> OnceScratch {
        OnceScratch {
            memo: Memo::new(2 * classes),
            chain_use: Marks::new(classes),
            other_use: Marks::new(classes),
            seen: Marks::new(classes),
        }
    }

    /// Starts a call: an empty memo and empty use sets.
    pub(super) fn next_call(&mut self) {
        self.memo.clear();
        self.chain_use.clear();
        self.other_use.clear();
    }
}

/// With every stored grid (`ExtractGraph::with_every_stored_grid`): whether an operator other than a
/// `combination` reads a tiled class the program computes by `combination` — a store read
/// inside its own kernel, which `lower` refuses. Once both picks are made every completion
/// has them, so the verdict holds for all.
pub(super) fn store_read_in_kernel(x: &ExtractGraph, choice: &Choice, met: &[u32]) -> bool {
    if !x.every_grid {
        return false;
    }
    let combines = |k: u32| {
        let p = choice[k as usize];
        p != NONE
            && class_tiled(x, k)
            && matches!(
                x.nodes[k as usize][p as usize].0.op,
                Op::Combination(..) | Op::Collection(_)
            )
    };
    met.iter().any(|&c| {
        let p = choice[c as usize];
        if p == NONE {
            return false;
        }
        let (node, kids) = &x.nodes[c as usize][p as usize];
        !matches!(node.op, Op::Combination(..) | Op::Collection(_))
            && kids.iter().any(|&k| combines(k))
    })
}
