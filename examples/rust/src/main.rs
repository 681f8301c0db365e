//! An agent's long-lived attention session with libssa. The history has the
//! structure real attention has (as examples/long_context_demo.cc): an attention
//! sink at token 0, topics arriving in bursts (keys cluster around their topic,
//! values correlate with it), a recent stretch on the query's topic and a few
//! "needle" tokens far back that the query matches strongly. One query is decoded
//! densely and with PQ top-k, SSA and SSA_ADAPTIVE at 20x; then the session is
//! checkpointed, restored and continued.
//!
//! Run (from examples/rust): cargo run --release   (libssa.a from ../../build, or SSA_LIB_DIR)
use ssa::{DType, DecodeParams, LoadOptions, Method, Runtime, RuntimeOptions, SessionConfig, Status};

const LAYERS: u32 = 2;
const NQ: usize = 8;
const NKV: usize = 2;
const D: usize = 64;
const N: usize = 32768;
const SPARSITY: f32 = 20.0;
const TOPICS: usize = 64;
const NEEDLES: usize = 4;
const RECENT: usize = 256;
const QUERY_TOPICS: [usize; 3] = [3, 17, 40]; // what the query is about, by weight

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
    fn below(&mut self, n: usize) -> usize {
        ((self.next() * n as f64) as usize).min(n - 1)
    }
}

/// Topic centres [TOPICS][NKV][D] for keys and values.
struct Topics {
    keys: Vec<f32>,
    values: Vec<f32>,
}
impl Topics {
    fn key(&self, t: usize, h: usize) -> &[f32] {
        &self.keys[(t * NKV + h) * D..][..D]
    }
    fn value(&self, t: usize, h: usize) -> &[f32] {
        &self.values[(t * NKV + h) * D..][..D]
    }
}

/// K/V [n][NKV][D] of tokens on the given topics.
fn tokens(rng: &mut Rng, c: &Topics, topic: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let (mut k, mut v) = (Vec::with_capacity(topic.len() * NKV * D), Vec::with_capacity(topic.len() * NKV * D));
    for &t in topic {
        for h in 0..NKV {
            k.extend(c.key(t, h).iter().map(|x| x + 0.55 * rng.normal()));
            v.extend(c.value(t, h).iter().map(|x| x + 0.6 * rng.normal()));
        }
    }
    (k, v)
}

/// The history of one layer: bursts of 32..512 tokens per topic, the last RECENT
/// on the query's topic, a sink at token 0 and NEEDLES needles in the first half.
fn history(rng: &mut Rng, c: &Topics) -> (Vec<f32>, Vec<f32>) {
    let mut topic = Vec::with_capacity(N);
    while topic.len() < N {
        let (len, t) = (32 + rng.below(481), rng.below(TOPICS));
        topic.extend(std::iter::repeat(t).take(len.min(N - topic.len())));
    }
    topic[N - RECENT..].fill(QUERY_TOPICS[0]);
    let (mut k, v) = tokens(rng, c, &topic);
    for h in 0..NKV {
        for j in 0..D {
            k[h * D + j] = 3.0 * c.key(0, h)[j]; // the attention sink
        }
    }
    for _ in 0..NEEDLES {
        let at = 1000 + rng.below(N / 2 - 1000);
        for h in 0..NKV {
            for j in 0..D {
                k[(at * NKV + h) * D + j] = 1.4 * c.key(QUERY_TOPICS[0], h)[j];
            }
        }
    }
    (k, v)
}

/// A mix of the query topics of each head's KV head: logits of about 6 on topic 3.
fn query(rng: &mut Rng, c: &Topics) -> Vec<f32> {
    let scale = 6.0 / (D as f32).sqrt();
    (0..NQ * D)
        .map(|i| {
            let (h, j) = (i / D / (NQ / NKV), i % D);
            let mix: f32 = [1.0, 0.7, 0.5].iter().zip(QUERY_TOPICS).map(|(w, t)| w * c.key(t, h)[j]).sum();
            mix * scale + 0.3 * rng.normal() / (D as f32).sqrt()
        })
        .collect()
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn main() -> Result<(), ssa::Error> {
    let mut rng = Rng(0x5EED_1234);
    let c = Topics {
        keys: (0..TOPICS * NKV * D).map(|_| rng.normal()).collect(),
        values: (0..TOPICS * NKV * D).map(|_| rng.normal()).collect(),
    };
    let rt = Runtime::new(&RuntimeOptions::cpu(0).seed(2024))?;
    let mut session = rt.create_session(&SessionConfig::new(LAYERS, NQ as u32, NKV as u32, D as u32, DType::F32))?;
    for layer in 0..LAYERS {
        let (k, v) = history(&mut rng, &c);
        for t in (0..N).step_by(4096) {
            // appended turn by turn; the PQ index follows
            let r = t * NKV * D..(t + 4096).min(N) * NKV * D;
            session.append(layer, &k[r.clone()], &v[r])?;
        }
    }
    println!(
        "history: {} tokens in {} layers (sink at 0, topic bursts, {} needles, the last {} tokens on the query's topic)",
        session.len(),
        LAYERS,
        NEEDLES,
        RECENT
    );

    let q = query(&mut rng, &c);
    let mut dense = vec![0f32; NQ * D];
    session.decode(0, &q, &mut dense, &DecodeParams::method(Method::Dense))?;
    println!(
        "\none query at {}x sparsity: each head reads {} of {} K/V rows (128 sink + 128 local always, the rest chosen by the method)",
        SPARSITY,
        (N as f32 / SPARSITY).ceil(),
        N
    );
    println!("error = ||out - dense|| / ||dense|| over all heads; heavy = rows taken by PQ proxy score, draws = rows sampled in proportion to it (per head)");
    for m in [Method::PqTopK, Method::Ssa, Method::SsaAdaptive] {
        let p = DecodeParams { sparsity: SPARSITY, ..DecodeParams::method(m) }.with_seed(1, 0);
        let mut out = vec![0f32; NQ * D];
        let st = session.decode(0, &q, &mut out, &p)?;
        println!(
            "  {:<12} error {:.4}  rows read {:5}  heavy {:5}  draws {:5}",
            format!("{:?}", m),
            rel_err(&out, &dense),
            st.tokens_read / NQ as u64,
            st.heavy_tokens / NQ as u64,
            st.draws / NQ as u64
        );
    }
    println!("PQ top-k keeps only the proxy's top rows and drops the tail's mass; SSA reads the top rows exactly and samples the tail, reweighting each draw by 1/inclusion probability (this synthetic context favours SSA more than a real model does: 2-3x lower error there, docs/FIDELITY.md)");

    let path = std::env::temp_dir().join(format!("agent-{}.ssa", std::process::id()));
    match session.checkpoint(&path) {
        Err(e) if e.status() == Status::Unsupported => {
            println!("snapshots are not available in this libssa build ({}); skipping restore", e.message());
        }
        Err(e) => return Err(e),
        Ok(()) => {
            let mut restored = rt.load(&path, LoadOptions { verify: true, mmap: false })?;
            let p = DecodeParams { sparsity: SPARSITY, ..DecodeParams::method(Method::Ssa) }.with_seed(1, 1);
            let a = session.decode_vec(0, &q, &p)?;
            let b = restored.decode_vec(0, &q, &p)?;
            println!(
                "\nrestored {} tokens: same seed and step decode bitwise equal: {}",
                restored.len(),
                a == b
            );
            // A new turn on the query's own topic: it takes attention mass, so the output moves.
            let (k, v) = tokens(&mut rng, &c, &[QUERY_TOPICS[0]; 64]);
            for layer in 0..LAYERS {
                restored.append(layer, &k, &v)?;
            }
            let moved = restored.decode_vec(0, &q, &DecodeParams::method(Method::Dense))?;
            let sparse = restored.decode_vec(0, &q, &p.with_seed(1, 2))?;
            println!(
                "continued to {} tokens with 64 on the query's topic: the output moved by {:.3} (relative; new tokens take attention), SSA error there {:.4}",
                restored.len(),
                rel_err(&moved, &a),
                rel_err(&sparse, &moved)
            );
            let _ = std::fs::remove_file(&path);
        }
    }
    Ok(())
}
