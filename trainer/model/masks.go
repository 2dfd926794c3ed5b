package model

import (
	"fmt"

	"github.com/shardline/shardline/tensor"
)

// Document masks: packed documents (each ended by the tokenizer's end-of-text
// token) kept apart inside a sequence, as Megatron's --eod-mask-loss and
// --reset-attention-mask do. A position's document is the number of
// end-of-text tokens before it, so the end-of-text token closes its own
// document. Chunked attention (config.Model.AttentionChunkSize) needs nothing
// but the attention shape's Chunk: its blocks are fixed positions.

// DocumentMasks are the data's document boundaries in the model: EOS is the
// tokenizer's end-of-text token id; MaskLoss ignores the loss of every
// position whose input token is EOS (its target, the next document's first
// token, is not predicted); ResetAttention lets each token attend only to the
// tokens of its own document.
type DocumentMasks struct {
	EOS                      int32
	MaskLoss, ResetAttention bool
}

// WithDocumentMasks applies the data's document masks.
func WithDocumentMasks(d DocumentMasks) Option { return func(o *options) { o.docs = d } }

// docState is a model's document masks: starts holds each local query's
// document start (global positions, the flash kernels' Starts) and
// startsHost its host copy; under context parallelism ends (f32, B·2·cp) is
// where the ranks sum each sequence chunk's last end-of-text position + 1 (0
// for none), so every rank knows where the documents of the chunks before its
// own began.
type docState struct {
	DocumentMasks
	starts     tensor.Buffer
	startsHost []int32
	startsAny  any
	ends       tensor.Buffer
	endsHost   []float32
	endsAny    any
}

// setupDocs checks and keeps the document masks (after setupCP: T is local).
func (m *Model[F]) setupDocs(d DocumentMasks) error {
	if !d.MaskLoss && !d.ResetAttention {
		return nil
	}
	if d.EOS < 0 || int(d.EOS) >= m.Cfg.VocabSize {
		return fmt.Errorf("model: document masks need the tokenizer's end-of-text token, a token id below model.vocab_size (%d), not %d: a tokenizer without one (byte, char) cannot mark documents", m.Cfg.VocabSize, d.EOS)
	}
	m.docs = &docState{DocumentMasks: d}
	return nil
}

// allocDocs makes the document starts' buffers.
func (m *Model[F]) allocDocs() {
	p := m.docs
	if p == nil || !p.ResetAttention {
		return
	}
	p.starts = m.allocInt(m.B * m.T)
	p.startsHost = make([]int32, m.B*m.T)
	p.startsAny = p.startsHost
	if m.cp != nil {
		p.ends = m.alloc1(m.B * 2 * m.cp.Size)
		p.endsHost = make([]float32, m.B*2*m.cp.Size)
		p.endsAny = p.endsHost
	}
}

// maskLoss sets the target of every position whose token is EOS to −1 (no
// loss), in the host copy of the targets.
func (m *Model[F]) maskLoss() {
	if m.docs == nil || !m.docs.MaskLoss {
		return
	}
	for i, t := range m.tokHost {
		if t == m.docs.EOS {
			m.tgtHost[i] = -1
		}
	}
}

// DocumentStarts sets starts[b·T+i] to the position where the document of
// token i of sequence b begins: one past the last EOS before it, 0 when none.
func DocumentStarts(starts, tokens []int32, B, T int, eos int32) {
	for b := 0; b < B; b++ {
		start := 0
		for i := 0; i < T; i++ {
			starts[b*T+i] = int32(start)
			if tokens[b*T+i] == eos {
				start = i + 1
			}
		}
	}
}

// uploadStarts computes the micro-batch's document starts from its tokens
// (tokHost) and writes them to the backend. Under context parallelism the
// rank holds two chunks of each sequence: the ranks first sum each chunk's
// last end-of-text position (a collective every rank of the cp group runs in
// the same forward), so a chunk's first document may begin in a chunk another
// rank holds.
func (m *Model[F]) uploadStarts() {
	p := m.docs
	if p == nil || !p.ResetAttention {
		return
	}
	if m.cp == nil {
		DocumentStarts(p.startsHost, m.tokHost, m.B, m.T, p.EOS)
		m.mem.Write(p.starts, p.startsAny)
		return
	}
	S, c := m.cp.Size, m.T/2
	clear(p.endsHost)
	for half, g := range m.chunks(m.cp.Rank) {
		for b := 0; b < m.B; b++ {
			toks := m.tokHost[(half*m.B+b)*c : (half*m.B+b+1)*c]
			for i := len(toks) - 1; i >= 0; i-- {
				if toks[i] == p.EOS {
					p.endsHost[b*2*S+g] = float32(g*c + i + 1) // exact: positions are below 2^24 (model.seq_len's bound)
					break
				}
			}
		}
	}
	m.mem.Write(p.ends, p.endsAny)
	if err := m.cp.Comm.AllReduce(p.ends); err != nil && m.hookErr == nil {
		m.hookErr = fmt.Errorf("context-parallel document starts: %w", err)
	}
	m.mem.Read(p.endsHost, p.ends)
	for half, g := range m.chunks(m.cp.Rank) {
		for b := 0; b < m.B; b++ {
			start := 0 // where the document open at chunk g's first position began
			for h := 0; h < g; h++ {
				start = max(start, int(p.endsHost[b*2*S+h]))
			}
			at := (half*m.B + b) * c
			for i := 0; i < c; i++ {
				p.startsHost[at+i] = int32(start)
				if m.tokHost[at+i] == p.EOS {
					start = g*c + i + 1
				}
			}
		}
	}
	m.mem.Write(p.starts, p.startsAny)
}

// startsBuf is the document starts the attention kernels read (the empty
// Buffer without ResetAttention).
func (m *Model[F]) startsBuf() tensor.Buffer {
	if m.docs == nil {
		return tensor.Buffer{}
	}
	return m.docs.starts
}
