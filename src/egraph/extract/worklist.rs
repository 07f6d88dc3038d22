//! The worklist of partial programs. Without a bound it is one order: cheapest first by the
//! estimate of the work a complete program does (`extract_graph::hole_estimate`), so limits
//! stop after the fused candidates. Rank-bounded extraction keeps a second order over the
//! same programs — lowest rank bound first (the bound of the program a child was pushed
//! from), then work — and takes from the two in turn, each program once.
//!
//! Why both: the bound order proves a top K quickly where the bound is tight (MHA decode at
//! B = 16: its top 10 proven in about 1–2 s, where the work order alone had found nine below
//! 1,100 µs in 20 s, because the programs whose completions can still tie the best
//! 360.05 µs are exactly the ones it takes first); where the bound is loose (a mask
//! withholds the input floor, so most programs share a bound of a few µs) it only orders by
//! stored bytes, and on the case studies the bound order alone found worse candidates or
//! none within their limits. One program in four from the bound order (`BOUND_EVERY`) kept
//! the case studies' 10 s results at or below their optimised forms; one in two did not
//! for sliding-window GQA (94.41 µs, the optimised form's, against 65.00 µs). And the bound
//! order waits for the first candidate with an estimate: until then the work order finds
//! fused candidates fastest (a tiny transformer layer's attention part found none in its
//! 5 s in a test build with the orders in turn from the start).

use super::reach::{add, has};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The bound order gives one program in this many, the work order the others.
const BOUND_EVERY: u32 = 4;

/// (bound in ns, work estimate, trail index): lowest bound first, then cheapest, then newest.
type ByBound = (Reverse<u64>, Reverse<u64>, u32);

/// Programs by trail index, in one or two orders.
pub(super) struct Worklist {
    /// (work estimate, trail index): among equal estimates the newest first.
    by_work: BinaryHeap<(Reverse<u64>, u32)>,
    /// `None` without a bound.
    by_bound: Option<BinaryHeap<ByBound>>,
    /// Trail indices taken, as a bitset: the other order skips them.
    taken: Vec<u64>,
    /// Programs taken: the bound order gives every `BOUND_EVERY`-th.
    turn: u32,
    waiting: usize,
}

impl Worklist {
    pub(super) fn new(bounded: bool) -> Worklist {
        Worklist {
            by_work: BinaryHeap::new(),
            by_bound: bounded.then(BinaryHeap::new),
            taken: Vec::new(),
            turn: 0,
            waiting: 0,
        }
    }

    /// Adds the program at trail index `at` (pushed once) with its work estimate and the
    /// bound (µs) it is ordered by in the bound order.
    pub(super) fn push(&mut self, work: u64, bound_us: f64, at: u32) {
        self.by_work.push((Reverse(work), at));
        if let Some(b) = self.by_bound.as_mut() {
            b.push((Reverse((bound_us * 1e3) as u64), Reverse(work), at));
        }
        self.waiting += 1;
    }

    /// The next program: from the two orders in turn, skipping what the other took; from the
    /// work order alone until `ranked` (a candidate with an estimate has been found).
    pub(super) fn pop(&mut self, ranked: bool) -> Option<u32> {
        let first = ranked && self.turn % BOUND_EVERY == 0 && self.by_bound.is_some();
        if ranked {
            self.turn = self.turn.wrapping_add(1);
        }
        let at = if first {
            self.pop_bound().or_else(|| self.pop_work())
        } else {
            self.pop_work().or_else(|| self.pop_bound())
        }?;
        if self.taken.len() <= at as usize / 64 {
            self.taken.resize(at as usize / 64 + 1, 0);
        }
        add(&mut self.taken, at as usize);
        self.waiting -= 1;
        Some(at)
    }

    fn is_taken(taken: &[u64], at: u32) -> bool {
        at as usize / 64 < taken.len() && has(taken, at as usize)
    }

    fn pop_work(&mut self) -> Option<u32> {
        while let Some((_, at)) = self.by_work.pop() {
            if !Self::is_taken(&self.taken, at) {
                return Some(at);
            }
        }
        None
    }

    fn pop_bound(&mut self) -> Option<u32> {
        let b = self.by_bound.as_mut()?;
        while let Some((_, _, at)) = b.pop() {
            if !Self::is_taken(&self.taken, at) {
                return Some(at);
            }
        }
        None
    }

    /// Programs waiting.
    pub(super) fn len(&self) -> usize {
        self.waiting
    }

    /// (entries, capacity, bytes per entry) of each table, for the memory limit.
    pub(super) fn tables(&self, out: &mut Vec<(usize, usize, usize)>) {
        out.push((self.by_work.len(), self.by_work.capacity(), 16));
        if let Some(b) = &self.by_bound {
            out.push((b.len(), b.capacity(), 24));
        }
        out.push((self.taken.len(), self.taken.capacity(), 8));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_bound_it_is_cheapest_first() {
        let mut w = Worklist::new(false);
        for (work, at) in [(5, 1), (1, 2), (3, 3)] {
            w.push(work, 0.0, at);
        }
        let order: Vec<u32> = std::iter::from_fn(|| w.pop(true)).collect();
        assert_eq!(order, vec![2, 3, 1]);
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn with_a_bound_the_orders_take_turns_and_each_program_comes_once() {
        let mut w = Worklist::new(true);
        // Work order: 1, 2, …, 8; bound order: 8, 7, …, 1.
        for at in 1..=8u32 {
            w.push(u64::from(at), f64::from(10 * (9 - at)), at);
        }
        let order: Vec<u32> = std::iter::from_fn(|| w.pop(true)).collect();
        assert_eq!(order, vec![8, 1, 2, 3, 7, 4, 5, 6]);
        // Before anything is ranked, the work order alone.
        let mut w = Worklist::new(true);
        for at in 1..=4u32 {
            w.push(u64::from(at), f64::from(10 * (5 - at)), at);
        }
        assert_eq!(w.pop(false), Some(1));
        assert_eq!(w.pop(false), Some(2));
        assert_eq!(w.pop(true), Some(4));
        assert_eq!(w.pop(true), Some(3));
        // Equal bounds: the cheaper first.
        let mut w = Worklist::new(true);
        w.push(9, 1.0, 1);
        w.push(2, 1.0, 2);
        assert_eq!(w.pop(true), Some(2));
    }
}
