//go:build amd64 && !purego

#include "textflag.h"

// rows_amd64.s's row updates eight lanes at a time, for CPUs with AVX2 but not
// AVX-512: the same operations in the same order (no fused multiply-add), so
// they equal the scalar expressions bit for bit. Constants come from memory
// (VBROADCASTSS): a legacy-SSE move between AVX instructions is slow on some
// CPUs (exp_avx2_amd64.s).

DATA rowsOne<>+0(SB)/4, $0x3f800000
GLOBL rowsOne<>(SB), RODATA|NOPTR, $4

// func vswiglu32AVX2(o, gate, u, s *float32, n int)
//
// o[i] = gate[i]·s[i]·u[i] for i < n, a multiple of 8 (s = σ(gate)).
TEXT ·vswiglu32AVX2(SB), NOSPLIT, $0-40
	MOVQ o+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ u+16(FP), R9
	MOVQ s+24(FP), R10
	MOVQ n+32(FP), CX
floop:
	TESTQ CX, CX
	JEQ fdone
	VMOVUPS (SI), Y0
	VMULPS (R10), Y0, Y0 // g·s
	VMULPS (R9), Y0, Y0  // ·u
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, R9
	ADDQ $32, R10
	SUBQ $8, CX
	JMP floop
fdone:
	VZEROUPPER
	RET

// func vswigluBack32AVX2(dg, du, do, gate, u, s *float32, n int, acc bool)
//
// dg[i] = do[i]·u[i]·s[i]·(1 + gate[i]·(1 − s[i])) and du[i] = do[i]·gate[i]·s[i] for
// i < n, a multiple of 8 (s = σ(gate)); with acc both are added to what dg and du
// hold.
TEXT ·vswigluBack32AVX2(SB), NOSPLIT, $0-57
	MOVQ dg+0(FP), DI
	MOVQ du+8(FP), R8
	MOVQ do+16(FP), SI
	MOVQ gate+24(FP), R9
	MOVQ u+32(FP), R10
	MOVQ s+40(FP), R11
	MOVQ n+48(FP), CX
	MOVBQZX acc+56(FP), DX
	VBROADCASTSS rowsOne<>(SB), Y7 // 1
bloop:
	TESTQ CX, CX
	JEQ bdone
	VMOVUPS (SI), Y0     // do
	VMOVUPS (R9), Y1     // g
	VMOVUPS (R11), Y2    // s
	VMULPS (R10), Y0, Y3 // do·u
	VMULPS Y2, Y3, Y3    // ·s
	VSUBPS Y2, Y7, Y4    // 1 − s
	VMULPS Y4, Y1, Y4    // g·(1 − s)
	VADDPS Y4, Y7, Y4    // 1 + g·(1 − s)
	VMULPS Y4, Y3, Y3    // dg's term
	VMULPS Y1, Y0, Y5    // do·g
	VMULPS Y2, Y5, Y5    // ·s: du's term
	TESTQ DX, DX
	JEQ bstore
	VADDPS (DI), Y3, Y3
	VADDPS (R8), Y5, Y5
bstore:
	VMOVUPS Y3, (DI)
	VMOVUPS Y5, (R8)
	ADDQ $32, DI
	ADDQ $32, R8
	ADDQ $32, SI
	ADDQ $32, R9
	ADDQ $32, R10
	ADDQ $32, R11
	SUBQ $8, CX
	JMP bloop
bdone:
	VZEROUPPER
	RET

// func vrmsBack32AVX2(dx, dw, d, w, x *float32, n int, r, k float32)
//
// dx[c] += r·d[c]·w[c] − x[c]·k and dw[c] += d[c]·x[c]·r for c < n, a multiple
// of 16: one row of RMSNorm's backward.
TEXT ·vrmsBack32AVX2(SB), NOSPLIT, $0-56
	MOVQ dx+0(FP), DI
	MOVQ dw+8(FP), R8
	MOVQ d+16(FP), SI
	MOVQ w+24(FP), R9
	MOVQ x+32(FP), R10
	MOVQ n+40(FP), CX
	VBROADCASTSS r+48(FP), Y6
	VBROADCASTSS k+52(FP), Y7
rloop:
	TESTQ CX, CX
	JEQ rdone
	VMOVUPS (SI), Y0     // d
	VMOVUPS (R10), Y1    // x
	VMULPS Y0, Y6, Y2    // r·d
	VMULPS (R9), Y2, Y2  // ·w
	VMULPS Y7, Y1, Y3    // x·k
	VSUBPS Y3, Y2, Y2    // r·d·w − x·k
	VADDPS (DI), Y2, Y2  // dx + ...
	VMOVUPS Y2, (DI)
	VMULPS Y1, Y0, Y4    // d·x
	VMULPS Y6, Y4, Y4    // ·r
	VADDPS (R8), Y4, Y4  // dw + ...
	VMOVUPS Y4, (R8)
	ADDQ $32, DI
	ADDQ $32, R8
	ADDQ $32, SI
	ADDQ $32, R9
	ADDQ $32, R10
	SUBQ $8, CX
	JMP rloop
rdone:
	VZEROUPPER
	RET
