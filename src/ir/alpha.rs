//! Functions equal up to renaming of parallel axes.
//!
//! An axis name means nothing outside its function: `combination[1,d](… partition[1,d] …)`
//! and the same program over `d_2` run the same kernels. Refinement names an axis after the
//! dimension it splits, and where one symbol names several dimensions of a product (a `DxD`
//! weight) it offers one naming per role (`d`, `d_2`), so that each meets the refinements of
//! its neighbours; an isolated product then has several namings of one implementation.
//! [`fingerprint`] identifies them: two functions with the same results computed by the same
//! operations from the same inputs, axes renamed one-to-one, have the same fingerprint.
//!
//! The fingerprint of a value is computed bottom-up without names: an operation's axes and
//! its operands' axes are numbered by first occurrence (own axes first, then each operand's
//! in operand order), and the value hashes its operation with its own axes replaced by those
//! own. A store (`combination`, `collection`) ends its kernel: the axes it binds are not
//! visible to what reads it, so two kernels may use one name for unrelated axes. (Folds,
//! `reduce … parallel=`, stay in their kernel, where folds over one axis share a loop: their
//! axes stay visible.) Commutative operands are ordered by fingerprint (both orders tried on a tie), so the
//! numbering depends on no name. Value names, spans and types (which the operations decide)
//! are not part of it.

use super::{Body, ExprKind, Function, NodeId, ReduceOver, Sym, Type};
use rustc_hash::FxHashMap;
use std::hash::{Hash, Hasher};

/// A function's identity up to axis renaming (and value names).
pub fn fingerprint(f: &Function) -> u128 {
    let mut memo: FxHashMap<NodeId, Form> = FxHashMap::default();
    let mut h = Hasher128::default();
    let mut axes: Vec<Sym> = Vec::new();
    for r in &f.body.results {
        let form = form(&f.body, *r, &mut memo);
        form.hash.hash(&mut h);
        for a in &form.axes {
            number(&mut axes, *a).hash(&mut h);
        }
    }
    h.finish128()
}

/// A value's fingerprint and its axes in the order of its numbering.
#[derive(Clone)]
struct Form {
    hash: u128,
    axes: Vec<Sym>,
}

fn number(axes: &mut Vec<Sym>, a: Sym) -> usize {
    match axes.iter().position(|b| *b == a) {
        Some(i) => i,
        None => {
            axes.push(a);
            axes.len() - 1
        }
    }
}

/// The axis an operation names, if any.
fn own_axis(kind: &ExprKind) -> Option<Sym> {
    match kind {
        ExprKind::Partition(_, a, _)
        | ExprKind::Replicate(a, _)
        | ExprKind::Combination(_, a, _)
        | ExprKind::Collection(a, _) => Some(*a),
        ExprKind::Reduce {
            over: ReduceOver::Parallel(a),
            ..
        } => Some(*a),
        _ => None,
    }
}

/// The operation without operands and with its axis replaced by a placeholder.
fn anonymous(kind: &ExprKind) -> ExprKind {
    let blank = Sym::new("_");
    match kind.with_operands(&[]) {
        ExprKind::Partition(d, _, x) => ExprKind::Partition(d, blank, x),
        ExprKind::Replicate(_, x) => ExprKind::Replicate(blank, x),
        ExprKind::Combination(d, _, x) => ExprKind::Combination(d, blank, x),
        ExprKind::Collection(_, x) => ExprKind::Collection(blank, x),
        ExprKind::Reduce {
            input,
            over: ReduceOver::Parallel(_),
            reducer,
            keep_dims,
        } => ExprKind::Reduce {
            input,
            over: ReduceOver::Parallel(blank),
            reducer,
            keep_dims,
        },
        k => k,
    }
}

fn commutative(kind: &ExprKind) -> bool {
    matches!(kind, ExprKind::Binary(b, ..) if b.is_commutative())
}

fn form(body: &Body, id: NodeId, memo: &mut FxHashMap<NodeId, Form>) -> Form {
    if let Some(f) = memo.get(&id) {
        return f.clone();
    }
    // Operands first, iteratively: bodies may be deep chains.
    let mut stack = vec![(id, false)];
    while let Some((n, ready)) = stack.pop() {
        if memo.contains_key(&n) {
            continue;
        }
        let kids = body.node(n).kind.operands();
        if !ready {
            stack.push((n, true));
            stack.extend(
                kids.iter()
                    .filter(|k| !memo.contains_key(k))
                    .map(|k| (*k, false)),
            );
            continue;
        }
        let kid_forms: Vec<Form> = kids.iter().map(|k| memo[k].clone()).collect();
        let f = if commutative(&body.node(n).kind) && kid_forms.len() == 2 {
            let ab = combine(body, n, &[&kid_forms[0], &kid_forms[1]]);
            let ba = combine(body, n, &[&kid_forms[1], &kid_forms[0]]);
            if ab.hash <= ba.hash {
                ab
            } else {
                ba
            }
        } else {
            combine(body, n, &kid_forms.iter().collect::<Vec<_>>())
        };
        memo.insert(n, f);
    }
    memo[&id].clone()
}

fn combine(body: &Body, n: NodeId, kids: &[&Form]) -> Form {
    let node = body.node(n);
    let mut h = Hasher128::default();
    let mut axes: Vec<Sym> = Vec::new();
    format!("{:?}", anonymous(&node.kind)).hash(&mut h);
    if let Some(a) = own_axis(&node.kind) {
        number(&mut axes, a).hash(&mut h);
    }
    match node.kind {
        // A leaf is its position or its annotated type (literals, fills, iotas).
        ExprKind::Input | ExprKind::Param => {
            body.params.iter().position(|p| *p == n).hash(&mut h);
        }
        ExprKind::Constant(_) | ExprKind::Fill(_) | ExprKind::Iota(_) => {
            format!("{:?}", node.annot).hash(&mut h);
        }
        _ => {}
    }
    // A sub-expression with different operand orders is a different operation: keep
    // the count and the order.
    kids.len().hash(&mut h);
    for k in kids {
        k.hash.hash(&mut h);
        for a in &k.axes {
            number(&mut axes, *a).hash(&mut h);
        }
    }
    // A combination or collection stores its tiles: whatever reads the result is another
    // kernel, so the axes the store binds are that kernel's own and a later kernel may
    // reuse their names for its own axes. Only the axes still on the result stay visible.
    if matches!(
        node.kind,
        ExprKind::Combination(..) | ExprKind::Collection(..)
    ) {
        let on_result = |a: &Sym| match &node.ty {
            Some(Type::Tensor(t)) => t.par.get(a).is_some(),
            Some(Type::Tuple(ts)) => ts.iter().any(|t| match t {
                Type::Tensor(t) => t.par.get(a).is_some(),
                Type::Tuple(_) => true,
            }),
            None => true,
        };
        axes.retain(on_result);
    }
    Form {
        hash: h.finish128(),
        axes,
    }
}

/// Two independent 64-bit FxHash-free hashes (std's SipHash with two keys): 128 bits, so a
/// collision that would drop a distinct candidate is not a practical concern.
struct Hasher128(std::hash::DefaultHasher, std::hash::DefaultHasher);

impl Default for Hasher128 {
    fn default() -> Self {
        let mut b = std::hash::DefaultHasher::new();
        0x9e37_79b9_7f4a_7c15u64.hash(&mut b);
        Hasher128(std::hash::DefaultHasher::new(), b)
    }
}

impl Hasher for Hasher128 {
    fn finish(&self) -> u64 {
        self.0.finish()
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
        self.1.write(bytes);
    }
}

impl Hasher128 {
    fn finish128(&self) -> u128 {
        ((self.0.finish() as u128) << 64) | self.1.finish() as u128
    }
}

#[cfg(test)]
mod tests {
    use super::fingerprint;

    fn function(src: &str) -> crate::ir::Function {
        let mut m = crate::parse::parse_module(src, 0).expect("parses");
        crate::verify::verify_module(&mut m).expect("verifies");
        m.funcs.remove(0)
    }

    const SPLIT_N: &str = "func f where S = 16, D = 32 {
  x: tensor<SxD, f32> = input
  w: tensor<DxD, f32> = input
  return combination[1,AXIS](tile_matmul(replicate[AXIS](x), partition[1,AXIS](w)))
}";

    #[test]
    fn renamed_axes_have_one_fingerprint() {
        let a = function(&SPLIT_N.replace("AXIS", "d"));
        let b = function(&SPLIT_N.replace("AXIS", "d_2"));
        assert_eq!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn which_values_share_an_axis_is_part_of_the_fingerprint() {
        let two = |a: &str, b: &str| {
            function(&format!(
                "func f where N = 16 {{
  x: tensor<N, f32> = input
  y: tensor<N, f32> = input
  s1 = reduce (reduce (partition[0,{a}](x)) axis=0 reducer=@add) parallel={a} reducer=@add
  s2 = reduce (reduce (partition[0,{b}](y)) axis=0 reducer=@add) parallel={b} reducer=@add
  return s1 + s2
}}"
            ))
        };
        // Folds over one axis in one kernel share its loop: not the program with two.
        // A bijective renaming keeps the fingerprint; merging two axes into one does not.
        assert_eq!(fingerprint(&two("a", "b")), fingerprint(&two("q", "p")));
        assert_ne!(fingerprint(&two("a", "b")), fingerprint(&two("a", "a")));
    }

    #[test]
    fn commutative_operands_in_either_order_have_one_fingerprint() {
        let a = function("func f where N = 4 {\n  x: tensor<N, f32> = input\n  y: tensor<N, f32> = input\n  return exp(x) + y\n}");
        let b = function("func f where N = 4 {\n  x: tensor<N, f32> = input\n  y: tensor<N, f32> = input\n  return y + exp(x)\n}");
        let c = function("func f where N = 4 {\n  x: tensor<N, f32> = input\n  y: tensor<N, f32> = input\n  return exp(y) + x\n}");
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }

    #[test]
    fn kernels_after_a_store_may_reuse_an_axis_name() {
        let split_k = |first: &str, second: &str| {
            function(&format!(
                "func f where S = 16, D = 32 {{
  x: tensor<SxD, f32> = input
  w: tensor<DxD, f32> = input
  stored = collection[{first}](tile_matmul(partition[1,{first}](x), partition[0,{first}](w)))
  return combination[1,{second}](reduce (partition[2,{second}](stored)) axis=0 reducer=@add)
}}"
            ))
        };
        assert_eq!(
            fingerprint(&split_k("d", "d")),
            fingerprint(&split_k("d_2", "d"))
        );
        assert_eq!(
            fingerprint(&split_k("d", "d")),
            fingerprint(&split_k("a", "b"))
        );
    }
}
