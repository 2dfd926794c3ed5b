//go:build amd64 && !purego

#include "textflag.h"

// func vexp32AVX512(dst, src *float32, n int, sigmoid bool)
//
// dst[i] = e^src[i] for i < n: the algorithm of exp32 (Cephes' expf) sixteen
// lanes at a time, the last n mod 16 values under a mask (lanes past n are
// neither read nor written), with fused multiply-adds where exp32 rounds each
// step, so a value may differ from exp32's in the last place. x is clamped to [-87.33654, 88.72283]; x = n·ln2 + r
// with n rounded to nearest (VRNDSCALEPS), e^r by the degree-6 polynomial, and the
// result scaled by 2^n (VSCALEFPS). With sigmoid set it is the logistic function
// instead: dst[i] = 1 / (1 + e^−src[i]).
TEXT ·vexp32AVX512(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVBQZX sigmoid+24(FP), R8
	VPXORD Z19, Z19, Z19          // 0, for negating
	MOVL $0x42b17217, AX // 88.72283
	VPBROADCASTD AX, Z20
	MOVL $0xc2aeac4f, AX // -87.33654
	VPBROADCASTD AX, Z21
	MOVL $0x3fb8aa3b, AX // log2(e)
	VPBROADCASTD AX, Z22
	MOVL $0x3f318000, AX // 0.693359375
	VPBROADCASTD AX, Z23
	MOVL $0xb95e8083, AX // -2.12194440e-4
	VPBROADCASTD AX, Z24
	MOVL $0x39506967, AX // 1.9875691500e-4
	VPBROADCASTD AX, Z25
	MOVL $0x3ab743ce, AX // 1.3981999507e-3
	VPBROADCASTD AX, Z26
	MOVL $0x3c088908, AX // 8.3334519073e-3
	VPBROADCASTD AX, Z27
	MOVL $0x3d2aa9c1, AX // 4.1665795894e-2
	VPBROADCASTD AX, Z28
	MOVL $0x3e2aaaaa, AX // 1.6666665459e-1
	VPBROADCASTD AX, Z29
	MOVL $0x3f000000, AX // 5.0000001201e-1 (0.5 in float32)
	VPBROADCASTD AX, Z30
	MOVL $0x3f800000, AX // 1
	VPBROADCASTD AX, Z31
	TESTQ CX, CX
	JLE done
loop:
	MOVL $0xffff, AX              // sixteen lanes, or the n mod 16 left
	CMPQ CX, $16
	JGE mask
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
mask:
	KMOVW AX, K1
	VMOVUPS.Z (SI), K1, Z0
	TESTQ R8, R8
	JEQ clamp
	VSUBPS Z0, Z19, Z0            // −x
clamp:
	VMINPS Z0, Z20, Z0             // x first: a NaN x stays NaN (VMINPS returns its second source on NaN)
	VMAXPS Z0, Z21, Z0
	VMULPS Z22, Z0, Z1
	VRNDSCALEPS $0, Z1, Z1        // n = round(x·log2e)
	VFNMADD231PS Z23, Z1, Z0      // r = x − n·C1
	VFNMADD231PS Z24, Z1, Z0      // r −= n·C2
	VMOVAPS Z25, Z2               // p = P0
	VFMADD213PS Z26, Z0, Z2       // p = p·r + P1
	VFMADD213PS Z27, Z0, Z2
	VFMADD213PS Z28, Z0, Z2
	VFMADD213PS Z29, Z0, Z2
	VFMADD213PS Z30, Z0, Z2       // p = p·r + P5
	VMULPS Z0, Z0, Z3             // r²
	VFMADD213PS Z0, Z3, Z2        // p·r² + r
	VADDPS Z31, Z2, Z2            // + 1
	VSCALEFPS Z1, Z2, Z2          // · 2^n
	TESTQ R8, R8
	JEQ store
	VADDPS Z31, Z2, Z2            // 1 + e^−x
	VDIVPS Z2, Z31, Z2            // 1 / (1 + e^−x)
store:
	VMOVUPS Z2, K1, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JG loop
done:
	VZEROUPPER
	RET

// func vmax32AVX512(x *float32, n int) float32
//
// The largest of x[0..n), n a positive multiple of 16: sixteen running maxima,
// then folded in halves. For finite values it is exactly the largest (max is
// exact and order-free); NaNs are not ordered (VMAXPS keeps its second operand).
TEXT ·vmax32AVX512(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VMOVUPS (SI), Z0
	ADDQ $64, SI
	SUBQ $16, CX
mloop:
	TESTQ CX, CX
	JEQ mfold
	VMAXPS (SI), Z0, Z0
	ADDQ $64, SI
	SUBQ $16, CX
	JMP mloop
mfold:
	VEXTRACTF32X8 $1, Z0, Y1
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+16(FP)
	RET

// func vaffine32AVX512(x *float32, n int, a, b float32)
//
// x[i] = a·x[i] + b for i < n, a multiple of 16, rounded after the product and
// after the sum, as the scalar expression is.
TEXT ·vaffine32AVX512(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS a+16(FP), Z1
	VBROADCASTSS b+20(FP), Z2
aloop:
	TESTQ CX, CX
	JEQ adone
	VMOVUPS (SI), Z0
	VMULPS Z1, Z0, Z0
	VADDPS Z2, Z0, Z0
	VMOVUPS Z0, (SI)
	ADDQ $64, SI
	SUBQ $16, CX
	JMP aloop
adone:
	VZEROUPPER
	RET

// func vdsoftmax32AVX512(d, p *float32, n int, dot, scale float32)
//
// d[i] = p[i]·(d[i] − dot)·scale for i < n, a multiple of 16: the softmax
// backward's dS from dP, in the order the scalar loop rounds it.
TEXT ·vdsoftmax32AVX512(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS dot+24(FP), Z1
	VBROADCASTSS scale+28(FP), Z2
dloop:
	TESTQ CX, CX
	JEQ ddone
	VMOVUPS (DI), Z0
	VSUBPS Z1, Z0, Z0 // d − dot
	VMULPS (SI), Z0, Z0 // ·p
	VMULPS Z2, Z0, Z0 // ·scale
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	SUBQ $16, CX
	JMP dloop
ddone:
	VZEROUPPER
	RET
