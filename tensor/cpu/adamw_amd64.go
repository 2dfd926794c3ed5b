//go:build amd64 && !purego

package cpu

//go:noescape
func adamw32AVX512(n int, p, grad, m, v *float32, k *[10]float32)

//go:noescape
func adamw32AVX2(n int, p, grad, m, v *float32, k *[10]float32)

// adamw32 runs the AdamW update over the longest prefix of whole 16-value
// blocks in AVX-512, or of 8-value blocks in AVX2, and returns its length (0
// with neither); k as adamw32AVX512. Either rounds every lane as the scalar
// code does.
func adamw32(p, g, m, v []float32, k *[10]float32) int {
	var n int
	switch {
	case hasAVX512:
		n = len(p) &^ 15
	case hasAVX2:
		n = len(p) &^ 7
	}
	if n == 0 {
		return 0
	}
	_, _, _ = g[n-1], m[n-1], v[n-1]
	if hasAVX512 {
		adamw32AVX512(n, &p[0], &g[0], &m[0], &v[0], k)
	} else {
		adamw32AVX2(n, &p[0], &g[0], &m[0], &v[0], k)
	}
	return n
}
