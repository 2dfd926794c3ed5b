//go:build cuda

package cuda

import (
	"strings"
	"testing"

	"github.com/shardline/shardline/parallel/collective"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/memtest"
)

// onDev is a Memory whose every call runs on the device's goroutine, as the
// engine's step will: memtest calls a tensor.Memory from the test's goroutine.
type onDev struct{ m *Memory }

func (o onDev) Alloc(t tensor.DType, n int) (b tensor.Buffer) {
	o.m.d.Do(func() { b = o.m.Alloc(t, n) })
	return b
}
func (o onDev) Free(b tensor.Buffer)             { o.m.d.Do(func() { o.m.Free(b) }) }
func (o onDev) Write(dst tensor.Buffer, src any) { o.m.d.Do(func() { o.m.Write(dst, src) }) }
func (o onDev) Read(dst any, src tensor.Buffer)  { o.m.d.Do(func() { o.m.Read(dst, src) }) }
func (o onDev) Copy(dst, src tensor.Buffer)      { o.m.d.Do(func() { o.m.Copy(dst, src) }) }
func (o onDev) Zero(b tensor.Buffer)             { o.m.d.Do(func() { o.m.Zero(b) }) }
func (o onDev) Fill(b tensor.Buffer, v float64)  { o.m.d.Do(func() { o.m.Fill(b, v) }) }
func (o onDev) Sync()                            { o.m.d.Do(o.m.Sync) }
func (o onDev) Readbacks() int64                 { return o.m.Readbacks() }
func (o onDev) Err() (err error) {
	o.m.d.Do(func() { err = o.m.Err() })
	return err
}

// TestMemoryConformance: the device memory behaves as every tensor.Memory
// must (tensor/memtest: conversions and rounding, slices, counted read-backs,
// sticky refusals), the checks the CPU memory passes in the ordinary suite.
func TestMemoryConformance(t *testing.T) {
	memtest.Run(t, func() tensor.Memory { return onDev{dev.NewMemory()} })
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
