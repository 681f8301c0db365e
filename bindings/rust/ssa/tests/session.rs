mod common;

use common::*;
use ssa::{
    BatchItem, DType, DecodeParams, LoadOptions, Method, Proxy, Runtime, RuntimeOptions, Session, SessionConfig, Status,
};

use std::os::raw::c_void;

const Q_LEN: usize = (NQ * D) as usize;
const ROW: usize = (NKV * D) as usize;

fn runtime() -> Runtime {
    Runtime::new(&RuntimeOptions::cpu(2)).expect("cpu runtime")
}

fn filled(rt: &Runtime, layers: u32, n: usize, rng: &mut Rng) -> (Session, Vec<f32>, Vec<f32>) {
    let mut s = rt.create_session(&SessionConfig::new(layers, NQ, NKV, D, DType::F32)).unwrap();
    let k = rng.clustered(n, NKV as usize, D as usize, 5);
    let v = rng.normals(n * ROW, 1.0);
    for l in 0..layers {
        s.append(l, &k, &v).unwrap();
    }
    (s, k, v)
}

fn dense() -> DecodeParams {
    DecodeParams::method(Method::Dense)
}

fn refr(q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
    reference(&to_f64(q), &to_f64(k), &to_f64(v), NQ as usize, NKV as usize, D as usize)
}

#[test]
fn runtime_basics_and_version() {
    let rt = Runtime::new(&RuntimeOptions::cpu(3)).unwrap();
    assert_eq!(rt.backend(), ssa::Backend::Cpu);
    assert_eq!(rt.num_threads(), 3);
    let (maj, min, _) = ssa::version();
    assert_eq!((maj, min), (ssa::HEADER_VERSION.0, ssa::HEADER_VERSION.1));
    let bad = Runtime::new(&RuntimeOptions { threads: -2, ..RuntimeOptions::cpu(0) }).unwrap_err();
    assert_eq!(bad.status(), Status::InvalidArgument);
    match Runtime::new(&RuntimeOptions { backend: ssa::Backend::Cuda, ..Default::default() }) {
        Ok(rt) => assert_eq!(rt.backend(), ssa::Backend::Cuda),
        Err(e) => assert!(matches!(e.status(), Status::Unsupported | Status::Device), "{}", e),
    }
}

#[test]
fn config_defaults_and_validation() {
    let rt = runtime();
    let mut cfg = SessionConfig::new(2, NQ, NKV, D, DType::F16);
    cfg.model_fingerprint = 0xFEED;
    let s = rt.create_session(&cfg).unwrap();
    assert_eq!(s.config().pq_subspaces, 16);
    assert_eq!(s.config().pq_centroids, 256);
    assert_eq!(s.config().model_fingerprint, 0xFEED);
    assert_eq!(s.config().dtype, DType::F16);
    assert!(s.is_empty());
    for bad in [
        SessionConfig::new(2, NQ, NKV, 30, DType::F32),
        SessionConfig::new(2, 6, 4, D, DType::F32),
        SessionConfig::new(0, NQ, NKV, D, DType::F32),
        SessionConfig { pq_centroids: 300, ..SessionConfig::new(1, NQ, NKV, D, DType::F32) },
    ] {
        let e = rt.create_session(&bad).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{:?}", bad);
        assert_eq!(e.function(), Some("ssa_session_create"));
        assert!(!e.message().is_empty());
    }
}

#[test]
fn append_checks_lengths_before_calling() {
    let rt = runtime();
    let mut s = rt.create_session(&SessionConfig::new(2, NQ, NKV, D, DType::F32)).unwrap();
    let kv = vec![0.5f32; 3 * ROW];
    let e = s.append(0, &kv[..ROW + 1], &kv[..ROW + 1]).unwrap_err();
    assert_eq!((e.status(), e.function()), (Status::InvalidArgument, None));
    let e = s.append(0, &kv, &kv[..ROW]).unwrap_err();
    assert!(e.message().contains("v has"), "{}", e);
    let e = s.append(5, &kv, &kv).unwrap_err();
    assert_eq!(e.function(), Some("ssa_session_append"));
    assert_eq!(s.layer_len(0), 0);
    s.append(1, &kv[..0], &kv[..0]).unwrap();
    s.append(1, &kv, &kv).unwrap();
    assert_eq!((s.layer_len(0), s.layer_len(1), s.len()), (0, 3, 0));
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|f| f.to_bits()).collect()
}

/// CPU sessions: append_raw_async is append_raw (the stream is not used).
#[test]
fn append_raw_async_on_cpu_equals_append() {
    let rt = runtime();
    let mut rng = Rng::new(21);
    let cfg = SessionConfig { index_min_tokens: 512, ..SessionConfig::new(2, NQ, NKV, D, DType::F32) };
    let mut a = rt.create_session(&cfg).unwrap();
    let mut b = rt.create_session(&cfg).unwrap();
    let n = 1500;
    let k = rng.clustered(n, NKV as usize, D as usize, 6);
    let v = rng.normals(n * ROW, 1.0);
    for l in 0..2 {
        // the index is trained at 512 tokens, inside the second chunk
        for (lo, hi) in [(0, 600), (600, 1100), (1100, n)] {
            let (kc, vc) = (&k[lo * ROW..hi * ROW], &v[lo * ROW..hi * ROW]);
            // SAFETY: kc and vc hold hi - lo full tokens of f32; CPU session (used for the call only).
            unsafe {
                a.append_raw_async(l, kc.as_ptr() as *const c_void, vc.as_ptr() as *const c_void, (hi - lo) as u64, 0)
            }
            .unwrap();
            b.append(l, kc, vc).unwrap();
        }
    }
    assert_eq!((a.len(), b.len(), a.layer_len(0), a.layer_len(1)), (1500, 1500, 1500, 1500));
    let q = rng.normals(Q_LEN, 1.5);
    let sp = DecodeParams::method(Method::Ssa).with_budget(200).with_window(16, 16).with_seed(9, 3);
    for l in 0..2 {
        for p in [dense(), sp] {
            let (oa, ob) = (a.decode_vec(l, &q, &p).unwrap(), b.decode_vec(l, &q, &p).unwrap());
            assert_eq!(bits(&oa), bits(&ob), "layer {} {:?}", l, p.method);
        }
    }
}

#[test]
fn append_raw_async_errors() {
    let rt = runtime();
    let mut s = rt.create_session(&SessionConfig::new(2, NQ, NKV, D, DType::F32)).unwrap();
    let kv = vec![0.5f32; 4 * ROW];
    let p = kv.as_ptr() as *const c_void;
    // SAFETY: kv holds 4 full tokens of f32; CPU session.
    let e = unsafe { s.append_raw_async(2, p, p, 4, 0) }.unwrap_err();
    assert_eq!((e.status(), e.function()), (Status::InvalidArgument, Some("ssa_session_append_async")));
    // SAFETY: null k/v are rejected by the library.
    let e = unsafe { s.append_raw_async(0, std::ptr::null(), std::ptr::null(), 4, 0) }.unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert_eq!(s.layer_len(0), 0);
}

#[test]
fn fork_is_independent() {
    let rt = runtime();
    let mut rng = Rng::new(11);
    let (mut s, k, v) = filled(&rt, 2, 500, &mut rng);
    let q = rng.normals(Q_LEN, 2.0);
    let before = s.decode_vec(0, &q, &dense()).unwrap();
    let sp = DecodeParams::method(Method::Ssa).with_budget(100).with_window(8, 8).with_seed(4, 1);
    let before_ssa = s.decode_vec(0, &q, &sp).unwrap();
    let mut f = s.fork().unwrap();
    assert_eq!(f.decode_vec(0, &q, &sp).unwrap(), before_ssa);
    let (k2, v2) = (rng.normals(300 * ROW, 1.0), rng.normals(300 * ROW, 1.0));
    f.append(0, &k2, &v2).unwrap();
    assert_eq!((f.layer_len(0), s.layer_len(0)), (800, 500));
    let mut kk = k.clone();
    kk.extend_from_slice(&k2);
    let mut vv = v.clone();
    vv.extend_from_slice(&v2);
    assert!(rel_err(&to_f64(&f.decode_vec(0, &q, &dense()).unwrap()), &refr(&q, &kk, &vv)) < 1e-5);
    assert_eq!(s.decode_vec(0, &q, &dense()).unwrap(), before);
    s.truncate(100).unwrap();
    assert_eq!((f.layer_len(1), s.layer_len(1)), (500, 100));
    drop(s); // the fork outlives its source
    assert!(rel_err(&to_f64(&f.decode_vec(1, &q, &dense()).unwrap()), &refr(&q, &k, &v)) < 1e-5);
}

#[test]
fn truncate_equals_fresh_prefix() {
    let rt = runtime();
    let mut rng = Rng::new(12);
    let (mut s, k, v) = filled(&rt, 2, 3000, &mut rng);
    let mut fresh = rt.create_session(&SessionConfig::new(2, NQ, NKV, D, DType::F32)).unwrap();
    for l in 0..2 {
        fresh.append(l, &k[..1700 * ROW], &v[..1700 * ROW]).unwrap();
    }
    let e = s.truncate(3001).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert_eq!(s.len(), 3000);
    s.truncate(1700).unwrap();
    assert_eq!(s.len(), 1700);
    let q = rng.normals(Q_LEN, 1.5);
    for l in 0..2 {
        let a = s.decode_vec(l, &q, &dense()).unwrap();
        assert_eq!(a, fresh.decode_vec(l, &q, &dense()).unwrap());
        assert!(rel_err(&to_f64(&a), &refr(&q, &k[..1700 * ROW], &v[..1700 * ROW])) < 1e-5);
    }
}

#[test]
fn update_index_keeps_dense_and_budget_n_exact() {
    let rt = runtime();
    let mut rng = Rng::new(13);
    let (mut s, k, v) = filled(&rt, 1, 600, &mut rng);
    let q = rng.normals(Q_LEN, 1.0);
    let before = s.decode_vec(0, &q, &dense()).unwrap();
    s.update_index().unwrap();
    assert_eq!(s.decode_vec(0, &q, &dense()).unwrap(), before);
    let pq = s.decode_vec(0, &q, &DecodeParams::method(Method::PqTopK).with_budget(600)).unwrap();
    assert!(rel_err(&to_f64(&pq), &refr(&q, &k, &v)) < 1e-5);
}

#[test]
fn batch_matches_single_decodes() {
    let rt = runtime();
    let mut rng = Rng::new(14);
    let (a, ka, va) = filled(&rt, 1, 300, &mut rng);
    let (b, kb, vb) = filled(&rt, 1, 1200, &mut rng);
    let (qa, qb) = (rng.normals(Q_LEN, 1.5), rng.normals(Q_LEN, 1.5));
    let (mut oa, mut ob, mut oa2) = (vec![0f32; Q_LEN], vec![0f32; Q_LEN], vec![0f32; Q_LEN]);
    {
        let mut items = [
            BatchItem { session: &a, q: &qa, out: &mut oa },
            BatchItem { session: &b, q: &qb, out: &mut ob },
        ];
        rt.decode_batch(&mut items, 0, &dense()).unwrap();
    }
    assert!(rel_err(&to_f64(&oa), &refr(&qa, &ka, &va)) < 1e-5);
    assert!(rel_err(&to_f64(&ob), &refr(&qb, &kb, &vb)) < 1e-5);
    let sp = DecodeParams::method(Method::Ssa).with_budget(64).with_window(8, 8).with_seed(9, 2);
    {
        let mut items = [
            BatchItem { session: &a, q: &qa, out: &mut oa },
            BatchItem { session: &b, q: &qb, out: &mut ob },
            BatchItem { session: &a, q: &qa, out: &mut oa2 },
        ];
        rt.decode_batch(&mut items, 0, &sp).unwrap();
    }
    assert_eq!(oa, a.decode_vec(0, &qa, &sp).unwrap());
    assert_eq!(oa2, oa);
    assert_eq!(ob, b.decode_vec(0, &qb, &sp).unwrap());
    // a session of another runtime is refused
    let other = runtime();
    let (c, _, _) = filled(&other, 1, 10, &mut rng);
    let mut items = [BatchItem { session: &c, q: &qa, out: &mut oa }];
    let e = rt.decode_batch(&mut items, 0, &dense()).unwrap_err();
    assert!(e.message().contains("another runtime"), "{}", e);
    let mut items = [BatchItem { session: &a, q: &qa[..5], out: &mut oa }];
    let e = rt.decode_batch(&mut items, 0, &dense()).unwrap_err();
    assert!(e.message().contains("item 0"), "{}", e);
}

#[test]
fn runtime_outlives_its_handle() {
    let mut rng = Rng::new(15);
    let s = {
        let rt = runtime();
        filled(&rt, 1, 50, &mut rng).0
    }; // the Runtime value is gone; the session keeps the handle alive
    let q = rng.normals(Q_LEN, 1.0);
    assert_eq!(s.decode_vec(0, &q, &dense()).unwrap().len(), Q_LEN);
    assert_eq!(s.runtime().backend(), ssa::Backend::Cpu);
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ssa-rust-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn snapshot_round_trip_or_unsupported() {
    let rt = runtime();
    let mut rng = Rng::new(16);
    let (mut s, k, v) = filled(&rt, 2, 1500, &mut rng);
    let path = tmp("round.ssa");
    match s.save(&path) {
        Err(e) => {
            assert_eq!(e.status(), Status::Unsupported, "{}", e);
            assert!(!e.message().is_empty());
            assert!(!path.exists());
            eprintln!("snapshots unsupported by this libssa build: {}", e);
            return;
        }
        Ok(()) => {}
    }
    let q = rng.normals(Q_LEN, 1.5);
    for opts in [LoadOptions::default(), LoadOptions { verify: true, mmap: false }, LoadOptions { verify: false, mmap: true }] {
        let t = rt.load(&path, opts).unwrap();
        assert_eq!(t.config(), s.config());
        assert_eq!(t.len(), s.len());
        for m in Method::ALL {
            let p = DecodeParams::method(m).with_budget(200).with_window(16, 16).with_seed(5, 9);
            assert_eq!(t.decode_vec(0, &q, &p).unwrap(), s.decode_vec(0, &q, &p).unwrap(), "{:?}", m);
        }
        assert!(rel_err(&to_f64(&t.decode_vec(1, &q, &dense()).unwrap()), &refr(&q, &k, &v)) < 1e-5);
    }
    let info = ssa::inspect(&path).unwrap();
    let c = s.config();
    assert_eq!(
        (info.n_layers, info.n_q_heads, info.n_kv_heads, info.head_dim, info.dtype),
        (c.n_layers, c.n_q_heads, c.n_kv_heads, c.head_dim, c.dtype)
    );
    assert_eq!((info.pq_subspaces, info.pq_centroids, info.page_tokens), (c.pq_subspaces, c.pq_centroids, c.page_tokens));
    assert_eq!((info.length, info.max_layer_length, info.generation), (1500, 1500, 1));
    assert!(info.live_bytes > 0 && info.live_bytes <= info.file_bytes);
    let more = rng.normals(100 * ROW, 1.0);
    s.append(0, &more, &more).unwrap();
    s.checkpoint(&path).unwrap();
    let info = ssa::inspect(&path).unwrap();
    assert_eq!((info.length, info.max_layer_length, info.generation), (1500, 1600, 2));
    let t = rt.load(&path, LoadOptions { verify: true, mmap: false }).unwrap();
    assert_eq!(t.layer_len(0), 1600);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() / 3);
    let cut = tmp("cut.ssa");
    std::fs::write(&cut, &bytes).unwrap();
    let e = rt.load(&cut, LoadOptions::default()).unwrap_err();
    assert_eq!(e.status(), Status::Corrupt, "{}", e);
}

#[test]
fn load_missing_file_fails_cleanly() {
    let rt = runtime();
    let e = rt.load(tmp("does-not-exist.ssa"), LoadOptions::default()).unwrap_err();
    assert!(matches!(e.status(), Status::Io | Status::Unsupported), "{}", e);
    let e = rt.load("a\0b", LoadOptions::default()).unwrap_err();
    assert_eq!((e.status(), e.function()), (Status::InvalidArgument, None));
    let e = ssa::inspect(tmp("does-not-exist.ssa")).unwrap_err();
    assert_eq!(e.status(), Status::Io, "{}", e);
    let e = ssa::inspect("a\0b").unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
}

/// Every proxy through the config: it reaches the library (the session's config,
/// inspect of its file, the loaded session), the query-aware ones take observed
/// queries and the others refuse them, and a loaded session decodes as the saved one.
#[test]
fn proxies_observe_queries_and_inspect() {
    let rt = runtime();
    let mut rng = Rng::new(31);
    let n = 700usize;
    let k = rng.normals(n * ROW, 1.0);
    let v = rng.normals(n * ROW, 1.0);
    let shown = rng.normals(40 * Q_LEN, 1.0);
    let q = rng.normals(Q_LEN, 1.0);
    let p = DecodeParams::method(Method::PqTopK).with_budget(40).with_window(4, 4);
    for proxy in [Proxy::Pq, Proxy::Opq, Proxy::Pq4, Proxy::Opq4, Proxy::Qpq, Proxy::Qpq4] {
        let mut cfg = SessionConfig::new(1, NQ, NKV, D, DType::F32);
        let four_bit = matches!(proxy, Proxy::Pq4 | Proxy::Opq4 | Proxy::Qpq4);
        cfg.proxy = proxy;
        cfg.pq_subspaces = if four_bit { 16 } else { 8 };
        cfg.pq_centroids = if four_bit { 16 } else { 256 };
        cfg.index_min_tokens = n as u32;
        cfg.index_train_sample = n as u32;
        let mut s = rt.create_session(&cfg).unwrap();
        let shown_ok = s.observe_queries(0, &shown);
        if matches!(proxy, Proxy::Qpq | Proxy::Qpq4) {
            shown_ok.unwrap();
        } else {
            assert_eq!(shown_ok.unwrap_err().status(), Status::InvalidArgument, "{:?}", proxy);
        }
        assert_eq!(s.observe_queries(0, &shown[..Q_LEN + 1]).unwrap_err().status(), Status::InvalidArgument);
        s.append(0, &k, &v).unwrap(); // trains the index
        assert_eq!((s.config().proxy, s.config().pq_parallel_weight), (proxy, 1.0));
        let path = tmp(&format!("proxy-{:?}.ssa", proxy));
        if let Err(e) = s.save(&path) {
            assert_eq!(e.status(), Status::Unsupported, "{}", e);
            return;
        }
        let info = ssa::inspect(&path).unwrap();
        assert_eq!((info.proxy, info.pq_parallel_weight, info.indexed_layers), (proxy, 1.0, 1));
        let t = rt.load(&path, LoadOptions { verify: true, mmap: false }).unwrap();
        assert_eq!(t.config().proxy, proxy);
        assert_eq!(t.decode_vec(0, &q, &p).unwrap(), s.decode_vec(0, &q, &p).unwrap(), "{:?}", proxy);
    }
}
