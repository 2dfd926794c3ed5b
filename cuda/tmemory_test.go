//go:build cuda

package cuda

import (
	"strings"
	"testing"

	"github.com/shardline/shardline/parallel/collective"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/memtest"
)

// TestMemoryConformance: the device memory behaves as every tensor.Memory
// must (tensor/memtest: conversions and rounding, slices, counted read-backs,
// sticky refusals), the checks the CPU memory passes in the ordinary suite;
// memtest calls it from the test's goroutine, so every call also takes the
// way to the device's goroutine.
func TestMemoryConformance(t *testing.T) {
	memtest.Run(t, func() tensor.Memory { return dev.NewMemory() })
}

// TestGroupOnMemory: NCCL's collectives on a device memory's tensor.Buffers
// through collective.Group's method set, in a group of one: a gather on
// slices of larger buffers, an all-reduce, the host-valued all-to-all, and a
// foreign buffer refused with the memory's error before anything is issued.
func TestGroupOnMemory(t *testing.T) {
	comms := ncclGroup(t, []*Device{dev})
	m := dev.NewMemory()
	var g collective.Group
	onDevice(t, func() {
		grp, err := m.Group(comms[0])
		if err != nil {
			t.Error(err)
			return
		}
		defer grp.Close()
		g = grp
		whole, out := m.Alloc(tensor.BFloat16, 6), m.Alloc(tensor.BFloat16, 4)
		m.Write(whole, []float32{9, 1, 2, 3, 4, 9})
		if err := g.AllGather(out, whole.Slice(1, 5)); err != nil {
			t.Error(err)
		}
		got := make([]float32, 4)
		m.Read(got, out)
		if err := exact("all-gather of a slice", got, []float32{1, 2, 3, 4}); err != nil {
			t.Error(err)
		}
		sum := m.Alloc(tensor.Float32, 3)
		m.Write(sum, []float32{1, 2, 3})
		if err := g.AllReduce(sum); err != nil {
			t.Error(err)
		}
		host := make([]float32, 2)
		if err := g.AllToAllHost(host, []float32{5, 6}, []int{2}, []int{2}); err != nil {
			t.Error(err)
		}
		if err := exact("all-to-all of host values", host, []float32{5, 6}); err != nil {
			t.Error(err)
		}
		if err := m.Err(); err != nil {
			t.Error(err)
		}
		if err := g.AllReduce(m.Alloc(tensor.BFloat16, 2)); err == nil || !strings.Contains(err.Error(), "it takes f32") {
			t.Errorf("a bf16 all-reduce: %v", err)
		}
		// Last: the refusal is kept as the memory's error, which is sticky.
		err = g.AllReduce(dev.NewMemory().Alloc(tensor.Float32, 2))
		if err == nil || !strings.Contains(err.Error(), "not this device memory's") {
			t.Errorf("a buffer of another memory: %v", err)
		}
	})
}
