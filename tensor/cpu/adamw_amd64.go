//go:build amd64 && !purego

package cpu

//go:noescape
func adamw32AVX512(n int, p, grad, m, v *float32, k *[9]float32)

// adamw32 runs the AdamW update over the longest prefix of whole 16-value blocks
// in AVX-512 and returns its length (0 without AVX-512); k as adamw32AVX512.
func adamw32(p, g, m, v []float32, k *[9]float32) int {
	n := len(p) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	_, _, _ = g[n-1], m[n-1], v[n-1]
	adamw32AVX512(n, &p[0], &g[0], &m[0], &v[0], k)
	return n
}
