//! Canonical forms of partial programs (≈ₚ): interned keys, commutative operands sorted, view
//! chains as sets, and the walk that computes them.

use super::extract_graph::ExtractGraph;
use super::{Choice, NONE};
use crate::egraph::lang::{ENode, Op};
use crate::ir::{BinaryOp, DType, Sym, Type};
use crate::lower::tiled;
use rustc_hash::FxHashMap;

/// A canonical term: holes by class, commutative operands sorted, view chains as sets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Hole(u32),
    Node(Op, Vec<u32>),
    /// A value under a chain of `partition`/`replicate` views, in canonical order.
    Views(u32, Vec<Op>),
    /// A value under a chain of `combination`s, in canonical order.
    Combinations(u32, Vec<Op>),
    /// A pointwise operator a kernel applied to a tile before storing it, written over the
    /// stored value: `combination(f(t))` as `f` of `combination(t)`. A kernel that loads it
    /// computes `f` itself (`views`), so where a kernel boundary cuts a pointwise chain is
    /// not part of the form; anywhere else it stays apart from the tensor-level `f`, which
    /// is a kernel of its own.
    Epilogue(Op, Vec<u32>),
}

pub(super) fn commutative(op: &Op) -> bool {
    matches!(op, Op::Binary(b) if b.is_commutative())
}

/// True when `b` is `a` with the operands of a commutative operator swapped.
pub(super) fn operand_swap(
    (a, a_kids): &(ENode, Vec<u32>),
    (b, b_kids): &(ENode, Vec<u32>),
) -> bool {
    commutative(&a.op)
        && a.op == b.op
        && a_kids.len() == 2
        && b_kids.len() == 2
        && a_kids[0] == b_kids[1]
        && a_kids[1] == b_kids[0]
}

/// Operators that compute (as opposed to leaves, views, stores and tuple plumbing).
pub(super) fn is_compute(op: &Op) -> bool {
    !matches!(
        op,
        Op::Input(..)
            | Op::Constant(..)
            | Op::Fill(..)
            | Op::Iota(..)
            | Op::Partition(..)
            | Op::Replicate(_)
            | Op::Combination(..)
            | Op::Collection(_)
            | Op::Tuple
            | Op::Get(_)
            // Views: their readers load through them (`lower::views`); no kernel of their own.
            | Op::Slice(..)
            | Op::Concat(_)
    )
}

pub(super) fn is_view(op: &Op) -> bool {
    matches!(op, Op::Partition(..) | Op::Replicate(_))
}

/// Canonical order of a chain of views: replicates (by axis) before partitions; partitions by
/// dimension, keeping the written order of partitions of the same dimension (nested tilings
/// of one dimension do not commute).
pub(super) fn view_rank(op: &Op) -> (u8, usize, &'static str) {
    match op {
        Op::Replicate(a) => (0, 0, a.as_str()),
        Op::Partition(d, _) => (1, *d, ""),
        Op::Combination(d, _) => (2, *d, ""),
        _ => (3, 0, ""),
    }
}

/// What normalisation needs to know of a canonical term: facts of its type. They are part of
/// a form's identity (`Interner::table`), so equal forms share them by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct KeyInfo {
    /// Has a parallel state: computed inside a kernel (or a view of a load).
    pub(super) tiled: bool,
    /// A rank-0 value without parallel state (a literal), which broadcasts to any tile.
    pub(super) literal: bool,
    pub(super) rank: usize,
    /// The element type of a tensor: an epilogue moves across a store only when it leaves
    /// the stored bytes alike.
    pub(super) dtype: Option<DType>,
}

/// Exact interning of canonical terms: equal ids ⇔ equal canonical forms.
#[derive(Default)]
pub(super) struct Interner {
    /// Ids by the hash of (key, facts); each key is stored once, in `keys`. Keyed with the
    /// facts too: a collection fold gives `reduce … parallel=` a tiled result where the
    /// operator itself may store it, and the two must not share a form (which one was
    /// interned first decided how replicas sank through it).
    /// (hash, id): the hash kept so that growing the table rehashes no key.
    pub(super) table: hashbrown::HashTable<(u64, u32)>,
    pub(super) keys: Vec<Key>,
    pub(super) info: Vec<KeyInfo>,
    /// Keep a fold over a stored collection (one outside any kernel, read back by every
    /// tile) in its own form instead of that of `reduce … parallel=`: the finer relation
    /// early compaction prunes by (see `Extractor::run`).
    pub(super) keep_stored_folds: bool,
    /// The walk's shortcut to `table`: a class's canonical id by what decides it.
    pub(super) steps: StepMemo,
    /// Per class, the id of its hole (`NONE` until first met): every walk names each of its
    /// holes, and a hole's key is a function of its class alone.
    pub(super) holes: Vec<u32>,
}

/// Canonical ids of walk steps. A class's canonical id is a function of its pick and the
/// canonical ids of its operands (or, for a chain of views or combinations, of the picks
/// along the chain and the id of its base): interning is a function of operand ids. Each
/// step is recorded under those u32s, so the next partial program that shares it — most of
/// a program is shared with its parent — finds the id without building, normalising and
/// hashing its key again.
#[derive(Default)]
pub(super) struct StepMemo {
    /// Each step with its canonical id.
    pub(super) steps: SliceTable,
    /// Per class (a step's first u32), the entry it was last looked up or recorded under:
    /// consecutive partial programs share most steps, and comparing with the last one is
    /// cheaper than hashing.
    pub(super) last: Vec<Option<SliceEntry>>,
}

impl StepMemo {
    pub(super) fn get(&mut self, step: &[u32]) -> Option<u32> {
        let c = step[0] as usize;
        let last = self.last.get(c).copied().flatten();
        if let Some(entry) = last.filter(|e| self.steps.slice(e) == step) {
            return Some(entry.value);
        }
        let entry = self.steps.find(step)?;
        self.remember(c, entry);
        Some(entry.value)
    }

    pub(super) fn insert(&mut self, step: &[u32], id: u32) {
        let entry = self.steps.insert(step, id);
        self.remember(step[0] as usize, entry);
    }

    pub(super) fn remember(&mut self, c: usize, entry: SliceEntry) {
        if c >= self.last.len() {
            self.last.resize(c + 1, None);
        }
        self.last[c] = Some(entry);
    }
}

/// Slices of u32s stored end to end in one arena, each with a u32 value, found by hash: the
/// walk's steps (`StepMemo`) and early compaction's seen-set, which hold millions of short
/// keys that would otherwise be a heap block each.
#[derive(Default)]
pub(super) struct SliceTable {
    pub(super) table: hashbrown::HashTable<SliceEntry>,
    pub(super) arena: Vec<u32>,
}

#[derive(Clone, Copy)]
pub(super) struct SliceEntry {
    /// The slice's hash, kept so that growing the table rehashes nothing.
    pub(super) hash: u64,
    pub(super) start: usize,
    pub(super) len: u32,
    pub(super) value: u32,
}

impl SliceTable {
    /// Its arena and table for `GrowthWatch` (a table's buckets also carry a control byte).
    pub(super) fn tables(&self, out: &mut Vec<(usize, usize, usize)>) {
        out.push((self.arena.len(), self.arena.capacity(), 4));
        let entry = std::mem::size_of::<SliceEntry>() + 1;
        out.push((self.table.len(), self.table.capacity(), entry));
    }

    pub(super) fn hash(key: &[u32]) -> u64 {
        use std::hash::BuildHasher;
        rustc_hash::FxBuildHasher.hash_one(key)
    }

    pub(super) fn slice(&self, e: &SliceEntry) -> &[u32] {
        &self.arena[e.start..e.start + e.len as usize]
    }

    pub(super) fn find(&self, key: &[u32]) -> Option<SliceEntry> {
        self.find_hashed(key, Self::hash(key))
    }

    /// `find`, given the key's `hash`.
    pub(super) fn find_hashed(&self, key: &[u32], hash: u64) -> Option<SliceEntry> {
        self.table
            .find(hash, |e| e.hash == hash && self.slice(e) == key)
            .copied()
    }

    /// Records a key not in the table.
    pub(super) fn insert(&mut self, key: &[u32], value: u32) -> SliceEntry {
        self.insert_hashed(key, Self::hash(key), value)
    }

    /// `insert`, given the key's `hash`.
    pub(super) fn insert_hashed(&mut self, key: &[u32], hash: u64, value: u32) -> SliceEntry {
        let entry = SliceEntry {
            hash,
            start: self.arena.len(),
            len: key.len() as u32,
            value,
        };
        self.arena.extend_from_slice(key);
        self.table.insert_unique(entry.hash, entry, |e| e.hash);
        entry
    }
}

impl Interner {
    /// Its tables for `GrowthWatch`, the step memo's included.
    pub(super) fn tables(&self, out: &mut Vec<(usize, usize, usize)>) {
        let key = std::mem::size_of::<Key>();
        out.push((self.keys.len(), self.keys.capacity(), key));
        let info = std::mem::size_of::<KeyInfo>();
        out.push((self.info.len(), self.info.capacity(), info));
        // (hash, id) and a control byte per bucket.
        out.push((self.table.len(), self.table.capacity(), 17));
        self.steps.steps.tables(out);
    }

    pub(super) fn intern(&mut self, k: Key, info: KeyInfo) -> u32 {
        fn hash(k: &Key, info: KeyInfo) -> u64 {
            use std::hash::BuildHasher;
            rustc_hash::FxBuildHasher.hash_one((k, info))
        }
        let Interner {
            table,
            keys,
            info: infos,
            ..
        } = self;
        let h = hash(&k, info);
        let same = |&(_, id): &(u64, u32)| infos[id as usize] == info && keys[id as usize] == k;
        if let Some((_, id)) = table.find(h, same) {
            return *id;
        }
        let id = keys.len() as u32;
        keys.push(k);
        infos.push(info);
        table.insert_unique(h, (h, id), |e| e.0);
        id
    }

    pub(super) fn key(&self, id: u32) -> Option<&Key> {
        self.keys.get(id as usize)
    }

    pub(super) fn info(&self, id: u32) -> KeyInfo {
        self.info[id as usize]
    }

    /// An operator computed inside a kernel that replicas pass through (`replicate[n](f(x))`
    /// is `f(replicate[n](x))` for the replicated `axes`): `(op, operands)`.
    pub(super) fn replica_transparent(&self, id: u32, axes: &[&Sym]) -> Option<(&Op, &[u32])> {
        match self.key(id) {
            Some(Key::Node(op, ks)) if self.info(id).tiled => {
                let transparent = match op {
                    Op::ReduceParallel { axis, .. } => !axes.contains(&axis),
                    op => {
                        is_pointwise(op)
                            || matches!(
                                op,
                                Op::ReduceAxis { .. } | Op::TileMatMul(_) | Op::Tuple | Op::Get(_)
                            )
                    }
                };
                transparent.then_some((op, ks.as_slice()))
            }
            _ => None,
        }
    }

    pub(super) fn node(&mut self, op: Op, mut ks: Vec<u32>, info: KeyInfo) -> u32 {
        if is_pointwise(&op) {
            // A literal broadcasts to any tile: its replicas are the literal. Not where every
            // operand is one (`1e-6 + replicate[n](norm)`, a computed scalar replicated so a
            // kernel computes it): nothing else carries the replica's axis, and without it
            // the tile computation would be the tensor-level one, or its replica along
            // another axis.
            let literal_replica = |this: &Self, k: u32| match this.key(k) {
                Some(Key::Views(b, chain)) => {
                    this.info(*b).literal && chain.iter().all(|v| matches!(v, Op::Replicate(_)))
                }
                _ => false,
            };
            let carried = ks
                .iter()
                .any(|k| !self.info(*k).literal && !literal_replica(self, *k));
            if carried {
                for k in &mut ks {
                    if literal_replica(self, *k) {
                        if let Some(Key::Views(b, _)) = self.key(*k) {
                            *k = *b;
                        }
                    }
                }
            }
        }
        if commutative(&op) {
            // Inside a kernel, a chain of one associative operator is one operation over a
            // multiset of operands: `(a * b) * c` and `a * (c * b)` compute alike.
            if associative(&op) && info.tiled {
                let mut flat = Vec::with_capacity(ks.len());
                for k in ks {
                    match self.key(k) {
                        Some(Key::Node(inner, kk))
                            if chain_link(&op, info.tiled, inner, self.info(k).tiled) =>
                        {
                            flat.extend(kk.iter().copied())
                        }
                        _ => flat.push(k),
                    }
                }
                ks = flat;
            }
            ks.sort();
        }
        self.intern(Key::Node(op, ks), info)
    }

    /// `chain` (innermost first) applied to `base`, in normal form: nested chains merged and
    /// sorted, and replicas sunk through operators computed in the kernel (pointwise, tile
    /// reductions and products, folds over other axes, tuples) down to their operands —
    /// `replicate[n](f(x))` and `f(replicate[n](x))` are the same tile computation, the second
    /// one written per coordinate of `n`.
    pub(super) fn views(&mut self, mut base: u32, mut chain: Vec<Op>) -> u32 {
        if chain.is_empty() {
            return base;
        }
        // Views of views: one chain, normalised as a whole (replicas added later may sink
        // where the earlier ones could not).
        if let Some(Key::Views(b, inner)) = self.key(base) {
            let mut all = inner.clone();
            all.extend(chain);
            chain = all;
            base = *b;
        }
        let info = self.info(base);
        if let Some(Key::Epilogue(op, ks)) = self.key(base) {
            // A loaded epilogue is computed by the loading kernel, on the loaded tiles.
            let (op, ks) = (op.clone(), ks.clone());
            let kids = self.operand_views(&ks, &chain);
            let tile = KeyInfo {
                tiled: true,
                literal: false,
                ..info
            };
            return self.node(op, kids, tile);
        }
        if replica_axes(&chain).len() == chain.len() {
            // The replicas the base lets through sink to its operands and the others stay
            // around it, each judged alone: a fold over `a` lets all but those along `a`
            // through, and the form must not depend on how the replicas were grouped.
            let (pass, stay): (Vec<Op>, Vec<Op>) = chain.iter().cloned().partition(
                |r| matches!(r, Op::Replicate(a) if self.replica_transparent(base, &[a]).is_some()),
            );
            let axes = replica_axes(&pass);
            if let Some((op, ks)) = self
                .replica_transparent(base, &axes)
                .filter(|_| !axes.is_empty())
            {
                let (op, ks) = (op.clone(), ks.to_vec());
                let kids = self.operand_views(&ks, &pass);
                let sunk = self.node(op, kids, info);
                return self.views(sunk, stay);
            }
        }
        let chain = normal_views(chain);
        if chain.is_empty() {
            return base;
        }
        let info = KeyInfo {
            tiled: true,
            literal: false,
            ..info
        };
        self.intern(Key::Views(base, chain), info)
    }

    /// `chain` applied to each operand of an operator moved inside the views, but literals,
    /// which broadcast to any tile as they are.
    pub(super) fn operand_views(&mut self, ks: &[u32], chain: &[Op]) -> Vec<u32> {
        ks.iter()
            .map(|k| {
                if self.info(*k).literal {
                    *k
                } else {
                    self.views(*k, chain.to_vec())
                }
            })
            .collect()
    }

    /// `chain` of combinations (innermost first) applied to `base`, in normal form: nested
    /// chains merged and sorted. (Cancelling `combination[d,a](f(partition[d,a](x)))` against
    /// `f(x)` inside a kernel was tried: it made the canonical form depend on more than the
    /// forms of a program's parts, and early compaction then lost classes.)
    pub(super) fn combinations(&mut self, mut base: u32, mut chain: Vec<Op>, info: KeyInfo) -> u32 {
        if let Some(Key::Combinations(b, inner)) = self.key(base) {
            let mut all = inner.clone();
            all.extend(chain);
            chain = all;
            base = *b;
        }
        chain.sort_by_key(view_rank);
        if chain.is_empty() {
            return base;
        }
        if !info.tiled {
            if let Some(id) = self.epilogue(base, &chain, info) {
                return id;
            }
        }
        self.intern(Key::Combinations(base, chain), info)
    }

    /// A store (`chain` combining `base` into a value without parallel state) of a pointwise
    /// operator on one tile and literals that keeps the tile's element type and rank: the
    /// operator as an `Epilogue` over the stored tile.
    pub(super) fn epilogue(&mut self, base: u32, chain: &[Op], info: KeyInfo) -> Option<u32> {
        let Some(Key::Node(op, ks)) = self.key(base) else {
            return None;
        };
        if !is_pointwise(op) || matches!(op, Op::Cast(_)) || !self.info(base).tiled {
            return None;
        }
        let mut tiles = ks.iter().filter(|k| !self.info(**k).literal);
        let tile = *tiles.next()?;
        let t = self.info(tile);
        if tiles.next().is_some() || t.dtype != info.dtype || t.rank != info.rank || !t.tiled {
            return None;
        }
        let (op, mut ks) = (op.clone(), ks.clone());
        let stored = self.combinations(tile, chain.to_vec(), info);
        for k in &mut ks {
            if *k == tile {
                *k = stored;
            }
        }
        if commutative(&op) {
            ks.sort();
        }
        Some(self.intern(Key::Epilogue(op, ks), info))
    }

    /// `reduce (collection[a](x)) axis=0` inside a kernel (or its all-reduce form
    /// `reduce (replicate[a](collection[a](x))) axis=0`, or with other replicas) is a fold
    /// over `a` that the kernel computes as a loop over `a`, as it does
    /// `reduce x parallel=a`: the same form.
    pub(super) fn collection_fold(&mut self, op: &Op, ks: &[u32], info: KeyInfo) -> Option<u32> {
        let Op::ReduceAxis {
            dim: 0,
            reducer,
            keep_dims: false,
        } = op
        else {
            return None;
        };
        if !info.tiled || ks.len() != 1 {
            return None;
        }
        // Replicas of the stack pass through the reduction (it is computed in the kernel), so
        // any chain of them, with `a` or not, ends up around the fold.
        let (stack, replicas) = match self.key(ks[0])? {
            Key::Views(b, chain) if chain.iter().all(|v| matches!(v, Op::Replicate(_))) => {
                (*b, chain.clone())
            }
            Key::Views(..) => return None,
            _ => (ks[0], Vec::new()),
        };
        let Some(Key::Node(Op::Collection(a), xs)) = self.key(stack) else {
            return None;
        };
        if self.keep_stored_folds && !self.info(stack).tiled {
            return None;
        }
        let fold = Op::ReduceParallel {
            axis: *a,
            reducer: reducer.clone(),
        };
        let x = *xs.first()?;
        let folded = self.node(fold, vec![x], info);
        Some(self.views(folded, replicas))
    }

    /// When every operand but literals is combined by the same chain: the operands under it.
    pub(super) fn common_combinations(&self, ks: &[u32]) -> Option<(Vec<u32>, Vec<Op>)> {
        let mut chain: Option<&Vec<Op>> = None;
        let mut bases = Vec::with_capacity(ks.len());
        for k in ks {
            if self.info(*k).literal {
                bases.push(*k);
                continue;
            }
            let Some(Key::Combinations(b, ch)) = self.key(*k) else {
                return None;
            };
            if chain.is_some_and(|c| c != ch) {
                return None;
            }
            chain = Some(ch);
            bases.push(*b);
        }
        chain.map(|c| (bases, c.clone()))
    }
}

/// A chain of views (innermost first) in normal form: its transposes composed into one,
/// applied to the base first (`transpose[p](partition[d,a](x))` is
/// `partition[i,a](transpose[p](x))` where `p[i] = d`), then the partitions and replicates
/// sorted by `view_rank`. Transposing a loaded tile is a way of writing its load.
pub(super) fn normal_views(chain: Vec<Op>) -> Vec<Op> {
    let mut perm: Option<Vec<usize>> = None;
    let mut rest: Vec<Op> = Vec::with_capacity(chain.len());
    for op in chain {
        match op {
            Op::Transpose(p) => {
                for v in &mut rest {
                    if let Op::Partition(d, a) = v {
                        if let Some(i) = p.iter().position(|x| x == d) {
                            *v = Op::Partition(i, *a);
                        }
                    }
                }
                perm = Some(match perm {
                    None => p,
                    Some(t) => p.iter().map(|&i| t.get(i).copied().unwrap_or(i)).collect(),
                });
            }
            v => rest.push(v),
        }
    }
    rest.sort_by_key(view_rank);
    let identity = |p: &Vec<usize>| p.iter().enumerate().all(|(i, &x)| i == x);
    match perm.filter(|p| !identity(p)) {
        Some(p) => std::iter::once(Op::Transpose(p)).chain(rest).collect(),
        None => rest,
    }
}

/// The axes of the `replicate` views of `chain`.
pub(super) fn replica_axes(chain: &[Op]) -> Vec<&Sym> {
    chain
        .iter()
        .filter_map(|op| match op {
            Op::Replicate(a) => Some(a),
            _ => None,
        })
        .collect()
}

/// Whether a `child_op` child flattens into its `op` parent's chain in the canonical form:
/// the same associative operator, both computed in a kernel.
pub(super) fn chain_link(op: &Op, tiled: bool, child_op: &Op, child_tiled: bool) -> bool {
    associative(op) && tiled && child_op == op && child_tiled
}

pub(super) fn associative(op: &Op) -> bool {
    matches!(
        op,
        Op::Binary(BinaryOp::Add | BinaryOp::Multiply | BinaryOp::Maximum | BinaryOp::Minimum)
    )
}

pub(super) fn is_pointwise(op: &Op) -> bool {
    op.is_pointwise()
}

/// A transpose inside a kernel, which the canonical form treats as part of a view chain.
pub(super) fn tile_transpose(op: &Op, info: KeyInfo) -> bool {
    matches!(op, Op::Transpose(_)) && info.tiled
}

pub(super) fn class_info(x: &ExtractGraph, c: u32) -> KeyInfo {
    x.info[c as usize]
}

pub(super) fn type_info(ty: Option<&Type>) -> KeyInfo {
    match ty {
        Some(Type::Tensor(t)) => KeyInfo {
            tiled: !t.par.is_empty(),
            literal: t.shape.is_empty() && t.par.is_empty(),
            rank: t.shape.len(),
            dtype: Some(t.dtype),
        },
        _ => KeyInfo {
            tiled: tiled(ty),
            literal: false,
            rank: 0,
            dtype: None,
        },
    }
}

/// What a walk of a partial program found. Reused from one partial program to the next, so
/// the cost of a walk follows the program's size, not the e-graph's: only the entries the
/// last walk set are reset.
#[derive(Default)]
pub(super) struct WalkFacts {
    /// Canonical id per class (`NONE`: not met, or a chain intermediate).
    pub(super) memo: Vec<u32>,
    /// Every class the walk met, chain intermediates included (`memo` skips those).
    pub(super) visited: Vec<bool>,
    /// The classes of `visited`, in the order the walk met them.
    pub(super) met: Vec<u32>,
    /// Unresolved classes, in depth-first order.
    pub(super) holes: Vec<u32>,
}

impl WalkFacts {
    pub(super) fn reset(&mut self, classes: usize) {
        if self.memo.len() != classes {
            self.memo = vec![NONE; classes];
            self.visited = vec![false; classes];
        } else {
            for &c in &self.met {
                self.memo[c as usize] = NONE;
                self.visited[c as usize] = false;
            }
        }
        self.met.clear();
        self.holes.clear();
    }

    pub(super) fn visit(&mut self, c: u32) {
        if !self.visited[c as usize] {
            self.visited[c as usize] = true;
            self.met.push(c);
        }
    }
}

/// Walks a partial program from its results: its canonical form and its holes, in
/// depth-first order.
pub(super) struct Walk<'g, 'a, 'f> {
    pub(super) x: &'g ExtractGraph<'a>,
    pub(super) choice: &'g Choice,
    pub(super) facts: &'f mut WalkFacts,
}

impl<'g, 'a, 'f> Walk<'g, 'a, 'f> {
    /// Walks `choice` from every result into `facts` (cleared first): the results'
    /// canonical ids.
    pub(super) fn roots(
        x: &'g ExtractGraph<'a>,
        choice: &'g Choice,
        interner: &mut Interner,
        facts: &'f mut WalkFacts,
    ) -> Vec<u32> {
        facts.reset(x.ids.len());
        let mut walk = Walk { x, choice, facts };
        x.roots.iter().map(|r| walk.canon(*r, interner)).collect()
    }

    /// The canonical id of class `c` under the walk's picks. Normalisation only looks at the
    /// canonical forms of operands (never at which classes wrote them), so a partial program's
    /// form and the forms of its holes' completions decide the completed program's form: what
    /// early compaction's pruning needs.
    pub(super) fn canon(&mut self, c: u32, interner: &mut Interner) -> u32 {
        if self.facts.memo[c as usize] != NONE {
            return self.facts.memo[c as usize];
        }
        self.facts.visit(c);
        let info = class_info(self.x, c);
        let Some((n, kids)) = self.x.op(c, self.choice) else {
            self.facts.holes.push(c);
            let cu = c as usize;
            if interner.holes.len() <= cu {
                interner.holes.resize(self.x.ids.len().max(cu + 1), NONE);
            }
            let id = match interner.holes[cu] {
                NONE => interner.intern(Key::Hole(c), info),
                id => id,
            };
            interner.holes[cu] = id;
            self.facts.memo[cu] = id;
            return id;
        };
        // What decides the class's id (see `StepMemo`): the class and its pick, then the
        // operands' ids, or the picks along a chain and the id of its base.
        let mut step: smallvec::SmallVec<[u32; 8]> =
            smallvec::smallvec![c, self.choice[c as usize]];
        let chain_kind = if is_view(&n.op) || tile_transpose(&n.op, info) {
            Some(false)
        } else {
            matches!(n.op, Op::Combination(..)).then_some(true)
        };
        let id = match chain_kind {
            Some(combos) => {
                let x = self.x;
                let same_kind = |op: &Op, class: u32| {
                    if combos {
                        matches!(op, Op::Combination(..))
                    } else {
                        is_view(op) || tile_transpose(op, class_info(x, class))
                    }
                };
                let mut cur = kids[0];
                while let Some((_, k)) = self
                    .x
                    .op(cur, self.choice)
                    .filter(|(m, _)| same_kind(&m.op, cur))
                {
                    self.facts.visit(cur);
                    step.extend([cur, self.choice[cur as usize]]);
                    cur = k[0];
                }
                let base = self.canon(cur, interner);
                step.push(base);
                if let Some(id) = interner.steps.get(&step) {
                    id
                } else {
                    // Written innermost first; the sorts are stable, so same-dimension order
                    // is kept.
                    let links = step[2..step.len() - 1].chunks(2);
                    let mut chain: Vec<Op> = links
                        .rev()
                        .filter_map(|l| self.x.op(l[0], self.choice).map(|(m, _)| m.op.clone()))
                        .collect();
                    chain.push(n.op.clone());
                    let id = if combos {
                        interner.combinations(base, chain, info)
                    } else {
                        interner.views(base, chain)
                    };
                    interner.steps.insert(&step, id);
                    id
                }
            }
            None => {
                let ks: smallvec::SmallVec<[u32; 4]> =
                    kids.iter().map(|k| self.canon(*k, interner)).collect();
                step.extend_from_slice(&ks);
                if let Some(id) = interner.steps.get(&step) {
                    id
                } else {
                    let id = canonical_node(&n.op, ks.to_vec(), info, interner);
                    interner.steps.insert(&step, id);
                    id
                }
            }
        };
        self.facts.memo[c as usize] = id;
        id
    }
}

/// The canonical form of candidate `choice` as text (holes as `□N`), comparable across runs:
/// two candidates are ≈ exactly when their canonical texts are equal.
pub fn canonical_text(x: &ExtractGraph, choice: &Choice) -> String {
    let mut interner = Interner::default();
    let roots = Walk::roots(x, choice, &mut interner, &mut WalkFacts::default());
    // Commutative operands in text order: interned ids depend on the order of interning,
    // which differs between interners, while the text does not.
    pub(super) fn render(i: &Interner, id: u32, memo: &mut FxHashMap<u32, String>) -> String {
        if let Some(t) = memo.get(&id) {
            return t.clone();
        }
        let kids = |ks: &[u32], sort: bool, memo: &mut FxHashMap<u32, String>| {
            let mut texts: Vec<String> = ks.iter().map(|k| render(i, *k, memo)).collect();
            if sort {
                texts.sort();
            }
            format!("({})", texts.join(", "))
        };
        let text = match i.key(id) {
            Some(Key::Hole(c)) => format!("□{c}"),
            Some(Key::Node(op, ks)) => {
                let tiled = if i.info(id).tiled { "ᵗ" } else { "" };
                format!("{op:?}{tiled}{}", kids(ks, commutative(op), memo))
            }
            Some(Key::Epilogue(op, ks)) => {
                format!("{op:?}ᵉ{}", kids(ks, commutative(op), memo))
            }
            Some(Key::Views(b, ops)) | Some(Key::Combinations(b, ops)) => {
                format!("{ops:?}{}", kids(&[*b], false, memo))
            }
            None => "?".to_string(),
        };
        memo.insert(id, text.clone());
        text
    }
    let mut memo = FxHashMap::default();
    let mut out = String::new();
    for r in roots {
        out.push_str(&render(&interner, r, &mut memo));
        out.push('\n');
    }
    out
}

/// The canonical id of `op` over operands with canonical ids `ks`.
pub(super) fn canonical_node(op: &Op, ks: Vec<u32>, info: KeyInfo, interner: &mut Interner) -> u32 {
    if let Some(id) = interner.collection_fold(op, &ks, info) {
        return id;
    }
    // A pointwise operator on partly combined tiles (the result is still tiled, so in the
    // same kernel) is the operator on the tiles, combined: lift it inside the
    // combinations.
    let lifted = if is_pointwise(op) && info.tiled {
        interner.common_combinations(&ks)
    } else {
        None
    };
    match lifted {
        Some((bases, chain)) => {
            let inner = interner.node(op.clone(), bases, info);
            interner.combinations(inner, chain, info)
        }
        None => interner.node(op.clone(), ks, info),
    }
}
