package cpu

import (
	"testing"

	"github.com/shardline/shardline/tensor"
)

// BenchmarkExpertsMatmul times moe-tiny's experts' products (8 experts of 512
// rows, 128 by 128) forward and backward, through ExpertsMatmul (an expert per
// core) and as each expert's Matmul in turn (each product shared among the
// cores: what ExpertsMatmul did before), with the operands in this core's
// caches (warm) and after 64 MiB were written (cold, as in a training step,
// where the layer's other kernels ran in between).
func BenchmarkExpertsMatmul(b *testing.B) {
	const E, rows, C, OC = 8, 512, 128, 128
	x, dy := make([]float32, E*rows*C), make([]float32, E*rows*OC)
	out, dx := make([]float32, E*rows*OC), make([]float32, E*rows*C)
	for i := range x {
		x[i] = float32(i%7) * 0.1
	}
	for i := range dy {
		dy[i] = float32(i%5) * 0.1
	}
	w, dw := make([]tensor.Weights[float32], E), make([][]float32, E)
	for e := range w {
		v := make([]float32, OC*C)
		for i := range v {
			v[i] = float32((i+e)%3) * 0.01
		}
		w[e], dw[e] = tensor.FloatWeights(v), make([]float32, OC*C)
	}
	off := make([]int32, E+1)
	for e := range off {
		off[e] = int32(e * rows)
	}
	s, sh := tensor.ExpertsShape{C: C, OC: OC}, tensor.MatmulShape{BT: rows, C: C, OC: OC}
	flush := make([]float32, 16<<20)
	for _, backward := range []bool{false, true} {
		for _, alone := range []bool{false, true} {
			for _, cold := range []bool{false, true} {
				name := map[bool]string{false: "forward", true: "backward"}[backward] +
					map[bool]string{false: "/experts", true: "/each-alone"}[alone] + map[bool]string{false: "/warm", true: "/cold"}[cold]
				b.Run(name, func(b *testing.B) {
					for b.Loop() {
						if cold {
							b.StopTimer()
							for j := range flush {
								flush[j]++
							}
							b.StartTimer()
						}
						switch {
						case !alone && !backward:
							ExpertsMatmul(out, tensor.FloatWeights(x), w, off, s, false)
						case !alone:
							ExpertsMatmulBackward(dx, dw, dy, tensor.FloatWeights(x), w, off, s, false)
						default:
							for e := range w {
								lo, hi := e*rows, (e+1)*rows
								if backward {
									MatmulBackward(dx[lo*C:hi*C], dw[e], dy[lo*OC:hi*OC], tensor.FloatWeights(x[lo*C:hi*C]), w[e], sh, false)
								} else {
									Matmul(out[lo*OC:hi*OC], tensor.FloatWeights(x[lo*C:hi*C]), w[e], sh, false)
								}
							}
						}
					}
				})
			}
		}
	}
}
