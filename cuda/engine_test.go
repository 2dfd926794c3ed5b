//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/kerneltest"
)

// TestKernelConformance: the engine's kernel set on the device computes what
// the CPU's does in float64 (tensor/kerneltest: every kernel, its bf16
// operands, accumulation, edge rows and the three MoE layouts), the checks the
// CPU's float32 kernels pass in the ordinary suite. One side of each case
// runs inside Device.Do (the calls stay on the device's goroutine), the
// other from the test's goroutine (each call finds its way there).
func TestKernelConformance(t *testing.T) {
	t.Run("inside Do", func(t *testing.T) { kerneltest.Run(t, dev.Kernels(), kerneltest.Options{Do: dev.Do}) })
	t.Run("from the test's goroutine", func(t *testing.T) { kerneltest.Run(t, dev.Kernels(), kerneltest.Options{}) })
}

// TestKernelsFromGoroutines: four goroutines, each with its own memory (as
// the trainer's in-process ranks sharing one GPU), issue kernels and
// read-backs at once; each gets its own results.
func TestKernelsFromGoroutines(t *testing.T) {
	k := dev.Kernels()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for r := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := k.NewMemory()
			a, b, out := m.Alloc(tensor.Float32, 1000), m.Alloc(tensor.Float32, 1000), m.Alloc(tensor.Float32, 1000)
			m.Fill(a, float64(r))
			m.Fill(b, 0.5)
			got := make([]float32, 1000)
			for i := 0; i < 50; i++ {
				k.Add(out, a, b, 1000)
				k.AddInto(a, b, 1000)
			}
			m.Read(got, out)
			// a ends at r + 50·0.5; the last Add read a before its last AddInto.
			if want := float32(r) + 49*0.5 + 0.5; got[999] != want || got[0] != want {
				errs[r] = fmt.Errorf("rank %d: %v, want %v", r, got[999], want)
			}
			if err := m.Err(); err != nil {
				errs[r] = err
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestKernelsRefuse: a kernel handed a buffer of another memory, of a dtype it
// does not read, or shorter than its shape keeps a failure that says so in the
// memory's error and does nothing.
func TestKernelsRefuse(t *testing.T) {
	k := dev.Kernels()
	for name, c := range map[string]struct {
		run  func(m, other tensor.Memory)
		want string
	}{
		"another memory": {func(m, other tensor.Memory) {
			k.Add(m.Alloc(tensor.Float32, 2), other.Alloc(tensor.Float32, 2), m.Alloc(tensor.Float32, 2), 2)
		}, "not this device memory's"},
		"mixed activation dtypes": {func(m, _ tensor.Memory) {
			k.SwiGLU(m.Alloc(tensor.BFloat16, 4), m.Alloc(tensor.Float32, 4), m.Alloc(tensor.Float32, 4), 4)
		}, "a f32 buffer where the kernel reads [bf16]"},
		"a bf16 statistic": {func(m, _ tensor.Memory) {
			k.RMSNorm(m.Alloc(tensor.BFloat16, 4), m.Alloc(tensor.BFloat16, 2), m.Alloc(tensor.BFloat16, 4), m.Alloc(tensor.BFloat16, 2), 2, 2, 1e-5)
		}, "a bf16 buffer where the kernel reads [f32]"},
		"too short": {func(m, _ tensor.Memory) {
			k.Matmul(m.Alloc(tensor.Float32, 5), m.Alloc(tensor.Float32, 6), m.Alloc(tensor.Float32, 6), tensor.MatmulShape{BT: 2, C: 3, OC: 3}, false)
		}, "a buffer of 5 f32 values where the kernel reads 6"},
	} {
		t.Run(name, func(t *testing.T) {
			dev.Do(func() {
				m, other := k.NewMemory(), k.NewMemory()
				c.run(m, other)
				if err := m.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("got %v, want an error containing %q", err, c.want)
				}
			})
		})
	}
}

// TestExpertsStaticSegments: the experts' products over static segments
// (ExpertsShape.Segment, the padded layout) read nothing back, forward or
// backward, and over weights at an even stride (slices of one allocation)
// they run as one batched product (strided finds the stride) with the
// per-expert result;
// over the routing's packed offsets each call reads the offsets back once.
func TestExpertsStaticSegments(t *testing.T) {
	k := dev.Kernels()
	m := k.NewMemory()
	const E, R, C, OC, gap = 4, 3, 8, 6, 5
	rows := E * R
	fill := func(b tensor.Buffer, seed int) tensor.Buffer {
		v := make([]float32, b.Len())
		for i := range v {
			v[i] = float32((i*7+seed)%11-5) / 8
		}
		m.Write(b, v)
		return b
	}
	all := fill(m.Alloc(tensor.Float32, E*(OC*C+gap)), 1)
	together, apart := make([]tensor.Buffer, E), make([]tensor.Buffer, E)
	gAll := m.Alloc(tensor.Float32, E*(OC*C+gap))
	gTogether, gApart := make([]tensor.Buffer, E), make([]tensor.Buffer, E)
	for e := range together {
		together[e] = all.Slice(e*(OC*C+gap), e*(OC*C+gap)+OC*C)
		apart[e] = fill(m.Alloc(tensor.Float32, OC*C), 0)
		gTogether[e] = gAll.Slice(e*(OC*C+gap), e*(OC*C+gap)+OC*C)
		gApart[e] = m.Alloc(tensor.Float32, OC*C)
		m.Alloc(tensor.Float32, 64*(e+1)) // uneven gaps: apart stays apart
		m.Copy(apart[e], together[e])
		m.Zero(gTogether[e])
		m.Zero(gApart[e])
	}
	x, dy := fill(m.Alloc(tensor.Float32, rows*C), 2), fill(m.Alloc(tensor.Float32, rows*OC), 3)
	offsets := m.Alloc(tensor.Int32, E+1)
	seg := make([]int32, E+1)
	for i := range seg {
		seg[i] = int32(i * R)
	}
	m.Write(offsets, seg)

	o := k.k.ops("strided")
	if _, stride, ok := o.strided(together, OC*C, F32); !ok || stride != OC*C+gap {
		t.Errorf("weights in one allocation: strided %v, stride %d (want %d)", ok, stride, OC*C+gap)
	}
	if _, _, ok := o.strided(apart, OC*C, F32); ok {
		t.Error("weights apart taken as one strided operand")
	}

	run := func(w, g []tensor.Buffer, sh tensor.ExpertsShape) (y, dx []float32, reads int64) {
		out, din := m.Alloc(tensor.Float32, rows*OC), m.Alloc(tensor.Float32, rows*C)
		before := dev.Readbacks()
		k.ExpertsMatmul(out, x, w, offsets, sh, false)
		k.ExpertsMatmulBackward(din, g, dy, x, w, offsets, sh, false)
		reads = dev.Readbacks() - before
		y, dx = make([]float32, rows*OC), make([]float32, rows*C)
		m.Read(y, out)
		m.Read(dx, din)
		return y, dx, reads
	}
	static := tensor.ExpertsShape{C: C, OC: OC, Segment: R}
	y1, dx1, n1 := run(together, gTogether, static)
	y2, dx2, n2 := run(apart, gApart, static)
	y3, dx3, n3 := run(apart, gApart, tensor.ExpertsShape{C: C, OC: OC})
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
	if n1 != 0 || n2 != 0 || n3 != 2 {
		t.Errorf("read-backs: static batched %d, static per expert %d (want 0, 0); packed %d (want 2)", n1, n2, n3)
	}
	g1, g2 := make([]float32, OC*C), make([]float32, OC*C)
	for e := range E {
		m.Read(g1, gTogether[e])
		m.Read(g2, gApart[e])
		for i := range g1 {
			// apart ran twice (static, then packed): its gradient accumulated twice.
			if d := g1[i] - g2[i]/2; d > 1e-5 || d < -1e-5 {
				t.Fatalf("expert %d weight gradient %d: batched %v, per expert %v", e, i, g1[i], g2[i]/2)
			}
		}
	}
	// Tolerance 1e-5 absolute: sums of 8 or 12 products of values under 1 in
	// fp32, in one order or another.
	for i := range y1 {
		if d := max(y1[i]-y2[i], y2[i]-y1[i], y3[i]-y1[i], y1[i]-y3[i]); d > 1e-5 {
			t.Fatalf("output %d: batched %v, per expert %v, packed %v", i, y1[i], y2[i], y3[i])
		}
	}
	for i := range dx1 {
		if d := max(dx1[i]-dx2[i], dx2[i]-dx1[i], dx3[i]-dx1[i], dx1[i]-dx3[i]); d > 1e-5 {
			t.Fatalf("input gradient %d: batched %v, per expert %v, packed %v", i, dx1[i], dx2[i], dx3[i])
		}
	}
}
