//! Which e-classes have a finite term, and an order to build them in.
//!
//! An e-graph may be cyclic (`x = x * 1`), so a class has a *finite* term only when one of its
//! e-nodes has operand classes that have one in turn. The verifier rejects a dump with a class
//! without one, and extraction keeps only e-nodes that can end in a program: one bottom-up pass
//! serves both. (Rebuilding a dump adds e-nodes in rounds in the dump's order instead: the
//! order of insertion decides egg's ids, which break ties in rules such as product fusion,
//! and that order keeps a re-saturated dump identical to the dump.)

/// The result of [`bottom_up`].
pub struct BottomUp {
    /// Per class: it has a finite term.
    pub finite: Vec<bool>,
    /// Every e-node whose operand classes all have a finite term, as (class, e-node index),
    /// each after some e-node of each of its operand classes.
    pub order: Vec<(usize, usize)>,
}

/// `nodes[c][i]` lists the operand classes of e-node `i` of class `c`; an index past the last
/// class stands for an operand that does not exist (that e-node never has a finite term).
/// Linear in the size of the e-graph: each operand occurrence is counted down once, when its
/// class is first found finite.
pub fn bottom_up(nodes: &[Vec<Vec<usize>>]) -> BottomUp {
    let classes = nodes.len();
    let mut users: Vec<Vec<(usize, usize)>> = vec![Vec::new(); classes];
    let mut left: Vec<Vec<usize>> = Vec::with_capacity(classes);
    let mut ready: Vec<(usize, usize)> = Vec::new();
    for (c, ns) in nodes.iter().enumerate() {
        let mut counts = Vec::with_capacity(ns.len());
        for (i, kids) in ns.iter().enumerate() {
            if kids.iter().any(|k| *k >= classes) {
                counts.push(usize::MAX);
                continue;
            }
            for k in kids {
                users[*k].push((c, i));
            }
            if kids.is_empty() {
                ready.push((c, i));
            }
            counts.push(kids.len());
        }
        left.push(counts);
    }
    let mut finite = vec![false; classes];
    let mut order = Vec::new();
    while let Some((c, i)) = ready.pop() {
        order.push((c, i));
        if std::mem::replace(&mut finite[c], true) {
            continue;
        }
        for &(uc, ui) in &users[c] {
            let count = &mut left[uc][ui];
            *count -= 1;
            if *count == 0 {
                ready.push((uc, ui));
            }
        }
    }
    BottomUp { finite, order }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_only_reachable_through_itself_has_no_finite_term() {
        // 0: leaf; 1: f(0) or g(1); 2: h(2) only; 3: k(2, 0); 4: uses a missing class.
        let nodes = vec![
            vec![vec![]],
            vec![vec![1], vec![0]],
            vec![vec![2]],
            vec![vec![2, 0]],
            vec![vec![9]],
        ];
        let b = bottom_up(&nodes);
        assert_eq!(b.finite, vec![true, true, false, false, false]);
        // g(1) is buildable too (after f(0)); h and k never are.
        let mut order = b.order.clone();
        order.sort();
        assert_eq!(order, vec![(0, 0), (1, 0), (1, 1)]);
        let pos = |e| b.order.iter().position(|x| *x == e).unwrap();
        assert!(pos((0, 0)) < pos((1, 1)) && pos((1, 1)) < pos((1, 0)));
    }

    #[test]
    fn an_operand_used_twice_is_counted_twice() {
        let nodes = vec![vec![vec![]], vec![vec![0, 0]]];
        assert_eq!(bottom_up(&nodes).finite, vec![true, true]);
    }
}
