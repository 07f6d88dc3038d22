//! Which classes a partial program's holes can still reach, as bit sets over dense class
//! indices.

use super::canon::is_view;
use super::extract_graph::ExtractGraph;
use super::{Choice, NONE};

/// True when `from`, following picked e-nodes, reaches `target`. With `through_holes`, also
/// when a class not resolved yet could reach it through any of its e-nodes: whether some
/// completion makes `from` reach `target`.
pub(super) fn reaches(
    x: &ExtractGraph,
    choice: &Choice,
    from: &[u32],
    target: u32,
    through_holes: bool,
    seen: &mut Marks,
) -> bool {
    let mut stack: Vec<u32> = from.to_vec();
    seen.clear();
    let t = target as usize;
    while let Some(c) = stack.pop() {
        if c == target {
            return true;
        }
        if !seen.mark(c) {
            continue;
        }
        match x.op(c, choice) {
            Some((_, kids)) => stack.extend(kids),
            None if through_holes && has(&x.reach[c as usize], t) => return true,
            None => {}
        }
    }
    false
}

/// A set of classes that empties in constant time: a class is in it when its mark is the
/// current generation.
pub(super) struct Marks {
    pub(super) generation: u32,
    pub(super) marks: Vec<u32>,
}

impl Marks {
    pub(super) fn new(classes: usize) -> Marks {
        Marks {
            generation: 1,
            marks: vec![0; classes],
        }
    }

    pub(super) fn clear(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.marks.iter_mut().for_each(|m| *m = 0);
            self.generation = 1;
        }
    }

    /// Adds `c`; false when it was in the set already.
    pub(super) fn mark(&mut self, c: u32) -> bool {
        std::mem::replace(&mut self.marks[c as usize], self.generation) != self.generation
    }

    pub(super) fn contains(&self, c: u32) -> bool {
        self.marks[c as usize] == self.generation
    }
}

pub(super) fn class_tiled(x: &ExtractGraph, c: u32) -> bool {
    x.info[c as usize].tiled
}

/// Whether `c` is a load: a tensor-level value, or views of one. `None` while a hole decides.
pub(super) fn loadable(x: &ExtractGraph, choice: &Choice, mut c: u32) -> Option<bool> {
    loop {
        if !class_tiled(x, c) {
            return Some(true);
        }
        let (n, kids) = x.op(c, choice)?;
        if !is_view(&n.op) {
            return Some(false);
        }
        c = kids[0];
    }
}

/// The classes a completion of a partial program may still resolve, as a bitset over classes:
/// those reached from its holes through the e-nodes of unresolved classes (a resolved class
/// keeps its pick, so a completion reaches nothing new through it).
pub(super) fn open_reach(
    x: &ExtractGraph,
    choice: &Choice,
    holes: &[u32],
    open: &mut Vec<u64>,
    stack: &mut Vec<u32>,
) {
    open.clear();
    open.resize(x.ids.len().div_ceil(64), 0);
    stack.clear();
    stack.extend_from_slice(holes);
    while let Some(c) = stack.pop() {
        let cu = c as usize;
        if choice[cu] != NONE || !add(open, cu) {
            continue;
        }
        for (_, kids) in &x.nodes[cu] {
            stack.extend(kids.iter().filter(|k| !has(open, **k as usize)));
        }
    }
}

/// Whether class `c` is in a bitset over classes.
pub(super) fn has(set: &[u64], c: usize) -> bool {
    set[c / 64] >> (c % 64) & 1 == 1
}

/// Adds class `c` to a bitset over classes: whether it was not in it.
pub(super) fn add(set: &mut [u64], c: usize) -> bool {
    let new = !has(set, c);
    set[c / 64] |= 1 << (c % 64);
    new
}

/// The classes in a bitset over classes, in increasing order.
pub(super) fn members(set: &[u64]) -> impl Iterator<Item = usize> + '_ {
    set.iter().enumerate().flat_map(|(w, &word)| {
        let mut bits = word;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let c = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                c
            })
        })
    })
}

/// The resolved classes a completion of a partial program can read, as a bitset over classes:
/// the resolved operands of the e-nodes of the classes it may still resolve (`open`, from
/// `open_reach`), and, through a resolved class with one e-node, its resolved operands too
/// (see `hole_context` for why). A completion picks e-nodes for open classes only, so every
/// resolved class it reads is one of these; one deeper down is read only through the picks the
/// program already made.
pub(super) fn readable_resolved(
    x: &ExtractGraph,
    choice: &Choice,
    open: &[u64],
    readable: &mut Vec<u64>,
    stack: &mut Vec<u32>,
) {
    readable.clear();
    readable.resize(open.len(), 0);
    stack.clear();
    for c in members(open) {
        stack.extend(x.nodes[c].iter().flat_map(|(_, kids)| kids));
    }
    while let Some(k) = stack.pop() {
        let ku = k as usize;
        if choice[ku] == NONE || !add(readable, ku) {
            continue;
        }
        if let [(_, kids)] = x.nodes[ku].as_slice() {
            stack.extend(kids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Marks;

    #[test]
    fn marks_are_empty_after_each_clear_even_when_the_generation_wraps() {
        let mut m = Marks::new(4);
        assert!(m.mark(1));
        assert!(!m.mark(1));
        m.clear();
        assert!(m.mark(1), "a clear empties the set");
        // A class marked in the last generation before the counter wraps must not count as
        // marked in the generation after it (which reuses the numbers from 1).
        m.generation = u32::MAX;
        assert!(m.mark(2));
        m.marks[3] = 1; // what a mark from generation 1, long ago, left behind
        m.clear();
        assert_eq!(m.generation, 1);
        for c in 0..4 {
            assert!(m.mark(c), "class {c} was left marked across the wrap");
        }
    }
}
