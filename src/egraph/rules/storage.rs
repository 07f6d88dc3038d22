//! Intermediate storage (paper §4.4): folding per-coordinate values in a later kernel.

use super::*;

#[rustfmt::skip]
pub static RULES: &[Rule] = &[
    // name            family             equation
    Rule { name: "store-partials", family: Family::Storage, equation: "reduce X parallel=p reducer=@r = reduce collection[p](X) axis=0 reducer=@r", root: Root::ReduceParallel, find: store_partials, reach: Reach::Own },
];

fn store_partials(_eg: &EGraph, _class: Id, n: &ENode, out: &mut Out) {
    let Op::ReduceParallel { axis, reducer } = &n.op else {
        return;
    };
    let stored = node(Op::Collection(*axis), vec![cls(n.children[0])]);
    out.push(node(
        Op::ReduceAxis {
            dim: 0,
            reducer: reducer.clone(),
            keep_dims: false,
        },
        vec![stored],
    ));
}
