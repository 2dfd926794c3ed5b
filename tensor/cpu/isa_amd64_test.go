//go:build amd64 && !purego

package cpu

import (
	"math"
	"math/rand"
	"testing"

	"golang.org/x/sys/cpu"
)

// isaLevel is one micro-kernel level: whether this CPU has it, and the
// feature switches (hasAVX512, hasAVX2) that select it.
type isaLevel struct {
	name        string
	have        bool
	wide, avx2v bool
}

func isaLevels() []isaLevel {
	avx512, avx2 := cpu.X86.HasAVX512F, cpu.X86.HasAVX2 && cpu.X86.HasFMA
	return []isaLevel{{"avx512", avx512, true, avx2}, {"avx2", avx2, false, true}, {"go", true, false, false}}
}

// eachISA runs fn once per micro-kernel level this CPU supports (AVX-512;
// AVX2 with FMA; plain Go), each as a subtest named for it, with the kernels'
// feature switches set to that level and restored after, so a machine with
// AVX-512 also tests the AVX2 and Go paths other machines take.
func eachISA(t *testing.T, fn func(t *testing.T)) {
	for _, l := range isaLevels() {
		if l.have {
			restore := useISA(l)
			t.Run(l.name, fn)
			restore()
		}
	}
}

// useISA sets the kernels' feature switches to level l and returns what
// puts them back.
func useISA(l isaLevel) (restore func()) {
	saved := [...]bool{hasAVX512, hasAVX2, hasStrided, hasBF16Dot}
	hasAVX512, hasAVX2, hasStrided = l.wide, l.avx2v, l.wide || l.avx2v
	hasBF16Dot = l.wide && saved[3]
	return func() { hasAVX512, hasAVX2, hasStrided, hasBF16Dot = saved[0], saved[1], saved[2], saved[3] }
}

// TestAVX2KernelMatchesAVX512: the AVX2 micro-kernel makes each sum as the
// AVX-512 one does (one FMA chain over k from zero, then added or stored), so
// on a CPU with both their tiles are equal bit for bit.
func TestAVX2KernelMatchesAVX512(t *testing.T) {
	if !cpu.X86.HasAVX512F || !cpu.X86.HasAVX2 || !cpu.X86.HasFMA {
		t.Skip("needs a CPU with AVX-512 and AVX2: this one runs one of the two kernels only (TestKernelsAgree checks it against Go)")
	}
	saved := hasAVX512
	defer func() { hasAVX512 = saved }()
	r := rand.New(rand.NewSource(3))
	for _, add := range []bool{true, false} {
		for _, k := range []int{1, 7, 256} {
			a, b := randSlice(r, k*mr), randSlice(r, k*nr)
			c1, c2 := randSlice(r, mr*40), make([]float32, mr*40)
			copy(c2, c1)
			hasAVX512 = true
			kernel(k, a, mr, b, nr, c1, 40, add)
			hasAVX512 = false
			kernel(k, a, mr, b, nr, c2, 40, add)
			for i := range c1 {
				if math.Float32bits(c1[i]) != math.Float32bits(c2[i]) {
					t.Fatalf("k=%d add=%v: element %d: avx512 %v, avx2 %v", k, add, i, c1[i], c2[i])
				}
			}
		}
	}
}

// eachISABench is eachISA for benchmarks.
func eachISABench(b *testing.B, fn func(b *testing.B)) {
	for _, l := range isaLevels() {
		if l.have {
			restore := useISA(l)
			b.Run(l.name, fn)
			restore()
		}
	}
}
