// shardline's CUDA kernels. Compiled to PTX by `make ptx` (the exact nvcc command is
// in the Makefile); the PTX is committed and embedded, so `go build -tags cuda`
// never needs nvcc.
//
// Conventions (the same as tensor/cpu's):
//   - Storage type S is float or __nv_bfloat16 (suffix _f32 / _bf16 on the exported
//     names); every kernel accumulates in fp32.
//   - Weight gradients and optimizer state are fp32 always; activation gradients are
//     stored in S.
//   - A backward kernel accumulates into weight gradients; into activation
//     gradients it overwrites unless its `accumulate` argument is set.
//   - Reductions are done in a fixed order (no float atomics), so a kernel gives
//     the same bits on every run.
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float ld(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, long i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// block_sum sums v over a block of blockDim.x threads (a multiple of 32, at most
// 1024) in a fixed order; every thread gets the total. sh holds 32 floats.
__device__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.f;
    return warp_sum(v);
}
__device__ float block_max(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

#define GRID_STRIDE(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

// ---- conversions and elementwise -------------------------------------------------

extern "C" __global__ void cast_f32_bf16(bf16* out, const float* in, long n) {
    GRID_STRIDE(i, n) out[i] = __float2bfloat16_rn(in[i]);
}
extern "C" __global__ void cast_bf16_f32(float* out, const bf16* in, long n) {
    GRID_STRIDE(i, n) out[i] = __bfloat162float(in[i]);
}

template <typename S> __device__ void add(S* out, const S* a, const S* b, long n) {
    GRID_STRIDE(i, n) st(out, i, ld(a, i) + ld(b, i));
}
template <typename S> __device__ void add_into(S* dst, const S* src, long n) {
    GRID_STRIDE(i, n) st(dst, i, ld(dst, i) + ld(src, i));
}
// scale_by multiplies x by *f, a factor held on the device (gradient clipping: no
// read-back to the host).
template <typename S> __device__ void scale_by(S* x, const float* f, long n) {
    float s = *f;
    GRID_STRIDE(i, n) st(x, i, ld(x, i) * s);
}

// ---- embedding ----------------------------------------------------------------------

// embedding: out (BT,C) = wte[tokens].
template <typename S> __device__ void embedding(S* out, const int* tokens, const S* wte, int BT, int C) {
    GRID_STRIDE(i, (long)BT * C) {
        long r = i / C, c = i % C;
        out[i] = wte[(long)tokens[r] * C + c];
    }
}

// embedding_backward: dwte[v] += Σ_{r: tokens[r]=v} dout[r] (fp32 dwte), one thread
// per (vocabulary row, channel), rows in token order: deterministic and free of
// atomics. O(BT) per thread scan is fine for the sizes a step has: the scan reads
// tokens only (cached).
template <typename S> __device__ void embedding_backward(float* dwte, const S* dout, const int* tokens, int BT, int C, int V) {
    GRID_STRIDE(i, (long)V * C) {
        int v = i / C, c = i % C;
        float s = 0.f;
        bool any = false;
        for (int r = 0; r < BT; r++)
            if (tokens[r] == v) { s += ld(dout, (long)r * C + c); any = true; }
        if (any) dwte[i] += s;
    }
}

// ---- RMSNorm ------------------------------------------------------------------------

// rmsnorm: one block per row; out = inp·rstd·weight, rstd = 1/sqrt(mean(inp²)+eps).
template <typename S> __device__ void rmsnorm(S* out, float* rstd, const S* inp, const S* weight, int C, float eps) {
    __shared__ float sh[32];
    long row = blockIdx.x;
    const S* x = inp + row * C;
    float ss = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) { float v = ld(x, c); ss += v * v; }
    ss = block_sum(ss, sh);
    float r = rsqrtf(ss / C + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x) st(out, row * C + c, ld(x, c) * r * ld(weight, c));
}

// rmsnorm_backward: one block per row of dinp (overwritten, or added to when
// accumulate): g = dout·weight, dinp = rstd·g − inp·rstd³·mean(g·inp). The weight
// gradient's per-row terms dout·inp·rstd go to partial (rows/RPB, C) sums of RPB rows
// each, which rmsnorm_dweight adds in order.
#define RMS_RPB 32
template <typename S> __device__ void rmsnorm_backward(S* dinp, float* partial, const S* dout, const S* inp, const S* weight, const float* rstd, int BT, int C, int accumulate) {
    __shared__ float sh[32];
    long row = blockIdx.x;
    const S* x = inp + row * C;
    const S* d = dout + row * C;
    float r = rstd[row];
    float dot = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += ld(d, c) * ld(weight, c) * ld(x, c);
    dot = block_sum(dot, sh) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float g = ld(d, c) * ld(weight, c);
        float v = r * g - ld(x, c) * r * r * r * dot;
        if (accumulate) v += ld(dinp, row * C + c);
        st(dinp, row * C + c, v);
    }
}
// rmsnorm_dweight_partial: block b sums rows [b·RPB, (b+1)·RPB) of dout·inp·rstd
// into partial[b] (C values), threads over channels.
template <typename S> __device__ void rmsnorm_dweight_partial(float* partial, const S* dout, const S* inp, const float* rstd, int BT, int C) {
    int b = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float s = 0.f;
        int hi = min(BT, (b + 1) * RMS_RPB);
        for (int r = b * RMS_RPB; r < hi; r++) s += ld(dout, (long)r * C + c) * ld(inp, (long)r * C + c) * rstd[r];
        partial[(long)b * C + c] = s;
    }
}
// sum_partials: dst[c] += Σ_b partial[b·C + c] over nb blocks, in order.
extern "C" __global__ void sum_partials(float* dst, const float* partial, int nb, int C) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int b = 0; b < nb; b++) s += partial[(long)b * C + c];
        dst[c] += s;
    }
}

// ---- RoPE ---------------------------------------------------------------------------

// rope rotates x (B,T,NH,HD) in place, pairing i with i+HD/2; cos/sin are (T,HD/2)
// fp32 tables; dir −1 is the backward (transpose) rotation.
template <typename S> __device__ void rope(S* x, const float* cs, const float* sn, int B, int T, int NH, int HD, float dir) {
    int half = HD / 2;
    GRID_STRIDE(i, (long)B * T * NH * half) {
        int j = i % half;
        long bth = i / half;
        int t = (bth / NH) % T;
        long base = bth * HD;
        float c = cs[t * half + j], s = dir * sn[t * half + j];
        float x1 = ld(x, base + j), x2 = ld(x, base + j + half);
        st(x, base + j, x1 * c - x2 * s);
        st(x, base + j + half, x1 * s + x2 * c);
    }
}

// ---- SwiGLU -------------------------------------------------------------------------

template <typename S> __device__ void swiglu(S* out, const S* gate, const S* up, long n) {
    GRID_STRIDE(i, n) {
        float g = ld(gate, i), s = 1.f / (1.f + __expf(-g));
        st(out, i, g * s * ld(up, i));
    }
}
template <typename S> __device__ void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, long n, int accumulate) {
    GRID_STRIDE(i, n) {
        float g = ld(gate, i), s = 1.f / (1.f + __expf(-g)), d = ld(dout, i);
        float dg = d * ld(up, i) * s * (1.f + g * (1.f - s)), du = d * g * s;
        if (accumulate) { dg += ld(dgate, i); du += ld(dup, i); }
        st(dgate, i, dg);
        st(dup, i, du);
    }
}

// ---- cross-entropy ------------------------------------------------------------------

// cross_entropy: one block per row of logits (BT,V); saves the row's log-sum-exp
// (so no (BT,V) probabilities are kept) and its loss −log softmax[target] (0 for a
// target < 0).
template <typename S> __device__ void cross_entropy(float* losses, float* lse, const S* logits, const int* targets, int V) {
    __shared__ float sh[32];
    long row = blockIdx.x;
    const S* z = logits + row * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, ld(z, j));
    m = block_max(m, sh);
    float s = 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += __expf(ld(z, j) - m);
    s = block_sum(s, sh);
    float l = m + logf(s);
    if (threadIdx.x == 0) {
        lse[row] = l;
        int t = targets[row];
        losses[row] = t < 0 ? 0.f : l - ld(z, t);
    }
}
// cross_entropy_backward: dlogits = (softmax − onehot(target))·dloss[row], the
// softmax recomputed from logits and the saved lse; overwritten, or added to when
// accumulate. Rows with target < 0 get 0 (or are left alone when accumulating).
template <typename S> __device__ void cross_entropy_backward(S* dlogits, const float* dloss, const float* lse, const S* logits, const int* targets, int V, int accumulate) {
    long row = blockIdx.x;
    int t = targets[row];
    float g = t < 0 ? 0.f : dloss[row], l = lse[row];
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        long i = row * V + j;
        float d = (__expf(ld(logits, i) - l) - (j == t ? 1.f : 0.f)) * g;
        if (accumulate) d += ld(dlogits, i);
        st(dlogits, i, d);
    }
}

// ---- optimizer and norms ------------------------------------------------------------

// adamw: one AdamW step on fp32 params with fp32 m, v and grads; the scale of the
// gradient (clipping) is *gscale on the device, or 1 when gscale is null. When
// compute is not null the bf16 compute copy of the updated weights is written in
// the same pass. c1, c2 are the bias corrections 1/(1−β^t).
extern "C" __global__ void adamw(float* params, bf16* compute, const float* grads, float* m, float* v, long n,
                                 float lr, float b1, float b2, float eps, float wd, float c1, float c2, const float* gscale) {
    float gs = gscale ? *gscale : 1.f;
    GRID_STRIDE(i, n) {
        float g = grads[i] * gs;
        float mi = b1 * m[i] + (1.f - b1) * g;
        float vi = b2 * v[i] + (1.f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = params[i];
        p = p - lr * (mi * c1 / (sqrtf(vi * c2) + eps) + wd * p);
        params[i] = p;
        if (compute) compute[i] = __float2bfloat16_rn(p);
    }
}

// sumsq_partial: block b of a fixed grid sums x² over its grid-stride elements into
// partial[b]; sumsq_finish adds the partials in order into *out (+= when
// accumulate). Together: Σx², the same bits on every run.
template <typename S> __device__ void sumsq_partial(float* partial, const S* x, long n) {
    __shared__ float sh[32];
    float s = 0.f;
    GRID_STRIDE(i, n) { float v = ld(x, i); s += v * v; }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
extern "C" __global__ void sumsq_finish(float* out, const float* partial, int nb, int accumulate) {
    __shared__ float sh[32];
    float s = 0.f;
    // one block; fixed assignment of partials to threads, fixed tree.
    for (int b = threadIdx.x; b < nb; b += blockDim.x) s += partial[b];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) *out = accumulate ? *out + s : s;
}
// clip_factor: *factor = min(1, maxnorm/(sqrt(*sumsq)+1e-6)), and *norm = sqrt(*sumsq):
// the clipping factor stays on the device for adamw's gscale.
extern "C" __global__ void clip_factor(float* factor, float* norm, const float* sumsq, float maxnorm) {
    float n = sqrtf(*sumsq);
    *norm = n;
    *factor = maxnorm > 0.f && n > maxnorm ? maxnorm / (n + 1e-6f) : 1.f;
}

// ---- flash attention ----------------------------------------------------------------
//
// Layout: q, o (B,Tq,NH,HD); k, v (B,Tk,NKV,HD); lse (B,NH,Tq) fp32. Query i sits at
// position qoff+i, key j at koff+j; with causal set, query i sees key j iff
// koff+j ≤ qoff+i. Query head h reads key/value head h/(NH/NKV). Only the output and
// each row's log-sum-exp (natural log, of the scaled scores) are saved; backward
// recomputes the probabilities. No (T,T) buffer exists anywhere.
//
// Forward: a block of FA_WARPS warps takes FA_ROWS query rows of one (batch, head);
// keys come in tiles of 32 through shared memory; a warp owns one query row at a
// time, lane j scoring key j of the tile, and each lane keeps HD/32 output columns
// (an online softmax rescales them as the running maximum grows).
#define FA_WARPS 4
#define FA_ROWS 16
#define FA_BC 32

template <typename S, int HD>
__device__ void flash_fwd(S* o, float* lse, const S* q, const S* k, const S* v, int Tq, int Tk, int NH, int NKV,
                          int qoff, int koff, int causal, float scale) {
    constexpr int PER = HD / 32;
    __shared__ float ks[FA_BC][HD + 1];
    __shared__ float vs[FA_BC][HD];
    __shared__ float qs[FA_WARPS][HD];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int r0 = blockIdx.x * FA_ROWS;
    int rend = min(Tq, r0 + FA_ROWS);
    // the last key any row of this block can see
    int klast = Tk;
    if (causal) klast = min(Tk, qoff + rend - 1 - koff + 1);
    // per-warp state for its rows: rows r0+w, r0+w+FA_WARPS, ...
    constexpr int RPW = FA_ROWS / FA_WARPS;
    float acc[RPW][PER], mrow[RPW], lrow[RPW];
    float qreg[RPW][PER];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        mrow[rr] = -INFINITY;
        lrow[rr] = 0.f;
        int i = r0 + w + rr * FA_WARPS;
#pragma unroll
        for (int p = 0; p < PER; p++) {
            acc[rr][p] = 0.f;
            qreg[rr][p] = i < Tq ? ld(q, (((long)b * Tq + i) * NH + h) * HD + lane + 32 * p) * scale : 0.f;
        }
    }
    for (int j0 = 0; j0 < klast; j0 += FA_BC) {
        __syncthreads();
        for (int e = threadIdx.x; e < FA_BC * HD; e += blockDim.x) {
            int jj = e / HD, d = e % HD, j = j0 + jj;
            long src = (((long)b * Tk + j) * NKV + kh) * HD + d;
            ks[jj][d] = j < Tk ? ld(k, src) : 0.f;
            vs[jj][d] = j < Tk ? ld(v, src) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            int i = r0 + w + rr * FA_WARPS;
            if (i >= Tq) break;
#pragma unroll
            for (int p = 0; p < PER; p++) qs[w][lane + 32 * p] = qreg[rr][p];
            __syncwarp();
            int j = j0 + lane;
            bool live = j < Tk && (!causal || koff + j <= qoff + i);
            float s = -INFINITY;
            if (live) {
                s = 0.f;
#pragma unroll 8
                for (int d = 0; d < HD; d++) s += qs[w][d] * ks[lane][d];
            }
            __syncwarp();
            float mt = warp_max(s);
            if (mt == -INFINITY) continue; // no visible key in this tile for this row
            float mnew = fmaxf(mrow[rr], mt);
            float corr = __expf(mrow[rr] - mnew);
            float pj = live ? __expf(s - mnew) : 0.f;
            lrow[rr] = lrow[rr] * corr + warp_sum(pj);
            mrow[rr] = mnew;
#pragma unroll
            for (int p = 0; p < PER; p++) acc[rr][p] *= corr;
#pragma unroll 4
            for (int jj = 0; jj < FA_BC; jj++) {
                float pb = __shfl_sync(0xffffffff, pj, jj);
#pragma unroll
                for (int p = 0; p < PER; p++) acc[rr][p] += pb * vs[jj][lane + 32 * p];
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        int i = r0 + w + rr * FA_WARPS;
        if (i >= Tq) break;
        float inv = lrow[rr] > 0.f ? 1.f / lrow[rr] : 0.f;
#pragma unroll
        for (int p = 0; p < PER; p++) st(o, (((long)b * Tq + i) * NH + h) * HD + lane + 32 * p, acc[rr][p] * inv);
        if (lane == 0) lse[((long)b * NH + h) * Tq + i] = lrow[rr] > 0.f ? mrow[rr] + logf(lrow[rr]) : -INFINITY;
    }
}

// flash_delta: D[b,h,i] = Σ_d dO·O (fp32), one warp per row.
template <typename S>
__device__ void flash_delta(float* D, const S* o, const S* dout, int B, int Tq, int NH, int HD) {
    long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (long)B * Tq * NH) return;
    // row indexes (b, i, h) in o's layout
    float s = 0.f;
    for (int d = lane; d < HD; d += 32) s += ld(o, row * HD + d) * ld(dout, row * HD + d);
    s = warp_sum(s);
    long h = row % NH, bi = row / NH, i = bi % Tq, b = bi / Tq;
    if (lane == 0) D[(b * NH + h) * Tq + i] = s;
}

// flash_bwd_dq: dq (overwritten, or added to when accumulate) = Σ_j dS_ij·k_j·scale
// with dS = P∘(dP − D), P = exp(scale·q·k − lse), dP = dO·v. Same tiling as the
// forward.
template <typename S, int HD>
__device__ void flash_bwd_dq(S* dq, const S* dout, const float* lse, const float* D, const S* q, const S* k, const S* v,
                             int Tq, int Tk, int NH, int NKV, int qoff, int koff, int causal, float scale, int accumulate) {
    constexpr int PER = HD / 32;
    __shared__ float ks[FA_BC][HD + 1];
    __shared__ float vs[FA_BC][HD + 1];
    __shared__ float qs[FA_WARPS][HD];
    __shared__ float ds[FA_WARPS][HD];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int r0 = blockIdx.x * FA_ROWS;
    int rend = min(Tq, r0 + FA_ROWS);
    int klast = Tk;
    if (causal) klast = min(Tk, qoff + rend - koff);
    constexpr int RPW = FA_ROWS / FA_WARPS;
    float acc[RPW][PER];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++)
#pragma unroll
        for (int p = 0; p < PER; p++) acc[rr][p] = 0.f;
    for (int j0 = 0; j0 < klast; j0 += FA_BC) {
        __syncthreads();
        for (int e = threadIdx.x; e < FA_BC * HD; e += blockDim.x) {
            int jj = e / HD, d = e % HD, j = j0 + jj;
            long src = (((long)b * Tk + j) * NKV + kh) * HD + d;
            ks[jj][d] = j < Tk ? ld(k, src) : 0.f;
            vs[jj][d] = j < Tk ? ld(v, src) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            int i = r0 + w + rr * FA_WARPS;
            if (i >= Tq) break;
            long qi = (((long)b * Tq + i) * NH + h) * HD;
            for (int d = lane; d < HD; d += 32) { qs[w][d] = ld(q, qi + d); ds[w][d] = ld(dout, qi + d); }
            __syncwarp();
            int j = j0 + lane;
            bool live = j < Tk && (!causal || koff + j <= qoff + i);
            float dsj = 0.f;
            if (live) {
                float s = 0.f, dp = 0.f;
#pragma unroll 8
                for (int d = 0; d < HD; d++) { s += qs[w][d] * ks[lane][d]; dp += ds[w][d] * vs[lane][d]; }
                long li = ((long)b * NH + h) * Tq + i;
                float pj = __expf(s * scale - lse[li]);
                dsj = pj * (dp - D[li]) * scale;
            }
            __syncwarp();
#pragma unroll 4
            for (int jj = 0; jj < FA_BC; jj++) {
                float dsb = __shfl_sync(0xffffffff, dsj, jj);
#pragma unroll
                for (int p = 0; p < PER; p++) acc[rr][p] += dsb * ks[jj][lane + 32 * p];
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        int i = r0 + w + rr * FA_WARPS;
        if (i >= Tq) break;
        long qi = (((long)b * Tq + i) * NH + h) * HD;
#pragma unroll
        for (int p = 0; p < PER; p++) {
            float x = acc[rr][p];
            if (accumulate) x += ld(dq, qi + lane + 32 * p);
            st(dq, qi + lane + 32 * p, x);
        }
    }
}

// flash_bwd_dkdv: a block of 128 threads owns FB_KEYS=32 keys of one (batch, kv head):
// thread (key jj = tid/4, quarter g = tid%4) keeps HD/4 columns of dk and dv for its
// key in registers and walks every query row (of every query head of the group)
// that can see the tile; the four quarters of a key sum their partial dot products
// with two shuffles. dk, dv are overwritten, or added to when accumulate.
#define FB_KEYS 32
template <typename S, int HD>
__device__ void flash_bwd_dkdv(S* dk, S* dv, const S* dout, const float* lse, const float* D, const S* q, const S* k, const S* v,
                               int Tq, int Tk, int NH, int NKV, int qoff, int koff, int causal, float scale, int accumulate) {
    constexpr int Q = HD / 4;
    __shared__ float qs[32][HD];
    __shared__ float dos[32][HD];
    __shared__ float ls[32], dsh[32];
    int bk = blockIdx.y, b = bk / NKV, kh = bk % NKV, group = NH / NKV;
    int jj = threadIdx.x >> 2, g = threadIdx.x & 3;
    int j = blockIdx.x * FB_KEYS + jj;
    bool jok = j < Tk;
    float kr[Q], vr[Q], dkr[Q], dvr[Q];
    long kj = (((long)b * Tk + (jok ? j : 0)) * NKV + kh) * HD + g * Q;
#pragma unroll
    for (int p = 0; p < Q; p++) {
        kr[p] = jok ? ld(k, kj + p) : 0.f;
        vr[p] = jok ? ld(v, kj + p) : 0.f;
        dkr[p] = 0.f;
        dvr[p] = 0.f;
    }
    // the first query row that can see any key of this tile
    int i0 = 0;
    if (causal) i0 = max(0, koff + blockIdx.x * FB_KEYS - qoff);
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        for (int t0 = (i0 / 32) * 32; t0 < Tq; t0 += 32) {
            __syncthreads();
            for (int e = threadIdx.x; e < 32 * HD; e += blockDim.x) {
                int r = e / HD, d = e % HD, i = t0 + r;
                long qi = (((long)b * Tq + i) * NH + h) * HD + d;
                qs[r][d] = i < Tq ? ld(q, qi) : 0.f;
                dos[r][d] = i < Tq ? ld(dout, qi) : 0.f;
            }
            if (threadIdx.x < 32) {
                int i = t0 + threadIdx.x;
                long li = ((long)b * NH + h) * Tq + i;
                ls[threadIdx.x] = i < Tq ? lse[li] : 0.f;
                dsh[threadIdx.x] = i < Tq ? D[li] : 0.f;
            }
            __syncthreads();
            int rmax = min(32, Tq - t0);
            for (int r = 0; r < rmax; r++) {
                int i = t0 + r;
                float s = 0.f, dp = 0.f;
#pragma unroll
                for (int p = 0; p < Q; p++) { s += qs[r][g * Q + p] * kr[p]; dp += dos[r][g * Q + p] * vr[p]; }
                s += __shfl_xor_sync(0xffffffff, s, 1);
                s += __shfl_xor_sync(0xffffffff, s, 2);
                dp += __shfl_xor_sync(0xffffffff, dp, 1);
                dp += __shfl_xor_sync(0xffffffff, dp, 2);
                bool live = jok && (!causal || koff + j <= qoff + i);
                if (!live) continue;
                float pj = __expf(s * scale - ls[r]);
                float dsj = pj * (dp - dsh[r]) * scale;
#pragma unroll
                for (int p = 0; p < Q; p++) { dvr[p] += pj * dos[r][g * Q + p]; dkr[p] += dsj * qs[r][g * Q + p]; }
            }
        }
    }
    if (!jok) return;
#pragma unroll
    for (int p = 0; p < Q; p++) {
        float a = dkr[p], c = dvr[p];
        if (accumulate) { a += ld(dk, kj + p); c += ld(dv, kj + p); }
        st(dk, kj + p, a);
        st(dv, kj + p, c);
    }
}

// ---- exported instantiations ----------------------------------------------------------

#define FOR_S(X) X(float, f32) X(bf16, bf16)

#define EXPORT_ELEMENTWISE(S, N)                                                                                       \
    extern "C" __global__ void add_##N(S* out, const S* a, const S* b, long n) { add(out, a, b, n); }                  \
    extern "C" __global__ void add_into_##N(S* dst, const S* src, long n) { add_into(dst, src, n); }                   \
    extern "C" __global__ void scale_by_##N(S* x, const float* f, long n) { scale_by(x, f, n); }                      \
    extern "C" __global__ void embedding_##N(S* out, const int* tok, const S* wte, int BT, int C) {                   \
        embedding(out, tok, wte, BT, C);                                                                              \
    }                                                                                                                 \
    extern "C" __global__ void embedding_backward_##N(float* dwte, const S* dout, const int* tok, int BT, int C, int V) { \
        embedding_backward(dwte, dout, tok, BT, C, V);                                                                \
    }                                                                                                                 \
    extern "C" __global__ void rmsnorm_##N(S* out, float* rstd, const S* inp, const S* w, int C, float eps) {        \
        rmsnorm(out, rstd, inp, w, C, eps);                                                                           \
    }                                                                                                                 \
    extern "C" __global__ void rmsnorm_backward_##N(S* dinp, const S* dout, const S* inp, const S* w,                \
                                                    const float* rstd, int BT, int C, int acc) {                     \
        rmsnorm_backward(dinp, (float*)0, dout, inp, w, rstd, BT, C, acc);                                            \
    }                                                                                                                 \
    extern "C" __global__ void rmsnorm_dweight_partial_##N(float* part, const S* dout, const S* inp,                 \
                                                           const float* rstd, int BT, int C) {                       \
        rmsnorm_dweight_partial(part, dout, inp, rstd, BT, C);                                                        \
    }                                                                                                                 \
    extern "C" __global__ void rope_##N(S* x, const float* c, const float* s, int B, int T, int NH, int HD, float dir) { \
        rope(x, c, s, B, T, NH, HD, dir);                                                                             \
    }                                                                                                                 \
    extern "C" __global__ void swiglu_##N(S* out, const S* g, const S* u, long n) { swiglu(out, g, u, n); }          \
    extern "C" __global__ void swiglu_backward_##N(S* dg, S* du, const S* d, const S* g, const S* u, long n, int acc) { \
        swiglu_backward(dg, du, d, g, u, n, acc);                                                                     \
    }                                                                                                                 \
    extern "C" __global__ void cross_entropy_##N(float* losses, float* lse, const S* z, const int* t, int V) {        \
        cross_entropy(losses, lse, z, t, V);                                                                          \
    }                                                                                                                 \
    extern "C" __global__ void cross_entropy_backward_##N(S* dz, const float* dloss, const float* lse, const S* z,    \
                                                          const int* t, int V, int acc) {                            \
        cross_entropy_backward(dz, dloss, lse, z, t, V, acc);                                                         \
    }                                                                                                                 \
    extern "C" __global__ void sumsq_partial_##N(float* part, const S* x, long n) { sumsq_partial(part, x, n); }      \
    extern "C" __global__ void flash_delta_##N(float* D, const S* o, const S* d, int B, int Tq, int NH, int HD) {     \
        flash_delta(D, o, d, B, Tq, NH, HD);                                                                          \
    }
FOR_S(EXPORT_ELEMENTWISE)

#define FA_ARGS int Tq, int Tk, int NH, int NKV, int qoff, int koff, int causal, float scale
#define EXPORT_FLASH_HD(S, N, HD)                                                                                     \
    extern "C" __global__ void __launch_bounds__(128) flash_fwd_##N##_##HD(S* o, float* lse, const S* q, const S* k,   \
                                                                          const S* v, FA_ARGS) {                      \
        flash_fwd<S, HD>(o, lse, q, k, v, Tq, Tk, NH, NKV, qoff, koff, causal, scale);                                \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_##N##_##HD(S* dq, const S* dout, const float* lse,  \
                                                                             const float* D, const S* q, const S* k,  \
                                                                             const S* v, FA_ARGS, int acc) {          \
        flash_bwd_dq<S, HD>(dq, dout, lse, D, q, k, v, Tq, Tk, NH, NKV, qoff, koff, causal, scale, acc);              \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkdv_##N##_##HD(S* dk, S* dv, const S* dout,           \
                                                                               const float* lse, const float* D,      \
                                                                               const S* q, const S* k, const S* v,    \
                                                                               FA_ARGS, int acc) {                    \
        flash_bwd_dkdv<S, HD>(dk, dv, dout, lse, D, q, k, v, Tq, Tk, NH, NKV, qoff, koff, causal, scale, acc);        \
    }
#define EXPORT_FLASH(S, N) EXPORT_FLASH_HD(S, N, 32) EXPORT_FLASH_HD(S, N, 64) EXPORT_FLASH_HD(S, N, 128)
FOR_S(EXPORT_FLASH)
