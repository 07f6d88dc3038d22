//! The tile analysis against brute force: for random masks, sizes and block sizes, every tile
//! with an element the mask keeps is visited, once, in ascending order; a tile visited
//! without the selects has every element kept; and for one comparison (exact at the tile's
//! corners) and the causal, window and sink masks of attention nothing else is visited.
//! Then masks read from programs, and which folds may skip.

use super::formula::{Affine, Atom, Dnf, Mask, Var};
use super::*;
use crate::interp::Rng;
use std::collections::{BTreeMap, BTreeSet};

/// Sizes, blocks and one program's coordinate along the grid axis `q`.
struct Fixed {
    q: i64,
    k: i64,
    bq: i64,
    bk: i64,
    cq: i64,
    padded: i64,
}

impl Env for Fixed {
    fn coord(&self, _: &str) -> i64 {
        self.cq
    }
    fn block(&self, a: &str) -> i64 {
        if a == "q" {
            self.bq
        } else {
            self.bk
        }
    }
    fn padded(&self, _: &DimBase) -> i64 {
        self.padded
    }
    fn size(&self, d: &DimBase) -> i64 {
        match d {
            DimBase::Lit(n) => *n as i64,
            DimBase::Sym(s) if s.as_str() == "Q" => self.q,
            _ => self.k,
        }
    }
    fn tiles(&self, a: &str) -> i64 {
        let (n, b) = if a == "q" {
            (self.q, self.bq)
        } else {
            (self.k, self.bk)
        };
        (n + b - 1) / b
    }
}

/// Index positions: 0 the key (loop axis `k`), 1 the query (grid axis `q`), 2 a whole
/// dimension of 5 elements padded to `padded`.
fn vars(whole: bool) -> BTreeMap<usize, Var> {
    let mut v: BTreeMap<usize, Var> = [(0, Var::Loop), (1, Var::Grid("q".into()))].into();
    if whole {
        v.insert(2, Var::Whole(DimBase::Lit(5)));
    }
    v
}

fn le(col: i64, row: i64, whole: i64, constant: i64) -> Atom {
    let coef = [(0, col), (1, row), (2, whole)]
        .into_iter()
        .filter(|(_, c)| *c != 0)
        .collect();
    Atom::Le(Affine {
        coef,
        constant,
        ..Affine::default()
    })
}

/// Whether the mask keeps the element at (whole, row, col), unknowns counted as `unknown`.
fn keeps(m: &Mask, idx: [i64; 3], unknown: bool, env: &Fixed) -> bool {
    m.terms.iter().any(|t| {
        t.iter().all(|a| match a {
            Atom::Le(e) => e.at(&|p| idx[p], &|d| env.size(d)) <= 0,
            Atom::Unknown => unknown,
        })
    })
}

/// Checks one mask at one size and schedule, every program; returns (tiles visited, tiles
/// with a kept element, tiles visited without the selects).
fn check(m: &Mask, env: &mut Fixed, exact: bool) -> (usize, usize, usize) {
    let v = visits(&m.bounds("k"));
    let (mut visited_total, mut needed_total, mut unmasked_total) = (0, 0, 0);
    let whole_hi = if m.vars.contains_key(&2) {
        env.padded
    } else {
        1
    };
    for cq in 0..env.tiles("q") {
        env.cq = cq;
        let segments = v.eval(env);
        let mut order = Vec::new();
        let mut unmasked = BTreeSet::new();
        for (lo, hi, masked) in &segments {
            for j in *lo..*hi {
                order.push(j);
                if !masked {
                    unmasked.insert(j);
                }
            }
        }
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "tiles not ascending or visited twice: {order:?} ({segments:?}) for {m:?}"
        );
        assert!(
            order.iter().all(|j| (0..env.tiles("k")).contains(j)),
            "a tile out of range: {order:?} for {m:?}"
        );
        let rows = cq * env.bq..(cq + 1) * env.bq;
        for j in 0..env.tiles("k") {
            let cols = j * env.bk..(j + 1) * env.bk;
            let mut any = false;
            let mut all = true;
            for w in 0..whole_hi {
                for r in rows.clone() {
                    for c in cols.clone() {
                        any |= keeps(m, [c, r, w], true, env);
                        all &= keeps(m, [c, r, w], false, env);
                    }
                }
            }
            let visited = order.contains(&j);
            assert!(
                !any || visited,
                "tile {j} of program {cq} has a kept element but is skipped ({segments:?}) for {m:?} at Q={} K={} Bq={} Bk={}",
                env.q, env.k, env.bq, env.bk
            );
            if exact {
                assert_eq!(visited, any, "tile {j} of program {cq} for {m:?}");
            }
            assert!(
                !unmasked.contains(&j) || all,
                "tile {j} of program {cq} is written unmasked but not every element is kept, for {m:?}"
            );
            visited_total += usize::from(visited);
            needed_total += usize::from(any);
            unmasked_total += usize::from(unmasked.contains(&j));
        }
    }
    (visited_total, needed_total, unmasked_total)
}

fn random_env(rng: &mut Rng) -> Fixed {
    let blocks = [1, 2, 3, 4, 8, 16];
    Fixed {
        q: 1 + rng.below(70) as i64,
        k: 1 + rng.below(70) as i64,
        bq: blocks[rng.below(6) as usize],
        bk: blocks[rng.below(6) as usize],
        cq: 0,
        padded: 8,
    }
}

/// Offsets that are sizes (`T − 1`, the last key index, less a window `W`: masks written with
/// reductions of `iota` and `fill` so that they scale with `--set`) bound tiles like
/// constants: random atoms over the key, the query and the sizes K and Q.
#[test]
fn masks_offset_by_sizes_visit_every_tile_they_keep() {
    let mut rng = Rng::new(45);
    let (mut visited, mut total) = (0, 0);
    for _ in 0..300 {
        let terms: Dnf = (0..1 + rng.below(2))
            .map(|_| {
                (0..1 + rng.below(2))
                    .map(|_| {
                        let c = |rng: &mut Rng| rng.below(3) as i64 - 1;
                        let Atom::Le(mut e) =
                            le(c(&mut rng), c(&mut rng), 0, rng.below(41) as i64 - 20)
                        else {
                            unreachable!("le makes an affine atom")
                        };
                        for d in ["K", "Q"] {
                            let k = c(&mut rng);
                            if k != 0 {
                                e.sizes.insert(DimBase::Sym(Sym::new(d)), k);
                            }
                        }
                        Atom::Le(e)
                    })
                    .collect()
            })
            .collect();
        let m = Mask {
            vars: vars(false),
            terms,
        };
        let mut env = random_env(&mut rng);
        let exact = m.terms.len() == 1 && m.terms[0].len() == 1;
        visited += check(&m, &mut env, exact).0;
        total += env.tiles("q") as usize * env.tiles("k") as usize;
    }
    assert!(visited < total, "{visited} of {total} tiles visited");
}

#[test]
fn random_masks_visit_every_tile_they_keep_once_in_order() {
    let mut rng = Rng::new(44);
    let (mut visited, mut needed, mut unmasked, mut total) = (0, 0, 0, 0);
    for case in 0..400 {
        let whole = case % 3 == 0;
        let terms: Dnf = (0..1 + rng.below(3))
            .map(|_| {
                (0..1 + rng.below(3))
                    .map(|_| {
                        if rng.below(12) == 0 {
                            Atom::Unknown
                        } else {
                            let c = |rng: &mut Rng| rng.below(5) as i64 - 2;
                            let w = if whole { c(&mut rng) } else { 0 };
                            le(c(&mut rng), c(&mut rng), w, rng.below(81) as i64 - 40)
                        }
                    })
                    .collect()
            })
            .collect();
        let m = Mask {
            vars: vars(whole),
            terms,
        };
        let mut env = random_env(&mut rng);
        let exact = m.terms.len() == 1 && m.terms[0].len() == 1 && m.terms[0][0] != Atom::Unknown;
        let (v, n, u) = check(&m, &mut env, exact);
        visited += v;
        needed += n;
        unmasked += u;
        total += env.tiles("q") as usize * env.tiles("k") as usize;
    }
    // Not vacuous: many tiles are skipped, many visited without the selects, and the
    // over-approximation stays close.
    assert!(
        visited < total * 3 / 4,
        "{visited} of {total} tiles visited"
    );
    assert!(
        unmasked > visited / 4,
        "{unmasked} of {visited} visited tiles unmasked"
    );
    assert!(
        visited <= needed + needed / 2,
        "{visited} visited, {needed} needed"
    );
}

/// Attention's masks with unit coefficients: exactly the tiles with a kept element.
#[test]
fn causal_window_and_sink_masks_visit_exactly_their_tiles() {
    let mut rng = Rng::new(7);
    for case in 0..300 {
        let width = 1 + rng.below(40) as i64;
        let sinks = 1 + rng.below(6) as i64;
        let start = rng.below(60) as i64;
        let causal = le(1, -1, 0, 0); // col <= row
        let window = le(-1, 1, 0, 1 - width); // col > row − width
        let sink = le(1, 0, 0, 1 - sinks); // col < sinks
        let after = le(-1, 0, 0, start); // col >= start
        let terms: Dnf = match case % 5 {
            0 => vec![vec![causal]],
            1 => vec![vec![causal, window]],
            2 => vec![vec![causal.clone(), window], vec![causal, sink]],
            3 => vec![vec![after]],
            _ => vec![vec![sink], vec![after]],
        };
        let m = Mask {
            vars: vars(false),
            terms,
        };
        let mut env = random_env(&mut rng);
        check(&m, &mut env, true);
    }
}

#[test]
fn sink_and_window_ranges_are_two_loops_in_order_without_a_runtime_sort() {
    // (col <= row && col > row − 8) || (col <= row && col < 2)
    let m = Mask {
        vars: vars(false),
        terms: vec![
            vec![le(1, -1, 0, 0), le(-1, 1, 0, -7)],
            vec![le(1, -1, 0, 0), le(1, 0, 0, -1)],
        ],
    };
    let v = visits(&m.bounds("k"));
    // The sink term starts at 0 and goes first: no compare-and-exchange.
    assert!(
        !v.lets.iter().any(|e| matches!(e, IExpr::IfNonPositive(..))),
        "{v:?}"
    );
    let mut env = Fixed {
        q: 64,
        k: 64,
        bq: 16,
        bk: 16,
        cq: 3,
        padded: 16,
    };
    // Rows 48..63: the sink tile 0, then the window's tiles 2 and 3, all partly masked.
    let tiles: Vec<i64> = v
        .eval(&env)
        .into_iter()
        .flat_map(|(lo, hi, masked)| {
            assert!(masked || lo >= hi);
            lo..hi
        })
        .collect();
    assert_eq!(tiles, vec![0, 2, 3]);
    env.cq = 0;
    assert_eq!(v.count(&env), 1);
}

#[test]
fn a_mask_that_never_holds_visits_nothing() {
    let m = Mask {
        vars: vars(false),
        terms: vec![],
    };
    let v = visits(&m.bounds("k"));
    assert!(v.segments.is_empty());
}

// ---- masks read from programs, and which folds skip ----

fn plan_of(text: &str) -> (crate::ir::Module, crate::verify::ModuleInfo) {
    let mut m = crate::parse::parse_module(text, 0).expect("parses");
    let info = crate::verify::verify_module(&mut m).expect("verifies");
    (m, info)
}

/// A tiled masked fold over `x: QxK` by `q` (grid) and `k` (loop): `FOLD` folds `ITEM`,
/// computed from `masked = select(COND, x_t, FILL)`.
fn masked_fold(cond: &str, fill: &str, item: &str, fold: &str) -> String {
    format!(
        "reducer @unguarded(state = <m, l>, item = <bm, s>) init = <-inf, 0.0> {{
  next = maximum(m, bm)
  return tuple(next, l * exp(m - next) + reduce (exp(s - next)) axis=1 reducer=@add keep_dims)
}}

reducer @guarded(state = <m, l>, item = <bm, s>) init = <-inf, 0.0> {{
  next = maximum(m, bm)
  shift = select(equal(next, -inf), 0.0, next)
  return tuple(next, l * exp(m - shift) + reduce (exp(s - shift)) axis=1 reducer=@add keep_dims)
}}

func f where Q = 40, K = 40 {{
  x: tensor<QxK, f32> = input
  m0: tensor<Qx1, f32> = input
  row: tensor<Qx1, i32> = iota[0]
  col: tensor<1xK, i32> = iota[1]
  width: tensor<i32> = constant 8
  x_t = partition[1,k](partition[0,q](x))
  m_t = replicate[k](partition[0,q](m0))
  row_t = replicate[k](partition[0,q](row))
  col_t = partition[1,k](replicate[q](col))
  masked = select({cond}, x_t, {fill})
  r = reduce ({item}) parallel=k reducer={fold}
  return combination[0,q]({result})
}}
",
        result = if fold.starts_with("@max") || fold.starts_with("@add") {
            "r"
        } else {
            "get[1](r)"
        }
    )
}

fn skips_of(text: &str) -> Vec<LoopSkip> {
    let (m, info) = plan_of(text);
    let p = crate::lower::plan(&info, &m.funcs[0]).expect("plans");
    p.kernels.iter().flat_map(|k| k.skips.clone()).collect()
}

const CAUSAL: &str = "less_equal(col_t, row_t)";
const WINDOW: &str = "logical_and(less_equal(col_t, row_t), greater(col_t, row_t - width))";
const BLOCK_MAX: &str = "reduce masked axis=1 reducer=@max keep_dims";

#[test]
fn a_running_maximum_of_masked_scores_skips() {
    let s = skips_of(&masked_fold(CAUSAL, "-inf", BLOCK_MAX, "@max"));
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].axis, "k");
    assert_eq!(s[0].selects.len(), 1);
    // The comparison and the key indices are read by the mask only: not computed in fully
    // kept tiles. (The query indices do not vary along `k`: computed once, before the loop.)
    assert_eq!(s[0].mask_only.len(), 2);
    assert_eq!(s[0].terms.len(), 1);
}

#[test]
fn a_sum_of_exponentials_shifted_by_a_value_from_outside_the_loop_skips() {
    let item = "reduce (exp(masked - m_t)) axis=1 reducer=@add keep_dims";
    assert_eq!(
        skips_of(&masked_fold(WINDOW, "-inf", item, "@add")).len(),
        1
    );
}

#[test]
fn a_guarded_rolling_reducer_skips_and_an_unguarded_one_does_not() {
    let item = format!("tuple({BLOCK_MAX}, masked)");
    let guarded = skips_of(&masked_fold(WINDOW, "-inf", &item, "@guarded"));
    assert_eq!(guarded.len(), 1);
    assert_eq!(guarded[0].terms.len(), 1);
    // Without the guard, a state that has folded only masked tiles (max = -inf) becomes NaN
    // on a masked tile: exp(-inf − -inf).
    assert!(skips_of(&masked_fold(WINDOW, "-inf", &item, "@unguarded")).is_empty());
}

#[test]
fn folds_a_masked_tile_would_change_do_not_skip() {
    // max(state, 0) is not the state; state + 1 is not the state.
    assert!(skips_of(&masked_fold(CAUSAL, "0.0", BLOCK_MAX, "@max")).is_empty());
    let sum = "reduce masked axis=1 reducer=@add keep_dims";
    assert!(skips_of(&masked_fold(CAUSAL, "1.0", sum, "@add")).is_empty());
    // A fill of 0 for a sum is the identity: it skips.
    assert_eq!(skips_of(&masked_fold(CAUSAL, "0.0", sum, "@add")).len(), 1);
    // An item the mask does not reach: nothing to skip.
    let unmasked = "reduce x_t axis=1 reducer=@max keep_dims";
    assert!(skips_of(&masked_fold(CAUSAL, "-inf", unmasked, "@max")).is_empty());
}

#[test]
fn a_condition_on_loaded_values_is_no_mask() {
    // `x_t > 0` depends on the data: nothing is known about a tile.
    let s = skips_of(&masked_fold("greater(x_t, 0.0)", "-inf", BLOCK_MAX, "@max"));
    assert!(s.is_empty());
    // Anded with the causal mask, the causal part still bounds the tiles, and no tile is
    // fully kept.
    let s = skips_of(&masked_fold(
        "logical_and(greater(x_t, 0.0), less_equal(col_t, row_t))",
        "-inf",
        BLOCK_MAX,
        "@max",
    ));
    assert_eq!(s.len(), 1);
    assert!(s[0].terms.iter().all(|t| t.full.is_none()));
}

#[test]
fn the_select_with_its_fill_first_keeps_where_the_condition_fails() {
    // select(col > row, -inf, x): kept where col <= row, the causal mask.
    let s = skips_of(&masked_fold(CAUSAL, "-inf", BLOCK_MAX, "@max"));
    let text = masked_fold(CAUSAL, "-inf", BLOCK_MAX, "@max").replace(
        "select(less_equal(col_t, row_t), x_t, -inf)",
        "select(greater(col_t, row_t), -inf, x_t)",
    );
    let t = skips_of(&text);
    assert_eq!(t.len(), 1);
    let env = |cq| Fixed {
        q: 40,
        k: 40,
        bq: 16,
        bk: 16,
        cq,
        padded: 16,
    };
    for cq in 0..3 {
        assert_eq!(s[0].visits.eval(&env(cq)), t[0].visits.eval(&env(cq)));
    }
}
