package collective

import (
	"sync"
	"testing"
	"time"

	"github.com/shardline/shardline/internal/allocs"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// makers are the ways to run a communicator on buffers, each test run with
// both: in place (OnHost) and through host copies (Staged), which must give
// the same results bit for bit.
var makers = map[string]func(comm.Communicator, *cpu.Memory) Group{
	"on host": func(c comm.Communicator, m *cpu.Memory) Group { return OnHost(c, m) },
	"staged":  func(c comm.Communicator, m *cpu.Memory) Group { return Staged(c, m) },
}

// onRanks runs f on every rank of an in-process world of n, each with its own
// CPU memory and its group made by mk, and returns the ranks' errors.
func onRanks(n int, mk func(comm.Communicator, *cpu.Memory) Group, f func(g Group, mem *cpu.Memory) error) []error {
	w := comm.NewWorld(n, 10*time.Second)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mem := cpu.NewMemory()
			errs[r] = f(mk(w.Rank(r), mem), mem)
		}()
	}
	wg.Wait()
	return errs
}

// TestOnBuffers: the collectives on buffers, in place and staged, give what
// the communicator gives on the buffers' elements, in f32 and bf16, on slices
// of larger buffers (the views start at the buffer's offset), and the sums are
// exact here (small integers, exact in bf16 too).
func TestOnBuffers(t *testing.T) {
	for name, mk := range makers {
		t.Run(name, func(t *testing.T) { testOnBuffers(t, mk) })
	}
}

func testOnBuffers(t *testing.T, mk func(comm.Communicator, *cpu.Memory) Group) {
	const n = 3
	var mu sync.Mutex
	got := map[string][][]float32{}
	keep := func(name string, r int, mem *cpu.Memory, b tensor.Buffer) {
		v := make([]float32, b.Len())
		mem.Read(v, b)
		mu.Lock()
		if got[name] == nil {
			got[name] = make([][]float32, n)
		}
		got[name][r] = v
		mu.Unlock()
	}
	errs := onRanks(n, mk, func(g Group, mem *cpu.Memory) error {
		r := g.Rank()
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			// src is elements 1..4 of a buffer of 6: rank r's values r·10+i.
			whole := mem.Alloc(dt, 6)
			src := whole.Slice(1, 5)
			mem.Write(src, []float32{float32(10 * r), float32(10*r + 1), float32(10*r + 2), float32(10*r + 3)})
			all := mem.Alloc(dt, n*4)
			if err := g.AllGather(all, src); err != nil {
				return err
			}
			keep("gather "+dt.String(), r, mem, all)
			// reduce-scatter of n·2 values: rank r's are r+j.
			rsrc := mem.Alloc(dt, n*2)
			vals := make([]float32, n*2)
			for j := range vals {
				vals[j] = float32(r + j)
			}
			mem.Write(rsrc, vals)
			part := mem.Alloc(dt, 2)
			if err := g.ReduceScatter(part, rsrc); err != nil {
				return err
			}
			keep("reduce-scatter "+dt.String(), r, mem, part)
		}
		buf := mem.Alloc(tensor.Float32, 2)
		mem.Write(buf, []float32{float32(r), 1})
		if err := g.AllReduce(buf); err != nil {
			return err
		}
		keep("all-reduce", r, mem, buf)
		ring := mem.Alloc(tensor.Float32, 2)
		mem.Write(ring, []float32{float32(r), float32(r)})
		recv := mem.Alloc(tensor.Float32, 2)
		if err := g.SendRecv(recv, ring, (r+1)%n, (r+n-1)%n); err != nil {
			return err
		}
		keep("send/recv", r, mem, recv)
		// all-to-all: one value to each rank.
		a2a := mem.Alloc(tensor.Float32, n)
		mem.Write(a2a, []float32{float32(10*r + 0), float32(10*r + 1), float32(10*r + 2)})
		out := mem.Alloc(tensor.Float32, n)
		ones := []int{1, 1, 1}
		if err := g.AllToAll(out, a2a, ones, ones); err != nil {
			return err
		}
		keep("all-to-all", r, mem, out)
		return mem.Err()
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for r := range n {
		for _, dt := range []string{"f32", "bf16"} {
			assert.Equal(t, []float32{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23}, got["gather "+dt][r], "rank %d all-gather %s", r, dt)
			// chunk r: Σ_q (q + 2r + i) = 3 + 3·(2r+i)
			assert.Equal(t, []float32{float32(3 + 6*r), float32(3 + 6*r + 3)}, got["reduce-scatter "+dt][r], "rank %d reduce-scatter %s", r, dt)
		}
		assert.Equal(t, []float32{3, 3}, got["all-reduce"][r])
		prev := float32((r + n - 1) % n)
		assert.Equal(t, []float32{prev, prev}, got["send/recv"][r])
		assert.Equal(t, []float32{float32(r), float32(10 + r), float32(20 + r)}, got["all-to-all"][r])
	}
}

// TestRefusesForeignBuffers: a buffer of another memory, or of a dtype the
// collective does not take, fails the collective with an error naming it, on
// every rank, in place and staged, and nothing is sent (no rank waits for a
// partner that never comes: every rank refuses before the exchange).
func TestRefusesForeignBuffers(t *testing.T) {
	for name, mk := range makers {
		t.Run(name, func(t *testing.T) { testRefusesForeignBuffers(t, mk) })
	}
}

func testRefusesForeignBuffers(t *testing.T, mk func(comm.Communicator, *cpu.Memory) Group) {
	errs := onRanks(2, mk, func(g Group, mem *cpu.Memory) error {
		other := cpu.NewMemory()
		return g.AllReduce(other.Alloc(tensor.Float32, 4))
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Contains(t, err.Error(), "all-reduce on buffers", "rank %d", r)
	}
	errs = onRanks(2, mk, func(g Group, mem *cpu.Memory) error {
		return g.AllToAll(mem.Alloc(tensor.Float32, 2), mem.Alloc(tensor.BFloat16, 2), []int{1, 1}, []int{1, 1})
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Contains(t, err.Error(), "all-to-all on buffers", "rank %d", r)
	}
}

// TestStagedReadsBackAndAllocatesNothing: a staged collective is one counted
// read-back (its source) and one upload, and once a size has been seen its
// collectives allocate nothing on the host: the host slots and their
// interfaces are kept. Two ranks, sizes alternating as an FSDP step's units do.
func TestStagedReadsBackAndAllocatesNothing(t *testing.T) {
	w := comm.NewWorld(2, 10*time.Second)
	mems := []*cpu.Memory{cpu.NewMemory(), cpu.NewMemory()}
	groups := []Group{Staged(w.Rank(0), mems[0]), Staged(w.Rank(1), mems[1])}
	type bufs struct{ big, bigAll, small, smallAll, bfPart, bfAll tensor.Buffer }
	b := make([]bufs, 2)
	for r, m := range mems {
		b[r] = bufs{m.Alloc(tensor.Float32, 64), m.Alloc(tensor.Float32, 128), m.Alloc(tensor.Float32, 5), m.Alloc(tensor.Float32, 10),
			m.Alloc(tensor.BFloat16, 8), m.Alloc(tensor.BFloat16, 16)}
	}
	run := func(r int) {
		g, x := groups[r], b[r]
		_ = g.AllGather(x.bigAll, x.big)
		_ = g.AllGather(x.smallAll, x.small)
		_ = g.ReduceScatter(x.bfPart, x.bfAll)
		_ = g.AllReduce(x.small)
	}
	// Rank 1 runs on a goroutine of its own, started once, so that a step
	// makes no goroutine (which would allocate).
	start, done := make(chan struct{}), make(chan struct{})
	go func() {
		for range start {
			run(1)
			done <- struct{}{}
		}
	}()
	defer close(start)
	step := func() {
		start <- struct{}{}
		run(0)
		<-done
	}
	before := mems[0].Readbacks()
	step()
	assert.Equal(t, int64(4), mems[0].Readbacks()-before, "one read-back per collective")
	for _, m := range mems {
		require.NoError(t, m.Err())
	}
	allocs.AssertSteady(t, step)
}

// TestAllGatherFP8: an all-gather of FP8 buffers (E4M3 and E5M2) moves every
// rank's codes unchanged, a byte a value, in place and staged, from a slice
// of a larger buffer (an odd offset: the pairs the host's communicators
// carry need not be aligned); every one of the 256 codes travels (NaN codes
// included: nothing reads them as values). An odd source length and a dtype
// mismatch are refused on every rank before anything is sent.
func TestAllGatherFP8(t *testing.T) {
	const n, L = 3, 256
	for name, mk := range makers {
		for _, dt := range []tensor.DType{tensor.Float8E4M3, tensor.Float8E5M2} {
			got := make([][]tensor.F8E4M3, n)
			errs := onRanks(n, mk, func(g Group, mem *cpu.Memory) error {
				r := g.Rank()
				codes := make([]tensor.F8E4M3, L)
				for i := range codes {
					codes[i] = tensor.F8E4M3(uint8(i + 85*r))
				}
				whole := mem.Alloc(dt, L+3)
				src := whole.Slice(1, L+1)
				if dt == tensor.Float8E5M2 {
					e := make([]tensor.F8E5M2, L)
					for i, c := range codes {
						e[i] = tensor.F8E5M2(c)
					}
					mem.Write(src, e)
				} else {
					mem.Write(src, codes)
				}
				all := mem.Alloc(dt, n*L)
				if err := g.AllGather(all, src); err != nil {
					return err
				}
				out := make([]tensor.F8E4M3, n*L)
				if dt == tensor.Float8E5M2 {
					e := make([]tensor.F8E5M2, n*L)
					mem.Read(e, all)
					for i, c := range e {
						out[i] = tensor.F8E4M3(c)
					}
				} else {
					mem.Read(out, all)
				}
				got[r] = out
				if err := g.AllGather(mem.Alloc(dt, n*3), whole.Slice(0, 3)); err == nil {
					return assert.AnError
				}
				if err := g.AllGather(all, mem.Alloc(tensor.BFloat16, L)); err == nil {
					return assert.AnError
				}
				return mem.Err()
			})
			for r := range n {
				require.NoError(t, errs[r], "%s %s rank %d", name, dt, r)
				for q := range n {
					for i := range L {
						require.Equal(t, tensor.F8E4M3(uint8(i+85*q)), got[r][q*L+i], "%s %s: rank %d's copy of rank %d's code %d", name, dt, r, q, i)
					}
				}
			}
		}
	}
}
