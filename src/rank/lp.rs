//! The LP relaxation of T̂ = min over legal θ of T(θ), over x = log2 of the block sizes
//! (solved with `good_lp`'s microlp backend).
//!
//! Every [`Term`] is bounded below by a monomial `2^(c + e·x)` on the domain's box:
//! `b·⌈n/b⌉ ≥ n`, `min(b, n)·⌈n/b⌉ ≥ n`, `⌈n/b⌉ ≥ n/b`, `min(b, n) ≥ b·min(1, n/max)`,
//! `1/⌈n/b⌉ ≥ b/(2·max(n, max))`; a term that counts visited tiles of a skipping loop is
//! bounded by 0, and padding to a tensor-core instruction's rows (a factor of at least 1)
//! is left out. A monomial is convex in x, so its tangents lie below it: the LP keeps, per
//! monomial, a variable above a growing set of tangents (cuts added where the LP's solution
//! is furthest below the monomial). Then, per kernel, `t_k ≥` each resource's demand over its
//! rate, and `t_k ≥` the same times SMs/P (the utilisation u ≤ P/SMs); the objective is
//! Σ_k (launch + t_k). Legality is relaxed the same way: a single monomial bound is linear in
//! x (block values within 2^20 elements), sums are bounded through their tangents (shared
//! memory at one stage, fold state with 16 warps). Every legal θ of the discrete domain is a
//! point of this LP with an objective no larger than T(θ): the LP optimum is a lower bound of
//! T̂ (warps, stages and the discrete L2 rule only raise T).

use super::device::Device;
use super::model::{FunctionModel, Pow, Term, Unit, MAX_NUMEL, RESERVED_REGS};
use good_lp::{microlp, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};

/// `2^(c + e·x)`.
#[derive(Clone, Debug)]
struct Monomial {
    c: f64,
    e: Vec<f64>,
}

impl Monomial {
    fn s(&self, x: &[f64]) -> f64 {
        self.c + self.e.iter().zip(x).map(|(e, x)| e * x).sum::<f64>()
    }

    /// The range of the exponent over the box.
    fn range(&self, lo: &[f64], hi: &[f64]) -> (f64, f64) {
        let (mut a, mut b) = (self.c, self.c);
        for ((e, l), h) in self.e.iter().zip(lo).zip(hi) {
            a += (e * l).min(e * h);
            b += (e * l).max(e * h);
        }
        (a, b)
    }
}

/// A lower-bounding monomial of `t` times `scale`, or `None` where the bound is 0.
fn monomial(t: &Term, scale: f64, n: &[f64], hi: &[u32]) -> Option<Monomial> {
    if !t.skips.is_empty() || t.coeff * scale <= 0.0 {
        return None;
    }
    let mut c = (t.coeff * scale).log2();
    let mut e = vec![0.0; t.pows.len()];
    for (i, p) in t.pows.iter().enumerate() {
        let Pow {
            clipped,
            block,
            tiles,
        } = *p;
        let l = n[i].max(1.0).log2();
        let top = f64::from(hi[i]);
        let clip = (l - top).min(0.0); // log2 min(1, n/max)
        let (mut cl, mut bl, mut ti) = (clipped, block, tiles);
        if ti > 0 {
            let kb = ti.min(bl);
            bl -= kb;
            ti -= kb;
            let kc = ti.min(cl);
            cl -= kc;
            ti -= kc;
            c += f64::from(kb + kc) * l;
            c += f64::from(ti) * l;
            e[i] -= f64::from(ti);
        } else if ti < 0 {
            let k = f64::from(-ti);
            c += k * (-1.0 - l.max(top));
            e[i] += k;
        }
        c += f64::from(cl) * clip;
        e[i] += f64::from(cl + bl);
    }
    Some(Monomial { c, e })
}

/// A variable above the largest of some monomials, with its cuts.
struct Group {
    monomials: Vec<Monomial>,
    /// Exponents at which tangents are placed, per monomial.
    cuts: Vec<Vec<f64>>,
}

/// `Σ groups + constant`.
#[derive(Default)]
struct Sum {
    groups: Vec<usize>,
    constant: f64,
}

impl Sum {
    fn add(&mut self, other: Sum) {
        self.groups.extend(other.groups);
        self.constant += other.constant;
    }
}

#[derive(Default)]
struct Builder {
    groups: Vec<Group>,
}

impl Builder {
    fn group(&mut self, monomials: Vec<Monomial>, lo: &[f64], hi: &[f64]) -> Option<usize> {
        if monomials.is_empty() {
            return None;
        }
        let cuts = monomials
            .iter()
            .map(|m| {
                let (a, b) = m.range(lo, hi);
                vec![a, (a + b) / 2.0, b]
            })
            .collect();
        self.groups.push(Group { monomials, cuts });
        Some(self.groups.len() - 1)
    }

    /// Each term its own group, plus constants.
    fn sum(
        &mut self,
        terms: &[Term],
        scale: f64,
        m: &FunctionModel,
        lo: &[f64],
        hi: &[f64],
    ) -> Sum {
        let mut s = Sum::default();
        for t in terms {
            if t.skips.is_empty() && t.pows.iter().all(|p| p.is_zero()) {
                s.constant += t.coeff * scale;
            } else if let Some(g) =
                monomial(t, scale, &m.sizes, &m.hi).and_then(|x| self.group(vec![x], lo, hi))
            {
                s.groups.push(g);
            }
        }
        s
    }
}

/// Divided by the kernel's programs: a tiles exponent less per grid axis.
fn per_program(t: &Term, grid: &[Option<usize>]) -> Term {
    let mut t = t.clone();
    for i in grid.iter().flatten() {
        t.pows[*i].tiles -= 1;
    }
    t
}

/// The LP's optimum (a lower bound of T̂, µs) and its point (log2 blocks), or `None` when the
/// solver fails or the relaxation is infeasible (no legal θ).
pub fn relax(m: &FunctionModel, dev: &Device) -> Option<(f64, Vec<f64>)> {
    let lo: Vec<f64> = m.lo.iter().map(|l| f64::from(*l)).collect();
    let hi: Vec<f64> = m.hi.iter().map(|h| f64::from(*h)).collect();
    let mut b = Builder::default();
    // Per kernel: the sums t_k must exceed.
    let mut bounds: Vec<Vec<Sum>> = Vec::new();
    // Sums that must stay below a limit.
    let mut limits: Vec<(Sum, f64)> = Vec::new();
    // Single monomials below a limit: linear in x.
    let mut linear: Vec<(Monomial, f64)> = Vec::new();
    let us = 1e6;
    let sms = dev.sms as f64;
    for k in &m.kernels {
        let mut sums = Vec::new();
        for parallel in [false, true] {
            let scale = if parallel { sms } else { 1.0 };
            let adjust = |t: &Term| {
                if parallel {
                    per_program(t, &k.grid)
                } else {
                    t.clone()
                }
            };
            // DRAM: per buffer the largest distinct bytes, plus stores.
            let mut dram = Sum::default();
            for r in &k.reads {
                let ms: Vec<Monomial> = r
                    .distinct
                    .iter()
                    .filter_map(|t| {
                        monomial(
                            &adjust(t),
                            scale * us / dev.dram_bytes_per_s,
                            &m.sizes,
                            &m.hi,
                        )
                    })
                    .collect();
                if let Some(g) = b.group(ms, &lo, &hi) {
                    dram.groups.push(g);
                }
            }
            let s = b.sum(
                &k.store_bytes.iter().map(adjust).collect::<Vec<_>>(),
                scale * us / dev.dram_bytes_per_s,
                m,
                &lo,
                &hi,
            );
            dram.add(s);
            sums.push(dram);
            let adj = |ts: &[Term]| ts.iter().map(adjust).collect::<Vec<_>>();
            let mut tensor = b.sum(
                &adj(&k.work[Unit::TensorBf16 as usize]),
                scale * us / dev.tensor_bf16_flops,
                m,
                &lo,
                &hi,
            );
            let tf32 = b.sum(
                &adj(&k.work[Unit::TensorTf32 as usize]),
                scale * us / dev.tensor_tf32_flops,
                m,
                &lo,
                &hi,
            );
            tensor.add(tf32);
            sums.push(tensor);
            sums.push(b.sum(
                &adj(&k.work[Unit::Cuda as usize]),
                scale * us / dev.cuda_f32_ops,
                m,
                &lo,
                &hi,
            ));
            sums.push(b.sum(
                &adj(&k.work[Unit::Sfu as usize]),
                scale * us / dev.sfu_ops,
                m,
                &lo,
                &hi,
            ));
        }
        bounds.push(sums);
        let smem: Vec<Term> = k.smem.iter().map(|(t, _)| t.clone()).collect();
        limits.push((b.sum(&smem, 1.0, m, &lo, &hi), dev.smem_per_block as f64));
        let regs = (dev.max_regs_per_thread - RESERVED_REGS) as f64 * 32.0 * 16.0;
        limits.push((b.sum(&k.state_words, 1.0, m, &lo, &hi), regs));
        for v in &k.values {
            if let Some(x) = monomial(v, 1.0, &m.sizes, &m.hi) {
                linear.push((x, MAX_NUMEL));
            }
        }
    }
    let launch = dev.launch_s * us * m.kernels.len() as f64;
    let mut best = None;
    for _round in 0..12 {
        let mut vars = ProblemVariables::new();
        let x: Vec<Variable> = lo
            .iter()
            .zip(&hi)
            .map(|(l, h)| vars.add(variable().min(*l).max(*h)))
            .collect();
        let y: Vec<Variable> = b.groups.iter().map(|_| vars.add(variable())).collect();
        let t: Vec<Variable> = bounds
            .iter()
            .map(|_| vars.add(variable().min(0.0)))
            .collect();
        let objective: Expression = t.iter().map(|v| Expression::from(*v)).sum();
        let mut model = vars.minimise(objective).using(microlp);
        let affine = |mono: &Monomial, s0: f64| -> Expression {
            // 2^s ≥ 2^s0 (1 + ln2 (s − s0)), s = c + e·x.
            let v = s0.exp2();
            let k = v * std::f64::consts::LN_2;
            let mut e = Expression::from(v + k * (mono.c - s0));
            for (ei, xi) in mono.e.iter().zip(&x) {
                if *ei != 0.0 {
                    e += k * *ei * *xi;
                }
            }
            e
        };
        for (g, yg) in b.groups.iter().zip(&y) {
            for (mono, cuts) in g.monomials.iter().zip(&g.cuts) {
                for s0 in cuts {
                    model = model.with(Expression::from(*yg).geq(affine(mono, *s0)));
                }
            }
        }
        let sum_expr = |s: &Sum| -> Expression {
            let mut e = Expression::from(s.constant);
            for g in &s.groups {
                e += y[*g];
            }
            e
        };
        for (sums, tk) in bounds.iter().zip(&t) {
            for s in sums {
                model = model.with(Expression::from(*tk).geq(sum_expr(s)));
            }
        }
        for (s, limit) in &limits {
            if !s.groups.is_empty() {
                model = model.with(sum_expr(s).leq(*limit));
            }
        }
        for (mono, limit) in &linear {
            let mut e = Expression::from(mono.c);
            for (ei, xi) in mono.e.iter().zip(&x) {
                if *ei != 0.0 {
                    e += *ei * *xi;
                }
            }
            model = model.with(e.leq(limit.log2()));
        }
        let sol = match model.solve() {
            Ok(s) => s,
            Err(_) => return best,
        };
        let xs: Vec<f64> = x.iter().map(|v| sol.value(*v)).collect();
        let value: f64 = t.iter().map(|v| sol.value(*v)).sum::<f64>() + launch;
        best = Some((value, xs.clone()));
        // New cuts where a group's variable lies below one of its monomials.
        let mut added = false;
        for (g, yg) in b.groups.iter_mut().zip(&y) {
            let yv = sol.value(*yg);
            for (mono, cuts) in g.monomials.iter().zip(g.cuts.iter_mut()) {
                let s = mono.s(&xs);
                if s.exp2() > yv * (1.0 + 1e-3) + 1e-9 && cuts.iter().all(|c| (c - s).abs() > 1e-6)
                {
                    cuts.push(s);
                    added = true;
                }
            }
        }
        if !added {
            break;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pow(clipped: i32, block: i32, tiles: i32) -> Pow {
        Pow {
            clipped,
            block,
            tiles,
        }
    }

    /// Every monomial bound lies below its term at every block of the domain.
    #[test]
    fn monomial_bounds_lie_below_their_terms() {
        let sizes = [1.0, 100.0, 4096.0, 16.0, 3000.0];
        let hi: Vec<u32> = sizes
            .iter()
            .map(|n: &f64| ((*n as u64).max(16).next_power_of_two().min(1024)).ilog2())
            .collect();
        let shapes = [
            pow(1, 0, 0),
            pow(0, 1, 0),
            pow(0, 0, 1),
            pow(1, 0, 1),
            pow(0, 1, 1),
            pow(2, 1, 1),
            pow(0, 0, -1),
            pow(1, 0, -1),
            pow(0, 2, 3),
            pow(1, 1, 2),
        ];
        for (i, n) in sizes.iter().enumerate() {
            for p in shapes {
                let mut t = Term::constant(sizes.len(), 3.0);
                t.pows[i] = p;
                let mono = monomial(&t, 2.0, &sizes, &hi).unwrap();
                for l in 4..=hi[i] {
                    let mut b = vec![16.0; sizes.len()];
                    b[i] = f64::from(1u32 << l);
                    let exact = 2.0 * t.value(&b, &sizes, &[]);
                    let x: Vec<f64> = b.iter().map(|v| v.log2()).collect();
                    let bound = mono.s(&x).exp2();
                    assert!(
                        bound <= exact * (1.0 + 1e-12),
                        "n={n} {p:?} b={}: {bound} > {exact}",
                        b[i]
                    );
                }
            }
        }
    }
}
