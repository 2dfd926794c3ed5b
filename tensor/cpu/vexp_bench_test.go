package cpu

import "testing"

// BenchmarkVexp times the vector exp and logistic function on 4096 values
// (a row block of attention scores), and exp over rows of 1 to 40 values (the
// lengths of a causal tile's rows, which mostly end mid-vector), in values per
// second, on every instruction-set level the CPU has.
func BenchmarkVexp(b *testing.B) {
	src, dst := make([]float32, 4096), make([]float32, 4096)
	for i := range src {
		src[i] = float32(i%200-150) / 10
	}
	rows := func(dst, src []float32) { // 820 values in rows of 1..40
		for n, at := 1, 0; n <= 40; n, at = n+1, at+n {
			vexp32(dst[at:at+n], src[at:at+n])
		}
	}
	for _, c := range []struct {
		name   string
		fn     func(dst, src []float32)
		values int
	}{{"exp", vexp32, len(src)}, {"sigmoid", vsigmoid32, len(src)}, {"exp-short-rows", rows, 820}} {
		b.Run(c.name, func(b *testing.B) {
			eachISABench(b, func(b *testing.B) {
				for b.Loop() {
					c.fn(dst, src)
				}
				b.ReportMetric(float64(c.values)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gvalues/s")
			})
		})
	}
}
