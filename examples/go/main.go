// Command agent_session shows an agent's long-lived attention session with libssa.
// The history has the structure real attention has (as examples/long_context_demo.cc):
// an attention sink at token 0, topics arriving in bursts (keys cluster around their
// topic, values correlate with it), a recent stretch on the query's topic and a few
// "needle" tokens far back that the query matches strongly. One query is decoded
// densely and with PQ top-k, SSA and SSA_ADAPTIVE at 20x; then the session is
// checkpointed, restored and continued.
//
// Run (PKG_CONFIG_PATH must find ssa.pc, see README.md): go run .
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
	layers   = 2
	nQ       = 8
	nKV      = 2
	dim      = 64
	nTokens  = 32768
	sparsity = 20
	nTopics  = 64
	needles  = 4
	recent   = 256
)

// What the query is about, by weight.
var queryTopics = [3]int{3, 17, 40}

// Topic centres [nTopics][nKV][dim] for keys and values.
type topics struct{ keys, values []float64 }

func (c *topics) key(t, h int) []float64   { return c.keys[(t*nKV+h)*dim:][:dim] }
func (c *topics) value(t, h int) []float64 { return c.values[(t*nKV+h)*dim:][:dim] }

// K/V [n][nKV][dim] of tokens on the given topics.
func tokens(r *rand.Rand, c *topics, topic []int) ([]float32, []float32) {
	k, v := make([]float32, 0, len(topic)*nKV*dim), make([]float32, 0, len(topic)*nKV*dim)
	for _, t := range topic {
		for h := 0; h < nKV; h++ {
			for j := 0; j < dim; j++ {
				k = append(k, float32(c.key(t, h)[j]+0.55*r.NormFloat64()))
				v = append(v, float32(c.value(t, h)[j]+0.6*r.NormFloat64()))
			}
		}
	}
	return k, v
}

// The history of one layer: bursts of 32..512 tokens per topic, the last `recent`
// on the query's topic, a sink at token 0 and `needles` needles in the first half.
func history(r *rand.Rand, c *topics) ([]float32, []float32) {
	topic := make([]int, 0, nTokens)
	for len(topic) < nTokens {
		n, t := 32+r.Intn(481), r.Intn(nTopics)
		for i := 0; i < n && len(topic) < nTokens; i++ {
			topic = append(topic, t)
		}
	}
	for i := nTokens - recent; i < nTokens; i++ {
		topic[i] = queryTopics[0]
	}
	k, v := tokens(r, c, topic)
	for h := 0; h < nKV; h++ {
		for j := 0; j < dim; j++ {
			k[h*dim+j] = float32(3 * c.key(0, h)[j]) // the attention sink
		}
	}
	for i := 0; i < needles; i++ {
		at := 1000 + r.Intn(nTokens/2-1000)
		for h := 0; h < nKV; h++ {
			for j := 0; j < dim; j++ {
				k[(at*nKV+h)*dim+j] = float32(1.4 * c.key(queryTopics[0], h)[j])
			}
		}
	}
	return k, v
}

// A mix of the query topics of each head's KV head: logits of about 6 on topic 3.
func query(r *rand.Rand, c *topics) []float32 {
	q := make([]float32, nQ*dim)
	for i := range q {
		h, j := i/dim/(nQ/nKV), i%dim
		mix := 1.0*c.key(queryTopics[0], h)[j] + 0.7*c.key(queryTopics[1], h)[j] + 0.5*c.key(queryTopics[2], h)[j]
		q[i] = float32((6*mix + 0.3*r.NormFloat64()) / math.Sqrt(dim))
	}
	return q
}

func relErr(a, b []float32) float64 {
	num, den := 0.0, 0.0
	for i := range b {
		d := float64(a[i] - b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / den)
}

func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func decode(s *ssa.Session, q []float32, p *ssa.DecodeParams) ([]float32, ssa.DecodeStats) {
	out := make([]float32, nQ*dim)
	st, err := s.DecodeF32(0, q, out, p)
	if err != nil {
		log.Fatal(err)
	}
	return out, st
}

func main() {
	r := rand.New(rand.NewSource(7))
	c := &topics{make([]float64, nTopics*nKV*dim), make([]float64, nTopics*nKV*dim)}
	for i := range c.keys {
		c.keys[i], c.values[i] = r.NormFloat64(), r.NormFloat64()
	}
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
	for l := 0; l < layers; l++ {
		k, v := history(r, c)
		for t := 0; t < nTokens; t += 4096 { // appended turn by turn; the PQ index follows
			e := t + 4096
			if e > nTokens {
				e = nTokens
			}
			if err := session.AppendF32(l, k[t*nKV*dim:e*nKV*dim], v[t*nKV*dim:e*nKV*dim]); err != nil {
				log.Fatal(err)
			}
		}
	}
	fmt.Printf("history: %d tokens in %d layers (sink at 0, topic bursts, %d needles, the last %d tokens on the query's topic)\n",
		session.Len(), layers, needles, recent)

	q := query(r, c)
	dense, _ := decode(session, q, ssa.WithMethod(ssa.MethodDense))
	fmt.Printf("\none query at %dx sparsity: each head reads %d of %d K/V rows (128 sink + 128 local always, the rest chosen by the method)\n",
		sparsity, (nTokens+sparsity-1)/sparsity, nTokens)
	fmt.Println("error = ||out - dense|| / ||dense|| over all heads; heavy = rows taken by PQ proxy score, draws = rows sampled in proportion to it (per head)")
	for _, m := range []ssa.Method{ssa.MethodPQTopK, ssa.MethodSSA, ssa.MethodSSAAdaptive} {
		p := ssa.WithMethod(m)
		p.Sparsity, p.Seed = sparsity, 1
		out, st := decode(session, q, p)
		fmt.Printf("  %-26s error %.4f  rows read %5d  heavy %5d  draws %5d\n", m, relErr(out, dense),
			st.TokensRead/nQ, st.HeavyTokens/nQ, st.Draws/nQ)
	}
	fmt.Println("PQ top-k keeps only the proxy's top rows and drops the tail's mass; SSA reads the top rows exactly and samples the tail, reweighting each draw by 1/inclusion probability (this synthetic context favours SSA more than a real model does: 2-3x lower error there, docs/FIDELITY.md)")

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
	p := ssa.WithMethod(ssa.MethodSSA)
	p.Sparsity, p.Seed, p.Step = sparsity, 1, 1
	a, _ := decode(session, q, p)
	b, _ := decode(restored, q, p)
	fmt.Printf("\nrestored %d tokens: same seed and step decode bitwise equal: %v\n", restored.Len(), equal(a, b))
	// A new turn on the query's own topic: it takes attention mass, so the output moves.
	same := make([]int, 64)
	for i := range same {
		same[i] = queryTopics[0]
	}
	k, v := tokens(r, c, same)
	for l := 0; l < layers; l++ {
		if err := restored.AppendF32(l, k, v); err != nil {
			log.Fatal(err)
		}
	}
	moved, _ := decode(restored, q, ssa.WithMethod(ssa.MethodDense))
	p.Step = 2
	sparse, _ := decode(restored, q, p)
	fmt.Printf("continued to %d tokens with 64 on the query's topic: the output moved by %.3f (relative; new tokens take attention), SSA error there %.4f\n",
		restored.Len(), relErr(moved, a), relErr(sparse, moved))
}
