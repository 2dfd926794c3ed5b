package trainer

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/model"
)

// The end of a run on the engine: the final weights reach rank 0 a parameter
// at a time, which writes weights.bin as they come, so that no rank holds the
// whole model beyond what the plan gives it (an optim_grads_params run gathers
// one group at a time into its FSDP arena, free by then). The sample follows
// one of two policies. Ranks on the host (CPU runs) sample on rank 0 alone
// from the whole model in fp32 on its host, a pass of one sequence per token,
// where rank 0 holds that model anyway (a world of one, or a run without
// sharded weights or model parallelism) or the host has room for it twice
// (rank 0's copy and the sampler's), which a CPU run nearly always has.
// Ranks on GPUs, whose memory the plan spends, sample with the training
// model: rank 0 alone where it holds the whole model, every rank together
// where the model is split over them (a micro-batch's pass per token, with
// every unit gathered again); so does a host without room.

// sampler is who draws the final sample, and from what.
type sampler int

const (
	sampleNone  sampler = iota // logging.sample_tokens = 0
	sampleHost                 // rank 0 alone, from the whole model in fp32 on its host (Generate)
	sampleModel                // rank 0 alone, with the training model, whole on it
	sampleAll                  // every rank together, with the training model
)

// samplesLikeDevices makes ranks on the host follow the GPUs' policy (never
// the host's copy), for tests; hostRoom is the room rank 0 judges its host
// by (tests stand in a figure of their own).
var (
	samplesLikeDevices = false
	hostRoom           = hostAvailable
)

// samplerFor is who samples, the same on every rank: where it depends on
// rank 0's host room, rank 0 decides and tells the world.
func (t *run) samplerFor(world comm.Communicator) (sampler, error) {
	switch {
	case t.r.Logging.SampleTokens == 0:
		return sampleNone, nil
	case t.st.host == nil || samplesLikeDevices:
		if world.Size() == 1 || !t.collectiveEval() {
			return sampleModel, nil
		}
		return sampleAll, nil
	case world.Size() == 1 || !t.collectiveEval():
		return sampleHost, nil // rank 0 holds the whole model
	}
	var fp32 int64
	for _, p := range t.plan.Params {
		fp32 += 4 * p.Numel()
	}
	alone := []float32{0}
	if avail := hostRoom(); t.rank == 0 && avail > 0 && 2*fp32+(1<<30) <= avail/2 {
		alone[0] = 1
	}
	if err := world.Broadcast(alone, 0); err != nil {
		return sampleNone, fmt.Errorf("agreeing on who samples: %w", err)
	}
	if alone[0] == 1 {
		return sampleHost, nil
	}
	return sampleAll, nil
}

// finalWeights runs state.finalWeights: rank 0 writes each parameter into
// weightsOut (committed by finish) and, with keep (sampleHost), keeps the
// whole model for the sample (finalTable, finalViews). Every rank calls it
// and gets the collectives' errors; rank 0's own (opening or writing
// weights.bin) are kept in weightsErr, for it to tell the world before the
// ranks sample together.
func (t *run) finalWeights(keep bool) error {
	table, err := parallel.ParamTable(t.r.Model, 1, 1)
	if err != nil {
		return err
	}
	st, lead := t.st, t.rank == 0
	if lead {
		t.weightsOut, t.weightsErr = newWeightsWriter(filepath.Join(t.dir, "weights.bin"), table)
	}
	// The values put are views of scratch, reused by the next group, or of a
	// rank's slice or expert: rank 0 copies them unless it holds the whole
	// model in place.
	clone := keep && t.collectiveEval()
	if lead && keep {
		t.finalTable, t.finalViews = table, make([][]float32, len(table))
	}
	put := func(i int, v []float32) {
		if t.weightsErr != nil {
			return
		}
		if t.weightsErr = t.weightsOut.put(i, v); t.weightsErr == nil && clone {
			t.finalViews[i] = slices.Clone(v)
		}
	}
	scratch := func(n int64, dt tensor.DType) (tensor.Buffer, func()) {
		if rt := t.rt; rt != nil && rt.weights {
			pool := rt.poolOf(dt)
			b, off := pool.get(n)
			return b, func() { pool.put(off, b) }
		}
		b := st.mem.Alloc(dt, int(n))
		return b, func() { st.mem.Free(b) }
	}
	if err := st.finalWeights(scratch, put); err != nil {
		return fmt.Errorf("saving weights: %w", err)
	}
	if lead && keep && !clone {
		t.finalViews = st.floatViews() // whole and in place (fp32 on the host), or read back
	}
	return nil
}

// abortWeights removes a weights.bin that was being written and will not be
// committed (nothing when there is none).
func (t *run) abortWeights() {
	if t.weightsOut != nil {
		t.weightsOut.abort()
		t.weightsOut = nil
	}
}

// sampleWithModel samples n tokens after prompt with the training model and
// returns them decoded: on rank 0 alone with world nil (sampleModel), or on
// every rank of the world together (sampleAll). Each token is one forward
// pass of the model's micro-batch (the window as its first sequence,
// evaluation text after) through the run's FSDP units and model-parallel
// groups; the logits of the window's last token are put together from the
// context-parallel rank that holds the position (the others add zeros) and
// every tensor-parallel rank's vocabulary rows, and rank 0's draw is
// broadcast, so that every rank goes on with the same token.
func (t *run) sampleWithModel(world comm.Communicator, prompt string, n int) (string, error) {
	r, st := t.r, t.st
	B, T, cp := r.Train.MicroBatchSize, r.Model.SeqLen, t.plan.Mesh.CP
	// The other sequences, and the first one's positions past the window
	// (which its last token does not attend to), hold the first evaluation
	// batch: text routed through MoE layers as evaluation routes it, not a
	// block of one token id that would crowd a few experts.
	fill, targets, tokens, local := make([]int32, B*T), make([]int32, B*T), make([]int32, B*T), make([]int32, B*T/cp)
	text := t.ds.ValSampler
	if text == nil {
		text = t.ds.TrainSampler
	}
	text.Fill(fill, targets, 0, B)
	part, logits := make([]float32, r.Model.VocabSize/t.plan.Mesh.TP), make([]float32, r.Model.VocabSize)
	if st.tpComm == nil {
		logits = part
	}
	next := func(window []int32, k int) ([]float32, error) {
		copy(tokens, fill)
		copy(tokens, window[:k])
		model.LocalTokens(local, tokens, B, T, st.cpRank, cp)
		owner, row := cpRow(k-1, B, T, cp)
		lo := 0 // the rows whose logits the forward makes: the position's, on its owner
		if owner == st.cpRank {
			lo = row
		}
		t.m.ForwardLogits(local, lo, lo+btoi(owner == st.cpRank))
		if err := t.flush(); err != nil {
			return nil, err
		}
		if owner == st.cpRank {
			t.m.ReadLogits(part, 0)
			if err := st.mem.Err(); err != nil {
				return nil, err
			}
		} else {
			clear(part)
		}
		if st.cpComm != nil {
			if err := st.cpComm.AllReduce(part); err != nil {
				return nil, err
			}
		}
		if st.tpComm != nil {
			if err := st.tpComm.AllGather(logits, part); err != nil {
				return nil, err
			}
		}
		return logits, nil
	}
	var agree func(int32) (int32, error)
	if world != nil {
		agree = func(id int32) (int32, error) {
			// The id's high bits and its low 12, each exact in a float32.
			b := []float32{float32(id >> 12), float32(id & 0xfff)}
			if err := world.Broadcast(b, 0); err != nil {
				return 0, err
			}
			return int32(b[0])<<12 | int32(b[1]), nil
		}
	}
	return generate(T, t.ds.Tok, prompt, n, sampleTemperature, r.Run.Seed, next, agree)
}

// cpRow is where position pos of a micro-batch's first sequence (B sequences
// of T tokens) lies under context parallelism over cp ranks: the cp rank
// that holds it and its row among that rank's tokens (model.LocalTokens'
// layout: rank i holds chunks i and 2cp−1−i of every sequence).
func cpRow(pos, B, T, cp int) (owner, row int) {
	if cp <= 1 {
		return 0, pos
	}
	c := T / (2 * cp)
	if g := pos / c; g < cp {
		return g, pos % c
	}
	return 2*cp - 1 - pos/c, B*c + pos%c
}
