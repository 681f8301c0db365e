package ssa

import (
	"math"
	"math/rand"
	"testing"
)

const (
	nQ   = 8
	nKV  = 2
	dim  = 64
	row  = nKV * dim
	qLen = nQ * dim
)

func normals(r *rand.Rand, n int, scale float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(scale * r.NormFloat64())
	}
	return out
}

// clustered returns keys [n][nKV][dim] around a few random centres.
func clustered(r *rand.Rand, n, clusters int) []float32 {
	centres := normals(r, clusters*row, 2)
	out := make([]float32, 0, n*row)
	for t := 0; t < n; t++ {
		c := r.Intn(clusters)
		for j := 0; j < row; j++ {
			out = append(out, centres[c*row+j]+float32(0.5*r.NormFloat64()))
		}
	}
	return out
}

func f64s(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// reference is exact softmax attention in float64; q head h reads kv head h/(nq/nkv).
func reference(q, k, v []float64, nq, nkv, d int) []float64 {
	n := len(k) / (nkv * d)
	group := nq / nkv
	out := make([]float64, nq*d)
	s := make([]float64, n)
	for h := 0; h < nq; h++ {
		kh := h / group
		m := math.Inf(-1)
		for t := 0; t < n; t++ {
			acc := 0.0
			for e := 0; e < d; e++ {
				acc += q[h*d+e] * k[(t*nkv+kh)*d+e]
			}
			s[t] = acc / math.Sqrt(float64(d))
			m = math.Max(m, s[t])
		}
		z := 0.0
		for t := 0; t < n; t++ {
			s[t] = math.Exp(s[t] - m)
			z += s[t]
		}
		for t := 0; t < n; t++ {
			for e := 0; e < d; e++ {
				out[h*d+e] += s[t] / z * v[(t*nkv+kh)*d+e]
			}
		}
	}
	return out
}

func relErr(out, ref []float64) float64 {
	num, den := 0.0, 0.0
	for i := range ref {
		num += (out[i] - ref[i]) * (out[i] - ref[i])
		den += ref[i] * ref[i]
	}
	return math.Sqrt(num / den)
}

// f32ToF16 rounds to IEEE binary16 (nearest even); inputs here are normal-range.
func f32ToF16(x float32) uint16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	mant := b & 0x7fffff
	if exp >= 0x1f {
		return sign | 0x7c00
	}
	if exp <= 0 {
		if exp < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint(14 - exp)
		half := uint32(1) << (shift - 1)
		rest := m & ((1 << shift) - 1)
		r := m >> shift
		if rest > half || (rest == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(exp)<<10 | mant>>13
	rest := mant & 0x1fff
	if rest > 0x1000 || (rest == 0x1000 && r&1 == 1) {
		r++
	}
	return sign | uint16(r)
}

func f16ToF64(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * mant * math.Pow(2, -24)
	case 0x1f:
		if mant == 0 {
			return sign * math.Inf(1)
		}
		return math.NaN()
	}
	return sign * (1 + mant/1024) * math.Pow(2, float64(exp-15))
}

func TestF16HelpersOnKnownValues(t *testing.T) {
	if f32ToF16(1) != 0x3c00 || f32ToF16(-2.5) != 0xc100 || f16ToF64(0x3555) != 0.333251953125 {
		t.Fatal("f16 helpers are wrong")
	}
}

func cpuRuntime(t *testing.T, seed uint64) *Runtime {
	t.Helper()
	rt, err := NewRuntime(&RuntimeOptions{Backend: BackendCPU, Threads: 2, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

func newSession(t *testing.T, rt *Runtime, layers int, dt DType) *Session {
	t.Helper()
	s, err := rt.NewSession(NewSessionConfig(layers, nQ, nKV, dim, dt))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
