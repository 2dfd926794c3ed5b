//go:build amd64 && !purego

package cpu

//go:noescape
func vexp32AVX512(dst, src *float32, n int, sigmoid bool)

// vexp32 sets dst[i] = e^src[i] (dst and src may be the same slice).
func vexp32(dst, src []float32) { vexpOrSigmoid(dst, src, false) }

// vsigmoid32 sets dst[i] = 1 / (1 + e^−src[i]) (dst and src may be the same slice).
func vsigmoid32(dst, src []float32) { vexpOrSigmoid(dst, src, true) }

//go:noescape
func vexp32AVX2(dst, src *float32, n int, sigmoid bool)

// vexpOrSigmoid is vexp32 or vsigmoid32: the whole slice on the widest vector
// level the CPU has (each masks its last partial vector), exp32 value by value
// without one.
func vexpOrSigmoid(dst, src []float32, sigmoid bool) {
	n := len(src)
	if n == 0 {
		return
	}
	_ = dst[n-1]
	switch {
	case hasAVX512:
		vexp32AVX512(&dst[0], &src[0], n, sigmoid)
		return
	case hasAVX2:
		vexp32AVX2(&dst[0], &src[0], n, sigmoid)
		return
	}
	for i, x := range src {
		if sigmoid {
			dst[i] = 1 / (1 + exp32(-x))
		} else {
			dst[i] = exp32(x)
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

//go:noescape
func vaffine32AVX512(x *float32, n int, a, b float32)

//go:noescape
func vdsoftmax32AVX512(d, p *float32, n int, dot, scale float32)

// affine sets x[i] = a·x[i] + b, sixteen at a time where the CPU has AVX-512 (the
// same roundings as the scalar expression).
func affine[F Float](x []F, a, b F) {
	bulk := 0
	if x32, ok := any(x).([]float32); ok && hasAVX512 && len(x32) >= 16 {
		bulk = len(x32) &^ 15
		vaffine32AVX512(&x32[0], bulk, float32(a), float32(b))
	}
	for i := bulk; i < len(x); i++ {
		x[i] = a*x[i] + b
	}
}

// dsoftmax sets d[i] = p[i]·(d[i] − dot)·scale (len(p) ≥ len(d)), sixteen at a
// time where the CPU has AVX-512, rounded as the scalar expression is.
func dsoftmax[F Float](d, p []F, dot, scale F) {
	bulk := 0
	if d32, ok := any(d).([]float32); ok && hasAVX512 && len(d32) >= 16 {
		p32 := any(p).([]float32)[:len(d32)]
		bulk = len(d32) &^ 15
		vdsoftmax32AVX512(&d32[0], &p32[0], bulk, float32(dot), float32(scale))
	}
	for i := bulk; i < len(d); i++ {
		d[i] = p[i] * (d[i] - dot) * scale
	}
}
