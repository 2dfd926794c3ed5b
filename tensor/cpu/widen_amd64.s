//go:build amd64 && !purego

#include "textflag.h"

// func widenPanelAVX512(dst *float32, src *tensor.BF16, ldb, k int)
//
// dst[p*32+j] = float32(src[p*ldb+j]) for p < k, j < 32: each bf16 is
// zero-extended to 32 bits (VPMOVZXWD) and shifted into the high half
// (VPSLLD $16), which is its float32 exactly. ldb is in elements.
TEXT ·widenPanelAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ldb+16(FP), BX
	MOVQ k+24(FP), CX
	SHLQ $1, BX // bytes per row of src
loop:
	TESTQ CX, CX
	JEQ done
	VPMOVZXWD (SI), Z0
	VPMOVZXWD 32(SI), Z1
	VPSLLD $16, Z0, Z0
	VPSLLD $16, Z1, Z1
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	ADDQ BX, SI
	ADDQ $128, DI
	DECQ CX
	JMP loop
done:
	VZEROUPPER
	RET

// func toBF16AVX512(dst *tensor.BF16, src *float32, n int)
//
// dst[i] = the bf16 nearest src[i], ties to even, for i < n (a multiple of 16):
// tensor.ToBF16 sixteen lanes at a time. The rounding adds 0x7fff plus the
// kept part's lowest bit to the bits and keeps the high half; a NaN keeps its
// high half with a quiet bit (0x40) set, so it stays a NaN.
TEXT ·toBF16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z2
	MOVL $1, AX
	VPBROADCASTD AX, Z3
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z4
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z5
	MOVL $0x40, AX
	VPBROADCASTD AX, Z6
tloop:
	TESTQ CX, CX
	JEQ tdone
	VMOVDQU32 (SI), Z0     // the bits b
	VPSRLD $16, Z0, Z1     // b >> 16
	VPANDD Z3, Z1, Z7      // its lowest bit
	VPADDD Z2, Z0, Z8      // b + 0x7fff
	VPADDD Z7, Z8, Z8      // + the lowest bit
	VPSRLD $16, Z8, Z8     // rounded
	VPANDD Z4, Z0, Z9      // |b|
	VPCMPUD $6, Z5, Z9, K1 // NaN lanes: |b| > 0x7f800000
	VPORD Z6, Z1, Z10      // b >> 16 | 0x40
	VMOVDQA32 Z10, K1, Z8  // NaNs take it
	VPMOVDW Z8, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JMP tloop
tdone:
	VZEROUPPER
	RET
