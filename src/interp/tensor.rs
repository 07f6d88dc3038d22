//! Dense row-major f32 tensors and the kernels the interpreter needs. Values of narrower
//! dtypes are stored as f32 already rounded to their dtype.

use crate::ir::DType;
use rayon::prelude::*;

/// Largest tensor the interpreter allocates (elements), so that huge `where` sizes fail with a
/// diagnostic instead of exhausting memory.
pub const MAX_ELEMENTS: u64 = 1 << 28;

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

pub fn element_count(shape: &[usize]) -> Result<usize, String> {
    let mut n: u64 = 1;
    for &d in shape {
        n = n.checked_mul(d as u64).ok_or("tensor size overflows")?;
    }
    if n > MAX_ELEMENTS {
        return Err(format!(
            "tensor of shape {shape:?} has {n} elements, over the interpreter's limit of {MAX_ELEMENTS}; use smaller sizes with --set"
        ));
    }
    Ok(n as usize)
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    let rounded = bits.wrapping_add(0x7fff + lsb) & 0xffff_0000;
    f32::from_bits(rounded)
}

pub fn round_f16(x: f32) -> f32 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let a = x.abs();
    if a >= 65520.0 {
        return f32::INFINITY.copysign(x);
    }
    let quantum = if a < 6.103_515_6e-5 {
        2f32.powi(-24)
    } else {
        let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
        2f32.powi(e - 10)
    };
    (x / quantum).round_ties_even() * quantum
}

/// Rounds a value to what `dtype` can hold.
pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F32 => x,
        DType::BF16 => round_bf16(x),
        DType::F16 => round_f16(x),
        DType::I32 => {
            if x.is_nan() {
                0.0
            } else {
                // `+ 0.0` turns -0 into 0: integers have no negative zero.
                x.trunc().clamp(i32::MIN as f32, i32::MAX as f32) + 0.0
            }
        }
        DType::I1 => {
            if x != 0.0 && !x.is_nan() {
                1.0
            } else {
                0.0
            }
        }
    }
}

impl Tensor {
    pub fn filled(shape: Vec<usize>, v: f32) -> Result<Tensor, String> {
        let n = element_count(&shape)?;
        Ok(Tensor {
            shape,
            data: vec![v; n],
        })
    }

    pub fn scalar(v: f32) -> Tensor {
        Tensor {
            shape: vec![],
            data: vec![v],
        }
    }

    pub fn round(&mut self, dtype: DType) {
        if dtype != DType::F32 {
            self.data.iter_mut().for_each(|x| *x = round_to(dtype, *x));
        }
    }

    /// Elementwise map over several tensors broadcast numpy-style.
    pub fn zip(inputs: &[&Tensor], f: impl Fn(&[f32]) -> f32 + Sync) -> Result<Tensor, String> {
        let rank = inputs.iter().map(|t| t.shape.len()).max().unwrap_or(0);
        let mut shape = vec![1usize; rank];
        for t in inputs {
            let off = rank - t.shape.len();
            for (i, &d) in t.shape.iter().enumerate() {
                let o = &mut shape[off + i];
                if *o == 1 {
                    *o = d;
                } else if d != 1 && d != *o {
                    return Err(format!(
                        "tile shapes {:?} do not broadcast",
                        inputs.iter().map(|t| &t.shape).collect::<Vec<_>>()
                    ));
                }
            }
        }
        let n = element_count(&shape)?;
        let out_strides = strides(&shape);
        // Per input: the stride along each output dimension (0 where broadcast).
        let in_strides: Vec<Vec<usize>> = inputs
            .iter()
            .map(|t| {
                let off = rank - t.shape.len();
                let s = strides(&t.shape);
                (0..rank)
                    .map(|i| {
                        if i < off || t.shape[i - off] == 1 {
                            0
                        } else {
                            s[i - off]
                        }
                    })
                    .collect()
            })
            .collect();
        let same_shape = inputs.iter().all(|t| t.shape == shape);
        let mut data = vec![0f32; n];
        let chunk = 4096;
        data.par_chunks_mut(chunk).enumerate().for_each(|(c, out)| {
            let mut args = vec![0f32; inputs.len()];
            for (k, slot) in out.iter_mut().enumerate() {
                let lin = c * chunk + k;
                if same_shape {
                    for (j, t) in inputs.iter().enumerate() {
                        args[j] = t.data[lin];
                    }
                } else {
                    for (j, t) in inputs.iter().enumerate() {
                        let mut rem = lin;
                        let mut off = 0;
                        for d in 0..rank {
                            let idx = rem / out_strides[d];
                            rem %= out_strides[d];
                            off += idx * in_strides[j][d];
                        }
                        args[j] = t.data[off];
                    }
                }
                *slot = f(&args);
            }
        });
        Ok(Tensor { shape, data })
    }

    /// Batched matrix product over the last two dimensions, batch dims broadcast,
    /// accumulating in f32.
    pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
        let (ra, rb) = (a.shape.len(), b.shape.len());
        if ra < 2 || rb < 2 || a.shape[ra - 1] != b.shape[rb - 2] {
            return Err(format!(
                "matmul tile shapes {:?} and {:?} do not match",
                a.shape, b.shape
            ));
        }
        let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
        let ba = Tensor {
            shape: a.shape[..ra - 2].to_vec(),
            data: vec![],
        };
        let bb = Tensor {
            shape: b.shape[..rb - 2].to_vec(),
            data: vec![],
        };
        let brank = ba.shape.len().max(bb.shape.len());
        let mut batch = vec![1usize; brank];
        for t in [&ba, &bb] {
            let off = brank - t.shape.len();
            for (i, &d) in t.shape.iter().enumerate() {
                if batch[off + i] == 1 {
                    batch[off + i] = d;
                } else if d != 1 && d != batch[off + i] {
                    return Err("matmul batch dimensions do not broadcast".into());
                }
            }
        }
        let mut shape = batch.clone();
        shape.push(m);
        shape.push(n);
        let total = element_count(&shape)?;
        let bstr = strides(&batch);
        let batch_offset = |t: &Tensor, lin: usize| -> usize {
            let off = brank - t.shape.len();
            let s = strides(&t.shape);
            let mut o = 0;
            let mut rem = lin;
            for d in 0..brank {
                let idx = rem / bstr[d];
                rem %= bstr[d];
                if d >= off && t.shape[d - off] != 1 {
                    o += idx * s[d - off];
                }
            }
            o
        };
        let mut data = vec![0f32; total];
        data.par_chunks_mut(n.max(1))
            .enumerate()
            .for_each(|(row, out)| {
                if n == 0 {
                    return;
                }
                let bi = row / m.max(1);
                let i = row % m.max(1);
                let a0 = batch_offset(&ba, bi) * m * k + i * k;
                let b0 = batch_offset(&bb, bi) * k * n;
                for kk in 0..k {
                    let av = a.data[a0 + kk];
                    let brow = &b.data[b0 + kk * n..b0 + (kk + 1) * n];
                    for (o, bv) in out.iter_mut().zip(brow) {
                        *o += av * bv;
                    }
                }
            });
        Ok(Tensor { shape, data })
    }

    /// Folds dimension `dim` with `f` from `init`, accumulating in f64; the dimension stays
    /// with size 1.
    pub fn reduce_dim(&self, dim: usize, init: f64, f: impl Fn(f64, f64) -> f64 + Sync) -> Tensor {
        let outer: usize = self.shape[..dim].iter().product();
        let len = self.shape[dim];
        let inner: usize = self.shape[dim + 1..].iter().product();
        let mut shape = self.shape.clone();
        shape[dim] = 1;
        let mut data = vec![0f32; outer * inner];
        data.par_iter_mut().enumerate().for_each(|(idx, out)| {
            let (o, i) = (idx / inner.max(1), idx % inner.max(1));
            let mut acc = init;
            for j in 0..len {
                acc = f(acc, self.data[(o * len + j) * inner + i] as f64);
            }
            *out = acc as f32;
        });
        Tensor { shape, data }
    }

    /// Elements `start..start+len` along `dim`.
    pub fn slice(&self, dim: usize, start: usize, len: usize) -> Tensor {
        let outer: usize = self.shape[..dim].iter().product();
        let full = self.shape[dim];
        let inner: usize = self.shape[dim + 1..].iter().product();
        let mut data = Vec::with_capacity(outer * len * inner);
        for o in 0..outer {
            let base = (o * full + start) * inner;
            data.extend_from_slice(&self.data[base..base + len * inner]);
        }
        let mut shape = self.shape.clone();
        shape[dim] = len;
        Tensor { shape, data }
    }

    pub fn concat(parts: &[&Tensor], dim: usize) -> Tensor {
        let first = parts[0];
        let outer: usize = first.shape[..dim].iter().product();
        let inner: usize = first.shape[dim + 1..].iter().product();
        let total_dim: usize = parts.iter().map(|p| p.shape[dim]).sum();
        let mut data = Vec::with_capacity(outer * total_dim * inner);
        for o in 0..outer {
            for p in parts {
                let len = p.shape[dim] * inner;
                data.extend_from_slice(&p.data[o * len..(o + 1) * len]);
            }
        }
        let mut shape = first.shape.clone();
        shape[dim] = total_dim;
        Tensor { shape, data }
    }

    pub fn stack(parts: &[&Tensor]) -> Tensor {
        let mut shape = vec![parts.len()];
        shape.extend_from_slice(&parts[0].shape);
        let data = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        Tensor { shape, data }
    }

    pub fn transpose(&self, perm: &[usize]) -> Tensor {
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let in_strides = strides(&self.shape);
        let out_strides = strides(&shape);
        let n = self.data.len();
        let mut data = vec![0f32; n];
        data.par_iter_mut().enumerate().for_each(|(lin, out)| {
            let mut rem = lin;
            let mut off = 0;
            for d in 0..shape.len() {
                let idx = rem / out_strides[d];
                rem %= out_strides[d];
                off += idx * in_strides[perm[d]];
            }
            *out = self.data[off];
        });
        Tensor { shape, data }
    }

    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor, String> {
        let z = Tensor::filled(shape.to_vec(), 0.0)?;
        Tensor::zip(&[self, &z], |v| v[0])
    }

    /// Index of the tensor along `dim` at every element (the `iota` kernel).
    pub fn iota(shape: Vec<usize>, dim: usize) -> Result<Tensor, String> {
        let n = element_count(&shape)?;
        let s = strides(&shape);
        let len = shape[dim];
        let data = (0..n).map(|lin| ((lin / s[dim]) % len) as f32).collect();
        Ok(Tensor { shape, data })
    }
}

/// A small deterministic generator (SplitMix64), so inputs are reproducible everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// A generator whose state is `state` as given (`new` mixes its seed in first): a fuzz
    /// test's seed then names the stream it always named.
    pub fn from_state(state: u64) -> Rng {
        Rng(state)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(round_bf16(1.0), 1.0);
        // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(
            round_bf16(1.0 + 3.0 * 2f32.powi(-8)),
            1.0 + 2.0 * 2f32.powi(-7)
        );
    }

    #[test]
    fn f16_rounding_has_ten_mantissa_bits() {
        assert_eq!(round_f16(1.0 + 2f32.powi(-11)), 1.0);
        assert_eq!(round_f16(1.0 + 2f32.powi(-10)), 1.0 + 2f32.powi(-10));
        assert_eq!(round_f16(70000.0), f32::INFINITY);
    }

    #[test]
    fn matmul_matches_hand_computation() {
        let a = Tensor {
            shape: vec![2, 3],
            data: vec![1., 2., 3., 4., 5., 6.],
        };
        let b = Tensor {
            shape: vec![3, 2],
            data: vec![7., 8., 9., 10., 11., 12.],
        };
        let c = Tensor::matmul(&a, &b).expect("shapes match");
        assert_eq!(c.data, vec![58., 64., 139., 154.]);
    }

    #[test]
    fn zip_broadcasts_rows_and_columns() {
        let a = Tensor {
            shape: vec![2, 1],
            data: vec![1., 2.],
        };
        let b = Tensor {
            shape: vec![3],
            data: vec![10., 20., 30.],
        };
        let c = Tensor::zip(&[&a, &b], |v| v[0] + v[1]).expect("broadcasts");
        assert_eq!(c.shape, vec![2, 3]);
        assert_eq!(c.data, vec![11., 21., 31., 12., 22., 32.]);
    }

    #[test]
    fn slice_concat_roundtrip() {
        let t = Tensor {
            shape: vec![2, 4],
            data: (0..8).map(|x| x as f32).collect(),
        };
        let a = t.slice(1, 0, 2);
        let b = t.slice(1, 2, 2);
        assert_eq!(Tensor::concat(&[&a, &b], 1), t);
    }
}
