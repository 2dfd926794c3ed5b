package data

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
)

// Sampler draws training or evaluation sequences from one or more token
// streams (sources) as Megatron-LM's GPT and blended datasets do, as a pure
// function of (seed, global sample index):
//
//   - a source of N tokens holds S = ⌊(N−1)/T⌋ samples; sample j is tokens
//     j·T … j·T+T (inputs and, shifted by one, targets);
//   - its samples are drawn in epochs: epoch e visits every sample once, in an
//     order shuffled by (seed, source, e) — without replacement;
//   - samples of a blend go to the sources by Megatron's blending index:
//     global sample g goes to the source whose count lags its weight most
//     (weight·max(g, 1) − count, the first on a tie), and is that source's
//     next sample.
//
// Global sample g of step s is s·global_batch + the sequence's index in the
// global batch, so any split of the batch over ranks and micro-batches, and
// a run resumed at any step, sees the same sequences.
type Sampler struct {
	sources []*Tokens
	weights []float64
	samples []int // per source
	seed    uint64
	T       int

	mu     sync.Mutex
	blocks [][]int // blocks[b]: samples drawn from each source before g = b·blendBlock
}

// blendBlock is how far apart the blend's kept counts are: finding a sample's
// source walks at most this many samples from the last kept count.
const blendBlock = 1024

// NewSampler samples sequences of T tokens (T+1 with the target) from
// sources, blended by weights (nil: one source, or equal weights; normalised
// to sum to 1).
func NewSampler(sources []*Tokens, weights []float64, seed int64, T int) (*Sampler, error) {
	if len(sources) == 0 {
		return nil, errors.New("no sources to sample")
	}
	if weights == nil {
		weights = make([]float64, len(sources))
		for i := range weights {
			weights[i] = 1
		}
	}
	if len(weights) != len(sources) {
		return nil, fmt.Errorf("%d weights for %d sources", len(weights), len(sources))
	}
	s := &Sampler{sources: sources, seed: uint64(seed), T: T}
	sum := 0.0
	for i, w := range weights {
		if !(w > 0) || w > 1e300 {
			return nil, fmt.Errorf("source %d has weight %v; weights must be positive", i+1, w)
		}
		sum += w
	}
	for i, w := range weights {
		s.weights = append(s.weights, w/sum)
		n := (sources[i].Len() - 1) / T
		if n < 1 {
			return nil, fmt.Errorf("source %d has %d tokens, fewer than one sequence of %d + 1", i+1, sources[i].Len(), T)
		}
		s.samples = append(s.samples, n)
	}
	s.blocks = [][]int{make([]int, len(sources))}
	return s, nil
}

// Samples is the number of samples of each source (one epoch each).
func (s *Sampler) Samples() []int { return append([]int(nil), s.samples...) }

// Weights are the normalised weights.
func (s *Sampler) Weights() []float64 { return append([]float64(nil), s.weights...) }

// pick is the blend's choice for sample g given the counts before it.
func (s *Sampler) pick(g int, counts []int) int {
	if len(counts) == 1 {
		return 0
	}
	x := float64(max(g, 1))
	best, bestErr := 0, s.weights[0]*x-float64(counts[0])
	for k := 1; k < len(counts); k++ {
		if e := s.weights[k]*x - float64(counts[k]); e > bestErr {
			best, bestErr = k, e
		}
	}
	return best
}

// countsAt returns the samples drawn from each source before global sample
// g, in dst (reused when it has room: a training step allocates nothing).
func (s *Sampler) countsAt(g int, dst []int) []int {
	c := dst[:0]
	if len(s.sources) == 1 {
		return append(c, g)
	}
	b := g / blendBlock
	s.mu.Lock()
	for len(s.blocks) <= b {
		last := len(s.blocks) - 1
		next := append([]int(nil), s.blocks[last]...)
		for i := last * blendBlock; i < (last+1)*blendBlock; i++ {
			next[s.pick(i, next)]++
		}
		s.blocks = append(s.blocks, next)
	}
	c = append(c, s.blocks[b]...)
	s.mu.Unlock()
	for i := b * blendBlock; i < g; i++ {
		c[s.pick(i, c)]++
	}
	return c
}

// Locate names global sample g's source, and its sample there (after the
// shuffle: the index of its first token is sample·T).
func (s *Sampler) Locate(g int) (source, sample int) {
	c := s.countsAt(g, nil)
	k := s.pick(g, c)
	return k, s.shuffled(k, c[k])
}

// shuffled maps source k's j-th drawn sample to a sample of the source:
// epoch j/S, position j%S in that epoch's permutation.
func (s *Sampler) shuffled(k, j int) int {
	n := s.samples[k]
	e, r := j/n, j%n
	key := splitmix64(splitmix64(s.seed^0x5eed) ^ uint64(k)<<40 ^ uint64(e))
	return int(permute(uint64(r), uint64(n), key))
}

// Fill fills tokens and targets (B·T each) with global samples g..g+B−1.
func (s *Sampler) Fill(tokens, targets []int32, g, B int) {
	var room [16]int // on the stack for up to 16 sources
	c := s.countsAt(g, room[:])
	T := s.T
	for b := 0; b < B; b++ {
		k := s.pick(g+b, c)
		start := s.shuffled(k, c[k]) * T
		c[k]++
		s.sources[k].Copy(tokens[b*T:(b+1)*T], start)
		s.sources[k].Copy(targets[b*T:(b+1)*T], start+1)
	}
}

// Consumed is what n global samples drew from one source.
type Consumed struct {
	Samples int     `json:"samples"`
	Tokens  int     `json:"tokens"`
	Epochs  float64 `json:"epochs"`
}

// Consumed says what the first n global samples drew from each source: its
// samples, their tokens (T each) and the epochs they make.
func (s *Sampler) Consumed(n int) []Consumed {
	c := s.countsAt(n, nil)
	out := make([]Consumed, len(c))
	for k, v := range c {
		out[k] = Consumed{Samples: v, Tokens: v * s.T, Epochs: float64(v) / float64(s.samples[k])}
	}
	return out
}

// permute is a bijection of [0, n) keyed by key: a four-round Feistel network
// on the smallest even number of bits covering n, walked until it lands below
// n (each walk step is itself a bijection, so the walk is one on [0, n)).
func permute(i, n, key uint64) uint64 {
	if n <= 1 {
		return 0
	}
	h := (bits.Len64(n-1) + 1) / 2
	mask := uint64(1)<<h - 1
	for {
		l, r := i>>h, i&mask
		for round := uint64(0); round < 4; round++ {
			l, r = r, l^(splitmix64(r^key^round*0x9e3779b97f4a7c15)&mask)
		}
		i = l<<h | r
		if i < n {
			return i
		}
	}
}

// Source is one source of a blended dataset: its name (the path given), its
// weight and its training and validation streams.
type Source struct {
	Name       string
	Weight     float64
	Train, Val *Tokens
}

// Blend joins datasets opened from several paths into one dataset whose
// training samples are drawn from each by weight (Sampler). They must share
// a tokenizer (by name; char vocabularies must be the same). The joined
// Train and Val streams (for the fingerprint and statistics, and validation)
// are the sources' in order.
func Blend(names []string, weights []float64, parts []*Dataset) (*Dataset, error) {
	if len(parts) == 0 || len(names) != len(parts) || len(weights) != len(parts) {
		return nil, errors.New("a blend needs a name, a weight and a dataset for each source")
	}
	d := &Dataset{Tok: parts[0].Tok, Train: &Tokens{}, Val: &Tokens{}}
	for i, p := range parts {
		if p.Tok.Name() != d.Tok.Name() || p.Tok.VocabSize() != d.Tok.VocabSize() {
			return nil, fmt.Errorf("%s has the %s tokenizer (vocabulary %d), %s the %s tokenizer (vocabulary %d); a blend's sources share one tokenizer",
				names[i], p.Tok.Name(), p.Tok.VocabSize(), names[0], d.Tok.Name(), d.Tok.VocabSize())
		}
		if c, ok := p.Tok.(*Char); ok && string(c.Chars) != string(d.Tok.(*Char).Chars) {
			return nil, fmt.Errorf("%s and %s have different char vocabularies; prepare them together, or use gpt2", names[i], names[0])
		}
		d.Train.join(p.Train)
		d.Val.join(p.Val)
		d.Sources = append(d.Sources, Source{Name: names[i], Weight: weights[i], Train: p.Train, Val: p.Val})
	}
	return d, nil
}

// join appends another stream's pieces.
func (t *Tokens) join(o *Tokens) {
	if o == nil {
		return
	}
	for _, s := range o.segs {
		t.append(s.v, s.lo, s.n)
	}
	t.docs += o.docs
}

// Sample makes the dataset's samplers for sequences of T tokens: training from
// its sources by weight (or its one training stream), validation from its
// validation stream (none when it is shorter than a sequence).
func (d *Dataset) Sample(seed int64, T int) error {
	srcs, weights := []*Tokens{d.Train}, []float64(nil)
	if len(d.Sources) > 0 {
		srcs, weights = nil, nil
		for _, s := range d.Sources {
			srcs, weights = append(srcs, s.Train), append(weights, s.Weight)
		}
	}
	var err error
	if d.TrainSampler, err = NewSampler(srcs, weights, seed, T); err != nil {
		if len(d.Sources) > 0 {
			for _, s := range d.Sources {
				if s.Train.Len() < T+1 {
					return fmt.Errorf("source %s: its training split has %d tokens, fewer than one sequence of %d + 1", s.Name, s.Train.Len(), T)
				}
			}
		}
		return err
	}
	d.ValSampler = nil
	if d.Val.Len() > T {
		d.ValSampler, err = NewSampler([]*Tokens{d.Val}, nil, seed, T)
	}
	return err
}

// SourceNames are the names of the training sources (one, "", without a blend).
func (d *Dataset) SourceNames() []string {
	if len(d.Sources) == 0 {
		return []string{""}
	}
	names := make([]string, len(d.Sources))
	for i, s := range d.Sources {
		names[i] = s.Name
	}
	return names
}

// Join is the streams one after another, as one stream.
func Join(streams ...*Tokens) *Tokens {
	t := &Tokens{}
	for _, s := range streams {
		t.join(s)
	}
	return t
}
