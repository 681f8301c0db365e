//! An agent's long-lived attention session with libssa: a structured history of a few
//! thousand tokens (each turn's keys cluster around its topic), dense vs sparse decode,
//! then checkpoint, restore and continue.
//!
//! Run: SSA_LIB_DIR=/path/to/build cargo run --release (from examples/rust)
use ssa::{DType, DecodeParams, LoadOptions, Method, Runtime, RuntimeOptions, SessionConfig, Status};

const LAYERS: u32 = 2;
const NQ: usize = 8;
const NKV: usize = 2;
const D: usize = 64;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        // xorshift64*, mapped to (0, 1)
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.next(), self.next());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn main() -> Result<(), ssa::Error> {
    let mut rng = Rng(0x5EED_1234);
    let rt = Runtime::new(&RuntimeOptions::cpu(0).seed(2024))?;
    let mut session = rt.create_session(&SessionConfig::new(LAYERS, NQ as u32, NKV as u32, D as u32, DType::F32))?;

    let topics: Vec<Vec<f32>> = (0..12).map(|_| (0..NKV * D).map(|_| 1.5 * rng.normal()).collect()).collect();
    let mut turn = |n: usize, topic: &[f32]| {
        let k: Vec<f32> = (0..n * NKV * D).map(|i| topic[i % (NKV * D)] + 0.4 * rng.normal()).collect();
        let v: Vec<f32> = (0..n * NKV * D).map(|_| rng.normal()).collect();
        (k, v)
    };
    let sizes = [400, 300, 250, 350, 200, 300, 250, 350, 200, 300, 280, 320];
    for (i, &n) in sizes.iter().enumerate() {
        let (k, v) = turn(n, &topics[i % topics.len()]);
        for layer in 0..LAYERS {
            session.append(layer, &k, &v)?;
        }
    }
    println!("history: {} tokens in {} layers", session.len(), LAYERS);

    let mut qrng = Rng(77);
    let q: Vec<f32> = (0..NQ * D)
        .map(|i| {
            let (h, e) = (i / D, i % D);
            topics[3][(h / (NQ / NKV)) * D + e] + 0.3 * qrng.normal()
        })
        .collect();
    let mut dense = vec![0f32; NQ * D];
    let dst = session.decode(0, &q, &mut dense, &DecodeParams::method(Method::Dense))?;
    for m in [Method::PqTopK, Method::Ssa, Method::SsaAdaptive] {
        let p = DecodeParams { sparsity: 10.0, ..DecodeParams::method(m) }.with_window(32, 64).with_seed(1, 0);
        let mut out = vec![0f32; NQ * D];
        let st = session.decode(0, &q, &mut out, &p)?;
        println!(
            "{:<12} rel. error vs dense {:.4}, tokens read {:6} of {}",
            format!("{:?}", m),
            rel_err(&out, &dense),
            st.tokens_read,
            dst.tokens_read
        );
    }

    let path = std::env::temp_dir().join(format!("agent-{}.ssa", std::process::id()));
    match session.checkpoint(&path) {
        Err(e) if e.status() == Status::Unsupported => {
            println!("snapshots are not available in this libssa build ({}); skipping restore", e.message());
        }
        Err(e) => return Err(e),
        Ok(()) => {
            let mut restored = rt.load(&path, LoadOptions { verify: true, mmap: false })?;
            let (k, v) = turn(64, &topics[5]);
            for layer in 0..LAYERS {
                restored.append(layer, &k, &v)?;
            }
            println!("restored {} tokens, continued to {}", session.len(), restored.len());
            let p = DecodeParams { sparsity: 10.0, ..DecodeParams::method(Method::Ssa) }.with_seed(1, 1);
            let a = session.decode_vec(0, &q, &p)?;
            let b = restored.decode_vec(0, &q, &p)?;
            println!("restored+64 tokens vs original: rel. difference {:.4}", rel_err(&b, &a));
            let _ = std::fs::remove_file(&path);
        }
    }
    Ok(())
}
