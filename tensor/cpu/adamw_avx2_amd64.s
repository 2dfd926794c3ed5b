//go:build amd64 && !purego

#include "textflag.h"

// func adamw32AVX2(n int, p, grad, m, v *float32, k *[9]float32)
//
// adamw32AVX512 eight lanes at a time for CPUs without AVX-512 (n a multiple of
// 8): the same operations in the same order, no fused multiply-add, so every
// lane rounds as the scalar code does. k as adamw32AVX512.
TEXT ·adamw32AVX2(SB), NOSPLIT, $0-48
	MOVQ n+0(FP), CX
	MOVQ p+8(FP), DI
	MOVQ grad+16(FP), SI
	MOVQ m+24(FP), R8
	MOVQ v+32(FP), R9
	MOVQ k+40(FP), AX
	VBROADCASTSS 0(AX), Y0  // b1
	VBROADCASTSS 4(AX), Y1  // 1-b1
	VBROADCASTSS 8(AX), Y2  // b2
	VBROADCASTSS 12(AX), Y3 // 1-b2
	VBROADCASTSS 16(AX), Y4 // c1
	VBROADCASTSS 20(AX), Y5 // c2
	VBROADCASTSS 24(AX), Y6 // eps
	VBROADCASTSS 28(AX), Y7 // lr
	VBROADCASTSS 32(AX), Y8 // wd
loop:
	TESTQ CX, CX
	JEQ done
	VMOVUPS (SI), Y9         // g
	VMOVUPS (R8), Y10         // m
	VMOVUPS (R9), Y11         // v
	VMOVUPS (DI), Y12         // p
	VMULPS Y0, Y10, Y10       // b1·m
	VMULPS Y1, Y9, Y13       // (1−b1)·g
	VADDPS Y13, Y10, Y10      // mi
	VMULPS Y2, Y11, Y11       // b2·v
	VMULPS Y3, Y9, Y13       // (1−b2)·g
	VMULPS Y9, Y13, Y13      // ·g
	VADDPS Y13, Y11, Y11      // vi
	VMOVUPS Y10, (R8)
	VMOVUPS Y11, (R9)
	VMULPS Y5, Y11, Y13       // vi·c2
	VSQRTPS Y13, Y13
	VADDPS Y6, Y13, Y13       // + eps
	VMULPS Y4, Y10, Y14       // mi·c1
	VDIVPS Y13, Y14, Y14      // / (√ + eps)
	VMULPS Y8, Y12, Y15       // wd·p
	VADDPS Y15, Y14, Y14
	VMULPS Y7, Y14, Y14       // lr·(…)
	VSUBPS Y14, Y12, Y12      // p − lr·(…)
	VMOVUPS Y12, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	ADDQ $32, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JMP loop
done:
	VZEROUPPER
	RET
