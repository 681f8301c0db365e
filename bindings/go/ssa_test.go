package ssa

import (
	"errors"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"unsafe"
)

func TestConstantsMatchCgo(t *testing.T) {
	c := cValues()
	for st, name := range statusNames {
		if c[name] != uint64(st) {
			t.Errorf("%s: Go %d, C %d", name, st, c[name])
		}
		if StatusName(st) != name {
			t.Errorf("library names %d %q, want %q", st, StatusName(st), name)
		}
	}
	for m, name := range methodNames {
		if c[name] != uint64(m) {
			t.Errorf("%s: Go %d, C %d", name, m, c[name])
		}
	}
	for d, name := range dTypeNames {
		if c[name] != uint64(d) {
			t.Errorf("%s mismatch", name)
		}
	}
	for name, v := range cMacros {
		if c[name] != v {
			t.Errorf("%s: Go %d, C %d", name, v, c[name])
		}
	}
	if len(Methods) != len(methodNames) {
		t.Errorf("Methods lists %d of %d methods", len(Methods), len(methodNames))
	}
}

func TestVersionAndRuntime(t *testing.T) {
	major, minor, _ := Version()
	if major != VersionMajor || minor != VersionMinor {
		t.Fatalf("library %d.%d, header %d.%d", major, minor, VersionMajor, VersionMinor)
	}
	rt := cpuRuntime(t, 0)
	if rt.Backend() != BackendCPU || rt.Threads() != 2 {
		t.Fatalf("backend %v threads %d", rt.Backend(), rt.Threads())
	}
	_, err := NewRuntime(&RuntimeOptions{Backend: BackendCPU, Threads: -1})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("negative threads: %v", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Op != "ssa_runtime_create" || e.Message == "" {
		t.Fatalf("error lacks detail: %#v", err)
	}
	if rt2, err := NewRuntime(&RuntimeOptions{Backend: BackendCUDA}); err == nil {
		rt2.Close()
	} else if !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrDevice) {
		t.Fatalf("CUDA without CUDA: %v", err)
	}
}

func TestSessionConfigAndValidation(t *testing.T) {
	rt := cpuRuntime(t, 0)
	cfg := NewSessionConfig(3, nQ, nKV, dim, F16)
	cfg.ModelFingerprint = 0xC0FFEE
	s, err := rt.NewSession(cfg)
	must(t, err)
	defer s.Close()
	got := s.Config()
	if got.PQSubspaces != 16 || got.PQCentroids != 256 || got.ModelFingerprint != 0xC0FFEE || got.DType != F16 || got.Layers != 3 {
		t.Fatalf("config %+v", got)
	}
	for _, bad := range []SessionConfig{
		NewSessionConfig(1, nQ, nKV, 30, F32),
		NewSessionConfig(1, 6, 4, dim, F32),
		NewSessionConfig(0, nQ, nKV, dim, F32),
		NewSessionConfig(-1, nQ, nKV, dim, F32),
	} {
		_, err := rt.NewSession(bad)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

func TestAppendAndErrors(t *testing.T) {
	rt := cpuRuntime(t, 0)
	s := newSession(t, rt, 2, F32)
	r := rand.New(rand.NewSource(1))
	k, v := normals(r, 30*row, 1), normals(r, 30*row, 1)
	must(t, s.AppendF32(0, k, v))
	must(t, s.AppendF32(1, k[:10*row], v[:10*row]))
	if s.LayerLen(0) != 30 || s.LayerLen(1) != 10 || s.Len() != 10 {
		t.Fatalf("lengths %d %d %d", s.LayerLen(0), s.LayerLen(1), s.Len())
	}
	var e *Error
	err := s.AppendF32(0, k[:row+1], v[:row+1])
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || e.Op != "" {
		t.Fatalf("bad length: %v", err)
	}
	if err := s.AppendF32(0, k, v[:row]); err == nil {
		t.Fatal("k/v length mismatch accepted")
	}
	if err := s.AppendU16(0, make([]uint16, row), make([]uint16, row)); err == nil {
		t.Fatal("uint16 into an F32 session accepted")
	}
	err = s.AppendF32(7, k, v)
	if !errors.As(err, &e) || e.Op != "ssa_session_append" || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad layer: %v", err)
	}
	if s.LayerLen(0) != 30 {
		t.Fatal("failed append changed the layer")
	}
}

// sameBits reports whether a and b hold bitwise the same float32 values.
func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// CPU sessions: AppendPtrAsync is AppendPtr (the stream is not used).
func TestAppendPtrAsyncOnCPUEqualsAppend(t *testing.T) {
	rt := cpuRuntime(t, 0)
	cfg := NewSessionConfig(2, nQ, nKV, dim, F32)
	cfg.IndexMinTokens = 512 // trained during the chunks below
	a, err := rt.NewSession(cfg)
	must(t, err)
	defer a.Close()
	b, err := rt.NewSession(cfg)
	must(t, err)
	defer b.Close()
	r := rand.New(rand.NewSource(21))
	const n = 1500
	k, v := clustered(r, n, 6), normals(r, n*row, 1)
	for l := 0; l < 2; l++ {
		for _, c := range [][2]int{{0, 600}, {600, 1100}, {1100, n}} {
			lo, hi := c[0]*row, c[1]*row
			must(t, a.AppendPtrAsync(l, unsafe.Pointer(&k[lo]), unsafe.Pointer(&v[lo]), uint64(c[1]-c[0]), 0))
			must(t, b.AppendF32(l, k[lo:hi], v[lo:hi]))
		}
	}
	if a.Len() != n || b.Len() != n || a.LayerLen(1) != n {
		t.Fatalf("lengths %d %d %d", a.Len(), b.Len(), a.LayerLen(1))
	}
	q := normals(r, qLen, 1.5)
	sp := WithMethod(MethodSSA)
	sp.Budget, sp.NSink, sp.NLocal, sp.Seed, sp.Step = 200, 16, 16, 9, 3
	for l := 0; l < 2; l++ {
		for _, p := range []*DecodeParams{WithMethod(MethodDense), sp} {
			oa, ob := make([]float32, qLen), make([]float32, qLen)
			_, err := a.DecodeF32(l, q, oa, p)
			must(t, err)
			_, err = b.DecodeF32(l, q, ob, p)
			must(t, err)
			if !sameBits(oa, ob) {
				t.Fatalf("layer %d %v: async and plain appends decode differently", l, p.Method)
			}
		}
	}
}

func TestAppendPtrAsyncErrors(t *testing.T) {
	rt := cpuRuntime(t, 0)
	s := newSession(t, rt, 2, F32)
	kv := normals(rand.New(rand.NewSource(22)), 4*row, 1)
	p := unsafe.Pointer(&kv[0])
	var e *Error
	err := s.AppendPtrAsync(2, p, p, 4, 0)
	if !errors.As(err, &e) || e.Op != "ssa_session_append_async" || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad layer: %v", err)
	}
	err = s.AppendPtrAsync(-1, p, p, 4, 0)
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || e.Op != "" {
		t.Fatalf("negative layer: %v", err)
	}
	if err := s.AppendPtrAsync(0, nil, nil, 4, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil k/v: %v", err)
	}
	if s.LayerLen(0) != 0 {
		t.Fatal("failed append changed the layer")
	}
}

func TestDenseMatchesReference(t *testing.T) {
	rt := cpuRuntime(t, 0)
	s := newSession(t, rt, 2, F32)
	r := rand.New(rand.NewSource(2))
	k0, v0 := normals(r, 600*row, 1), normals(r, 600*row, 1)
	k1, v1 := normals(r, 200*row, 1), normals(r, 200*row, 1)
	must(t, s.AppendF32(0, k0[:100*row], v0[:100*row]))
	must(t, s.AppendF32(1, k1, v1))
	must(t, s.AppendF32(0, k0[100*row:], v0[100*row:]))
	q := normals(r, qLen, 2)
	out := make([]float32, qLen)
	st, err := s.DecodeF32(0, q, out, WithMethod(MethodDense))
	must(t, err)
	ref0 := reference(f64s(q), f64s(k0), f64s(v0), nQ, nKV, dim)
	if e := relErr(f64s(out), ref0); e > 1e-5 {
		t.Fatalf("layer 0 rel err %g", e)
	}
	if st.ContextTokens != 600 || st.TokensRead != 600*nQ {
		t.Fatalf("stats %+v", st)
	}
	_, err = s.DecodeF32(1, q, out, WithMethod(MethodDense))
	must(t, err)
	if e := relErr(f64s(out), reference(f64s(q), f64s(k1), f64s(v1), nQ, nKV, dim)); e > 1e-5 {
		t.Fatalf("layer 1 rel err %g", e)
	}
}

func TestDenseF16(t *testing.T) {
	rt := cpuRuntime(t, 0)
	s := newSession(t, rt, 1, F16)
	r := rand.New(rand.NewSource(3))
	enc := func(x []float32) []uint16 {
		o := make([]uint16, len(x))
		for i, v := range x {
			o[i] = f32ToF16(v)
		}
		return o
	}
	dec := func(x []uint16) []float64 {
		o := make([]float64, len(x))
		for i, v := range x {
			o[i] = f16ToF64(v)
		}
		return o
	}
	k, v, q := enc(normals(r, 300*row, 1)), enc(normals(r, 300*row, 1)), enc(normals(r, qLen, 2))
	must(t, s.AppendU16(0, k, v))
	out := make([]uint16, qLen)
	_, err := s.DecodeU16(0, q, out, WithMethod(MethodDense))
	must(t, err)
	if e := relErr(dec(out), reference(dec(q), dec(k), dec(v), nQ, nKV, dim)); e > 2e-3 {
		t.Fatalf("f16 rel err %g", e)
	}
	if _, err := s.DecodeF32(0, make([]float32, qLen), make([]float32, qLen), nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("float32 q in an F16 session: %v", err)
	}
}

func TestBudgetCoveringContextIsDense(t *testing.T) {
	rt := cpuRuntime(t, 0)
	s := newSession(t, rt, 1, F32)
	r := rand.New(rand.NewSource(4))
	k, v := clustered(r, 800, 5), normals(r, 800*row, 1)
	must(t, s.AppendF32(0, k, v))
	q := normals(r, qLen, 2)
	ref := reference(f64s(q), f64s(k), f64s(v), nQ, nKV, dim)
	out := make([]float32, qLen)
	for _, m := range Methods {
		for _, budget := range []uint32{800, 5000} {
			p := WithMethod(m)
			p.Budget, p.NSink, p.NLocal, p.Seed, p.Step = budget, 16, 16, 5, 1
			_, err := s.DecodeF32(0, q, out, p)
			must(t, err)
			if e := relErr(f64s(out), ref); e > 1e-5 {
				t.Errorf("%v budget %d: rel err %g", m, budget, e)
			}
		}
	}
}

func peakedSession(t *testing.T, rt *Runtime, seed int64) (*Session, []float32) {
	s := newSession(t, rt, 1, F32)
	r := rand.New(rand.NewSource(seed))
	k := clustered(r, 4096, 8)
	must(t, s.AppendF32(0, k, normals(r, 4096*row, 1)))
	q := make([]float32, qLen)
	for h := 0; h < nQ; h++ {
		kh := h / (nQ / nKV)
		for e := 0; e < dim; e++ {
			q[h*dim+e] = 0.6*k[(17*nKV+kh)*dim+e] + float32(0.2*r.NormFloat64())
		}
	}
	return s, q
}

func TestSparseBudgetAndReproducibility(t *testing.T) {
	rt := cpuRuntime(t, 321)
	s, q := peakedSession(t, rt, 5)
	for _, m := range Methods[1:] {
		p := WithMethod(m)
		p.Budget, p.NSink, p.NLocal, p.Seed, p.Step = 400, 16, 16, 42, 7
		a, b := make([]float32, qLen), make([]float32, qLen)
		st, err := s.DecodeF32(0, q, a, p)
		must(t, err)
		if st.TokensRead == 0 || st.TokensRead > 400*nQ || st.ContextTokens != 4096 {
			t.Errorf("%v: stats %+v", m, st)
		}
		_, err = s.DecodeF32(0, q, b, p)
		must(t, err)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%v: same seed and step differ", m)
		}
		sampled := m != MethodOracleTopK && m != MethodPQTopK
		p2 := *p
		p2.Step = 8
		_, err = s.DecodeF32(0, q, b, &p2)
		must(t, err)
		if sampled == reflect.DeepEqual(a, b) {
			t.Errorf("%v: another step gave equal=%v, sampled=%v", m, reflect.DeepEqual(a, b), sampled)
		}
		// Seed 0 means the runtime's seed (321).
		p3 := *p
		p3.Seed = 0
		p4 := *p
		p4.Seed = 321
		c, d := make([]float32, qLen), make([]float32, qLen)
		_, err = s.DecodeF32(0, q, c, &p3)
		must(t, err)
		_, err = s.DecodeF32(0, q, d, &p4)
		must(t, err)
		if !reflect.DeepEqual(c, d) {
			t.Errorf("%v: seed 0 is not the runtime seed", m)
		}
	}
}

func TestWindowOnlyHeads(t *testing.T) {
	rt := cpuRuntime(t, 321)
	s, q := peakedSession(t, rt, 9)
	out := make([]float32, qLen)
	// 4096 / 50 = 82 tokens: below the default 128 + 128.
	st, err := s.DecodeF32(0, q, out, WithMethod(MethodSSA))
	must(t, err)
	if st.WindowOnlyHeads != nQ || st.HeavyTokens != 0 || st.Draws != 0 || st.TokensRead != 256*nQ {
		t.Errorf("budget below sink + local: stats %+v", st)
	}
	for _, m := range []Method{MethodDense, MethodSSA} {
		p := WithMethod(m)
		p.Budget = 400
		st, err := s.DecodeF32(0, q, out, p)
		must(t, err)
		if st.WindowOnlyHeads != 0 {
			t.Errorf("%v with budget 400: stats %+v", m, st)
		}
	}
}

func TestConcurrentDecodes(t *testing.T) {
	rt := cpuRuntime(t, 0)
	s, q := peakedSession(t, rt, 6)
	params := func(i int) *DecodeParams {
		p := WithMethod(MethodSSA)
		p.Budget, p.NSink, p.NLocal, p.Seed, p.Step = 256, 16, 16, 3, uint64(i)
		return p
	}
	serial := make([][]float32, 6)
	for i := range serial {
		serial[i] = make([]float32, qLen)
		_, err := s.DecodeF32(0, q, serial[i], params(i))
		must(t, err)
	}
	par := make([][]float32, 6)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range par {
		par[i] = make([]float32, qLen)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = s.DecodeF32(0, q, par[i], params(i))
		}(i)
	}
	wg.Wait()
	for i := range par {
		must(t, errs[i])
		if !reflect.DeepEqual(serial[i], par[i]) {
			t.Errorf("decode %d differs under concurrency", i)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	rt := cpuRuntime(t, 0)
	s := newSession(t, rt, 1, F32)
	q, out := make([]float32, qLen), make([]float32, qLen)
	for i := range q {
		q[i] = 0.01 * float32(i%13+1)
	}
	if _, err := s.DecodeF32(0, q, out, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty layer: %v", err)
	}
	r := rand.New(rand.NewSource(9))
	kv := normals(r, 10*row, 1)
	must(t, s.AppendF32(0, kv, kv))
	if _, err := s.DecodeF32(0, q[:5], out, nil); err == nil {
		t.Fatal("short q accepted")
	}
	if _, err := s.DecodeF32(0, q, q, nil); err == nil {
		t.Fatal("overlapping q and out accepted")
	}
	for _, mod := range []func(*DecodeParams){
		func(p *DecodeParams) { p.Sparsity = 0.5 },
		func(p *DecodeParams) { p.HeavyFraction = 2 },
		func(p *DecodeParams) { p.Method = Method(99) },
	} {
		p := DefaultDecodeParams()
		mod(&p)
		_, err := s.DecodeF32(0, q, out, &p)
		var e *Error
		if !errors.As(err, &e) || e.Op != "ssa_decode" || e.Status != ErrInvalidArgument {
			t.Errorf("params %+v: %v", p, err)
		}
	}
}

func TestForkTruncate(t *testing.T) {
	rt := cpuRuntime(t, 0)
	s := newSession(t, rt, 2, F32)
	r := rand.New(rand.NewSource(10))
	k, v := clustered(r, 2000, 4), normals(r, 2000*row, 1)
	for l := 0; l < 2; l++ {
		must(t, s.AppendF32(l, k, v))
	}
	q := normals(r, qLen, 1.5)
	before := make([]float32, qLen)
	_, err := s.DecodeF32(0, q, before, WithMethod(MethodDense))
	must(t, err)
	f, err := s.Fork()
	must(t, err)
	defer f.Close()
	must(t, f.Truncate(1200))
	extra := normals(r, 50*row, 1)
	must(t, f.AppendF32(0, extra, extra))
	if f.LayerLen(0) != 1250 || s.LayerLen(0) != 2000 {
		t.Fatalf("fork %d source %d", f.LayerLen(0), s.LayerLen(0))
	}
	after := make([]float32, qLen)
	_, err = s.DecodeF32(0, q, after, WithMethod(MethodDense))
	must(t, err)
	if !reflect.DeepEqual(before, after) {
		t.Fatal("mutating the fork changed the source")
	}
	// truncated fork == fresh session with the same prefix
	fresh := newSession(t, rt, 2, F32)
	must(t, fresh.AppendF32(1, k[:1200*row], v[:1200*row]))
	a, b := make([]float32, qLen), make([]float32, qLen)
	_, err = f.DecodeF32(1, q, a, WithMethod(MethodDense))
	must(t, err)
	_, err = fresh.DecodeF32(1, q, b, WithMethod(MethodDense))
	must(t, err)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("truncate differs from a fresh prefix")
	}
	if e := relErr(f64s(a), reference(f64s(q), f64s(k[:1200*row]), f64s(v[:1200*row]), nQ, nKV, dim)); e > 1e-5 {
		t.Fatalf("rel err %g", e)
	}
	if err := s.Truncate(2001); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("truncate past the end: %v", err)
	}
	must(t, s.UpdateIndex())
}

func TestBatch(t *testing.T) {
	rt := cpuRuntime(t, 0)
	r := rand.New(rand.NewSource(11))
	a, b := newSession(t, rt, 1, F32), newSession(t, rt, 1, F32)
	ka, va := normals(r, 300*row, 1), normals(r, 300*row, 1)
	kb, vb := normals(r, 900*row, 1), normals(r, 900*row, 1)
	must(t, a.AppendF32(0, ka, va))
	must(t, b.AppendF32(0, kb, vb))
	qa, qb := normals(r, qLen, 1.5), normals(r, qLen, 1.5)
	items := []BatchItemF32{{a, qa, make([]float32, qLen)}, {b, qb, make([]float32, qLen)}, {a, qa, make([]float32, qLen)}}
	must(t, rt.DecodeBatchF32(items, 0, WithMethod(MethodDense)))
	if e := relErr(f64s(items[0].Out), reference(f64s(qa), f64s(ka), f64s(va), nQ, nKV, dim)); e > 1e-5 {
		t.Fatalf("item 0 rel err %g", e)
	}
	if e := relErr(f64s(items[1].Out), reference(f64s(qb), f64s(kb), f64s(vb), nQ, nKV, dim)); e > 1e-5 {
		t.Fatalf("item 1 rel err %g", e)
	}
	p := WithMethod(MethodSSA)
	p.Budget, p.NSink, p.NLocal, p.Seed, p.Step = 64, 8, 8, 9, 2
	must(t, rt.DecodeBatchF32(items, 0, p))
	single := make([]float32, qLen)
	_, err := b.DecodeF32(0, qb, single, p)
	must(t, err)
	if !reflect.DeepEqual(single, items[1].Out) || !reflect.DeepEqual(items[0].Out, items[2].Out) {
		t.Fatal("batch differs from single decodes")
	}
	other := cpuRuntime(t, 0)
	c := newSession(t, other, 1, F32)
	must(t, c.AppendF32(0, ka, va))
	if err := rt.DecodeBatchF32([]BatchItemF32{{c, qa, make([]float32, qLen)}}, 0, nil); err == nil {
		t.Fatal("session of another runtime accepted")
	}
	if err := rt.DecodeBatchF32([]BatchItemF32{{a, qa[:3], make([]float32, qLen)}}, 0, nil); err == nil {
		t.Fatal("short q accepted")
	}
	err = rt.DecodeBatchF32([]BatchItemF32{{a, qa, make([]float32, qLen)}}, 4, nil)
	var e *Error
	if !errors.As(err, &e) || e.Op != "ssa_decode_batch" {
		t.Fatalf("bad layer: %v", err)
	}
}

// Batches while the collector runs: the binding stores Go-typed pointer fields
// into C memory, and the write barrier reads what each field held before. Single
// decodes in between leave Go addresses (their q and out) in freed C memory that
// a batch's staging can reuse; left uninitialised, the collector finds them.
func TestBatchDuringCollection(t *testing.T) {
	rt := cpuRuntime(t, 0)
	r := rand.New(rand.NewSource(21))
	a, b := newSession(t, rt, 1, F32), newSession(t, rt, 1, F32)
	kv := normals(r, 200*row, 1)
	must(t, a.AppendF32(0, kv, kv))
	must(t, b.AppendF32(0, kv, kv))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
			}
		}
	}()
	p := WithMethod(MethodDense)
	for i := 0; i < 3000; i++ {
		q := normals(r, qLen, 1)
		single := make([]float32, qLen)
		_, err := a.DecodeF32(0, q, single, p)
		must(t, err)
		// Batches of 1 to 6 items: item arrays of several allocation sizes.
		items := make([]BatchItemF32, 1+i%6)
		for j := range items {
			items[j] = BatchItemF32{[]*Session{a, b}[j%2], q, make([]float32, qLen)}
		}
		must(t, rt.DecodeBatchF32(items, 0, p))
		if !reflect.DeepEqual(items[0].Out, single) {
			t.Fatalf("batch %d differs from the single decode", i)
		}
	}
	close(stop)
	<-done
}

func TestCloseOrder(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{Backend: BackendCPU, Threads: 1})
	must(t, err)
	s, err := rt.NewSession(NewSessionConfig(1, nQ, nKV, dim, F32))
	must(t, err)
	must(t, rt.Close()) // deferred until the session closes
	r := rand.New(rand.NewSource(12))
	kv := normals(r, 5*row, 1)
	must(t, s.AppendF32(0, kv, kv))
	if _, err := rt.NewSession(NewSessionConfig(1, nQ, nKV, dim, F32)); err == nil {
		t.Fatal("closed runtime made a session")
	}
	must(t, s.Close())
	must(t, s.Close())
	if rt.ptr != nil {
		t.Fatal("runtime not freed with its last session")
	}
	if err := s.AppendF32(0, kv, kv); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("closed session: %v", err)
	}
}

func TestSnapshotRoundTripOrUnsupported(t *testing.T) {
	rt := cpuRuntime(t, 0)
	s := newSession(t, rt, 2, F32)
	r := rand.New(rand.NewSource(13))
	k, v := clustered(r, 1500, 5), normals(r, 1500*row, 1)
	for l := 0; l < 2; l++ {
		must(t, s.AppendF32(l, k, v))
	}
	path := filepath.Join(t.TempDir(), "s.ssa")
	if err := s.Save(path); err != nil {
		if !errors.Is(err, ErrUnsupported) {
			t.Fatalf("save: %v", err)
		}
		if _, statErr := os.Stat(path); statErr == nil {
			t.Fatal("unsupported save left a file")
		}
		t.Skipf("snapshots unsupported by this libssa build: %v", err)
	}
	q := normals(r, qLen, 1.5)
	for _, opts := range []LoadOptions{{}, {Verify: true}, {Mmap: true}} {
		l, err := rt.Load(path, opts)
		must(t, err)
		if l.Len() != s.Len() || l.Config() != s.Config() {
			t.Fatalf("loaded %d tokens, config %+v", l.Len(), l.Config())
		}
		for _, m := range Methods {
			p := WithMethod(m)
			p.Budget, p.NSink, p.NLocal, p.Seed, p.Step = 200, 16, 16, 5, 9
			a, b := make([]float32, qLen), make([]float32, qLen)
			_, err := s.DecodeF32(0, q, a, p)
			must(t, err)
			_, err = l.DecodeF32(0, q, b, p)
			must(t, err)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("%v differs after load %+v", m, opts)
			}
		}
		l.Close()
	}
	info, err := Inspect(path)
	must(t, err)
	c := s.Config()
	if info.Layers != c.Layers || info.QHeads != c.QHeads || info.KVHeads != c.KVHeads || info.HeadDim != c.HeadDim ||
		info.DType != c.DType || info.PQSubspaces != c.PQSubspaces || info.PageTokens != c.PageTokens ||
		info.Length != 1500 || info.MaxLayerLength != 1500 || info.Generation != 1 ||
		info.LiveBytes == 0 || info.LiveBytes > info.FileBytes {
		t.Fatalf("inspect: %+v for config %+v", info, c)
	}
	extra := normals(r, 100*row, 1)
	must(t, s.AppendF32(0, extra, extra))
	must(t, s.Checkpoint(path))
	if info, err = Inspect(path); err != nil || info.Generation != 2 || info.Length != 1500 || info.MaxLayerLength != 1600 {
		t.Fatalf("inspect after a checkpoint: %+v, %v", info, err)
	}
	l, err := rt.Load(path, LoadOptions{Verify: true})
	must(t, err)
	defer l.Close()
	if l.LayerLen(0) != 1600 {
		t.Fatalf("checkpoint lost tokens: %d", l.LayerLen(0))
	}
	data, _ := os.ReadFile(path)
	cut := filepath.Join(t.TempDir(), "cut.ssa")
	must(t, os.WriteFile(cut, data[:len(data)/3], 0o644))
	if _, err := rt.Load(cut, LoadOptions{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated file: %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	rt := cpuRuntime(t, 0)
	_, err := rt.Load(filepath.Join(t.TempDir(), "missing.ssa"), LoadOptions{})
	if !errors.Is(err, ErrIO) && !errors.Is(err, ErrUnsupported) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := rt.Load("a\x00b", LoadOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("NUL in path: %v", err)
	}
	if _, err := Inspect(filepath.Join(t.TempDir(), "missing.ssa")); !errors.Is(err, ErrIO) {
		t.Fatalf("inspect of a missing file: %v", err)
	}
	if _, err := Inspect("a\x00b"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("inspect, NUL in path: %v", err)
	}
}

// Error-targeted decode: each head picks its budget; a tighter target reads
// more rows; the error against DENSE stays near the target; bad values fail.
func TestErrorTarget(t *testing.T) {
	rt := cpuRuntime(t, 5)
	s, q := peakedSession(t, rt, 11)
	dense := make([]float32, qLen)
	_, err := s.DecodeF32(0, q, dense, WithMethod(MethodDense))
	must(t, err)
	ref := make([]float64, qLen)
	for i, x := range dense {
		ref[i] = float64(x)
	}
	budgets := map[float32]uint64{}
	for _, eps := range []float32{0.05, 0.2} {
		p := WithMethod(MethodSSA)
		p.NSink, p.NLocal, p.TargetError, p.TargetDelta, p.MaxBudget = 16, 16, eps, 0.1, 4096
		out := make([]float32, qLen)
		st, err := s.DecodeF32(0, q, out, p)
		must(t, err)
		got := make([]float64, qLen)
		for i, x := range out {
			got[i] = float64(x)
		}
		if st.TargetBudget == 0 || st.TokensRead > st.TargetBudget || st.PredictedError <= 0 || st.CappedHeads != 0 {
			t.Errorf("eps %g: stats %+v", eps, st)
		}
		// The bound holds per head with probability 0.9; over all heads the error
		// stays well within twice the target.
		if e := relErr(got, ref); e > 2*float64(eps) {
			t.Errorf("eps %g: rel err %g", eps, e)
		}
		budgets[eps] = st.TargetBudget
	}
	if budgets[0.05] <= budgets[0.2] {
		t.Errorf("a tighter target did not read more: %v", budgets)
	}
	for _, mod := range []func(*DecodeParams){
		func(p *DecodeParams) { p.TargetError = -1 },
		func(p *DecodeParams) { p.TargetError, p.TargetDelta = 0.1, 1.5 },
		func(p *DecodeParams) { p.TargetError, p.Method = 0.1, MethodPQTopK },
	} {
		p := DefaultDecodeParams()
		mod(&p)
		_, err := s.DecodeF32(0, q, make([]float32, qLen), &p)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("params %+v: %v", p, err)
		}
	}
}

func TestGroupSelection(t *testing.T) {
	rt := cpuRuntime(t, 77)
	s, q := peakedSession(t, rt, 9)
	const g = nQ / nKV
	dense := make([]float32, qLen)
	_, err := s.DecodeF32(0, q, dense, WithMethod(MethodDense))
	must(t, err)
	for _, grp := range []GroupSelection{GroupMixture, GroupMeanQuery} {
		for _, m := range Methods[2:] {
			p := WithMethod(m)
			p.GroupSelection, p.Budget = grp, 4096
			out := make([]float32, qLen)
			_, err := s.DecodeF32(0, q, out, p)
			must(t, err)
			if e := relErr(f64s(out), f64s(dense)); e > 1e-6 {
				t.Errorf("%v %v at full budget: rel err %g", grp, m, e)
			}
			p.Budget, p.NSink, p.NLocal, p.Seed, p.Step = 400, 16, 16, 5, 2
			st, err := s.DecodeF32(0, q, out, p)
			must(t, err)
			// Every head of a group uses the group's rows: at most g * k' of them.
			if st.TokensRead > nQ*(32+g*(400-32)) {
				t.Errorf("%v %v: %d rows read", grp, m, st.TokensRead)
			}
			if m == MethodPQTopK && st.HeavyTokens != nQ*g*(400-32) {
				t.Errorf("%v: heavy %d", grp, st.HeavyTokens)
			}
		}
	}
	p := WithMethod(MethodSSA)
	p.GroupSelection, p.TargetError = GroupMixture, 0.05
	if _, err := s.DecodeF32(0, q, make([]float32, qLen), p); !errors.Is(err, ErrUnsupported) {
		t.Errorf("group selection with an error target: %v", err)
	}
	p.GroupSelection, p.TargetError = GroupSelection(7), 0
	if _, err := s.DecodeF32(0, q, make([]float32, qLen), p); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("unknown group selection: %v", err)
	}
}

func TestShardedRuntimeDecodesAsUnsharded(t *testing.T) {
	one := cpuRuntime(t, 5)
	three, err := NewRuntime(&RuntimeOptions{Backend: BackendCPU, Threads: 2, Seed: 5, Devices: []int{3, 0, 8}, ShardTokens: 8192})
	if err != nil {
		t.Fatal(err)
	}
	defer three.Close()
	if one.Shards() != 1 || three.Shards() != 3 {
		t.Fatalf("shards %d %d", one.Shards(), three.Shards())
	}
	r := rand.New(rand.NewSource(4))
	const n = 20000
	k, v, q := normals(r, n*row, 1), normals(r, n*row, 1), normals(r, qLen, 2)
	var outs [2][][]float32
	for i, rt := range []*Runtime{one, three} {
		s := newSession(t, rt, 1, F32)
		must(t, s.AppendF32(0, k[:9000*row], v[:9000*row]))
		must(t, s.AppendF32(0, k[9000*row:], v[9000*row:]))
		for _, m := range []Method{MethodDense, MethodPQTopK, MethodSSA, MethodSSAAdaptive} {
			p := DefaultDecodeParams()
			p.Method, p.Budget, p.Step = m, 600, 2
			out := make([]float32, qLen)
			if _, err := s.DecodeF32(0, q, out, &p); err != nil {
				t.Fatal(err)
			}
			outs[i] = append(outs[i], out)
		}
	}
	for j := range outs[0] {
		for e := range outs[0][j] {
			if math.Float32bits(outs[0][j][e]) != math.Float32bits(outs[1][j][e]) {
				t.Fatalf("method %d element %d: %v vs %v", j, e, outs[0][j][e], outs[1][j][e])
			}
		}
	}
	if _, err := NewRuntime(&RuntimeOptions{Backend: BackendCPU, Devices: []int{2, 2}}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("duplicate devices: %v", err)
	}
}

// Every proxy through the config: it reaches the library (the session's config,
// Inspect of its file, the loaded session), the query-aware ones take the
// queries shown with ObserveQueriesF32 and the others refuse them, and a loaded
// session decodes as the saved one.
func TestProxiesObserveQueriesInspect(t *testing.T) {
	rt := cpuRuntime(t, 3)
	r := rand.New(rand.NewSource(21))
	const qh, kvh, d, n = 4, 2, 32, 700
	k, v := normals(r, n*kvh*d, 1), normals(r, n*kvh*d, 1)
	shown := normals(r, 40*qh*d, 1)
	q := normals(r, qh*d, 1)
	params := WithMethod(MethodPQTopK)
	params.Budget, params.NSink, params.NLocal = 40, 4, 4
	for _, p := range []Proxy{ProxyPQ, ProxyOPQ, ProxyPQ4, ProxyOPQ4, ProxyQPQ, ProxyQPQ4} {
		cfg := NewSessionConfig(1, qh, kvh, d, F32)
		cfg.Proxy, cfg.IndexMinTokens, cfg.IndexTrainSample = p, n, n
		cfg.PQSubspaces, cfg.PQCentroids = 8, 256
		if p == ProxyPQ4 || p == ProxyOPQ4 || p == ProxyQPQ4 {
			cfg.PQSubspaces, cfg.PQCentroids = 16, 16
		}
		s, err := rt.NewSession(cfg)
		must(t, err)
		queryAware := p == ProxyQPQ || p == ProxyQPQ4
		err = s.ObserveQueriesF32(0, shown)
		if queryAware {
			must(t, err)
		} else if !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%v: observing queries: %v, want ErrInvalidArgument", p, err)
		}
		if err := s.ObserveQueriesF32(0, shown[:qh*d+1]); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%v: a partial query: %v", p, err)
		}
		must(t, s.AppendF32(0, k, v)) // trains the index
		if s.Config().Proxy != p || s.Config().PQParallelWeight != 1 {
			t.Fatalf("config %+v", s.Config())
		}
		path := filepath.Join(t.TempDir(), "p.ssa")
		must(t, s.Save(path))
		info, err := Inspect(path)
		must(t, err)
		if info.Proxy != p || info.PQParallelWeight != 1 || info.IndexedLayers != 1 {
			t.Fatalf("%v: inspect %+v", p, info)
		}
		l, err := rt.Load(path, LoadOptions{Verify: true})
		must(t, err)
		if l.Config().Proxy != p {
			t.Fatalf("%v: loaded as %v", p, l.Config().Proxy)
		}
		a, b := make([]float32, qh*d), make([]float32, qh*d)
		_, err = s.DecodeF32(0, q, a, params)
		must(t, err)
		_, err = l.DecodeF32(0, q, b, params)
		must(t, err)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%v: loaded session decodes %g at %d, saved %g", p, b[i], i, a[i])
			}
		}
		l.Close()
		s.Close()
	}
	if ProxyQPQ4.String() != "SSA_PROXY_QPQ4" || Proxy(99).String() != "ssa_proxy(99)" {
		t.Fatalf("names: %s %s", ProxyQPQ4, Proxy(99))
	}
}
