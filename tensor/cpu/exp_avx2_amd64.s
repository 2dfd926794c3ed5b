//go:build amd64 && !purego

#include "textflag.h"

// The exponent bias, eight lanes (VPADDD's memory operand).
DATA expBias<>+0(SB)/4, $127
DATA expBias<>+4(SB)/4, $127
DATA expBias<>+8(SB)/4, $127
DATA expBias<>+12(SB)/4, $127
DATA expBias<>+16(SB)/4, $127
DATA expBias<>+20(SB)/4, $127
DATA expBias<>+24(SB)/4, $127
DATA expBias<>+28(SB)/4, $127
GLOBL expBias<>(SB), RODATA|NOPTR, $32

// exp32's constants, loaded by VBROADCASTSS (VEX-encoded: moving them through
// a general register takes a legacy-SSE MOVQ, which, between AVX instructions,
// cost about a microsecond a call here).
DATA expConst<>+0(SB)/4, $0x42b17217 // 88.72283
DATA expConst<>+4(SB)/4, $0xc2aeac4f // -87.33654
DATA expConst<>+8(SB)/4, $0x3fb8aa3b // log2(e)
DATA expConst<>+12(SB)/4, $0x3f318000 // 0.693359375
DATA expConst<>+16(SB)/4, $0xb95e8083 // -2.12194440e-4
DATA expConst<>+20(SB)/4, $0x39506967 // 1.9875691500e-4
DATA expConst<>+24(SB)/4, $0x3ab743ce // 1.3981999507e-3
DATA expConst<>+28(SB)/4, $0x3c088908 // 8.3334519073e-3
DATA expConst<>+32(SB)/4, $0x3d2aa9c1 // 4.1665795894e-2
DATA expConst<>+36(SB)/4, $0x3e2aaaaa // 1.6666665459e-1
DATA expConst<>+40(SB)/4, $0x3f000000 // 5.0000001201e-1 (0.5 in float32)
DATA expConst<>+44(SB)/4, $0x3f800000 // 1
GLOBL expConst<>(SB), RODATA|NOPTR, $48

// The tail's lane masks: eight all-ones words, then eight zeros; the eight
// words from byte 4·(8−r) on mask the first r lanes.
DATA expTail<>+0(SB)/4, $-1
DATA expTail<>+4(SB)/4, $-1
DATA expTail<>+8(SB)/4, $-1
DATA expTail<>+12(SB)/4, $-1
DATA expTail<>+16(SB)/4, $-1
DATA expTail<>+20(SB)/4, $-1
DATA expTail<>+24(SB)/4, $-1
DATA expTail<>+28(SB)/4, $-1
DATA expTail<>+32(SB)/4, $0
DATA expTail<>+36(SB)/4, $0
DATA expTail<>+40(SB)/4, $0
DATA expTail<>+44(SB)/4, $0
DATA expTail<>+48(SB)/4, $0
DATA expTail<>+52(SB)/4, $0
DATA expTail<>+56(SB)/4, $0
DATA expTail<>+60(SB)/4, $0
GLOBL expTail<>(SB), RODATA|NOPTR, $64

// func vexp32AVX2(dst, src *float32, n int, sigmoid bool)
//
// vexp32AVX512 for CPUs with AVX2 and FMA but not AVX-512, eight lanes at a
// time, the last n mod 8 values under a mask (VMASKMOVPS, in the tail only:
// AMD's masked stores are slow; lanes past n are neither read nor written):
// x clamped to [-87.33654, 88.72283], n = round(x·log2e)
// (VROUNDPS, to nearest even), r = x − n·C1 + n·C2, e^r by the degree-6
// polynomial, times 2^n built in the exponent bits (as exp32 scales, so the
// largest clamped x gives +Inf as exp32 does). With sigmoid set, dst[i] =
// 1 / (1 + e^−src[i]). Constants: Y4..Y15; Y0..Y3 work.
TEXT ·vexp32AVX2(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVBQZX sigmoid+24(FP), R8
	VBROADCASTSS expConst<>+0(SB), Y4 // 88.72283
	VBROADCASTSS expConst<>+4(SB), Y5 // -87.33654
	VBROADCASTSS expConst<>+8(SB), Y6 // log2(e)
	VBROADCASTSS expConst<>+12(SB), Y7 // 0.693359375
	VBROADCASTSS expConst<>+16(SB), Y8 // -2.12194440e-4
	VBROADCASTSS expConst<>+20(SB), Y9 // 1.9875691500e-4
	VBROADCASTSS expConst<>+24(SB), Y10 // 1.3981999507e-3
	VBROADCASTSS expConst<>+28(SB), Y11 // 8.3334519073e-3
	VBROADCASTSS expConst<>+32(SB), Y12 // 4.1665795894e-2
	VBROADCASTSS expConst<>+36(SB), Y13 // 1.6666665459e-1
	VBROADCASTSS expConst<>+40(SB), Y14 // 5.0000001201e-1 (0.5 in float32)
	VBROADCASTSS expConst<>+44(SB), Y15 // 1
loop:
	TESTQ CX, CX
	JLE done
	CMPQ CX, $8
	JLT tailload
	VMOVUPS (SI), Y0
	JMP loaded
tailload:
	LEAQ expTail<>+32(SB), AX     // the first CX lanes' mask: 4·CX bytes before the zeros
	MOVQ CX, DX
	SHLQ $2, DX
	SUBQ DX, AX
	VMOVDQU (AX), Y3
	VMASKMOVPS (SI), Y3, Y0
loaded:
	TESTQ R8, R8
	JEQ clamp
	VXORPS Y3, Y3, Y3
	VSUBPS Y0, Y3, Y0             // −x
clamp:
	VMINPS Y0, Y4, Y0 // x first: a NaN x stays NaN (VMINPS returns its second source on NaN)
	VMAXPS Y0, Y5, Y0
	VMULPS Y6, Y0, Y1
	VROUNDPS $0, Y1, Y1           // n = round(x·log2e)
	VFNMADD231PS Y7, Y1, Y0       // r = x − n·C1
	VFNMADD231PS Y8, Y1, Y0       // r −= n·C2
	VMOVAPS Y9, Y2                // p = P0
	VFMADD213PS Y10, Y0, Y2       // p = p·r + P1
	VFMADD213PS Y11, Y0, Y2
	VFMADD213PS Y12, Y0, Y2
	VFMADD213PS Y13, Y0, Y2
	VFMADD213PS Y14, Y0, Y2       // p = p·r + P5
	VMULPS Y0, Y0, Y3             // r²
	VFMADD213PS Y0, Y3, Y2        // p·r² + r
	VADDPS Y15, Y2, Y2            // + 1
	VCVTPS2DQ Y1, Y1              // n, exact
	VPADDD expBias<>(SB), Y1, Y1
	VPSLLD $23, Y1, Y1            // 2^n
	VMULPS Y1, Y2, Y2
	TESTQ R8, R8
	JEQ store
	VADDPS Y15, Y2, Y2            // 1 + e^−x
	VDIVPS Y2, Y15, Y2            // 1 / (1 + e^−x)
store:
	CMPQ CX, $8
	JLT tailstore
	VMOVUPS Y2, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP loop
tailstore:
	VMOVDQU (AX), Y3              // the mask again (Y3 was work)
	VMASKMOVPS Y2, Y3, (DI)
done:
	VZEROUPPER
	RET
