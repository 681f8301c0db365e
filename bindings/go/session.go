package ssa

/*
#include <stdlib.h>
#include <string.h>
#include <ssa.h>
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Session is one long-lived KV store: one sequence, all layers of a model.
//
// Decodes may run from many goroutines at once; Append, UpdateIndex and Truncate
// take the session exclusively inside the library (they wait for running decodes).
// Close waits for calls in flight and then frees the session.
type Session struct {
	mu         sync.RWMutex // Close takes it exclusively; every other call shares it
	ptr        *C.ssa_session
	rt         *Runtime
	cfg        SessionConfig
	devicePtrs bool
}

// Close frees the session (and the runtime, if it was closed and this was its last
// session). Idempotent.
func (s *Session) Close() error {
	s.mu.Lock()
	p := s.ptr
	s.ptr = nil
	s.mu.Unlock()
	if p != nil {
		C.ssa_session_destroy(p)
		runtime.SetFinalizer(s, nil)
		s.rt.release()
	}
	return nil
}

// use runs f with the session's handle while holding the shared lock, on one OS
// thread (the error message is thread-local).
func (s *Session) use(f func(p *C.ssa_session) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ptr == nil {
		return invalid("session is closed")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return f(s.ptr)
}

// Config is the configuration as the library resolved it.
func (s *Session) Config() SessionConfig { return s.cfg }

// Runtime is the runtime the session lives on.
func (s *Session) Runtime() *Runtime { return s.rt }

// TakesDevicePointers reports whether K, V, q and out must be device pointers (a CUDA
// session without HostPointers); then only the *Ptr methods can be used.
func (s *Session) TakesDevicePointers() bool { return s.devicePtrs }

// Len is the number of tokens present in every layer (0 if closed).
func (s *Session) Len() uint64 {
	var n uint64
	_ = s.use(func(p *C.ssa_session) error { n = uint64(C.ssa_session_length(p)); return nil })
	return n
}

// LayerLen is the number of tokens in one layer (0 if out of range or closed).
func (s *Session) LayerLen(layer int) uint64 {
	if layer < 0 || layer >= s.cfg.Layers {
		return 0
	}
	var n uint64
	_ = s.use(func(p *C.ssa_session) error {
		n = uint64(C.ssa_session_layer_length(p, C.uint32_t(layer)))
		return nil
	})
	return n
}

func (s *Session) hostElems(isF32 bool) error {
	if s.devicePtrs {
		return invalid("this CUDA session takes device pointers: use AppendPtr/DecodePtr or HostPointers")
	}
	if isF32 && s.cfg.DType != F32 {
		return invalid("[]float32 data does not fit a %s session (use []uint16 bits)", s.cfg.DType)
	}
	if !isF32 && s.cfg.DType == F32 {
		return invalid("[]uint16 data does not fit a %s session (use []float32)", s.cfg.DType)
	}
	return nil
}

func layerArg(layer int) (C.uint32_t, error) {
	if layer < 0 || layer > 0xffffffff {
		return 0, invalid("layer %d is out of range", layer)
	}
	return C.uint32_t(layer), nil
}

func (s *Session) appendSlices(layer int, nk, nv int, k, v unsafe.Pointer, isF32 bool) error {
	if err := s.hostElems(isF32); err != nil {
		return err
	}
	row := s.cfg.KVHeads * s.cfg.HeadDim
	if nk%row != 0 {
		return invalid("k has %d elements, not a multiple of KVHeads*HeadDim = %d", nk, row)
	}
	if nv != nk {
		return invalid("v has %d elements but k has %d", nv, nk)
	}
	if nk == 0 {
		return nil
	}
	return s.AppendPtr(layer, k, v, uint64(nk/row))
}

// AppendF32 appends tokens to one layer of an F32 session. k and v are
// [n_tokens][KVHeads][HeadDim] flattened. All-or-nothing.
func (s *Session) AppendF32(layer int, k, v []float32) error {
	return appendHost(s, layer, k, v, true)
}

// AppendU16 appends tokens to one layer of an F16 or BF16 session (raw bits).
func (s *Session) AppendU16(layer int, k, v []uint16) error {
	return appendHost(s, layer, k, v, false)
}

// hostElem is an element type of host K, V, q and out: float32 for F32 sessions,
// uint16 (raw bits) for F16 and BF16 sessions.
type hostElem interface{ float32 | uint16 }

func appendHost[T hostElem](s *Session, layer int, k, v []T, f32 bool) error {
	var kp, vp unsafe.Pointer
	if len(k) > 0 && len(v) > 0 {
		kp, vp = unsafe.Pointer(&k[0]), unsafe.Pointer(&v[0])
	}
	err := s.appendSlices(layer, len(k), len(v), kp, vp, f32)
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	return err
}

// ObserveQueriesF32 shows one layer of an F32 session n queries, q
// [n][QHeads][HeadDim] flattened, for the query-aware proxies to learn from
// (ssa_session_observe_queries): the layer's next index training uses them.
func (s *Session) ObserveQueriesF32(layer int, q []float32) error {
	return observeHost(s, layer, q, true)
}

// ObserveQueriesU16 is ObserveQueriesF32 for F16 and BF16 sessions (raw bits).
func (s *Session) ObserveQueriesU16(layer int, q []uint16) error {
	return observeHost(s, layer, q, false)
}

func observeHost[T hostElem](s *Session, layer int, q []T, f32 bool) error {
	if err := s.hostElems(f32); err != nil {
		return err
	}
	row := s.cfg.QHeads * s.cfg.HeadDim
	if len(q)%row != 0 {
		return invalid("q has %d elements, not a multiple of QHeads*HeadDim = %d", len(q), row)
	}
	if len(q) == 0 {
		return nil
	}
	err := s.ObserveQueriesPtr(layer, unsafe.Pointer(&q[0]), uint64(len(q)/row))
	runtime.KeepAlive(q)
	return err
}

// ObserveQueriesPtr shows n queries from a pointer in the session's memory
// space (device pointers for CUDA sessions). The caller guarantees its size.
func (s *Session) ObserveQueriesPtr(layer int, q unsafe.Pointer, n uint64) error {
	l, err := layerArg(layer)
	if err != nil {
		return err
	}
	return s.use(func(p *C.ssa_session) error {
		return check(C.ssa_session_observe_queries(p, l, q, C.uint64_t(n)), "ssa_session_observe_queries")
	})
}

// AppendPtr appends nTokens tokens from pointers in the session's memory space
// (device pointers for CUDA sessions). The caller guarantees their sizes.
func (s *Session) AppendPtr(layer int, k, v unsafe.Pointer, nTokens uint64) error {
	l, err := layerArg(layer)
	if err != nil {
		return err
	}
	return s.use(func(p *C.ssa_session) error {
		return check(C.ssa_session_append(p, l, k, v, C.uint64_t(nTokens)), "ssa_session_append")
	})
}

// AppendPtrAsync is AppendPtr queued on a CUDA stream (a cudaStream_t; 0 = the
// legacy default stream) instead of waiting. For CUDA sessions it returns once the
// copy is queued: k and v must stay valid and unchanged until the stream gets there,
// and are not scanned for NaN/Inf. Appends that (re)train the index and HostPointers
// sessions wait for the stream and append as AppendPtr. CPU sessions: the same as
// AppendPtr (stream is not used).
func (s *Session) AppendPtrAsync(layer int, k, v unsafe.Pointer, nTokens uint64, stream uintptr) error {
	l, err := layerArg(layer)
	if err != nil {
		return err
	}
	st := *(*unsafe.Pointer)(unsafe.Pointer(&stream))
	return s.use(func(p *C.ssa_session) error {
		return check(C.ssa_session_append_async(p, l, k, v, C.uint64_t(nTokens), st), "ssa_session_append_async")
	})
}

// UpdateIndex (re)trains the PQ codebooks of every non-empty layer and re-encodes.
func (s *Session) UpdateIndex() error {
	return s.use(func(p *C.ssa_session) error {
		return check(C.ssa_session_update_index(p), "ssa_session_update_index")
	})
}

// Truncate keeps the first n tokens of every layer (agent rollback).
func (s *Session) Truncate(n uint64) error {
	return s.use(func(p *C.ssa_session) error {
		return check(C.ssa_session_truncate(p, C.uint64_t(n)), "ssa_session_truncate")
	})
}

// Fork makes an independent copy that shares pages copy-on-write.
func (s *Session) Fork() (*Session, error) {
	var out *C.ssa_session
	err := s.use(func(p *C.ssa_session) error {
		return check(C.ssa_session_fork(p, &out), "ssa_session_fork")
	})
	if err != nil {
		return nil, err
	}
	return s.rt.adopt(out)
}

// Save writes the whole session to path atomically.
func (s *Session) Save(path string) error {
	cpath, err := cString(path)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cpath))
	return s.use(func(p *C.ssa_session) error {
		return check(C.ssa_session_save(p, cpath), "ssa_session_save")
	})
}

// Checkpoint appends to path only what changed since the last save/checkpoint to it
// (a full save when path holds no snapshot of this session).
func (s *Session) Checkpoint(path string) error {
	cpath, err := cString(path)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cpath))
	return s.use(func(p *C.ssa_session) error {
		return check(C.ssa_session_checkpoint(p, cpath), "ssa_session_checkpoint")
	})
}

// DecodeParams are the parameters of a decode. Start from DefaultDecodeParams (the
// library's defaults); a nil *DecodeParams means the defaults too.
type DecodeParams struct {
	Method        Method
	Budget        uint32  // tokens per query head incl. sink+local; 0 = ceil(N / Sparsity)
	Sparsity      float32 // >= 1
	HeavyFraction float32 // in [0, 1]
	NSink, NLocal uint32
	PiMin         float32 // in (0, 1]
	Seed          uint64  // 0 = the runtime's seed
	Step          uint64  // RNG counter
	Stream        uintptr // cudaStream_t for CUDA sessions; 0 = default stream
	// Error-targeted decode (SSA and SSA_ADAPTIVE; not batched on CUDA sessions; see ssa.h):
	// TargetError > 0 asks each head for relative error <= TargetError with
	// probability >= 1 - TargetDelta, choosing its own budget up to MaxBudget
	// (0 = the library's default cap); Budget is then a floor.
	TargetError float32
	TargetDelta float32
	MaxBudget   uint32
	// GroupSelection > GroupOff selects once per KV group (see
	// docs/GROUP_SELECTION.md).
	GroupSelection GroupSelection
}

// DefaultDecodeParams returns the library's defaults (SSA, sparsity 50, ...).
func DefaultDecodeParams() DecodeParams {
	var p C.ssa_decode_params
	C.ssa_decode_params_init(&p)
	return DecodeParams{Method: Method(p.method), Budget: uint32(p.budget), Sparsity: float32(p.sparsity),
		HeavyFraction: float32(p.heavy_fraction), NSink: uint32(p.n_sink), NLocal: uint32(p.n_local),
		PiMin: float32(p.pi_min), Seed: uint64(p.seed), Step: uint64(p.step),
		TargetError: float32(p.target_error), TargetDelta: float32(p.target_delta), MaxBudget: uint32(p.max_budget),
		GroupSelection: GroupSelection(p.group_selection)}
}

// WithMethod returns the defaults with another method.
func WithMethod(m Method) *DecodeParams {
	p := DefaultDecodeParams()
	p.Method = m
	return &p
}

func (d *DecodeParams) toC() C.ssa_decode_params {
	var p C.ssa_decode_params
	C.ssa_decode_params_init(&p)
	if d == nil {
		return p
	}
	p.method = C.ssa_method(d.Method)
	p.budget = C.uint32_t(d.Budget)
	p.sparsity = C.float(d.Sparsity)
	p.heavy_fraction = C.float(d.HeavyFraction)
	p.n_sink = C.uint32_t(d.NSink)
	p.n_local = C.uint32_t(d.NLocal)
	p.pi_min = C.float(d.PiMin)
	p.seed = C.uint64_t(d.Seed)
	p.step = C.uint64_t(d.Step)
	p.stream = *(*unsafe.Pointer)(unsafe.Pointer(&d.Stream))
	p.target_error = C.float(d.TargetError)
	p.target_delta = C.float(d.TargetDelta)
	p.max_budget = C.uint32_t(d.MaxBudget)
	p.group_selection = C.uint32_t(d.GroupSelection)
	return p
}

// DecodeStats is what a decode did; sums are over query heads.
type DecodeStats struct {
	ContextTokens, TokensRead, HeavyTokens, Draws, UniqueSamples uint64
	ResidualProxyMass                                            float64
	ScoredTokens                                                 uint64
	// Error-targeted decode only (0 otherwise): the budgets the heads chose, the
	// heads that stopped at MaxBudget above the target, and the predicted error
	// bound, each summed over query heads.
	TargetBudget   uint64
	CappedHeads    uint32
	PredictedError float64
	// Query heads whose budget did not exceed sink + local on a longer context:
	// they read only those tokens (no sparse selection). Nonzero: raise the budget.
	WindowOnlyHeads uint32
	// Tiered CUDA sessions (RuntimeOptions.DeviceKVBudget): rows read over the bus
	// from host pages, and rows of host pages read from their device copy.
	RowsFromHost  uint64
	HostCacheHits uint64
}

func (s *Session) checkQ(nq, nout int) error {
	n := s.cfg.QHeads * s.cfg.HeadDim
	if nq != n {
		return invalid("q has %d elements, expected QHeads*HeadDim = %d", nq, n)
	}
	if nout != n {
		return invalid("out has %d elements, expected QHeads*HeadDim = %d", nout, n)
	}
	return nil
}

// DecodeF32 writes the attention output of one layer for query q into out
// ([QHeads][HeadDim] flattened) in an F32 session.
func (s *Session) DecodeF32(layer int, q, out []float32, params *DecodeParams) (DecodeStats, error) {
	return decodeHost(s, layer, q, out, params, true)
}

// DecodeU16 is DecodeF32 for F16 and BF16 sessions (raw bits).
func (s *Session) DecodeU16(layer int, q, out []uint16, params *DecodeParams) (DecodeStats, error) {
	return decodeHost(s, layer, q, out, params, false)
}

func decodeHost[T hostElem](s *Session, layer int, q, out []T, params *DecodeParams, f32 bool) (DecodeStats, error) {
	if err := s.hostElems(f32); err != nil {
		return DecodeStats{}, err
	}
	if err := s.checkQ(len(q), len(out)); err != nil {
		return DecodeStats{}, err
	}
	if &q[0] == &out[0] {
		return DecodeStats{}, invalid("q and out must not overlap")
	}
	st, err := s.DecodePtr(layer, unsafe.Pointer(&q[0]), unsafe.Pointer(&out[0]), params)
	runtime.KeepAlive(q)
	runtime.KeepAlive(out)
	return st, err
}

// DecodePtr decodes through pointers in the session's memory space (device pointers
// for CUDA sessions). The caller guarantees their sizes.
func (s *Session) DecodePtr(layer int, q, out unsafe.Pointer, params *DecodeParams) (DecodeStats, error) {
	l, err := layerArg(layer)
	if err != nil {
		return DecodeStats{}, err
	}
	p := params.toC()
	var st C.ssa_decode_stats
	C.ssa_decode_stats_init(&st)
	err = s.use(func(h *C.ssa_session) error {
		return check(C.ssa_decode(h, l, q, out, &p, &st), "ssa_decode")
	})
	if err != nil {
		return DecodeStats{}, err
	}
	return DecodeStats{uint64(st.context_tokens), uint64(st.tokens_read), uint64(st.heavy_tokens),
		uint64(st.draws), uint64(st.unique_samples), float64(st.residual_proxy_mass),
		uint64(st.scored_tokens), uint64(st.target_budget), uint32(st.capped_heads),
		float64(st.predicted_error), uint32(st.window_only_heads), uint64(st.rows_from_host),
		uint64(st.host_cache_hits)}, nil
}

// BatchItemF32 is one entry of Runtime.DecodeBatchF32.
type BatchItemF32 struct {
	Session *Session
	Q, Out  []float32
}

// BatchItemU16 is one entry of Runtime.DecodeBatchU16.
type BatchItemU16 struct {
	Session *Session
	Q, Out  []uint16
}

// DecodeBatchF32 decodes many F32 sessions of this runtime at one layer in one call.
func (r *Runtime) DecodeBatchF32(items []BatchItemF32, layer int, params *DecodeParams) error {
	b := make([]batchEntry, len(items))
	for i, it := range items {
		b[i] = batchEntry{it.Session, sliceData(it.Q), len(it.Q),
			sliceData(it.Out), len(it.Out), 4, true}
	}
	err := r.decodeBatch(b, layer, params)
	runtime.KeepAlive(items)
	return err
}

// DecodeBatchU16 decodes many F16/BF16 sessions of this runtime at one layer.
func (r *Runtime) DecodeBatchU16(items []BatchItemU16, layer int, params *DecodeParams) error {
	b := make([]batchEntry, len(items))
	for i, it := range items {
		b[i] = batchEntry{it.Session, sliceData(it.Q), len(it.Q),
			sliceData(it.Out), len(it.Out), 2, false}
	}
	err := r.decodeBatch(b, layer, params)
	runtime.KeepAlive(items)
	return err
}

func sliceData[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

type batchEntry struct {
	s       *Session
	q       unsafe.Pointer
	nq      int
	out     unsafe.Pointer
	nout    int
	elem    int
	isFloat bool
}

// decodeBatch stages q and out through C memory: cgo forbids handing C an array
// that holds Go pointers, and the item array is exactly that.
func (r *Runtime) decodeBatch(b []batchEntry, layer int, params *DecodeParams) error {
	l, err := layerArg(layer)
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	for i, e := range b {
		if e.s == nil {
			return invalid("item %d: nil session", i)
		}
		if e.s.rt != r {
			return invalid("item %d: session belongs to another runtime", i)
		}
		if err := e.s.hostElems(e.isFloat); err != nil {
			return invalid("item %d: %s", i, err.(*Error).Message)
		}
		if err := e.s.checkQ(e.nq, e.nout); err != nil {
			return invalid("item %d: %s", i, err.(*Error).Message)
		}
	}
	// Hold every distinct session's shared lock for the call.
	seen := map[*Session]bool{}
	for _, e := range b {
		if !seen[e.s] {
			seen[e.s] = true
			e.s.mu.RLock()
			defer e.s.mu.RUnlock()
			if e.s.ptr == nil {
				return invalid("a batch session is closed")
			}
		}
	}
	total := 0
	for _, e := range b {
		total += 2 * e.nq * e.elem
	}
	// Zeroed: storing a pointer field from Go runs the write barrier, which also
	// reads the field's old value as a pointer. Left from malloc, that value can be
	// a stale address inside the Go heap (a C buffer that once held a q or out
	// pointer of a single decode), and the collector then fails with "found bad
	// pointer in Go heap".
	items := (*[1 << 28]C.ssa_decode_item)(C.calloc(C.size_t(len(b)), C.size_t(unsafe.Sizeof(C.ssa_decode_item{}))))[:len(b):len(b)]
	defer C.free(unsafe.Pointer(&items[0]))
	buf := C.malloc(C.size_t(total))
	defer C.free(buf)
	off := uintptr(0)
	for i, e := range b {
		n := uintptr(e.nq * e.elem)
		qc := unsafe.Add(buf, off)
		oc := unsafe.Add(buf, off+n)
		off += 2 * n
		C.memcpy(qc, e.q, C.size_t(n))
		items[i].session = e.s.ptr
		items[i].q = qc
		items[i].out = oc
	}
	p := params.toC()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := check(C.ssa_decode_batch(&items[0], C.size_t(len(b)), l, &p), "ssa_decode_batch"); err != nil {
		return err
	}
	for i, e := range b {
		C.memcpy(e.out, items[i].out, C.size_t(e.nout*e.elem))
	}
	return nil
}
