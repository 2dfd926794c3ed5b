//go:build amd64 && !purego

#include "textflag.h"

// Constants of toBF16AVX2, eight lanes each (VPADDD's and VPAND's memory
// operands; loading them through a general register would take a legacy-SSE
// move, slow between AVX instructions: exp_avx2_amd64.s).
DATA bf16Round<>+0(SB)/4, $0x7fff
DATA bf16Round<>+4(SB)/4, $0x7fff
DATA bf16Round<>+8(SB)/4, $0x7fff
DATA bf16Round<>+12(SB)/4, $0x7fff
DATA bf16Round<>+16(SB)/4, $0x7fff
DATA bf16Round<>+20(SB)/4, $0x7fff
DATA bf16Round<>+24(SB)/4, $0x7fff
DATA bf16Round<>+28(SB)/4, $0x7fff
GLOBL bf16Round<>(SB), RODATA|NOPTR, $32

DATA bf16Consts<>+0(SB)/4, $1          // the kept part's lowest bit
DATA bf16Consts<>+4(SB)/4, $0x7fffffff // |b|
DATA bf16Consts<>+8(SB)/4, $0x7f800000 // +Inf's bits
DATA bf16Consts<>+12(SB)/4, $0x40      // a NaN's quiet bit, in the high half
GLOBL bf16Consts<>(SB), RODATA|NOPTR, $16

// func widenPanelAVX2(dst *float32, src *tensor.BF16, ldb, k int)
//
// widenPanelAVX512 eight lanes an instruction: dst[p*32+j] = float32(src[p*ldb+j])
// for p < k, j < 32, each bf16 zero-extended (VPMOVZXWD) and shifted into the
// high half, which is its float32 exactly.
TEXT ·widenPanelAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ldb+16(FP), BX
	MOVQ k+24(FP), CX
	SHLQ $1, BX // bytes per row of src
wloop:
	TESTQ CX, CX
	JEQ wdone
	VPMOVZXWD (SI), Y0
	VPMOVZXWD 16(SI), Y1
	VPMOVZXWD 32(SI), Y2
	VPMOVZXWD 48(SI), Y3
	VPSLLD $16, Y0, Y0
	VPSLLD $16, Y1, Y1
	VPSLLD $16, Y2, Y2
	VPSLLD $16, Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ BX, SI
	ADDQ $128, DI
	DECQ CX
	JMP wloop
wdone:
	VZEROUPPER
	RET

// func toBF16AVX2(dst *tensor.BF16, src *float32, n int)
//
// toBF16AVX512 for CPUs with AVX2 but not AVX-512, sixteen values an iteration
// (n a multiple of 16), two halves of eight: the bits plus 0x7fff plus the kept
// part's lowest bit, shifted down, a NaN's high half with the quiet bit set
// instead (VPBLENDVB on |b| > +Inf's bits, a signed compare that is right
// because |b| < 2³¹), then the halves packed to 16 bits (VPACKUSDW, within
// 128-bit lanes, put in order by VPERMQ).
TEXT ·toBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VMOVDQU bf16Round<>(SB), Y2
	VPBROADCASTD bf16Consts<>+0(SB), Y3
	VPBROADCASTD bf16Consts<>+4(SB), Y4
	VPBROADCASTD bf16Consts<>+8(SB), Y5
	VPBROADCASTD bf16Consts<>+12(SB), Y6
tloop:
	TESTQ CX, CX
	JEQ tdone
	VMOVDQU (SI), Y0       // the bits b (first eight)
	VPSRLD $16, Y0, Y1     // b >> 16
	VPAND Y3, Y1, Y7       // its lowest bit
	VPADDD Y2, Y0, Y8      // b + 0x7fff
	VPADDD Y7, Y8, Y8      // + the lowest bit
	VPSRLD $16, Y8, Y8     // rounded
	VPAND Y4, Y0, Y9       // |b|
	VPCMPGTD Y5, Y9, Y9    // NaN lanes: |b| > 0x7f800000
	VPOR Y6, Y1, Y10       // b >> 16 | 0x40
	VPBLENDVB Y9, Y10, Y8, Y8
	VMOVDQU 32(SI), Y0     // the next eight
	VPSRLD $16, Y0, Y1
	VPAND Y3, Y1, Y7
	VPADDD Y2, Y0, Y11
	VPADDD Y7, Y11, Y11
	VPSRLD $16, Y11, Y11
	VPAND Y4, Y0, Y9
	VPCMPGTD Y5, Y9, Y9
	VPOR Y6, Y1, Y10
	VPBLENDVB Y9, Y10, Y11, Y11
	VPACKUSDW Y11, Y8, Y8  // 0-3, 8-11 | 4-7, 12-15
	VPERMQ $0xd8, Y8, Y8   // 0-3, 4-7 | 8-11, 12-15
	VMOVDQU Y8, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JMP tloop
tdone:
	VZEROUPPER
	RET
