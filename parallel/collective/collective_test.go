package collective

import (
	"sync"
	"testing"
	"time"

	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// onRanks runs f on every rank of an in-process world of n, each with its own
// CPU memory, and returns the ranks' errors.
func onRanks(n int, f func(g Group, mem *cpu.Memory) error) []error {
	w := comm.NewWorld(n, 10*time.Second)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mem := cpu.NewMemory()
			errs[r] = f(OnHost(w.Rank(r), mem), mem)
		}()
	}
	wg.Wait()
	return errs
}

// TestOnHost: the collectives on buffers give what the communicator gives on
// the buffers' elements, in f32 and bf16, on slices of larger buffers (the
// views start at the buffer's offset), and the sums are exact here (small
// integers, exact in bf16 too).
func TestOnHost(t *testing.T) {
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
	errs := onRanks(n, func(g Group, mem *cpu.Memory) error {
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

// TestOnHostRefusesForeignBuffers: a buffer of another memory, or of a dtype
// the collective does not take, fails the collective with an error naming it,
// on every rank, and nothing is sent (no rank waits for a partner that never
// comes: every rank refuses before the exchange).
func TestOnHostRefusesForeignBuffers(t *testing.T) {
	errs := onRanks(2, func(g Group, mem *cpu.Memory) error {
		other := cpu.NewMemory()
		return g.AllReduce(other.Alloc(tensor.Float32, 4))
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Contains(t, err.Error(), "all-reduce on buffers", "rank %d", r)
	}
	errs = onRanks(2, func(g Group, mem *cpu.Memory) error {
		return g.AllToAll(mem.Alloc(tensor.Float32, 2), mem.Alloc(tensor.BFloat16, 2), []int{1, 1}, []int{1, 1})
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Contains(t, err.Error(), "all-to-all on buffers", "rank %d", r)
	}
}
