//! Integer expressions over a program's grid coordinates, block sizes and sizes: the bounds
//! of the key-tile ranges a masked fold visits. The plan evaluates them (to count visited
//! tiles at the `where` sizes and a schedule's blocks); the Triton writer prints them, once per
//! program, before the loop.
//!
//! Divisions are floor divisions of a non-negative numerator by a positive divisor, by
//! construction ([`IExpr::div_nonneg`]): Triton truncates integer division towards zero when
//! compiled and floors it under the interpreter (numpy), and the two agree there.

use crate::ir::DimBase;

/// An integer expression.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IExpr {
    Const(i64),
    /// The program's coordinate along a grid axis.
    Coord(String),
    /// The block size of an axis (`BLOCK_<axis>`).
    Block(String),
    /// The block length of a dimension one block spans (its next power of two).
    Padded(DimBase),
    /// The number of tiles of an axis (`EXT_<axis>`).
    Tiles(String),
    /// A dimension's size (a kernel argument): masks offset by `T − 1` (the last key index)
    /// or by a window of `W` keys, written as reductions of `iota` and `fill`.
    Size(DimBase),
    /// A value computed earlier in the same program (see [`super::Visits`]).
    Local(usize),
    Add(Box<IExpr>, Box<IExpr>),
    Sub(Box<IExpr>, Box<IExpr>),
    Mul(Box<IExpr>, Box<IExpr>),
    /// `floor(a / b)` with `a >= 0` and `b > 0`.
    Div(Box<IExpr>, Box<IExpr>),
    Min(Box<IExpr>, Box<IExpr>),
    Max(Box<IExpr>, Box<IExpr>),
    /// `a <= 0 ? b : c`.
    IfNonPositive(Box<IExpr>, Box<IExpr>, Box<IExpr>),
}

/// What an [`IExpr`]'s leaves are worth in one program under one schedule.
pub trait Env {
    fn coord(&self, axis: &str) -> i64;
    fn block(&self, axis: &str) -> i64;
    fn padded(&self, d: &DimBase) -> i64;
    fn tiles(&self, axis: &str) -> i64;
    fn size(&self, d: &DimBase) -> i64;
}

impl IExpr {
    pub fn c(v: i64) -> IExpr {
        IExpr::Const(v)
    }

    fn as_const(&self) -> Option<i64> {
        match self {
            IExpr::Const(v) => Some(*v),
            _ => None,
        }
    }

    /// `k·x` with `k < 0`, as `(−k, x)`.
    fn negative_multiple(e: &IExpr) -> Option<(i64, IExpr)> {
        match e {
            IExpr::Mul(k, x) => match **k {
                IExpr::Const(k) if k < 0 => Some((k.checked_neg()?, (**x).clone())),
                _ => None,
            },
            _ => None,
        }
    }

    pub fn plus(a: IExpr, b: IExpr) -> IExpr {
        match (a.as_const(), b.as_const()) {
            (Some(x), Some(y)) => IExpr::Const(x.saturating_add(y)),
            (Some(0), _) => b,
            (_, Some(0)) => a,
            (_, Some(y)) if y < 0 => IExpr::Sub(Box::new(a), Box::new(IExpr::Const(-y))),
            _ => match IExpr::negative_multiple(&b) {
                Some((k, x)) => IExpr::minus(a, IExpr::times(IExpr::c(k), x)),
                None => IExpr::Add(Box::new(a), Box::new(b)),
            },
        }
    }

    pub fn minus(a: IExpr, b: IExpr) -> IExpr {
        match (a.as_const(), b.as_const()) {
            (Some(x), Some(y)) => IExpr::Const(x.saturating_sub(y)),
            (_, Some(0)) => a,
            (Some(0), _) => IExpr::times(IExpr::c(-1), b),
            (_, Some(y)) if y < 0 => IExpr::Add(Box::new(a), Box::new(IExpr::Const(-y))),
            _ if a == b => IExpr::Const(0),
            _ => match IExpr::negative_multiple(&b) {
                Some((k, x)) => IExpr::plus(a, IExpr::times(IExpr::c(k), x)),
                None => IExpr::Sub(Box::new(a), Box::new(b)),
            },
        }
    }

    pub fn times(a: IExpr, b: IExpr) -> IExpr {
        match (a.as_const(), b.as_const()) {
            (Some(x), Some(y)) => IExpr::Const(x.saturating_mul(y)),
            (Some(0), _) | (_, Some(0)) => IExpr::Const(0),
            (Some(1), _) => b,
            (_, Some(1)) => a,
            (Some(k), None) => match b {
                // k·(m·x) = (k·m)·x
                IExpr::Mul(m, x) if m.as_const().is_some() => {
                    IExpr::times(IExpr::c(k.saturating_mul(m.as_const().unwrap_or(1))), *x)
                }
                b => IExpr::Mul(Box::new(IExpr::Const(k)), Box::new(b)),
            },
            (None, Some(_)) => IExpr::times(b, a),
            _ => IExpr::Mul(Box::new(a), Box::new(b)),
        }
    }

    /// `floor(a / b)`; the caller guarantees `a >= 0` and `b > 0`.
    pub fn div_nonneg(a: IExpr, b: IExpr) -> IExpr {
        match (a.as_const(), b.as_const()) {
            (Some(x), Some(y)) if y > 0 => IExpr::Const(x.div_euclid(y)),
            (_, Some(1)) => a,
            _ => IExpr::Div(Box::new(a), Box::new(b)),
        }
    }

    pub fn min(a: IExpr, b: IExpr) -> IExpr {
        match (a.as_const(), b.as_const()) {
            (Some(x), Some(y)) => IExpr::Const(x.min(y)),
            _ if a == b => a,
            _ => IExpr::Min(Box::new(a), Box::new(b)),
        }
    }

    pub fn max(a: IExpr, b: IExpr) -> IExpr {
        match (a.as_const(), b.as_const()) {
            (Some(x), Some(y)) => IExpr::Const(x.max(y)),
            _ if a == b => a,
            _ => IExpr::Max(Box::new(a), Box::new(b)),
        }
    }

    pub fn if_non_positive(c: IExpr, a: IExpr, b: IExpr) -> IExpr {
        match c.as_const() {
            Some(x) if x <= 0 => a,
            Some(_) => b,
            None if a == b => a,
            None => IExpr::IfNonPositive(Box::new(c), Box::new(a), Box::new(b)),
        }
    }

    /// `ceil(a / b)` for `b > 0`, as 0 when `a <= 0`: the first tile index `j` with
    /// `j·b >= a`, clamped at 0.
    pub fn ceil_div_clamped(a: IExpr, b: IExpr) -> IExpr {
        let num = IExpr::plus(
            IExpr::max(a, IExpr::c(0)),
            IExpr::minus(b.clone(), IExpr::c(1)),
        );
        IExpr::div_nonneg(num, b)
    }

    /// `floor(a / b) + 1` for `b > 0`, as 0 when `a < 0`: one past the last tile index `j`
    /// with `j·b <= a`, clamped at 0.
    pub fn floor_div_plus_one_clamped(a: IExpr, b: IExpr) -> IExpr {
        let num = IExpr::max(IExpr::plus(a, b.clone()), IExpr::c(0));
        IExpr::div_nonneg(num, b)
    }

    pub fn eval(&self, env: &dyn Env, locals: &[i64]) -> i64 {
        match self {
            IExpr::Const(v) => *v,
            IExpr::Coord(a) => env.coord(a),
            IExpr::Block(a) => env.block(a),
            IExpr::Padded(d) => env.padded(d),
            IExpr::Tiles(a) => env.tiles(a),
            IExpr::Size(d) => env.size(d),
            IExpr::Local(i) => locals.get(*i).copied().unwrap_or(0),
            IExpr::Add(a, b) => a.eval(env, locals).saturating_add(b.eval(env, locals)),
            IExpr::Sub(a, b) => a.eval(env, locals).saturating_sub(b.eval(env, locals)),
            IExpr::Mul(a, b) => a.eval(env, locals).saturating_mul(b.eval(env, locals)),
            IExpr::Div(a, b) => {
                let d = b.eval(env, locals);
                if d <= 0 {
                    0
                } else {
                    a.eval(env, locals).div_euclid(d)
                }
            }
            IExpr::Min(a, b) => a.eval(env, locals).min(b.eval(env, locals)),
            IExpr::Max(a, b) => a.eval(env, locals).max(b.eval(env, locals)),
            IExpr::IfNonPositive(c, a, b) => {
                if c.eval(env, locals) <= 0 {
                    a.eval(env, locals)
                } else {
                    b.eval(env, locals)
                }
            }
        }
    }

    /// The grid axes whose coordinates it reads.
    pub fn coords(&self, out: &mut std::collections::BTreeSet<String>) {
        match self {
            IExpr::Coord(a) => {
                out.insert(a.clone());
            }
            IExpr::Const(_)
            | IExpr::Block(_)
            | IExpr::Padded(_)
            | IExpr::Tiles(_)
            | IExpr::Size(_)
            | IExpr::Local(_) => {}
            IExpr::Add(a, b)
            | IExpr::Sub(a, b)
            | IExpr::Mul(a, b)
            | IExpr::Div(a, b)
            | IExpr::Min(a, b)
            | IExpr::Max(a, b) => {
                a.coords(out);
                b.coords(out);
            }
            IExpr::IfNonPositive(c, a, b) => {
                c.coords(out);
                a.coords(out);
                b.coords(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl Env for Fixed {
        fn coord(&self, _: &str) -> i64 {
            3
        }
        fn block(&self, _: &str) -> i64 {
            16
        }
        fn padded(&self, _: &DimBase) -> i64 {
            64
        }
        fn tiles(&self, _: &str) -> i64 {
            5
        }
        fn size(&self, _: &DimBase) -> i64 {
            70
        }
    }

    #[test]
    fn clamped_divisions_match_their_definitions() {
        for a in -70..70 {
            for b in [1, 3, 16] {
                let lo = IExpr::ceil_div_clamped(IExpr::c(a), IExpr::c(b)).eval(&Fixed, &[]);
                let want = (0..).find(|j| j * b >= a).unwrap_or(0);
                assert_eq!(lo, want, "ceil({a}/{b})");
                let hi =
                    IExpr::floor_div_plus_one_clamped(IExpr::c(a), IExpr::c(b)).eval(&Fixed, &[]);
                let want = (0..200).filter(|j| j * b <= a).count() as i64;
                assert_eq!(hi, want, "floor({a}/{b})+1");
            }
        }
    }

    #[test]
    fn folding_keeps_symbolic_leaves() {
        let e = IExpr::plus(
            IExpr::times(IExpr::Coord("q".into()), IExpr::Block("q".into())),
            IExpr::c(-1),
        );
        assert_eq!(e.eval(&Fixed, &[]), 47);
        assert!(matches!(e, IExpr::Sub(..)));
        let mut axes = Default::default();
        e.coords(&mut axes);
        assert_eq!(axes.into_iter().collect::<Vec<_>>(), vec!["q".to_string()]);
    }
}
