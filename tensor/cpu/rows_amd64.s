//go:build amd64 && !purego

#include "textflag.h"

// The element-wise row updates of SwiGLU and RMSNorm, sixteen lanes at a time,
// each rounded as the scalar expression in kernels.go is (a product, then the
// next, left to right; no fused multiply-add), so they equal it bit for bit.

// func vswiglu32AVX512(o, gate, u, s *float32, n int)
//
// o[i] = gate[i]·s[i]·u[i] for i < n, a multiple of 16 (s = σ(gate)).
TEXT ·vswiglu32AVX512(SB), NOSPLIT, $0-40
	MOVQ o+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ u+16(FP), R9
	MOVQ s+24(FP), R10
	MOVQ n+32(FP), CX
floop:
	TESTQ CX, CX
	JEQ fdone
	VMOVUPS (SI), Z0
	VMULPS (R10), Z0, Z0 // g·s
	VMULPS (R9), Z0, Z0  // ·u
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, R9
	ADDQ $64, R10
	SUBQ $16, CX
	JMP floop
fdone:
	VZEROUPPER
	RET

// func vswigluBack32AVX512(dg, du, do, gate, u, s *float32, n int, acc bool)
//
// dg[i] = do[i]·u[i]·s[i]·(1 + gate[i]·(1 − s[i])) and du[i] = do[i]·gate[i]·s[i] for
// i < n, a multiple of 16 (s = σ(gate)); with acc both are added to what dg and du
// hold.
TEXT ·vswigluBack32AVX512(SB), NOSPLIT, $0-57
	MOVQ dg+0(FP), DI
	MOVQ du+8(FP), R8
	MOVQ do+16(FP), SI
	MOVQ gate+24(FP), R9
	MOVQ u+32(FP), R10
	MOVQ s+40(FP), R11
	MOVQ n+48(FP), CX
	MOVBQZX acc+56(FP), DX
	MOVL $0x3f800000, AX // 1
	VPBROADCASTD AX, Z7
bloop:
	TESTQ CX, CX
	JEQ bdone
	VMOVUPS (SI), Z0     // do
	VMOVUPS (R9), Z1     // g
	VMOVUPS (R11), Z2    // s
	VMULPS (R10), Z0, Z3 // do·u
	VMULPS Z2, Z3, Z3    // ·s
	VSUBPS Z2, Z7, Z4    // 1 − s
	VMULPS Z4, Z1, Z4    // g·(1 − s)
	VADDPS Z4, Z7, Z4    // 1 + g·(1 − s)
	VMULPS Z4, Z3, Z3    // dg's term
	VMULPS Z1, Z0, Z5    // do·g
	VMULPS Z2, Z5, Z5    // ·s: du's term
	TESTQ DX, DX
	JEQ bstore
	VADDPS (DI), Z3, Z3
	VADDPS (R8), Z5, Z5
bstore:
	VMOVUPS Z3, (DI)
	VMOVUPS Z5, (R8)
	ADDQ $64, DI
	ADDQ $64, R8
	ADDQ $64, SI
	ADDQ $64, R9
	ADDQ $64, R10
	ADDQ $64, R11
	SUBQ $16, CX
	JMP bloop
bdone:
	VZEROUPPER
	RET

// func vrmsBack32AVX512(dx, dw, d, w, x *float32, n int, r, k float32)
//
// dx[c] += r·d[c]·w[c] − x[c]·k and dw[c] += d[c]·x[c]·r for c < n, a multiple
// of 16: one row of RMSNorm's backward.
TEXT ·vrmsBack32AVX512(SB), NOSPLIT, $0-56
	MOVQ dx+0(FP), DI
	MOVQ dw+8(FP), R8
	MOVQ d+16(FP), SI
	MOVQ w+24(FP), R9
	MOVQ x+32(FP), R10
	MOVQ n+40(FP), CX
	VBROADCASTSS r+48(FP), Z6
	VBROADCASTSS k+52(FP), Z7
rloop:
	TESTQ CX, CX
	JEQ rdone
	VMOVUPS (SI), Z0     // d
	VMOVUPS (R10), Z1    // x
	VMULPS Z0, Z6, Z2    // r·d
	VMULPS (R9), Z2, Z2  // ·w
	VMULPS Z7, Z1, Z3    // x·k
	VSUBPS Z3, Z2, Z2    // r·d·w − x·k
	VADDPS (DI), Z2, Z2  // dx + ...
	VMOVUPS Z2, (DI)
	VMULPS Z1, Z0, Z4    // d·x
	VMULPS Z6, Z4, Z4    // ·r
	VADDPS (R8), Z4, Z4  // dw + ...
	VMOVUPS Z4, (R8)
	ADDQ $64, DI
	ADDQ $64, R8
	ADDQ $64, SI
	ADDQ $64, R9
	ADDQ $64, R10
	SUBQ $16, CX
	JMP rloop
rdone:
	VZEROUPPER
	RET
