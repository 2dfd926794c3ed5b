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
