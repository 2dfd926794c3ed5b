//go:build amd64 && !purego

#include "textflag.h"

// func adamw32AVX512(n int, p, grad, m, v *float32, k *[10]float32)
//
// One AdamW step over n values (n a multiple of 16), sixteen lanes at a time, with
// the operations of optimJob.update in the same order and no fused multiply-add,
// so every lane rounds exactly as the scalar code does. k holds b1, 1−b1, b2,
// 1−b2, c1, c2, eps, lr, wd and the clip factor, which each gradient is
// multiplied by first (broadcast again each block: no register is left over in
// the AVX2 twin).
TEXT ·adamw32AVX512(SB), NOSPLIT, $0-48
	MOVQ n+0(FP), CX
	MOVQ p+8(FP), DI
	MOVQ grad+16(FP), SI
	MOVQ m+24(FP), R8
	MOVQ v+32(FP), R9
	MOVQ k+40(FP), AX
	VBROADCASTSS 0(AX), Z0  // b1
	VBROADCASTSS 4(AX), Z1  // 1-b1
	VBROADCASTSS 8(AX), Z2  // b2
	VBROADCASTSS 12(AX), Z3 // 1-b2
	VBROADCASTSS 16(AX), Z4 // c1
	VBROADCASTSS 20(AX), Z5 // c2
	VBROADCASTSS 24(AX), Z6 // eps
	VBROADCASTSS 28(AX), Z7 // lr
	VBROADCASTSS 32(AX), Z8 // wd
loop:
	TESTQ CX, CX
	JEQ done
	VMOVUPS (SI), Z10         // g
	VMOVUPS (R8), Z11         // m
	VMOVUPS (R9), Z12         // v
	VMOVUPS (DI), Z13         // p
	VBROADCASTSS 36(AX), Z14  // clip
	VMULPS Z14, Z10, Z10      // g·clip
	VMULPS Z0, Z11, Z11       // b1·m
	VMULPS Z1, Z10, Z14       // (1−b1)·g
	VADDPS Z14, Z11, Z11      // mi
	VMULPS Z2, Z12, Z12       // b2·v
	VMULPS Z3, Z10, Z14       // (1−b2)·g
	VMULPS Z10, Z14, Z14      // ·g
	VADDPS Z14, Z12, Z12      // vi
	VMOVUPS Z11, (R8)
	VMOVUPS Z12, (R9)
	VMULPS Z5, Z12, Z14       // vi·c2
	VSQRTPS Z14, Z14
	VADDPS Z6, Z14, Z14       // + eps
	VMULPS Z4, Z11, Z15       // mi·c1
	VDIVPS Z14, Z15, Z15      // / (√ + eps)
	VMULPS Z8, Z13, Z16       // wd·p
	VADDPS Z16, Z15, Z15
	VMULPS Z7, Z15, Z15       // lr·(…)
	VSUBPS Z15, Z13, Z13      // p − lr·(…)
	VMOVUPS Z13, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, R8
	ADDQ $64, R9
	SUBQ $16, CX
	JMP loop
done:
	VZEROUPPER
	RET
