mod common;

use common::*;
use ssa::{DType, DecodeParams, Method, Runtime, RuntimeOptions, Session, SessionConfig, Status};

fn runtime() -> Runtime {
    Runtime::new(&RuntimeOptions::cpu(2).seed(99)).expect("cpu runtime")
}

fn session(rt: &Runtime, layers: u32, dtype: DType) -> Session {
    rt.create_session(&SessionConfig::new(layers, NQ, NKV, D, dtype)).expect("session")
}

const Q_LEN: usize = (NQ * D) as usize;
const ROW: usize = (NKV * D) as usize;

#[test]
fn dense_f32_matches_f64_reference_per_layer() {
    let rt = runtime();
    let mut s = session(&rt, 2, DType::F32);
    let mut rng = Rng::new(1);
    let (k0, v0) = (rng.normals(700 * ROW, 1.0), rng.normals(700 * ROW, 1.0));
    let (k1, v1) = (rng.normals(250 * ROW, 1.0), rng.normals(250 * ROW, 1.0));
    s.append(0, &k0[..300 * ROW], &v0[..300 * ROW]).unwrap();
    s.append(1, &k1, &v1).unwrap();
    s.append(0, &k0[300 * ROW..], &v0[300 * ROW..]).unwrap();
    assert_eq!((s.layer_len(0), s.layer_len(1), s.len()), (700, 250, 250));
    let q = rng.normals(Q_LEN, 2.0);
    let mut out = vec![0f32; Q_LEN];
    let st = s.decode(0, &q, &mut out, &DecodeParams::method(Method::Dense)).unwrap();
    let r0 = reference(&to_f64(&q), &to_f64(&k0), &to_f64(&v0), NQ as usize, NKV as usize, D as usize);
    let r1 = reference(&to_f64(&q), &to_f64(&k1), &to_f64(&v1), NQ as usize, NKV as usize, D as usize);
    assert!(rel_err(&to_f64(&out), &r0) < 1e-5, "{}", rel_err(&to_f64(&out), &r0));
    assert!(rel_err(&to_f64(&out), &r1) > 0.1);
    assert_eq!(st.context_tokens, 700);
    assert_eq!(st.tokens_read, 700 * NQ as u64);
    let out1 = s.decode_vec(1, &q, &DecodeParams::method(Method::Dense)).unwrap();
    assert!(rel_err(&to_f64(&out1), &r1) < 1e-5);
}

fn half_case(dtype: DType, enc: fn(f32) -> u16, dec: fn(u16) -> f64, tol: f64) {
    let rt = runtime();
    let mut s = session(&rt, 1, dtype);
    let mut rng = Rng::new(2);
    let k: Vec<u16> = rng.normals(400 * ROW, 1.0).into_iter().map(enc).collect();
    let v: Vec<u16> = rng.normals(400 * ROW, 1.0).into_iter().map(enc).collect();
    let q: Vec<u16> = rng.normals(Q_LEN, 2.0).into_iter().map(enc).collect();
    s.append(0, &k, &v).unwrap();
    let out = s.decode_vec(0, &q, &DecodeParams::method(Method::Dense)).unwrap();
    let f = |x: &[u16]| x.iter().map(|&b| dec(b)).collect::<Vec<f64>>();
    let r = reference(&f(&q), &f(&k), &f(&v), NQ as usize, NKV as usize, D as usize);
    let e = rel_err(&f(&out), &r);
    assert!(e < tol, "{:?}: {}", dtype, e);
    // f32 data cannot go into a half session
    let kf = vec![1.0f32; ROW];
    let mut s2 = session(&rt, 1, dtype);
    let err = s2.append(0, &kf, &kf).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(err.function(), None);
}

#[test]
fn dense_f16_matches_reference() {
    half_case(DType::F16, f32_to_f16, f16_to_f64, 2e-3);
}

#[test]
fn dense_bf16_matches_reference() {
    half_case(DType::BF16, f32_to_bf16, bf16_to_f64, 1.6e-2);
}

#[test]
fn f16_conversion_helpers_are_exact_on_known_values() {
    assert_eq!(f32_to_f16(1.0), 0x3c00);
    assert_eq!(f32_to_f16(-2.5), 0xc100);
    assert_eq!(f16_to_f64(0x3555), 0.333251953125);
    assert_eq!(f32_to_bf16(1.0), 0x3f80);
    assert_eq!(bf16_to_f64(0xc040), -3.0);
}

#[test]
fn gqa_heads_read_their_kv_head() {
    let rt = runtime();
    let mut s = rt.create_session(&SessionConfig::new(1, 8, 4, 32, DType::F32)).unwrap();
    let mut rng = Rng::new(3);
    let (k, v) = (rng.normals(150 * 4 * 32, 1.0), rng.normals(150 * 4 * 32, 1.0));
    s.append(0, &k, &v).unwrap();
    let q = rng.normals(8 * 32, 3.0);
    let out = s.decode_vec(0, &q, &DecodeParams::method(Method::Dense)).unwrap();
    let r = reference(&to_f64(&q), &to_f64(&k), &to_f64(&v), 8, 4, 32);
    for h in 0..8 {
        let e = rel_err(&to_f64(&out[h * 32..(h + 1) * 32]), &r[h * 32..(h + 1) * 32]);
        assert!(e < 1e-5, "head {}: {}", h, e);
    }
}

#[test]
fn budget_covering_context_is_dense_for_every_method() {
    let rt = runtime();
    let mut s = session(&rt, 1, DType::F32);
    let mut rng = Rng::new(4);
    let k = rng.clustered(900, NKV as usize, D as usize, 5);
    let v = rng.normals(900 * ROW, 1.0);
    s.append(0, &k, &v).unwrap();
    let q = rng.normals(Q_LEN, 2.0);
    let r = reference(&to_f64(&q), &to_f64(&k), &to_f64(&v), NQ as usize, NKV as usize, D as usize);
    for m in Method::ALL {
        for budget in [900u32, 4000] {
            let p = DecodeParams::method(m).with_budget(budget).with_window(16, 16).with_seed(5, 1);
            let out = s.decode_vec(0, &q, &p).unwrap();
            let e = rel_err(&to_f64(&out), &r);
            assert!(e < 1e-5, "{:?} budget {}: {}", m, budget, e);
        }
    }
}

fn peaked(rt: &Runtime, seed: u64) -> (Session, Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut s = session(rt, 1, DType::F32);
    let mut rng = Rng::new(seed);
    let k = rng.clustered(4096, NKV as usize, D as usize, 8);
    let v = rng.normals(4096 * ROW, 1.0);
    s.append(0, &k, &v).unwrap();
    let noise = rng.normals(Q_LEN, 0.2);
    // q heads of a group point at one key's cluster (token 17)
    let q: Vec<f32> = (0..Q_LEN)
        .map(|i| {
            let (h, e) = (i / D as usize, i % D as usize);
            let kh = h / (NQ / NKV) as usize;
            0.6 * k[(17 * NKV as usize + kh) * D as usize + e] + noise[i]
        })
        .collect();
    (s, k, v, q)
}

#[test]
fn sparse_methods_respect_the_budget() {
    let rt = runtime();
    let (s, k, v, q) = peaked(&rt, 5);
    let r = reference(&to_f64(&q), &to_f64(&k), &to_f64(&v), NQ as usize, NKV as usize, D as usize);
    for m in &Method::ALL[1..] {
        let p = DecodeParams::method(*m).with_budget(512).with_window(32, 32).with_seed(11, 0);
        let mut out = vec![0f32; Q_LEN];
        let st = s.decode(0, &q, &mut out, &p).unwrap();
        assert!(out.iter().all(|x| x.is_finite()));
        assert_eq!(st.context_tokens, 4096);
        assert!(st.tokens_read > 0 && st.tokens_read <= 512 * NQ as u64, "{:?}: {}", m, st.tokens_read);
        if matches!(m, Method::OracleTopK | Method::PqTopK) {
            assert_eq!(st.heavy_tokens, (512 - 64) * NQ as u64);
            assert!(rel_err(&to_f64(&out), &r) < 0.3, "{:?}", m);
        } else {
            assert!(st.draws > 0 && st.unique_samples <= st.draws, "{:?}", m);
        }
    }
}

#[test]
fn same_seed_and_step_reproduce_other_steps_differ() {
    let rt = runtime();
    let (s, _, _, q) = peaked(&rt, 6);
    for m in [Method::Sampling, Method::Ssa, Method::SsaAdaptive, Method::HybridUniform] {
        let p = DecodeParams::method(m).with_budget(300).with_window(8, 8).with_seed(42, 7);
        let a = s.decode_vec(0, &q, &p).unwrap();
        let b = s.decode_vec(0, &q, &p).unwrap();
        assert_eq!(a, b, "{:?}", m);
        let c = s.decode_vec(0, &q, &DecodeParams { step: 8, ..p }).unwrap();
        assert_ne!(a, c, "{:?}", m);
        // seed None = the runtime's seed (99)
        let d = s.decode_vec(0, &q, &DecodeParams { seed: None, ..p }).unwrap();
        let e = s.decode_vec(0, &q, &DecodeParams { seed: Some(99), ..p }).unwrap();
        assert_eq!(d, e, "{:?}", m);
    }
}

#[test]
fn concurrent_decodes_from_threads_match_serial() {
    let rt = runtime();
    let (s, _, _, q) = peaked(&rt, 7);
    let params: Vec<DecodeParams> =
        (0..6).map(|i| DecodeParams::method(Method::Ssa).with_budget(256).with_window(16, 16).with_seed(3, i)).collect();
    let serial: Vec<Vec<f32>> = params.iter().map(|p| s.decode_vec(0, &q, p).unwrap()).collect();
    let parallel: Vec<Vec<f32>> = std::thread::scope(|sc| {
        let hs: Vec<_> = params.iter().map(|p| sc.spawn(|| s.decode_vec(0, &q, p).unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(serial, parallel);
}

#[test]
fn decode_argument_errors() {
    let rt = runtime();
    let mut s = session(&rt, 1, DType::F32);
    let q = vec![0.25f32; Q_LEN];
    let empty = s.decode_vec(0, &q, &DecodeParams::method(Method::Dense)).unwrap_err();
    assert_eq!(empty.status(), Status::InvalidArgument);
    assert_eq!(empty.function(), Some("ssa_decode"));
    assert!(!empty.message().is_empty());
    let mut rng = Rng::new(8);
    let kv = rng.normals(20 * ROW, 1.0);
    s.append(0, &kv, &kv).unwrap();
    let short = s.decode_vec(0, &q[..10], &DecodeParams::default()).unwrap_err();
    assert_eq!((short.status(), short.function()), (Status::InvalidArgument, None));
    assert!(short.message().contains("q has 10"), "{}", short);
    let qh = vec![0u16; Q_LEN];
    assert!(s.decode_vec(0, &qh, &DecodeParams::default()).is_err());
    for bad in [
        DecodeParams { sparsity: 0.5, ..Default::default() },
        DecodeParams { heavy_fraction: 1.5, ..Default::default() },
        DecodeParams { pi_min: 0.0, ..Default::default() },
    ] {
        let e = s.decode_vec(0, &q, &bad).unwrap_err();
        assert_eq!((e.status(), e.function()), (Status::InvalidArgument, Some("ssa_decode")), "{:?}", bad);
    }
    let e = s.decode_vec(3, &q, &DecodeParams::default()).unwrap_err();
    assert!(e.to_string().contains("SSA_ERR_INVALID_ARGUMENT"), "{}", e);
}

#[test]
fn error_targeted_decode_chooses_budgets_per_head() {
    let rt = runtime();
    let (s, k, v, q) = peaked(&rt, 12);
    let r = reference(&to_f64(&q), &to_f64(&k), &to_f64(&v), NQ as usize, NKV as usize, D as usize);
    let mut budgets = Vec::new();
    for eps in [0.05f32, 0.2] {
        let p = DecodeParams::method(Method::Ssa).with_window(16, 16).with_target_error(eps, 0.1).with_max_budget(4096);
        let mut out = vec![0f32; Q_LEN];
        let st = s.decode(0, &q, &mut out, &p).unwrap();
        assert!(st.target_budget > 0 && st.tokens_read <= st.target_budget, "{:?}", st);
        assert_eq!(st.capped_heads, 0, "{:?}", st);
        assert!(st.predicted_error > 0.0, "{:?}", st);
        // Per head the bound holds with probability 0.9; over all heads the error
        // stays well within twice the target.
        let e = rel_err(&to_f64(&out), &r);
        assert!(e <= 2.0 * eps as f64, "eps {}: {}", eps, e);
        budgets.push(st.target_budget);
    }
    assert!(budgets[0] > budgets[1], "a tighter target did not read more: {:?}", budgets);
    for bad in [
        DecodeParams::method(Method::Ssa).with_target_error(-1.0, 0.1),
        DecodeParams::method(Method::Ssa).with_target_error(0.1, 1.5),
        DecodeParams::method(Method::PqTopK).with_target_error(0.1, 0.1),
    ] {
        let e = s.decode_vec(0, &q, &bad).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{:?}", bad);
    }
}

#[test]
fn budget_within_sink_and_local_is_reported_window_only() {
    let rt = runtime();
    let (s, _, _, q) = peaked(&rt, 9);
    let mut out = vec![0f32; Q_LEN];
    // 4096 / 50 = 82 tokens: below the default 128 + 128.
    let st = s.decode(0, &q, &mut out, &DecodeParams::method(Method::Ssa)).unwrap();
    assert_eq!(st.window_only_heads, NQ);
    assert_eq!((st.heavy_tokens, st.draws, st.scored_tokens), (0, 0, 0));
    assert_eq!(st.tokens_read, 256 * NQ as u64);
    for m in [Method::Dense, Method::Ssa] {
        let st = s.decode(0, &q, &mut out, &DecodeParams::method(m).with_budget(400)).unwrap();
        assert_eq!(st.window_only_heads, 0, "{:?}", m);
    }
}

#[test]
fn group_selection_shares_rows_across_a_group_and_is_dense_at_full_budget() {
    let rt = runtime();
    let (s, k, v, q) = peaked(&rt, 7);
    let r = reference(&to_f64(&q), &to_f64(&k), &to_f64(&v), NQ as usize, NKV as usize, D as usize);
    let g = (NQ / NKV) as u64;
    for grp in [ssa::GroupSelection::Mixture, ssa::GroupSelection::MeanQuery] {
        for m in &Method::ALL[2..] {
            let full = DecodeParams::method(*m).with_budget(4096).with_group_selection(grp);
            let out = s.decode_vec(0, &q, &full).unwrap();
            assert!(rel_err(&to_f64(&out), &r) < 1e-5, "{:?} {:?}", grp, m);
            let p = DecodeParams::method(*m).with_budget(512).with_window(32, 32).with_seed(3, 1).with_group_selection(grp);
            let mut out = vec![0f32; Q_LEN];
            let st = s.decode(0, &q, &mut out, &p).unwrap();
            assert!(out.iter().all(|x| x.is_finite()));
            // Every head of a group uses the group's rows: at most g * k' of them.
            assert!(st.tokens_read <= NQ as u64 * (64 + g * (512 - 64)), "{:?} {:?}: {}", grp, m, st.tokens_read);
            if *m == Method::PqTopK {
                assert_eq!(st.heavy_tokens, NQ as u64 * g * (512 - 64), "{:?}", grp);
            }
        }
    }
    let bad = DecodeParams::method(Method::Ssa).with_group_selection(ssa::GroupSelection::Mixture).with_target_error(0.05, 0.1);
    let mut out = vec![0f32; Q_LEN];
    assert_eq!(s.decode(0, &q, &mut out, &bad).unwrap_err().status(), Status::Unsupported);
}

#[test]
fn sharded_runtime_decodes_bitwise_as_unsharded() {
    let one = runtime();
    let three = Runtime::new(&RuntimeOptions::cpu(2).seed(99).sharded(&[7, 2, 5], 8192)).expect("sharded");
    assert_eq!((one.num_shards(), three.num_shards()), (1, 3));
    let n = 20000usize;
    let mut rng = Rng::new(8);
    let (k, v) = (rng.normals(n * ROW, 1.0), rng.normals(n * ROW, 1.0));
    let q = rng.normals(Q_LEN, 2.0);
    let mut outs = Vec::new();
    for rt in [&one, &three] {
        let mut s = session(rt, 1, DType::F32);
        s.append(0, &k[..9000 * ROW], &v[..9000 * ROW]).unwrap();
        s.append(0, &k[9000 * ROW..], &v[9000 * ROW..]).unwrap();
        let mut got = Vec::new();
        for m in [Method::Dense, Method::PqTopK, Method::Ssa, Method::SsaAdaptive] {
            got.push(s.decode_vec(0, &q, &DecodeParams::method(m).with_budget(600).with_seed(3, 1)).unwrap());
        }
        outs.push(got);
    }
    assert_eq!(outs[0], outs[1]);
    let dup = Runtime::new(&RuntimeOptions::cpu(1).sharded(&[1, 1], 0)).unwrap_err();
    assert_eq!(dup.status(), Status::InvalidArgument);
}
