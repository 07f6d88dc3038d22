//! Derived sizes: `where` bindings defined by an expression over other dimension symbols
//! (`HD = NH*D`, `T1 = T + 1`), and the normal form that compares dimensions symbolically.
//!
//! A dimension stays a symbol in types (`tensor<BxHD, f32>`); what a symbol *is* lives in the
//! function's [`SizeDefs`]. Wherever typing must know that two shapes hold the same number of
//! elements (`reshape`), or which symbol names a computed extent (`slice`, `concat`), it
//! compares [`Poly`]s: sums of monomials with integer coefficients over the base symbols, every
//! derived symbol expanded through its definition. Equal normal forms mean equal sizes at every
//! binding of the base symbols, so the check is sound for all `--set` values.

use super::module::Binding;
use super::symbol::Sym;
use super::types::{Dim, DimBase};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A size expression as written in a `where` binding.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SizeExpr {
    Lit(u64),
    Sym(Sym),
    Add(Box<SizeExpr>, Box<SizeExpr>),
    Sub(Box<SizeExpr>, Box<SizeExpr>),
    Mul(Box<SizeExpr>, Box<SizeExpr>),
}

impl SizeExpr {
    /// The dimension symbols it names, in first-use order.
    pub fn symbols(&self) -> Vec<Sym> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(e) = stack.pop() {
            match e {
                SizeExpr::Lit(_) => {}
                SizeExpr::Sym(s) => {
                    if !out.contains(s) {
                        out.push(*s);
                    }
                }
                SizeExpr::Add(a, b) | SizeExpr::Sub(a, b) | SizeExpr::Mul(a, b) => {
                    stack.push(b);
                    stack.push(a);
                }
            }
        }
        out
    }

    /// Its value with every symbol's value from `value`; `None` on overflow, a negative
    /// intermediate or an unknown symbol.
    pub fn eval(&self, value: &dyn Fn(&str) -> Option<u64>) -> Option<i128> {
        Some(match self {
            SizeExpr::Lit(n) => *n as i128,
            SizeExpr::Sym(s) => value(s)? as i128,
            SizeExpr::Add(a, b) => a.eval(value)?.checked_add(b.eval(value)?)?,
            SizeExpr::Sub(a, b) => a.eval(value)?.checked_sub(b.eval(value)?)?,
            SizeExpr::Mul(a, b) => a.eval(value)?.checked_mul(b.eval(value)?)?,
        })
    }

    fn write(&self, f: &mut fmt::Formatter<'_>, prec: u8) -> fmt::Result {
        // `*` binds tighter and prints without spaces (`NH*D`), `+`/`-` with (`T + 1`).
        let (p, sym, a, b) = match self {
            SizeExpr::Lit(n) => return write!(f, "{n}"),
            SizeExpr::Sym(s) => return write!(f, "{s}"),
            SizeExpr::Add(a, b) => (1, " + ", a, b),
            SizeExpr::Sub(a, b) => (1, " - ", a, b),
            SizeExpr::Mul(a, b) => (2, "*", a, b),
        };
        if p < prec {
            f.write_str("(")?;
        }
        a.write(f, p)?;
        f.write_str(sym)?;
        // Left-associative: a right operand of equal strength keeps its parentheses.
        b.write(f, p + 1)?;
        if p < prec {
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl fmt::Display for SizeExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, 0)
    }
}

/// A product of atoms, sorted: a base symbol (`Dim::sym`) or a dimension the normal form
/// cannot look into (a tile dimension `(K/p)`, an axis extent `|p|`).
pub type Monomial = Vec<Dim>;

/// A size in normal form: a sum of monomials with non-zero integer coefficients.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Poly(pub BTreeMap<Monomial, i128>);

impl Poly {
    pub fn constant(n: i128) -> Poly {
        let mut m = BTreeMap::new();
        if n != 0 {
            m.insert(Vec::new(), n);
        }
        Poly(m)
    }

    pub fn atom(d: Dim) -> Poly {
        Poly(BTreeMap::from([(vec![d], 1)]))
    }

    /// The value when it has no atoms.
    pub fn as_constant(&self) -> Option<i128> {
        match self.0.len() {
            0 => Some(0),
            1 => self.0.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// The atom when it is one atom with coefficient 1.
    pub fn as_atom(&self) -> Option<&Dim> {
        match self.0.iter().next() {
            Some((m, 1)) if self.0.len() == 1 && m.len() == 1 => m.first(),
            _ => None,
        }
    }

    pub fn checked_add(&self, other: &Poly) -> Option<Poly> {
        let mut out = self.0.clone();
        for (m, c) in &other.0 {
            let e = out.entry(m.clone()).or_insert(0);
            *e = e.checked_add(*c)?;
            if *e == 0 {
                out.remove(m);
            }
        }
        Some(Poly(out))
    }

    pub fn checked_neg(&self) -> Option<Poly> {
        let mut out = BTreeMap::new();
        for (m, c) in &self.0 {
            out.insert(m.clone(), c.checked_neg()?);
        }
        Some(Poly(out))
    }

    pub fn checked_sub(&self, other: &Poly) -> Option<Poly> {
        self.checked_add(&other.checked_neg()?)
    }

    pub fn checked_mul(&self, other: &Poly) -> Option<Poly> {
        let mut out = Poly::default();
        for (ma, ca) in &self.0 {
            for (mb, cb) in &other.0 {
                let mut m: Monomial = ma.iter().chain(mb).cloned().collect();
                m.sort();
                out = out.checked_add(&Poly(BTreeMap::from([(m, ca.checked_mul(*cb)?)])))?;
            }
        }
        Some(out)
    }

    /// Whether every coefficient is positive (then the size is positive at every binding of
    /// its atoms), or it is a positive constant.
    pub fn surely_positive(&self) -> bool {
        !self.0.is_empty() && self.0.values().all(|c| *c > 0)
    }
}

impl fmt::Display for Poly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("0");
        }
        // Highest degree first, the constant last: `NH*D`, `T + 1`, `2*T - 1`.
        let mut terms: Vec<(&Monomial, &i128)> = self.0.iter().collect();
        terms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(b.0)));
        for (i, (m, c)) in terms.into_iter().enumerate() {
            let (neg, mag) = (*c < 0, c.unsigned_abs());
            match (i, neg) {
                (0, true) => f.write_str("-")?,
                (0, false) => {}
                (_, true) => f.write_str(" - ")?,
                (_, false) => f.write_str(" + ")?,
            }
            let atoms: Vec<String> = m.iter().map(|d| d.to_string()).collect();
            match (mag, atoms.is_empty()) {
                (_, true) => write!(f, "{mag}")?,
                (1, false) => f.write_str(&atoms.join("*"))?,
                (_, false) => write!(f, "{mag}*{}", atoms.join("*"))?,
            }
        }
        Ok(())
    }
}

/// The derived sizes of a function: what each derived symbol stands for, and which symbol
/// names each size, so typing can name an extent it computes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SizeDefs {
    /// Every derived symbol's normal form.
    derived: BTreeMap<Sym, Poly>,
}

impl SizeDefs {
    /// The definitions of a function's `where` bindings. Bindings that do not resolve (a
    /// cycle, an unknown symbol: reported by [`resolve_bindings`]) are left out.
    pub fn from_bindings(bindings: &[Binding]) -> SizeDefs {
        SizeDefs {
            derived: normal_forms(bindings).0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.derived.is_empty()
    }

    /// Whether `name` is a derived symbol.
    pub fn is_derived(&self, name: &str) -> bool {
        self.derived.contains_key(name)
    }

    /// A dimension's normal form: a literal is a constant, a derived symbol its definition,
    /// anything else an atom.
    pub fn normal(&self, d: &Dim) -> Poly {
        if !d.splits.is_empty() {
            return Poly::atom(d.clone());
        }
        match &d.base {
            DimBase::Lit(n) => Poly::constant(*n as i128),
            DimBase::Sym(s) => self
                .derived
                .get(s)
                .cloned()
                .unwrap_or_else(|| Poly::atom(d.clone())),
            DimBase::Extent(_) => Poly::atom(d.clone()),
        }
    }

    /// The dimension that names a size: a literal for a positive constant, a symbol whose
    /// normal form it is, or `None`.
    pub fn name(&self, p: &Poly) -> Option<Dim> {
        if let Some(c) = p.as_constant() {
            return (c > 0).then(|| Dim::lit(c as u64));
        }
        if let Some(s) = self.derived.iter().find(|(_, q)| *q == p).map(|(s, _)| s) {
            return Some(Dim::sym(s));
        }
        p.as_atom().cloned()
    }

    /// Whether two dimensions have the same size at every binding.
    pub fn same_dim(&self, a: &Dim, b: &Dim) -> bool {
        a == b || self.normal(a) == self.normal(b)
    }

    /// The product of a shape's sizes in normal form (`None` on overflow).
    pub fn count(&self, shape: &[Dim]) -> Option<Poly> {
        shape
            .iter()
            .try_fold(Poly::constant(1), |acc, d| acc.checked_mul(&self.normal(d)))
    }
}

/// Why a `where` binding does not resolve: the binding (by index) and the message.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeError {
    pub binding: usize,
    pub message: String,
    pub help: Option<String>,
}

/// The normal form of every derived binding that resolves, and the errors of those that
/// do not (a cycle, a symbol the `where` clause does not bind, an axis, an overflow).
fn normal_forms(bindings: &[Binding]) -> (BTreeMap<Sym, Poly>, Vec<SizeError>) {
    let index: BTreeMap<&str, usize> = bindings
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.as_str(), i))
        .collect();
    let mut done: BTreeMap<Sym, Poly> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut failed: BTreeSet<usize> = BTreeSet::new();
    // Depth-first over the definitions; `on_path` detects cycles.
    fn visit(
        i: usize,
        bindings: &[Binding],
        index: &BTreeMap<&str, usize>,
        on_path: &mut Vec<usize>,
        done: &mut BTreeMap<Sym, Poly>,
        failed: &mut BTreeSet<usize>,
        errors: &mut Vec<SizeError>,
    ) -> Option<Poly> {
        let b = &bindings[i];
        let Some(def) = &b.def else {
            return Some(Poly::atom(Dim::sym(&b.name)));
        };
        let name = Sym::new(&b.name);
        if let Some(p) = done.get(&name) {
            return Some(p.clone());
        }
        if failed.contains(&i) {
            return None;
        }
        if let Some(at) = on_path.iter().position(|j| *j == i) {
            let cycle: Vec<&str> = on_path[at..]
                .iter()
                .chain(std::iter::once(&i))
                .map(|j| bindings[*j].name.as_str())
                .collect();
            errors.push(SizeError {
                binding: i,
                message: format!(
                    "the definition of `{}` is circular: {}",
                    b.name,
                    cycle.join(" → ")
                ),
                help: Some("a derived size is an expression over sizes defined without it".into()),
            });
            failed.insert(i);
            return None;
        }
        on_path.push(i);
        let result = poly_of(
            def, &b.name, i, bindings, index, on_path, done, failed, errors,
        );
        on_path.pop();
        match result {
            Some(p) => {
                done.insert(name, p.clone());
                Some(p)
            }
            None => {
                failed.insert(i);
                None
            }
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn poly_of(
        e: &SizeExpr,
        owner: &str,
        i: usize,
        bindings: &[Binding],
        index: &BTreeMap<&str, usize>,
        on_path: &mut Vec<usize>,
        done: &mut BTreeMap<Sym, Poly>,
        failed: &mut BTreeSet<usize>,
        errors: &mut Vec<SizeError>,
    ) -> Option<Poly> {
        let mut go = |e: &SizeExpr, on_path: &mut Vec<usize>, errors: &mut Vec<SizeError>| {
            poly_of(e, owner, i, bindings, index, on_path, done, failed, errors)
        };
        match e {
            SizeExpr::Lit(n) => Some(Poly::constant(*n as i128)),
            SizeExpr::Sym(s) => {
                if !super::types::is_dim_symbol(s) {
                    errors.push(SizeError {
                        binding: i,
                        message: format!("`{s}` in the definition of `{owner}` is not a dimension symbol"),
                        help: Some("sizes are defined over dimension symbols (upper case) and integers; parallel axis extents are schedule parameters".into()),
                    });
                    return None;
                }
                let Some(&j) = index.get(s.as_str()) else {
                    let known: Vec<&str> = bindings
                        .iter()
                        .filter(|b| super::types::is_dim_symbol(&b.name) && b.name != owner)
                        .map(|b| b.name.as_str())
                        .collect();
                    errors.push(SizeError {
                        binding: i,
                        message: format!("`{s}` in the definition of `{owner}` is not bound in `where`"),
                        help: Some(if known.is_empty() {
                            format!("bind it in the same `where` clause, e.g. `{s} = 4`")
                        } else {
                            format!("bind it in the same `where` clause (e.g. `{s} = 4`); bound here: {}", known.join(", "))
                        }),
                    });
                    return None;
                };
                visit(j, bindings, index, on_path, done, failed, errors)
            }
            SizeExpr::Add(a, b) | SizeExpr::Sub(a, b) | SizeExpr::Mul(a, b) => {
                let pa = go(a, on_path, errors);
                let pb = go(b, on_path, errors);
                let (pa, pb) = (pa?, pb?);
                let r = match e {
                    SizeExpr::Add(..) => pa.checked_add(&pb),
                    SizeExpr::Sub(..) => pa.checked_sub(&pb),
                    _ => pa.checked_mul(&pb),
                };
                if r.is_none() {
                    errors.push(SizeError {
                        binding: i,
                        message: format!("the definition of `{owner}` overflows"),
                        help: None,
                    });
                }
                r
            }
        }
    }
    for i in 0..bindings.len() {
        let mut on_path = Vec::new();
        visit(
            i,
            bindings,
            &index,
            &mut on_path,
            &mut done,
            &mut failed,
            &mut errors,
        );
    }
    (done, errors)
}

/// Checks a `where` clause's definitions and gives every derived binding its value from its
/// factors' values (after `--set`, say). Errors: a definition that is circular, names a
/// symbol the clause does not bind or an axis, overflows, is not positive at these sizes, or
/// only restates another symbol (two names for one size would make typing's choice of name
/// arbitrary).
pub fn resolve_bindings(bindings: &mut [Binding]) -> Result<(), Vec<SizeError>> {
    let (forms, mut errors) = normal_forms(bindings);
    for (i, b) in bindings.iter().enumerate() {
        if b.def.is_none() {
            continue;
        }
        if !super::types::is_dim_symbol(&b.name) {
            errors.push(SizeError {
                binding: i,
                message: format!("parallel axis `{}` cannot be defined by an expression", b.name),
                help: Some("an axis extent is an integer (`p = 4`); derived sizes are dimension symbols (upper case)".into()),
            });
            continue;
        }
        let Some(p) = forms.get(b.name.as_str()) else {
            continue;
        };
        if let Some(d) = p.as_atom() {
            errors.push(SizeError {
                binding: i,
                message: format!("`{}` only renames `{d}`", b.name),
                help: Some(format!("use `{d}` itself")),
            });
        } else if let Some((other, _)) = forms.iter().find(|(s, q)| {
            *q == p
                && s.as_str() != b.name
                && bindings.iter().position(|x| x.name == s.as_str()) < Some(i)
        }) {
            errors.push(SizeError {
                binding: i,
                message: format!("`{}` and `{other}` are the same size, {p}", b.name),
                help: Some(format!("use `{other}` for both")),
            });
        }
    }
    if !errors.is_empty() {
        errors.sort_by_key(|e| e.binding);
        return Err(errors);
    }
    // Values in dependency order: a definition's symbols are either plain or resolved above,
    // so repeating until nothing changes settles in at most `bindings.len()` rounds.
    let mut value: BTreeMap<String, Option<i128>> = bindings
        .iter()
        .map(|b| (b.name.clone(), b.def.is_none().then_some(b.value as i128)))
        .collect();
    for _ in 0..bindings.len() {
        let mut changed = false;
        for b in bindings.iter() {
            let Some(def) = &b.def else { continue };
            if value.get(&b.name).copied().flatten().is_some() {
                continue;
            }
            let lookup = |s: &str| -> Option<u64> {
                value
                    .get(s)
                    .copied()
                    .flatten()
                    .and_then(|v| u64::try_from(v).ok())
            };
            if def.symbols().iter().all(|s| lookup(s).is_some()) {
                let v = def.eval(&lookup);
                value.insert(b.name.clone(), Some(v.unwrap_or(i128::MIN)));
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    for (i, b) in bindings.iter_mut().enumerate() {
        let Some(def) = &b.def else { continue };
        let v = value.get(&b.name).copied().flatten();
        match v.filter(|v| *v != i128::MIN) {
            Some(v) if v >= 1 && v <= u64::MAX as i128 => b.value = v as u64,
            Some(v) if v >= 1 => errors.push(SizeError {
                binding: i,
                message: format!("`{} = {def}` is {v}, too large", b.name),
                help: None,
            }),
            Some(v) => errors.push(SizeError {
                binding: i,
                message: format!(
                    "`{} = {def}` is {v} at these sizes: a dimension needs at least 1",
                    b.name
                ),
                help: Some(format!(
                    "choose sizes of {} that make it positive",
                    def.symbols()
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }),
            None => errors.push(SizeError {
                binding: i,
                message: format!("`{} = {def}` overflows at these sizes", b.name),
                help: None,
            }),
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Appends to `out` the symbols bound to a number that `name` stands on: itself if it is
/// one, else those of its definition's symbols (unbound names are left out).
pub fn base_symbols(bindings: &[Binding], name: &str, out: &mut Vec<String>) {
    let mut stack = vec![name.to_string()];
    let mut seen = BTreeSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        match bindings.iter().find(|b| b.name == n) {
            Some(Binding { def: Some(def), .. }) => {
                stack.extend(def.symbols().iter().map(|s| s.to_string()))
            }
            Some(_) if !out.contains(&n) => out.push(n),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Span;

    fn lit(name: &str, v: u64) -> Binding {
        Binding {
            name: name.into(),
            value: v,
            def: None,
            span: Span::default(),
        }
    }

    fn sym(s: &str) -> Box<SizeExpr> {
        Box::new(SizeExpr::Sym(Sym::new(s)))
    }

    fn derived(name: &str, def: SizeExpr) -> Binding {
        Binding {
            name: name.into(),
            value: 0,
            def: Some(def),
            span: Span::default(),
        }
    }

    #[test]
    fn products_and_sums_normalise_and_evaluate() {
        // HD = NH*D defined before its factors; E = (T + 1)*D - D = T*D.
        let mut bs = vec![
            derived("HD", SizeExpr::Mul(sym("NH"), sym("D"))),
            lit("NH", 4),
            lit("D", 8),
            lit("T", 3),
            derived(
                "E",
                SizeExpr::Sub(
                    Box::new(SizeExpr::Mul(
                        Box::new(SizeExpr::Add(sym("T"), Box::new(SizeExpr::Lit(1)))),
                        sym("D"),
                    )),
                    sym("D"),
                ),
            ),
        ];
        resolve_bindings(&mut bs).expect("resolves");
        assert_eq!(bs[0].value, 32);
        assert_eq!(bs[4].value, 24);
        let defs = SizeDefs::from_bindings(&bs);
        let td = Poly::atom(Dim::sym("T")).checked_mul(&Poly::atom(Dim::sym("D")));
        assert_eq!(
            defs.normal(&Dim::sym("E")),
            td.clone().expect("no overflow")
        );
        assert_eq!(defs.name(&td.expect("no overflow")), Some(Dim::sym("E")));
        assert!(defs.same_dim(&Dim::sym("HD"), &Dim::sym("HD")));
        assert!(!defs.same_dim(&Dim::sym("HD"), &Dim::sym("E")));
        let split = [Dim::sym("NH"), Dim::sym("D")];
        assert_eq!(defs.count(&split), defs.count(&[Dim::sym("HD")]));
    }

    #[test]
    fn cycles_unknown_symbols_and_non_positive_sizes_are_errors() {
        let mut cyc = vec![
            derived("A", SizeExpr::Add(sym("B"), Box::new(SizeExpr::Lit(1)))),
            derived("B", SizeExpr::Mul(sym("A"), sym("A"))),
        ];
        let e = resolve_bindings(&mut cyc).unwrap_err();
        assert!(e[0].message.contains("circular"), "{e:?}");
        let mut unknown = vec![derived("A", SizeExpr::Mul(sym("Q"), sym("Q")))];
        let e = resolve_bindings(&mut unknown).unwrap_err();
        assert!(e[0].message.contains("not bound"), "{e:?}");
        let mut zero = vec![
            lit("T", 1),
            derived("S", SizeExpr::Sub(sym("T"), Box::new(SizeExpr::Lit(1)))),
        ];
        let e = resolve_bindings(&mut zero).unwrap_err();
        assert!(e[0].message.contains("is 0"), "{e:?}");
        let mut alias = vec![
            lit("T", 1),
            derived("S", SizeExpr::Mul(sym("T"), Box::new(SizeExpr::Lit(1)))),
        ];
        let e = resolve_bindings(&mut alias).unwrap_err();
        assert!(e[0].message.contains("only renames"), "{e:?}");
    }

    #[test]
    fn polys_print_highest_degree_first() {
        let t = Poly::atom(Dim::sym("T"));
        let p = t
            .checked_add(&Poly::constant(1))
            .and_then(|p| p.checked_mul(&Poly::constant(2)))
            .and_then(|p| p.checked_sub(&Poly::constant(3)))
            .expect("small");
        assert_eq!(p.to_string(), "2*T - 1");
        let e = SizeExpr::Mul(
            Box::new(SizeExpr::Add(sym("T"), Box::new(SizeExpr::Lit(1)))),
            sym("D"),
        );
        assert_eq!(e.to_string(), "(T + 1)*D");
    }
}
