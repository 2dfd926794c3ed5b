//go:build !amd64 || purego

package cpu

// vexp32 sets dst[i] = e^src[i] (dst and src may be the same slice).
func vexp32(dst, src []float32) {
	for i, x := range src {
		dst[i] = exp32(x)
	}
}
