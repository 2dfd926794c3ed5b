//go:build amd64 && !purego

package cpu

//go:noescape
func vexp32AVX512(dst, src *float32, n int, sigmoid bool)

// vexp32 sets dst[i] = e^src[i] (dst and src may be the same slice).
func vexp32(dst, src []float32) { vexpOrSigmoid(dst, src, false) }

// vsigmoid32 sets dst[i] = 1 / (1 + e^−src[i]) (dst and src may be the same slice).
func vsigmoid32(dst, src []float32) { vexpOrSigmoid(dst, src, true) }

func vexpOrSigmoid(dst, src []float32, sigmoid bool) {
	n := len(src)
	bulk := n &^ 15
	if hasAVX512 && bulk > 0 {
		_ = dst[n-1]
		vexp32AVX512(&dst[0], &src[0], bulk, sigmoid)
	} else {
		bulk = 0
	}
	for i := bulk; i < n; i++ {
		if sigmoid {
			dst[i] = 1 / (1 + exp32(-src[i]))
		} else {
			dst[i] = exp32(src[i])
		}
	}
}

//go:noescape
func vmax32AVX512(x *float32, n int) float32

// maxOf is the largest value of x (not empty), sixteen at a time where the CPU
// has AVX-512; for finite values the same as a scalar scan.
func maxOf[F Float](x []F) F {
	if x32, ok := any(x).([]float32); ok && hasAVX512 && len(x32) >= 16 {
		bulk := len(x32) &^ 15
		mx := vmax32AVX512(&x32[0], bulk)
		for _, v := range x32[bulk:] {
			if v > mx {
				mx = v
			}
		}
		return F(mx)
	}
	return maxScan(x)
}
