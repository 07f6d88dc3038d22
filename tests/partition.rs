//! `partition` (paper §5.2): subgraphs are convex (no dependency path leaves one and comes
//! back), cover every compute node once, and their functions have typed interfaces — the
//! module of subgraph functions and the composition verifies (a call's operands must have its
//! callee's parameter types) and computes what the source computes, on hand-made graphs (one
//! where a naive split would make a cycle) and on random ones.

use efopt::interp::{random_inputs, relative_l2, Interpreter, Sizes};
use efopt::ir::{Function, Module, NodeId};
use efopt::partition::{is_convex, partition, split};

fn module(text: &str) -> Module {
    let mut m = efopt::parse::parse_module(text, 0).expect("parses");
    efopt::verify::verify_module(&mut m).expect("verifies");
    m
}

fn node(f: &Function, name: &str) -> NodeId {
    f.body
        .ids()
        .find(|id| f.body.node(*id).name.as_deref() == Some(name))
        .expect("named value")
}

/// The composition of `f` cut at `size`: it verifies and computes `f`'s results.
fn check_split(m: &Module, f: &Function, size: usize) {
    let p = partition(f, size).expect("a cut");
    let mut covered: Vec<NodeId> = p.subgraphs.iter().flatten().copied().collect();
    covered.sort();
    let len = covered.len();
    covered.dedup();
    assert_eq!(covered.len(), len, "{}: a node in two subgraphs", f.name);
    for s in &p.subgraphs {
        assert!(s.len() <= size, "{}: a subgraph over size {size}", f.name);
        assert!(
            is_convex(f, s),
            "{}: a subgraph is not convex: {s:?}",
            f.name
        );
    }
    let mut split_module = Module {
        reducers: m.reducers.clone(),
        funcs: split(f, &p),
        egraphs: Vec::new(),
    };
    if let Err(d) = efopt::verify::verify_module(&mut split_module) {
        panic!(
            "{} at size {size}: the split does not verify: {}\n{}",
            f.name,
            d[0].message,
            efopt::ir::print::print_module(&split_module, Default::default())
        );
    }
    let comp = split_module.funcs.last().expect("the composition");
    let sizes = Sizes::for_function(f, 4);
    let inputs = random_inputs(f, &sizes, 7, 1.0).expect("inputs");
    let want = Interpreter::new(m, sizes.clone())
        .run(f, &inputs)
        .expect("source runs");
    let got = Interpreter::new(&split_module, sizes)
        .run(comp, &inputs)
        .expect("composition runs");
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (g.dense().expect("tensor"), w.dense().expect("tensor"));
        assert!(
            relative_l2(g, w) < 1e-6,
            "{}: the composition differs",
            f.name
        );
    }
}

/// `b` reads `a`, `c` reads both: cutting {a, c} from {b} (say, "the reductions" and "the
/// rest") leaves no order to run them in — a path a → b → c leaves {a, c} and comes back.
const DIAMOND: &str = "func diamond where B = 4, H = 8 {
  x: tensor<BxH, f32> = input
  a = reduce (exp(x)) axis=H reducer=@add keep_dims
  b = x / a
  c = reduce (b * a) axis=H reducer=@max keep_dims
  return c
}
";

#[test]
fn a_naive_split_that_would_make_a_cycle_is_not_convex_and_partition_never_makes_one() {
    let m = module(DIAMOND);
    let f = &m.funcs[0];
    let (a, b, c) = (node(f, "a"), node(f, "b"), node(f, "c"));
    let reductions = vec![a, c];
    assert!(!is_convex(f, &reductions));
    assert!(is_convex(f, &[b]));
    assert!(is_convex(f, &[a, b]));
    // Every granularity gives convex subgraphs that compose to the source.
    for size in 1..=4 {
        check_split(&m, f, size);
    }
}

/// A small deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random program over [B, H] values: pointwise operators, row reductions (broadcast back)
/// and products with a square weight, each reading random earlier values; one or two results.
fn random_program(seed: u64) -> String {
    let mut r = Rng(seed);
    let mut text = String::from(
        "func random where B = 4, H = 8 {\n  x: tensor<BxH, f32> = input\n  y: tensor<BxH, f32> = input\n  w: tensor<HxH, f32> = input\n",
    );
    let mut values = vec!["x".to_string(), "y".to_string()];
    let n = 6 + r.below(10);
    for i in 0..n {
        let a = values[r.below(values.len())].clone();
        let b = values[r.below(values.len())].clone();
        let e = match r.below(6) {
            0 => format!("{a} + {b}"),
            1 => format!("{a} * tanh({b})"),
            2 => format!("{a} - reduce {b} axis=H reducer=@max keep_dims"),
            3 => format!("matmul({a}, w) acc=f32"),
            4 => format!("{a} / (1.0 + reduce (square({b})) axis=H reducer=@add keep_dims)"),
            _ => format!("exp(-square({a}))"),
        };
        text.push_str(&format!("  v{i} = {e}\n"));
        values.push(format!("v{i}"));
    }
    let last = values.last().cloned().unwrap_or_default();
    let other = values[2 + r.below(values.len() - 2)].clone();
    text.push_str(&format!("  return {last}, {other}\n}}\n"));
    text
}

#[test]
fn random_programs_split_into_convex_typed_subgraphs_that_compute_the_source() {
    let mut cuts = 0;
    for seed in 0..60 {
        let text = random_program(seed);
        let m = module(&text);
        let f = &m.funcs[0];
        for size in [1, 2, 3, 5, 8] {
            if partition(f, size).is_some() {
                check_split(&m, f, size);
                cuts += 1;
            }
        }
    }
    assert!(cuts >= 250, "only {cuts} cuts checked");
}
