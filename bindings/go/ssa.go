// Package ssa binds libssa: long-lived attention KV sessions with Stratified Sparse
// Attention decode.
//
// A Runtime picks the backend and CPU threads; a Session is one sequence's KV store
// over all layers of a model. Append K/V per layer, decode a query per layer (dense
// or one of the sparse methods), fork, truncate, save and load. Every handle has a
// Close method; a Session keeps its Runtime alive, so closing the Runtime first is
// safe (it is freed with its last session).
//
// Data is passed by pointer without copies: []float32 for F32 sessions, []uint16
// (raw bits) for F16 and BF16 sessions. Failing calls return an *Error that carries
// the Status and the library's message; errors.Is(err, ssa.ErrCorrupt) works.
//
// Build: cgo finds libssa with pkg-config (ssa.pc, installed by libssa's CMake).
package ssa

/*
#cgo pkg-config: ssa
#include <stdlib.h>
#include <string.h>
#include <ssa.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Error is a failing libssa call, or an argument refused by the binding before it.
type Error struct {
	Status  Status // the status; ErrInvalidArgument for binding-side checks
	Message string // ssa_last_error_message() or the binding's explanation
	Op      string // the C function that failed, "" for binding-side checks
}

func (e *Error) Error() string {
	if e.Op != "" {
		return fmt.Sprintf("%s: %s: %s", e.Op, e.Status, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Status, e.Message)
}

// Unwrap returns the Status, so errors.Is(err, ssa.ErrCorrupt) matches.
func (e *Error) Unwrap() error { return e.Status }

// Error makes a Status usable as a sentinel error value.
func (s Status) Error() string { return s.String() }

// String is the status's C name ("SSA_ERR_CORRUPT").
func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("ssa_status(%d)", uint32(s))
}

func (b Backend) String() string {
	if n, ok := backendNames[b]; ok {
		return n
	}
	return fmt.Sprintf("ssa_backend(%d)", uint32(b))
}

func (d DType) String() string {
	if n, ok := dTypeNames[d]; ok {
		return n
	}
	return fmt.Sprintf("ssa_dtype(%d)", uint32(d))
}

func (p Proxy) String() string {
	if n, ok := proxyNames[p]; ok {
		return n
	}
	return fmt.Sprintf("ssa_proxy(%d)", uint32(p))
}

func (m Method) String() string {
	if n, ok := methodNames[m]; ok {
		return n
	}
	return fmt.Sprintf("ssa_method(%d)", uint32(m))
}

// Methods lists every decode method in the header's order.
var Methods = []Method{MethodDense, MethodOracleTopK, MethodPQTopK, MethodHybridUniform,
	MethodSampling, MethodSSA, MethodSSAAdaptive}

// StatusName asks the library for a status's name (ssa_status_string).
func StatusName(s Status) string {
	return C.GoString(C.ssa_status_string(C.ssa_status(s)))
}

func invalid(format string, args ...any) error {
	return &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// check turns a status into an error. It must run on the OS thread that made the
// call (the message is thread-local), so callers lock the goroutine to its thread.
func check(st C.ssa_status, op string) error {
	if st == C.SSA_OK {
		return nil
	}
	return &Error{Status: Status(st), Message: C.GoString(C.ssa_last_error_message()), Op: op}
}

// Version returns (major, minor, patch) of the libssa actually loaded.
func Version() (int, int, int) {
	v := int(C.ssa_version())
	return v / 10000, (v / 100) % 100, v % 100
}

// RuntimeOptions configure NewRuntime. The zero value is the library's default except
// Seed 0, which keeps the library's default seed.
type RuntimeOptions struct {
	Backend Backend // BackendAuto (default), BackendCPU or BackendCUDA
	Device  int     // CUDA device ordinal
	Threads int     // CPU worker threads; 0 = hardware concurrency
	Seed    uint64  // default sampling seed; 0 = the library's default
	// Bytes of device memory the K/V pages of the runtime's CUDA sessions may use
	// (0 = no limit); pages beyond it live in pinned host memory.
	DeviceKVBudget uint64
	// The part of the budget for device copies of host pages read recently
	// (0 = an eighth of the budget).
	HostCacheBytes uint64
	// Sharded sessions (docs/SHARDING.md): one shard per entry, in shard order
	// (distinct ordinals; on the CPU backend they only name in-process shards).
	// Empty = one device, Device.
	Devices []int
	// Tokens a shard takes before the next one starts; 0 = the library's default
	// (1048576); else a multiple of 8192.
	ShardTokens uint64
	// Pinned host memory page-locked when the runtime is created, for the host
	// tier of its CUDA sessions (0 = none); a multiple of 64 MiB, only with a
	// DeviceKVBudget. CPU runtimes check it and ignore it.
	HostPoolBytes uint64
}

// Runtime is a libssa runtime. It may be used from any number of goroutines.
type Runtime struct {
	mu       sync.Mutex
	ptr      *C.ssa_runtime
	sessions int
	closing  bool
	device   int
}

// NewRuntime creates a runtime; opts nil means defaults.
func NewRuntime(opts *RuntimeOptions) (*Runtime, error) {
	var o C.ssa_runtime_options
	C.ssa_runtime_options_init(&o)
	device := 0
	if opts != nil {
		o.backend = C.ssa_backend(opts.Backend)
		o.device = C.int32_t(opts.Device)
		o.num_threads = C.int32_t(opts.Threads)
		if opts.Seed != 0 {
			o.seed = C.uint64_t(opts.Seed)
		}
		o.device_kv_budget = C.uint64_t(opts.DeviceKVBudget)
		o.host_cache_bytes = C.uint64_t(opts.HostCacheBytes)
		o.shard_tokens = C.uint64_t(opts.ShardTokens)
		o.host_pool_bytes = C.uint64_t(opts.HostPoolBytes)
		if len(opts.Devices) > 0 {
			// C memory: the options struct may not hold a Go pointer.
			list := (*C.int32_t)(C.malloc(C.size_t(len(opts.Devices)) * C.size_t(unsafe.Sizeof(C.int32_t(0)))))
			defer C.free(unsafe.Pointer(list))
			items := unsafe.Slice(list, len(opts.Devices))
			for i, d := range opts.Devices {
				items[i] = C.int32_t(d)
			}
			o.devices = list
			o.n_devices = C.uint32_t(len(opts.Devices))
		}
		device = opts.Device
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var out *C.ssa_runtime
	if err := check(C.ssa_runtime_create(&o, &out), "ssa_runtime_create"); err != nil {
		return nil, err
	}
	r := &Runtime{ptr: out, device: device}
	runtime.SetFinalizer(r, func(r *Runtime) { r.Close() })
	return r, nil
}

func (r *Runtime) handle() (*C.ssa_runtime, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ptr == nil || r.closing {
		return nil, invalid("runtime is closed")
	}
	return r.ptr, nil
}

// Close frees the runtime now, or when its last session is closed. Idempotent.
func (r *Runtime) Close() error {
	r.mu.Lock()
	r.closing = true
	free := r.sessions == 0 && r.ptr != nil
	p := r.ptr
	if free {
		r.ptr = nil
	}
	r.mu.Unlock()
	if free {
		C.ssa_runtime_destroy(p)
		runtime.SetFinalizer(r, nil)
	}
	return nil
}

func (r *Runtime) acquire() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ptr == nil || r.closing {
		return invalid("runtime is closed")
	}
	r.sessions++
	return nil
}

func (r *Runtime) release() {
	r.mu.Lock()
	r.sessions--
	free := r.closing && r.sessions == 0 && r.ptr != nil
	p := r.ptr
	if free {
		r.ptr = nil
	}
	r.mu.Unlock()
	if free {
		C.ssa_runtime_destroy(p)
		runtime.SetFinalizer(r, nil)
	}
}

// Backend is the backend actually used (never BackendAuto); BackendAuto if closed.
func (r *Runtime) Backend() Backend {
	p, err := r.handle()
	if err != nil {
		return BackendAuto
	}
	return Backend(C.ssa_runtime_backend(p))
}

// Threads is the number of CPU worker threads (>= 1); 0 if closed.
func (r *Runtime) Threads() int {
	p, err := r.handle()
	if err != nil {
		return 0
	}
	return int(C.ssa_runtime_num_threads(p))
}

// Shards returns the number of shards (devices) every session of the runtime is
// split over (>= 1), or 0 once the runtime is closed.
func (r *Runtime) Shards() int {
	p, err := r.handle()
	if err != nil {
		return 0
	}
	return int(C.ssa_runtime_num_shards(p))
}

// SessionConfig describes a session. Start from NewSessionConfig, which fills the
// library's defaults, then change what you need.
type SessionConfig struct {
	Layers, QHeads, KVHeads, HeadDim int
	DType                            DType
	PQSubspaces, PQCentroids         int
	ModelFingerprint                 uint64
	PageTokens                       int
	HostPointers                     bool // CUDA sessions: take host memory
	IndexMinTokens                   int
	IndexRegrowFactor                float32
	IndexTrainSample                 int
	IndexIterations                  int
	// Proxy is the score candidates are ranked and sampled by (ssa.h, ssa_proxy);
	// ProxyQPQ and ProxyQPQ4 learn from the queries shown with ObserveQueries.
	Proxy Proxy
	// PQParallelWeight is the score-aware loss's weight (1: plain squared error).
	PQParallelWeight float32
}

// NewSessionConfig returns a config with the given shape and dtype and the library's
// defaults for everything else.
func NewSessionConfig(layers, qHeads, kvHeads, headDim int, dtype DType) SessionConfig {
	var c C.ssa_session_config
	C.ssa_session_config_init(&c)
	cfg := configFromC(&c)
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.DType = layers, qHeads, kvHeads, headDim, dtype
	return cfg
}

func configFromC(c *C.ssa_session_config) SessionConfig {
	return SessionConfig{
		Layers: int(c.n_layers), QHeads: int(c.n_q_heads), KVHeads: int(c.n_kv_heads), HeadDim: int(c.head_dim),
		DType: DType(c.kv_dtype), PQSubspaces: int(c.pq_subspaces), PQCentroids: int(c.pq_centroids),
		ModelFingerprint: uint64(c.model_fingerprint), PageTokens: int(c.page_tokens),
		HostPointers:   c.flags&C.SSA_SESSION_HOST_POINTERS != 0,
		IndexMinTokens: int(c.index_min_tokens), IndexRegrowFactor: float32(c.index_regrow_factor),
		IndexTrainSample: int(c.index_train_sample), IndexIterations: int(c.index_iterations),
		Proxy: Proxy(c.proxy), PQParallelWeight: float32(c.pq_parallel_weight),
	}
}

func u32(name string, v int) (C.uint32_t, error) {
	if v < 0 || uint64(v) > 0xffffffff {
		return 0, invalid("%s = %d is out of range", name, v)
	}
	return C.uint32_t(v), nil
}

func (cfg *SessionConfig) toC() (C.ssa_session_config, error) {
	var c C.ssa_session_config
	C.ssa_session_config_init(&c)
	fields := []struct {
		name string
		v    int
		dst  *C.uint32_t
	}{
		{"Layers", cfg.Layers, &c.n_layers}, {"QHeads", cfg.QHeads, &c.n_q_heads},
		{"KVHeads", cfg.KVHeads, &c.n_kv_heads}, {"HeadDim", cfg.HeadDim, &c.head_dim},
		{"PQSubspaces", cfg.PQSubspaces, &c.pq_subspaces}, {"PQCentroids", cfg.PQCentroids, &c.pq_centroids},
		{"PageTokens", cfg.PageTokens, &c.page_tokens}, {"IndexMinTokens", cfg.IndexMinTokens, &c.index_min_tokens},
		{"IndexTrainSample", cfg.IndexTrainSample, &c.index_train_sample},
		{"IndexIterations", cfg.IndexIterations, &c.index_iterations},
	}
	for _, f := range fields {
		v, err := u32(f.name, f.v)
		if err != nil {
			return c, err
		}
		*f.dst = v
	}
	c.kv_dtype = C.ssa_dtype(cfg.DType)
	c.model_fingerprint = C.uint64_t(cfg.ModelFingerprint)
	c.index_regrow_factor = C.float(cfg.IndexRegrowFactor)
	c.proxy = C.ssa_proxy(cfg.Proxy)
	c.pq_parallel_weight = C.float(cfg.PQParallelWeight)
	c.flags = 0
	if cfg.HostPointers {
		c.flags |= C.SSA_SESSION_HOST_POINTERS
	}
	return c, nil
}

// NewSession creates an empty session on this runtime.
func (r *Runtime) NewSession(cfg SessionConfig) (*Session, error) {
	c, err := cfg.toC()
	if err != nil {
		return nil, err
	}
	p, err := r.handle()
	if err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var out *C.ssa_session
	if err := check(C.ssa_session_create(p, &c, &out), "ssa_session_create"); err != nil {
		return nil, err
	}
	return r.adopt(out)
}

// LoadOptions are the flags of Runtime.Load.
type LoadOptions struct {
	Verify bool // verify every checksum up front (default: on read)
	Mmap   bool // map the file instead of reading it (CPU sessions)
}

// Load restores a session saved with Session.Save or Session.Checkpoint.
func (r *Runtime) Load(path string, opts LoadOptions) (*Session, error) {
	cpath, err := cString(path)
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cpath))
	p, err := r.handle()
	if err != nil {
		return nil, err
	}
	flags := C.uint32_t(0)
	if opts.Verify {
		flags |= C.SSA_LOAD_VERIFY
	}
	if opts.Mmap {
		flags |= C.SSA_LOAD_MMAP
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var out *C.ssa_session
	if err := check(C.ssa_session_load(p, cpath, flags, &out), "ssa_session_load"); err != nil {
		return nil, err
	}
	return r.adopt(out)
}

// SnapshotInfo is what a snapshot file holds, read without loading it.
type SnapshotInfo struct {
	FormatVersion                    uint32
	Generation                       uint64 // 1 after a full save, +1 per checkpoint
	FileBytes, LiveBytes             uint64 // bytes the snapshot spans; bytes still in use
	Sections                         int
	Layers, QHeads, KVHeads, HeadDim int
	DType                            DType
	PQSubspaces, PQCentroids         int
	PageTokens                       int
	IndexedLayers                    int // layers saved with trained PQ codebooks
	ModelFingerprint                 uint64
	Length                           uint64 // tokens in every layer
	MaxLayerLength                   uint64 // tokens of the longest layer
	MetadataBytes                    uint64
	Proxy                            Proxy
	PQParallelWeight                 float32
}

// Inspect describes the snapshot at path (a session's file or a group's manifest)
// without loading it: the config, layer and metadata sections are read and their
// checksums verified; K/V pages, codes and codebooks are not read.
func Inspect(path string) (SnapshotInfo, error) {
	cpath, err := cString(path)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer C.free(unsafe.Pointer(cpath))
	var i C.ssa_snapshot_info
	C.ssa_snapshot_info_init(&i)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := check(C.ssa_snapshot_inspect(cpath, &i), "ssa_snapshot_inspect"); err != nil {
		return SnapshotInfo{}, err
	}
	return SnapshotInfo{
		FormatVersion: uint32(i.format_version), Generation: uint64(i.generation),
		FileBytes: uint64(i.file_bytes), LiveBytes: uint64(i.live_bytes), Sections: int(i.n_sections),
		Layers: int(i.n_layers), QHeads: int(i.n_q_heads), KVHeads: int(i.n_kv_heads), HeadDim: int(i.head_dim),
		DType: DType(i.kv_dtype), PQSubspaces: int(i.pq_subspaces), PQCentroids: int(i.pq_centroids),
		PageTokens: int(i.page_tokens), IndexedLayers: int(i.indexed_layers),
		ModelFingerprint: uint64(i.model_fingerprint), Length: uint64(i.length),
		MaxLayerLength: uint64(i.max_layer_length), MetadataBytes: uint64(i.metadata_bytes),
		Proxy: Proxy(i.proxy), PQParallelWeight: float32(i.pq_parallel_weight),
	}, nil
}

func cString(s string) (*C.char, error) {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return nil, invalid("path contains a NUL byte")
		}
	}
	return C.CString(s), nil
}

func (r *Runtime) adopt(p *C.ssa_session) (*Session, error) {
	if err := r.acquire(); err != nil {
		C.ssa_session_destroy(p)
		return nil, err
	}
	var c C.ssa_session_config
	C.ssa_session_config_init(&c)
	if err := check(C.ssa_session_get_config(p, &c), "ssa_session_get_config"); err != nil {
		C.ssa_session_destroy(p)
		r.release()
		return nil, err
	}
	cfg := configFromC(&c)
	s := &Session{ptr: p, rt: r, cfg: cfg,
		devicePtrs: r.Backend() == BackendCUDA && !cfg.HostPointers}
	runtime.SetFinalizer(s, func(s *Session) { s.Close() })
	return s, nil
}
