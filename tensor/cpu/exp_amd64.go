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
