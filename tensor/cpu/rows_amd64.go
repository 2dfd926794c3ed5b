//go:build amd64 && !purego

package cpu

//go:noescape
func vswiglu32AVX512(o, gate, u, s *float32, n int)

//go:noescape
func vswigluBack32AVX512(dg, du, do, gate, u, s *float32, n int, acc bool)

//go:noescape
func vrmsBack32AVX512(dx, dw, d, w, x *float32, n int, r, k float32)

//go:noescape
func vswiglu32AVX2(o, gate, u, s *float32, n int)

//go:noescape
func vswigluBack32AVX2(dg, du, do, gate, u, s *float32, n int, acc bool)

//go:noescape
func vrmsBack32AVX2(dx, dw, d, w, x *float32, n int, r, k float32)

// rowLanes is the vector width the row kernels run at: 16 with AVX-512, 8
// with AVX2 and FMA, 0 (the scalar loops only) otherwise.
func rowLanes() int {
	switch {
	case hasAVX512:
		return 16
	case hasAVX2:
		return 8
	}
	return 0
}

// swigluRow is swigluRowScalar, sixteen at a time where the CPU has AVX-512,
// eight with AVX2 (rows_amd64.s, rows_avx2_amd64.s: the same roundings).
func swigluRow[F Float](o, g, u, s []F) {
	bulk := 0
	if g32, ok := any(g).([]float32); ok && rowLanes() > 0 && len(g32) >= rowLanes() {
		o32, u32, s32 := any(o).([]float32)[:len(g32)], any(u).([]float32)[:len(g32)], any(s).([]float32)[:len(g32)]
		bulk = len(g32) &^ (rowLanes() - 1)
		if hasAVX512 {
			vswiglu32AVX512(&o32[0], &g32[0], &u32[0], &s32[0], bulk)
		} else {
			vswiglu32AVX2(&o32[0], &g32[0], &u32[0], &s32[0], bulk)
		}
	}
	swigluRowScalar(o[bulk:], g[bulk:], u[bulk:], s[bulk:])
}

// swigluBackRow is swigluBackRowScalar, sixteen at a time where the CPU has
// AVX-512, eight with AVX2 (the same roundings).
func swigluBackRow[F Float](dg, du, do, g, u, s []F, acc bool) {
	bulk := 0
	if g32, ok := any(g).([]float32); ok && rowLanes() > 0 && len(g32) >= rowLanes() {
		n := len(g32)
		dg32, du32, do32 := any(dg).([]float32)[:n], any(du).([]float32)[:n], any(do).([]float32)[:n]
		u32, s32 := any(u).([]float32)[:n], any(s).([]float32)[:n]
		bulk = n &^ (rowLanes() - 1)
		if hasAVX512 {
			vswigluBack32AVX512(&dg32[0], &du32[0], &do32[0], &g32[0], &u32[0], &s32[0], bulk, acc)
		} else {
			vswigluBack32AVX2(&dg32[0], &du32[0], &do32[0], &g32[0], &u32[0], &s32[0], bulk, acc)
		}
	}
	swigluBackRowScalar(dg[bulk:], du[bulk:], do[bulk:], g[bulk:], u[bulk:], s[bulk:], acc)
}

// rmsBackRow is rmsBackRowScalar, sixteen at a time where the CPU has AVX-512,
// eight with AVX2 (the same roundings).
func rmsBackRow[F Float](dx, dw, d, w, x []F, r, k F) {
	bulk := 0
	if x32, ok := any(x).([]float32); ok && rowLanes() > 0 && len(x32) >= rowLanes() {
		n := len(x32)
		dx32, dw32, d32, w32 := any(dx).([]float32)[:n], any(dw).([]float32)[:n], any(d).([]float32)[:n], any(w).([]float32)[:n]
		bulk = n &^ (rowLanes() - 1)
		if hasAVX512 {
			vrmsBack32AVX512(&dx32[0], &dw32[0], &d32[0], &w32[0], &x32[0], bulk, float32(r), float32(k))
		} else {
			vrmsBack32AVX2(&dx32[0], &dw32[0], &d32[0], &w32[0], &x32[0], bulk, float32(r), float32(k))
		}
	}
	rmsBackRowScalar(dx[bulk:], dw[bulk:], d[bulk:], w[bulk:], x[bulk:], r, k)
}
