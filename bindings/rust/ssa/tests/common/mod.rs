//! Test helpers: a seeded RNG, half-precision conversions and a float64 reference.
#![allow(dead_code)]

pub const NQ: u32 = 8;
pub const NKV: u32 = 2;
pub const D: u32 = 64;

/// splitmix64: small, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    pub fn normals(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| (scale * self.normal()) as f32).collect()
    }
    /// Keys around a few centres: [n][nkv][d].
    pub fn clustered(&mut self, n: usize, nkv: usize, d: usize, clusters: usize) -> Vec<f32> {
        let centres = self.normals(clusters * nkv * d, 2.0);
        let mut out = Vec::with_capacity(n * nkv * d);
        for _ in 0..n {
            let c = (self.next_u64() % clusters as u64) as usize;
            for j in 0..nkv * d {
                out.push(centres[c * nkv * d + j] + (0.5 * self.normal()) as f32);
            }
        }
        out
    }
}

/// f32 -> IEEE binary16 bits, round to nearest even (normals, subnormals, overflow to inf).
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let mant = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (r & 1) == 1) {
        r += 1;
    }
    sign | r as u16
}

/// IEEE binary16 bits -> f64.
pub fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let mant = (h & 0x3ff) as f64;
    match exp {
        0 => sign * mant * 2f64.powi(-24),
        0x1f => if mant == 0.0 { sign * f64::INFINITY } else { f64::NAN },
        _ => sign * (1.0 + mant / 1024.0) * 2f64.powi(exp - 15),
    }
}

/// f32 -> bfloat16 bits, round to nearest even.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

pub fn bf16_to_f64(h: u16) -> f64 {
    f32::from_bits((h as u32) << 16) as f64
}

/// Exact softmax attention in f64. q: [nq][d]; k, v: [n][nkv][d]. GQA: q head h reads
/// kv head h / (nq / nkv).
pub fn reference(q: &[f64], k: &[f64], v: &[f64], nq: usize, nkv: usize, d: usize) -> Vec<f64> {
    let n = k.len() / (nkv * d);
    let group = nq / nkv;
    let mut out = vec![0.0; nq * d];
    for h in 0..nq {
        let kh = h / group;
        let scores: Vec<f64> = (0..n)
            .map(|t| (0..d).map(|e| q[h * d + e] * k[(t * nkv + kh) * d + e]).sum::<f64>() / (d as f64).sqrt())
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = w.iter().sum();
        for t in 0..n {
            for e in 0..d {
                out[h * d + e] += w[t] / z * v[(t * nkv + kh) * d + e];
            }
        }
    }
    out
}

pub fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

pub fn rel_err(out: &[f64], reference: &[f64]) -> f64 {
    let num: f64 = out.iter().zip(reference).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = reference.iter().map(|b| b * b).sum();
    (num / den).sqrt()
}
