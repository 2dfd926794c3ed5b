//go:build !amd64 || purego

package cpu

// vexp32 sets dst[i] = e^src[i] (dst and src may be the same slice).
func vexp32(dst, src []float32) {
	for i, x := range src {
		dst[i] = exp32(x)
	}
}

// vsigmoid32 sets dst[i] = 1 / (1 + e^−src[i]) (dst and src may be the same slice).
func vsigmoid32(dst, src []float32) {
	for i, x := range src {
		dst[i] = 1 / (1 + exp32(-x))
	}
}

// maxOf is the largest value of x (not empty).
func maxOf[F Float](x []F) F { return maxScan(x) }

// affine sets x[i] = a·x[i] + b.
func affine[F Float](x []F, a, b F) {
	for i := range x {
		x[i] = a*x[i] + b
	}
}

// dsoftmax sets d[i] = p[i]·(d[i] − dot)·scale (len(p) ≥ len(d)).
func dsoftmax[F Float](d, p []F, dot, scale F) {
	for i := range d {
		d[i] = p[i] * (d[i] - dot) * scale
	}
}
