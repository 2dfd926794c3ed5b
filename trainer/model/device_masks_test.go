//go:build cuda || cudaemu

package model

import (
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/require"
)

// maskedPass builds the engine's model (trainer/model) of r on be and mem
// over B sequences of T tokens with opts, runs one forward and backward
// (scale 1: the loss sum's gradient), and returns the loss sum and count, the
// gradients and, with wantLogits, the logits of every row.
func maskedPass(r config.Recipe, table []parallel.Param, w [][]float32, be tensor.Backend, mem tensor.Memory, B, T int, tokens, targets []int32, wantLogits bool, opts ...Option) (sum float64, n int, grads [][]float32, logits []float32, err error) {
	wb := tensor.Upload(mem, tensor.Float32, w)
	gb := make([]tensor.Buffer, len(w))
	for i := range gb {
		gb[i] = mem.Alloc(tensor.Float32, len(w[i]))
	}
	m, err := New[float32](r.Model, table, wb, gb, be, B, T, append([]Option{WithMemory(mem)}, opts...)...)
	if err != nil {
		return 0, 0, nil, nil, err
	}
	sum, n = m.Loss(tokens, targets)
	m.Backward(tokens, targets, 1)
	grads = make([][]float32, len(gb))
	for i, g := range gb {
		grads[i] = make([]float32, g.Len())
		mem.Read(grads[i], g)
	}
	V := r.Model.VocabSize
	for lo := 0; wantLogits && lo < B*T; lo += m.LogitRows() {
		hi := min(B*T, lo+m.LogitRows())
		m.ForwardLogits(tokens, lo, hi)
		part := make([]float32, (hi-lo)*V)
		m.ReadLogits(part, 0)
		logits = append(logits, part...)
	}
	if err = m.Err(); err == nil {
		err = mem.Err()
	}
	return sum, n, grads, logits, err
}

// onDeviceEngine runs maskedPass on the device's kernel set and memory.
func onDeviceEngine(r config.Recipe, table []parallel.Param, w [][]float32, B, T int, tokens, targets []int32, wantLogits bool, opts ...Option) (sum float64, n int, grads [][]float32, logits []float32, err error) {
	dev, derr := cuda.Open(0)
	if derr != nil {
		return 0, 0, nil, nil, derr
	}
	defer dev.Close()
	dev.Do(func() {
		k := dev.Kernels()
		sum, n, grads, logits, err = maskedPass(r, table, w, k, k.NewMemory(), B, T, tokens, targets, wantLogits, opts...)
	})
	return
}

// TestEngineMasksOnDevice: the engine's model with chunked attention (chunks
// of 48 of the tiny recipe's 128 positions, in every layer and, iRoPE, in the
// rotary layers only) and document masks (each "." of
// Newton's text ending a document: a few per sequence) on the device's
// kernels gives the CPU's loss and gradients (the CPU's masks are checked in
// float64 against finite differences and against documents run apart).
// Tolerance as TestEngineModelOnDevice's fp32: 1e-4 of |want| + rms.
func TestEngineMasksOnDevice(t *testing.T) {
	for _, sets := range [][]string{
		{"model.attention_chunk_size=48"},
		// iRoPE (Llama 4): the rotary layers in chunks, every 2nd layer (NoPE)
		// over its whole documents.
		{"model.attention_chunk_size=48", "model.nope_interval=2"},
	} {
		t.Run(fmt.Sprint(sets), func(t *testing.T) {
			r := loadRecipe(t, "tiny", sets...)
			table, err := parallel.ParamTable(r.Model, 1, 1)
			require.NoError(t, err)
			B, T := 1, r.Model.SeqLen
			w := initWeights(r, table)
			tokens, targets := opticks(t, B, T, 3)
			docs := WithDocumentMasks(DocumentMasks{EOS: '.', MaskLoss: true, ResetAttention: true})
			cs, cn, cg, _, err := maskedPass(r, table, w, cpu.Backend{}, cpu.NewMemory(), B, T, tokens, targets, false, docs)
			require.NoError(t, err)
			gs, gn, gg, _, err := onDeviceEngine(r, table, w, B, T, tokens, targets, false, docs)
			require.NoError(t, err)
			require.Equal(t, cn, gn)
			require.Less(t, cn, B*T, "some inputs are '.': their targets are not counted")
			require.InDelta(t, cs, gs, 1e-4*math.Abs(cs))
			for i := range cg {
				if err := close32(cg[i], gg[i], 1e-4); err != nil {
					t.Errorf("gradient of %s: %v", table[i].Name, err)
				}
			}
		})
	}
}

// TestDocumentsApartOnDevice: two documents packed in one sequence of 64
// positions of the tiny recipe's model, with reset_attention_mask and eod_mask_loss, on
// the device's kernels give each position the logits it has with its document
// run alone on a model without masks (its EOS input's target ignored), the sum
// of the documents' losses and the sum of their gradients. fp32: the packed
// run attends over the same keys in other tiles and at other RoPE angles;
// tolerance 1e-4 of |want| + rms, as the other fp32 comparisons of the engine.
func TestDocumentsApartOnDevice(t *testing.T) {
	r := loadRecipe(t, "tiny")
	table, err := parallel.ParamTable(r.Model, 1, 1)
	require.NoError(t, err)
	w := initWeights(r, table)
	text, err := os.ReadFile(opticksPath())
	require.NoError(t, err)
	const eos = 0 // a byte Newton's text never has
	doc := func(at, n int) []int32 {
		d := make([]int32, n)
		for i := range d[:n-1] {
			d[i] = int32(text[at+i])
		}
		d[n-1] = eos
		return d
	}
	docs := [][]int32{doc(5000, 27), doc(9000, 37)} // the boundary inside the kernels' tiles of 16 and 32
	tokens := append(append([]int32{}, docs[0]...), docs[1]...)
	targets := append(append([]int32{}, tokens[1:]...), int32(text[0]))
	ps, pn, pg, pl, err := onDeviceEngine(r, table, w, 1, len(tokens), tokens, targets, true,
		WithDocumentMasks(DocumentMasks{EOS: eos, MaskLoss: true, ResetAttention: true}))
	require.NoError(t, err)
	var as float64
	an, at := 0, 0
	ag := make([][]float32, len(pg))
	for i := range ag {
		ag[i] = make([]float32, len(pg[i]))
	}
	var al []float32
	for _, d := range docs {
		tgt := append([]int32{}, targets[at:at+len(d)]...)
		tgt[len(d)-1] = -1 // the EOS input: eod_mask_loss
		s, n, g, l, err := onDeviceEngine(r, table, w, 1, len(d), d, tgt, true)
		require.NoError(t, err)
		as, an = as+s, an+n
		for i := range g {
			for j := range g[i] {
				ag[i][j] += g[i][j]
			}
		}
		al = append(al, l...)
		at += len(d)
	}
	require.Equal(t, an, pn)
	require.InDelta(t, as, ps, 1e-4*math.Abs(as))
	require.NoError(t, close32(al, pl, 1e-4), "logits")
	for i := range ag {
		if err := close32(ag[i], pg[i], 1e-4); err != nil {
			t.Errorf("gradient of %s: %v", table[i].Name, err)
		}
	}
}
