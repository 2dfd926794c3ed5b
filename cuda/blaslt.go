//go:build cuda

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <cublasLt.h>

// cuBLASLt is opened with dlopen, never linked, so one binary runs with the
// library of any CUDA 12 or 13 install; cublasLt.h (CUDA 11.8 from Debian) gives
// the types, whose layout these versions share.
#define LT_FNS(X) X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetVersion) \
	X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) \
	X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatmulPreferenceCreate) \
	X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) \
	X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)
#define LT_DECL(f) static __typeof__(f)* p_##f;
LT_FNS(LT_DECL)

static void* lt_lib;

// lt_open loads name; it returns NULL, or what failed.
static const char* lt_open(const char* name) {
	lt_lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!lt_lib) return dlerror();
#define LT_LOAD(f) p_##f = (__typeof__(f)*)dlsym(lt_lib, #f); if (!p_##f) return #f;
	LT_FNS(LT_LOAD)
	return NULL;
}

static int lt_create(cublasLtHandle_t* h) { return p_cublasLtCreate(h); }
static void lt_destroy(cublasLtHandle_t h) { p_cublasLtDestroy(h); }
static size_t lt_version(void) { return p_cublasLtGetVersion(); }

typedef struct {
	cublasLtMatmulDesc_t op;
	cublasLtMatrixLayout_t a, b, c;
	cublasLtMatmulAlgo_t algo;
	size_t workspace;
} lt_plan;

// lt_batch makes layout l a strided batch of count matrices stride elements apart.
static int lt_batch(cublasLtMatrixLayout_t l, int count, long long stride) {
	int st;
	if (count <= 1) return 0;
	if ((st = p_cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)))) return st;
	return p_cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride));
}

// lt_prepare describes C (m×n, column-major) = op(A)·op(B) (+ C) with A of type
// at, B of type bt and C of type ct, fp32 accumulation, over a strided batch of `batch` products
// (strides sa, sb, sc in elements), and picks the heuristic's first algorithm that
// fits a workspace of ws bytes.
static int lt_prepare(cublasLtHandle_t h, lt_plan* p, int ta, int tb, long m, long n, long k,
                      long lda, long ldb, long ldc, int at, int bt, int ct, size_t ws, int batch, long long sa, long long sb, long long sc,
                      unsigned int ala, unsigned int alb, unsigned int alc) {
	int st;
	cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	if ((st = p_cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return st;
	if ((st = p_cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)))) return st;
	if ((st = p_cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)))) return st;
	if ((st = p_cublasLtMatrixLayoutCreate(&p->a, (cudaDataType)at, ta ? k : m, ta ? m : k, lda))) return st;
	if ((st = p_cublasLtMatrixLayoutCreate(&p->b, (cudaDataType)bt, tb ? n : k, tb ? k : n, ldb))) return st;
	if ((st = p_cublasLtMatrixLayoutCreate(&p->c, (cudaDataType)ct, m, n, ldc))) return st;
	if ((st = lt_batch(p->a, batch, sa)) || (st = lt_batch(p->b, batch, sb)) || (st = lt_batch(p->c, batch, sc))) return st;
	cublasLtMatmulPreference_t pref;
	if ((st = p_cublasLtMatmulPreferenceCreate(&pref))) return st;
	st = p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
	// The operands' alignment, which the heuristic otherwise takes to be 256
	// bytes: a product over a slice (rows of a buffer, a piece of columns)
	// may start anywhere a value does.
	if (!st) st = p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ala, sizeof(ala));
	if (!st) st = p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alb, sizeof(alb));
	if (!st) st = p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alc, sizeof(alc));
	if (!st) st = p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alc, sizeof(alc));
	cublasLtMatmulHeuristicResult_t r;
	int found = 0;
	if (!st) st = p_cublasLtMatmulAlgoGetHeuristic(h, p->op, p->a, p->b, p->c, p->c, pref, 1, &r, &found);
	p_cublasLtMatmulPreferenceDestroy(pref);
	if (st) return st;
	if (!found) return -1;
	p->algo = r.algo;
	p->workspace = r.workspaceSize;
	return 0;
}

// lt_matmul runs a prepared product; device addresses come as integers.
static int lt_matmul(cublasLtHandle_t h, lt_plan* p, unsigned long long A, unsigned long long B, unsigned long long C,
                     float beta, unsigned long long ws, size_t wsSize, void* stream) {
	float alpha = 1.f;
	return p_cublasLtMatmul(h, p->op, &alpha, (const void*)A, p->a, (const void*)B, p->b, &beta, (void*)C, p->c,
	                        (void*)C, p->c, &p->algo, (void*)ws, wsSize, (cudaStream_t)stream);
}

// lt_matmul_scaled runs a prepared FP8 product, A's and B's scale inverses
// (f32 device scalars) set as the descriptor's scale pointers first: cuBLASLt
// multiplies the product by both.
static int lt_matmul_scaled(cublasLtHandle_t h, lt_plan* p, unsigned long long A, unsigned long long sa, unsigned long long B,
                            unsigned long long sb, unsigned long long C, float beta, unsigned long long ws, size_t wsSize, void* stream) {
	const void* pa = (const void*)sa;
	const void* pb = (const void*)sb;
	int st;
	if ((st = p_cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof(pa)))) return st;
	if ((st = p_cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof(pb)))) return st;
	return lt_matmul(h, p, A, B, C, beta, ws, wsSize, stream);
}

static void lt_release(lt_plan* p) {
	p_cublasLtMatrixLayoutDestroy(p->a);
	p_cublasLtMatrixLayoutDestroy(p->b);
	p_cublasLtMatrixLayoutDestroy(p->c);
	p_cublasLtMatmulDescDestroy(p->op);
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"
)

// blasLtNames are the cuBLASLt libraries tried, newest first.
var blasLtNames = []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"}

// blasWorkspace is cuBLASLt's workspace (32 MiB: what NVIDIA advises for Hopper).
const blasWorkspace = 32 << 20

type blasLt struct {
	h       C.cublasLtHandle_t
	stream  unsafe.Pointer
	ws      cu.DevicePtr
	plans   map[gemmKey]*C.lt_plan
	version int
	library string
}

type gemmKey struct {
	ta, tb        bool
	m, n, k       int
	lda, ldb, ldc int
	a, b, c       DType
	batch         int
	sa, sb, sc    int // batch strides in elements
	// alA, alB, alC are the operands' alignment in bytes (alignment): an
	// algorithm chosen for aligned operands may need that alignment.
	alA, alB, alC uint
}

// alignment is the largest power of two up to 256 that divides p (256 for
// 0): what cuBLASLt's heuristic is told of an operand's start.
func alignment(p devicePtr) uint {
	if p == 0 {
		return 256
	}
	return uint(min(uint64(p)&-uint64(p), 256))
}

func openBlasLt(stream unsafe.Pointer) (*blasLt, error) {
	lt := &blasLt{stream: stream, plans: map[gemmKey]*C.lt_plan{}}
	var err error
	lt.library, err = openLibrary("cuBLASLt", blasLtNames, func(name *C.char) *C.char { return C.lt_open(name) },
		"install CUDA 12 or 13's libcublas, or add its lib64 to LD_LIBRARY_PATH")
	if err != nil {
		return nil, err
	}
	if st := C.lt_create(&lt.h); st != 0 {
		return nil, fmt.Errorf("cuda: cublasLtCreate: status %d", st)
	}
	lt.version = int(C.lt_version())
	ws, err := cu.MemAlloc(blasWorkspace)
	if err != nil {
		return nil, fmt.Errorf("cuda: cuBLASLt workspace: %w", err)
	}
	lt.ws = ws
	return lt, nil
}

func (lt *blasLt) close() {
	for _, p := range lt.plans {
		C.lt_release(p)
		C.free(unsafe.Pointer(p))
	}
	C.lt_destroy(lt.h)
	_ = cu.MemFree(lt.ws)
}

func cudaType(t DType) C.int {
	switch t {
	case BF16:
		return C.CUDA_R_16BF
	case F8E4M3:
		return C.CUDA_R_8F_E4M3
	case F8E5M2:
		return C.CUDA_R_8F_E5M2
	}
	return C.CUDA_R_32F
}

// batchedProduct is gemmBatched's products on cuBLASLt, the i-th reading A, B
// and C at i·sa, i·sb and i·sc elements. The algorithm for a shape is chosen
// once by cuBLASLt's heuristic and cached.
func (d *Device) batchedProduct(ta, tb bool, m, n, k int, A Buffer, lda, sa int, B Buffer, ldb, sb int, beta float32, Cb Buffer, ldc, sc, batch int) {
	lt := d.drv.lt
	key := gemmKey{ta, tb, m, n, k, lda, ldb, ldc, A.DType, B.DType, Cb.DType, batch, sa, sb, sc, alignment(A.ptr), alignment(B.ptr), alignment(Cb.ptr)}
	p := d.ltPlan(key)
	if p == nil {
		return
	}
	st := C.lt_matmul(lt.h, p, C.ulonglong(A.ptr), C.ulonglong(B.ptr), C.ulonglong(Cb.ptr),
		C.float(beta), C.ulonglong(lt.ws), C.size_t(blasWorkspace), lt.stream)
	if st != 0 {
		d.fail("gemm", fmt.Errorf("cublasLtMatmul %+v: status %d", key, st))
	}
}

// ltPlan is key's prepared product: cached, or chosen by cuBLASLt's
// heuristic now; nil (the device failed) when cuBLASLt has none.
func (d *Device) ltPlan(key gemmKey) *C.lt_plan {
	lt := d.drv.lt
	if p, ok := lt.plans[key]; ok {
		return p
	}
	p := (*C.lt_plan)(C.calloc(1, C.size_t(unsafe.Sizeof(C.lt_plan{}))))
	st := C.lt_prepare(lt.h, p, cbool(key.ta), cbool(key.tb), C.long(key.m), C.long(key.n), C.long(key.k), C.long(key.lda), C.long(key.ldb), C.long(key.ldc),
		cudaType(key.a), cudaType(key.b), cudaType(key.c), blasWorkspace, C.int(key.batch), C.longlong(key.sa), C.longlong(key.sb), C.longlong(key.sc),
		C.uint(key.alA), C.uint(key.alB), C.uint(key.alC))
	if st != 0 {
		C.free(unsafe.Pointer(p))
		d.fail("gemm", fmt.Errorf("cuBLASLt has no algorithm for %+v (status %d)", key, st))
		return nil
	}
	lt.plans[key] = p
	return p
}

// fp8Product is gemmFP8's product on cuBLASLt's FP8 kernels: C (m×n) =
// (sa·sb)·Aᵀ·B + β·C, A and B FP8 codes, sa and sb device scalars.
func (d *Device) fp8Product(m, n, k int, A Buffer, lda int, sa Buffer, B Buffer, ldb int, sb Buffer, beta float32, Cb Buffer, ldc int) {
	lt := d.drv.lt
	key := gemmKey{true, false, m, n, k, lda, ldb, ldc, A.DType, B.DType, Cb.DType, 1, 0, 0, 0, alignment(A.ptr), alignment(B.ptr), alignment(Cb.ptr)}
	p := d.ltPlan(key)
	if p == nil {
		return
	}
	st := C.lt_matmul_scaled(lt.h, p, C.ulonglong(A.ptr), C.ulonglong(sa.ptr), C.ulonglong(B.ptr), C.ulonglong(sb.ptr), C.ulonglong(Cb.ptr),
		C.float(beta), C.ulonglong(lt.ws), C.size_t(blasWorkspace), lt.stream)
	if st != 0 {
		d.fail("gemm", fmt.Errorf("cublasLtMatmul (FP8) %+v: status %d", key, st))
	}
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
