//go:build !amd64 || purego

package cpu

// swigluRow sets o[i] = g[i]·s[i]·u[i].
func swigluRow[F Float](o, g, u, s []F) { swigluRowScalar(o, g, u, s) }

// swigluBackRow is swigluBackRowScalar.
func swigluBackRow[F Float](dg, du, do, g, u, s []F, acc bool) {
	swigluBackRowScalar(dg, du, do, g, u, s, acc)
}

// rmsBackRow is rmsBackRowScalar.
func rmsBackRow[F Float](dx, dw, d, w, x []F, r, k F) { rmsBackRowScalar(dx, dw, d, w, x, r, k) }
