package cpu

import "testing"

// BenchmarkVexp times the vector exp and logistic function on 4096 values
// (a row block of attention scores), in values per second.
func BenchmarkVexp(b *testing.B) {
	src, dst := make([]float32, 4096), make([]float32, 4096)
	for i := range src {
		src[i] = float32(i%200-150) / 10
	}
	for _, c := range []struct {
		name string
		fn   func(dst, src []float32)
	}{{"exp", vexp32}, {"sigmoid", vsigmoid32}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				c.fn(dst, src)
			}
			b.ReportMetric(float64(len(src))*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gvalues/s")
		})
	}
}
