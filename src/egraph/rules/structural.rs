//! Structural equalities between parallel views: cancelling a combination with the
//! partition that undoes it, and reordering independent views.

use super::*;

#[rustfmt::skip]
pub static RULES: &[Rule] = &[
    // name                             family                equation
    Rule { name: "partition-of-combination", family: Family::Structural, equation: "partition[d,a](combination[d,a](x)) = x", root: Root::Partition, find: partition_of_combination, reach: Reach::Node },
    Rule { name: "combination-of-partition", family: Family::Structural, equation: "combination[d,a](partition[d,a](x)) = x", root: Root::Combination, find: combination_of_partition, reach: Reach::Node },
    Rule { name: "partition-replicate-swap", family: Family::Structural, equation: "partition[d,p](replicate[q](x)) = replicate[q](partition[d,p](x))", root: Root::Partition, find: partition_replicate_swap, reach: Reach::Node },
    Rule { name: "replicate-partition-swap", family: Family::Structural, equation: "replicate[q](partition[d,p](x)) = partition[d,p](replicate[q](x))", root: Root::Replicate, find: replicate_partition_swap, reach: Reach::Node },
    Rule { name: "partition-partition-swap", family: Family::Structural, equation: "partition[d,p](partition[e,q](x)) = partition[e,q](partition[d,p](x))", root: Root::Partition, find: partition_partition_swap, reach: Reach::Node },
    Rule { name: "combination-injective",    family: Family::Structural, equation: "combination[d,a](x) = combination[d,a](y) ⇒ x = y", root: Root::Combination, find: combination_injective, reach: Reach::ClassNodes },
    Rule { name: "replicate-replicate-swap", family: Family::Structural, equation: "replicate[p](replicate[q](x)) = replicate[q](replicate[p](x))", root: Root::Replicate, find: replicate_replicate_swap, reach: Reach::Node },
];

fn partition_of_combination(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(d, a) = &n.op else { return };
    for c in nodes(eg, n.children[0]) {
        if c.op == Op::Combination(*d, *a) {
            out.push(cls(c.children[0]));
        }
    }
}

fn combination_of_partition(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Combination(d, a) = &n.op else { return };
    for p in nodes(eg, n.children[0]) {
        if p.op == Op::Partition(*d, *a) {
            out.push(cls(p.children[0]));
        }
    }
}

fn partition_replicate_swap(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(d, p) = &n.op else { return };
    for r in nodes(eg, n.children[0]) {
        if let Op::Replicate(_) = &r.op {
            out.push(node(
                r.op.clone(),
                vec![node(Op::Partition(*d, *p), vec![cls(r.children[0])])],
            ));
        }
    }
}

fn replicate_partition_swap(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(q) = &n.op else { return };
    for p in nodes(eg, n.children[0]) {
        if let Op::Partition(..) = &p.op {
            out.push(node(
                p.op.clone(),
                vec![node(Op::Replicate(*q), vec![cls(p.children[0])])],
            ));
        }
    }
}

fn partition_partition_swap(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Partition(d, p) = &n.op else { return };
    for inner in nodes(eg, n.children[0]) {
        if let Op::Partition(e, q) = &inner.op {
            if e != d && p != q {
                out.push(node(
                    inner.op.clone(),
                    vec![node(Op::Partition(*d, *p), vec![cls(inner.children[0])])],
                ));
            }
        }
    }
}

fn replicate_replicate_swap(eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::Replicate(p) = &n.op else { return };
    for inner in nodes(eg, n.children[0]) {
        if let Op::Replicate(q) = &inner.op {
            if p != q {
                out.push(node(
                    inner.op.clone(),
                    vec![node(Op::Replicate(*p), vec![cls(inner.children[0])])],
                ));
            }
        }
    }
}

fn combination_injective(eg: &EGraph, class: Id, n: &ENode, out: &mut Out) {
    let Op::Combination(..) = &n.op else { return };
    let x = eg.find(n.children[0]);
    for m in &eg[class].nodes {
        let y = eg.find(m.children.first().copied().unwrap_or(x));
        if m.op == n.op && y != x && x < y {
            out.equal(x, cls(y));
        }
    }
}
