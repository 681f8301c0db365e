// Command agent_session shows an agent's long-lived attention session with libssa:
// a structured history of a few thousand tokens (each turn's keys cluster around its
// topic), dense vs sparse decode, then checkpoint, restore and continue.
//
// Run (PKG_CONFIG_PATH must find ssa.pc, see bindings/README.md): go run .
package main

import (
	"errors"
	"fmt"
	"log"
	"math"
	"math/rand"
	"os"
	"path/filepath"

	"libssa/ssa"
)

const (
	layers = 2
	nQ     = 8
	nKV    = 2
	dim    = 64
)

func relErr(a, b []float32) float64 {
	num, den := 0.0, 0.0
	for i := range b {
		d := float64(a[i] - b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / den)
}

func main() {
	r := rand.New(rand.NewSource(7))
	rt, err := ssa.NewRuntime(&ssa.RuntimeOptions{Backend: ssa.BackendCPU, Seed: 2024})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()
	session, err := rt.NewSession(ssa.NewSessionConfig(layers, nQ, nKV, dim, ssa.F32))
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()

	topics := make([][]float32, 12)
	for i := range topics {
		topics[i] = make([]float32, nKV*dim)
		for j := range topics[i] {
			topics[i][j] = float32(1.5 * r.NormFloat64())
		}
	}
	turn := func(n int, topic []float32) ([]float32, []float32) {
		k, v := make([]float32, n*nKV*dim), make([]float32, n*nKV*dim)
		for i := range k {
			k[i] = topic[i%(nKV*dim)] + float32(0.4*r.NormFloat64())
			v[i] = float32(r.NormFloat64())
		}
		return k, v
	}
	for i, n := range []int{400, 300, 250, 350, 200, 300, 250, 350, 200, 300, 280, 320} {
		k, v := turn(n, topics[i%len(topics)])
		for l := 0; l < layers; l++ {
			if err := session.AppendF32(l, k, v); err != nil {
				log.Fatal(err)
			}
		}
	}
	fmt.Printf("history: %d tokens in %d layers\n", session.Len(), layers)

	q := make([]float32, nQ*dim)
	for i := range q {
		h, e := i/dim, i%dim
		q[i] = topics[3][(h/(nQ/nKV))*dim+e] + float32(0.3*r.NormFloat64())
	}
	dense := make([]float32, nQ*dim)
	dst, err := session.DecodeF32(0, q, dense, ssa.WithMethod(ssa.MethodDense))
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range []ssa.Method{ssa.MethodPQTopK, ssa.MethodSSA, ssa.MethodSSAAdaptive} {
		p := ssa.WithMethod(m)
		p.Sparsity, p.NSink, p.NLocal, p.Seed = 10, 32, 64, 1
		out := make([]float32, nQ*dim)
		st, err := session.DecodeF32(0, q, out, p)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%-26s rel. error vs dense %.4f, tokens read %6d of %d\n", m, relErr(out, dense), st.TokensRead, dst.TokensRead)
	}

	dir, err := os.MkdirTemp("", "ssa-agent")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "agent.ssa")
	if err := session.Checkpoint(path); errors.Is(err, ssa.ErrUnsupported) {
		fmt.Printf("snapshots are not available in this libssa build (%v); skipping restore\n", err)
		return
	} else if err != nil {
		log.Fatal(err)
	}
	restored, err := rt.Load(path, ssa.LoadOptions{Verify: true})
	if err != nil {
		log.Fatal(err)
	}
	defer restored.Close()
	k, v := turn(64, topics[5])
	for l := 0; l < layers; l++ {
		if err := restored.AppendF32(l, k, v); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Printf("restored %d tokens, continued to %d\n", session.Len(), restored.Len())
	p := ssa.WithMethod(ssa.MethodSSA)
	p.Sparsity, p.Seed, p.Step = 10, 1, 1
	a, b := make([]float32, nQ*dim), make([]float32, nQ*dim)
	if _, err := session.DecodeF32(0, q, a, p); err != nil {
		log.Fatal(err)
	}
	if _, err := restored.DecodeF32(0, q, b, p); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("restored+64 tokens vs original: rel. difference %.4f\n", relErr(b, a))
}
