// shardline's CUDA kernels. Compiled to PTX by `make ptx` (the exact nvcc command is
// in the Makefile); the PTX is committed and embedded, so `go build -tags cuda`
// never needs nvcc.
//
// Conventions (the same as tensor/cpu's):
//   - Storage type S is float or __nv_bfloat16 (suffix _f32 / _bf16 on the exported
//     names); every kernel accumulates in fp32.
//   - Weight gradients are fp32, or bf16 in a run that reduces them in bf16 (the
//     kernels that add into one add in fp32 and round once per call: the "bf16
//     parameter gradients" section); optimizer state is fp32 always; activation
//     gradients are stored in S.
//   - A backward kernel accumulates into weight gradients; into activation
//     gradients it overwrites unless its `accumulate` argument is set.
//   - Reductions are done in a fixed order (no float atomics), so a kernel gives
//     the same bits on every run.
#ifndef SHARDLINE_EMU // the host emulator (emu/emu.h) defines bf16 itself
#include <cuda_bf16.h>
#endif
#include <stdint.h>

typedef __nv_bfloat16 bf16;

// FOR_S(X) instantiates X for each storage type and its name suffix.
#define FOR_S(X) X(float, f32) X(bf16, bf16)

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

// pack2 packs two floats as bf16 into 32 bits, lo in the low half.
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

#define GRID_STRIDE(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

// ---- 16-byte vectors ------------------------------------------------------------------
//
// The memory-bound kernels move 16 bytes per load and store (8 bf16 or 4 fp32 values,
// one ld.global.v4) where every operand they touch is 16-byte aligned and a row holds
// whole vectors: a warp of 2-byte loads asks the memory system for 64 bytes at a time
// and leaves much of its bandwidth unused. Each value's arithmetic is the scalar
// path's, so the two paths give the same bits; a kernel takes the vector path for
// all but a tail of n mod W values, which the scalar loop finishes.
template <typename S> struct alignas(16) Vec {
    static constexpr int W = 16 / sizeof(S);
    S v[W];
};
__device__ __forceinline__ bool al16(const void* p) { return ((uintptr_t)p & 15) == 0; }
#ifdef SHARDLINE_EMU
#define VEC_ALIGNED(p) emu::check_aligned(p, 16)
#else
#define VEC_ALIGNED(p)
#endif
template <typename S> __device__ __forceinline__ Vec<S> ldv(const S* p) {
    VEC_ALIGNED(p);
    Vec<S> r;
    uint4 bits = *reinterpret_cast<const uint4*>(p);
    memcpy(&r, &bits, 16);
    return r;
}
template <typename S> __device__ __forceinline__ void stv(S* p, const Vec<S>& x) {
    VEC_ALIGNED(p);
    uint4 bits;
    memcpy(&bits, &x, 16);
    *reinterpret_cast<uint4*>(p) = bits;
}

// ---- conversions and elementwise -------------------------------------------------

extern "C" __global__ void cast_f32_bf16(bf16* out, const float* in, long n) {
    GRID_STRIDE(i, n) out[i] = __float2bfloat16_rn(in[i]);
}
extern "C" __global__ void cast_bf16_f32(float* out, const bf16* in, long n) {
    GRID_STRIDE(i, n) out[i] = __bfloat162float(in[i]);
}
template <typename S> __device__ void add(S* out, const S* a, const S* b, long n) {
    constexpr int W = Vec<S>::W;
    long nv = al16(out) && al16(a) && al16(b) ? n / W : 0;
    GRID_STRIDE(i, nv) {
        Vec<S> x = ldv(a + i * W), y = ldv(b + i * W), o;
#pragma unroll
        for (int k = 0; k < W; k++) st(o.v, k, ld(x.v, k) + ld(y.v, k));
        stv(out + i * W, o);
    }
    GRID_STRIDE(j, n - nv * W) {
        long i = nv * W + j;
        st(out, i, ld(a, i) + ld(b, i));
    }
}
template <typename S> __device__ void add_into(S* dst, const S* src, long n) {
    constexpr int W = Vec<S>::W;
    long nv = al16(dst) && al16(src) ? n / W : 0;
    GRID_STRIDE(i, nv) {
        Vec<S> x = ldv(dst + i * W), y = ldv(src + i * W);
#pragma unroll
        for (int k = 0; k < W; k++) st(x.v, k, ld(x.v, k) + ld(y.v, k));
        stv(dst + i * W, x);
    }
    GRID_STRIDE(j, n - nv * W) {
        long i = nv * W + j;
        st(dst, i, ld(dst, i) + ld(src, i));
    }
}

// ---- RMSNorm ------------------------------------------------------------------------

// rmsnorm: one warp per row (blockDim.x/32 rows a block); out = inp·rstd·weight,
// rstd = 1/sqrt(mean(inp²)+eps). Rows of whole vectors (C a multiple of W, every
// operand aligned) are read and written 16 bytes at a time.
template <typename S> __device__ void rmsnorm(S* out, float* rstd, const S* inp, const S* weight, int rows, int C, float eps) {
    constexpr int W = Vec<S>::W;
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return; // the whole warp: one row each
    const S* x = inp + row * C;
    S* y = out + row * C;
    bool vec = C % W == 0 && al16(x) && al16(y) && al16(weight);
    float ss = 0.f;
    if (vec) {
        for (int c = lane * W; c < C; c += 32 * W) {
            Vec<S> v = ldv(x + c);
#pragma unroll
            for (int k = 0; k < W; k++) { float f = ld(v.v, k); ss += f * f; }
        }
    } else {
        for (int c = lane; c < C; c += 32) { float v = ld(x, c); ss += v * v; }
    }
    ss = warp_sum(ss);
    float r = rsqrtf(ss / C + eps);
    if (lane == 0) rstd[row] = r;
    if (vec) {
        for (int c = lane * W; c < C; c += 32 * W) {
            Vec<S> v = ldv(x + c), w = ldv(weight + c), o;
#pragma unroll
            for (int k = 0; k < W; k++) st(o.v, k, ld(v.v, k) * r * ld(w.v, k));
            stv(y + c, o);
        }
    } else {
        for (int c = lane; c < C; c += 32) st(y, c, ld(x, c) * r * ld(weight, c));
    }
}

// rmsnorm_backward: one warp per row of dinp (overwritten, or added to when
// accumulate), vectors as in rmsnorm: g = dout·weight, dinp = rstd·g −
// inp·rstd³·mean(g·inp). The weight gradient's per-row terms dout·inp·rstd go to
// partial (rows/RPB, C) sums of RPB rows each (rmsnorm_dweight_partial), which
// sum_partials adds in order.
#define RMS_RPB 32
template <typename S> __device__ void rmsnorm_backward(S* dinp, const S* dout, const S* inp, const S* weight, const float* rstd, int BT, int C, int accumulate) {
    constexpr int W = Vec<S>::W;
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= BT) return;
    const S* x = inp + row * C;
    const S* d = dout + row * C;
    S* dx = dinp + row * C;
    bool vec = C % W == 0 && al16(x) && al16(d) && al16(dx) && al16(weight);
    float r = rstd[row];
    float dot = 0.f;
    if (vec) {
        for (int c = lane * W; c < C; c += 32 * W) {
            Vec<S> dv = ldv(d + c), wv = ldv(weight + c), xv = ldv(x + c);
#pragma unroll
            for (int k = 0; k < W; k++) dot += ld(dv.v, k) * ld(wv.v, k) * ld(xv.v, k);
        }
    } else {
        for (int c = lane; c < C; c += 32) dot += ld(d, c) * ld(weight, c) * ld(x, c);
    }
    dot = warp_sum(dot) / C;
    if (vec) {
        for (int c = lane * W; c < C; c += 32 * W) {
            Vec<S> dv = ldv(d + c), wv = ldv(weight + c), xv = ldv(x + c), o;
            if (accumulate) o = ldv(dx + c);
#pragma unroll
            for (int k = 0; k < W; k++) {
                float g = ld(dv.v, k) * ld(wv.v, k);
                float v = r * g - ld(xv.v, k) * r * r * r * dot;
                if (accumulate) v += ld(o.v, k);
                st(o.v, k, v);
            }
            stv(dx + c, o);
        }
    } else {
        for (int c = lane; c < C; c += 32) {
            float g = ld(d, c) * ld(weight, c);
            float v = r * g - ld(x, c) * r * r * r * dot;
            if (accumulate) v += ld(dx, c);
            st(dx, c, v);
        }
    }
}
// rmsnorm_dweight_partial: block row b sums rows [b·RPB, (b+1)·RPB) of
// dout·inp·rstd into partial[b] (C values), threads over channels (W adjacent
// channels a thread where rows are whole aligned vectors); each channel's sum
// runs over the rows in order on either path.
template <typename S> __device__ void rmsnorm_dweight_partial(float* partial, const S* dout, const S* inp, const float* rstd, int BT, int C) {
    constexpr int W = Vec<S>::W;
    int b = blockIdx.y;
    int hi = min(BT, (b + 1) * RMS_RPB);
    long t = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    if (C % W == 0 && al16(dout) && al16(inp)) {
        for (long c = t * W; c < C; c += stride * W) {
            float s[W];
#pragma unroll
            for (int k = 0; k < W; k++) s[k] = 0.f;
            for (int r = b * RMS_RPB; r < hi; r++) {
                Vec<S> dv = ldv(dout + (long)r * C + c), xv = ldv(inp + (long)r * C + c);
                float rr = rstd[r];
#pragma unroll
                for (int k = 0; k < W; k++) s[k] += ld(dv.v, k) * ld(xv.v, k) * rr;
            }
#pragma unroll
            for (int k = 0; k < W; k++) partial[(long)b * C + c + k] = s[k];
        }
        return;
    }
    for (long c = t; c < C; c += stride) {
        float s = 0.f;
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
// With half a multiple of W and x aligned, a thread rotates W pairs at once: a
// vector of the first half with the vector half a head later.
template <typename S> __device__ void rope(S* x, const float* cs, const float* sn, int B, int T, int NH, int HD, float dir) {
    constexpr int W = Vec<S>::W;
    int half = HD / 2;
    if (half % W == 0 && al16(x)) {
        int hv = half / W;
        GRID_STRIDE(i, (long)B * T * NH * hv) {
            int j = (int)(i % hv) * W;
            long bth = i / hv;
            int t = (bth / NH) % T;
            long base = bth * HD;
            Vec<S> a = ldv(x + base + j), b = ldv(x + base + j + half);
#pragma unroll
            for (int k = 0; k < W; k++) {
                float c = cs[t * half + j + k], s = dir * sn[t * half + j + k];
                float x1 = ld(a.v, k), x2 = ld(b.v, k);
                st(a.v, k, x1 * c - x2 * s);
                st(b.v, k, x1 * s + x2 * c);
            }
            stv(x + base + j, a);
            stv(x + base + j + half, b);
        }
        return;
    }
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

// swiglu_at is silu(g)·u; swiglu_grads its gradients (dg, du) from dout d.
__device__ __forceinline__ float swiglu_at(float g, float u) {
    float s = 1.f / (1.f + __expf(-g));
    return g * s * u;
}
__device__ __forceinline__ void swiglu_grads(float& dg, float& du, float d, float g, float u) {
    float s = 1.f / (1.f + __expf(-g));
    dg = d * u * s * (1.f + g * (1.f - s));
    du = d * g * s;
}
template <typename S> __device__ void swiglu(S* out, const S* gate, const S* up, long n) {
    constexpr int W = Vec<S>::W;
    long nv = al16(out) && al16(gate) && al16(up) ? n / W : 0;
    GRID_STRIDE(i, nv) {
        Vec<S> g = ldv(gate + i * W), u = ldv(up + i * W), o;
#pragma unroll
        for (int k = 0; k < W; k++) st(o.v, k, swiglu_at(ld(g.v, k), ld(u.v, k)));
        stv(out + i * W, o);
    }
    GRID_STRIDE(j, n - nv * W) {
        long i = nv * W + j;
        st(out, i, swiglu_at(ld(gate, i), ld(up, i)));
    }
}
template <typename S> __device__ void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, long n, int accumulate) {
    constexpr int W = Vec<S>::W;
    long nv = al16(dgate) && al16(dup) && al16(dout) && al16(gate) && al16(up) ? n / W : 0;
    GRID_STRIDE(i, nv) {
        Vec<S> g = ldv(gate + i * W), u = ldv(up + i * W), d = ldv(dout + i * W), a, b;
        if (accumulate) { a = ldv(dgate + i * W); b = ldv(dup + i * W); }
#pragma unroll
        for (int k = 0; k < W; k++) {
            float dg, du;
            swiglu_grads(dg, du, ld(d.v, k), ld(g.v, k), ld(u.v, k));
            if (accumulate) { dg += ld(a.v, k); du += ld(b.v, k); }
            st(a.v, k, dg);
            st(b.v, k, du);
        }
        stv(dgate + i * W, a);
        stv(dup + i * W, b);
    }
    GRID_STRIDE(j, n - nv * W) {
        long i = nv * W + j;
        float dg, du;
        swiglu_grads(dg, du, ld(dout, i), ld(gate, i), ld(up, i));
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

// ---- mixture of experts --------------------------------------------------------------
//
// The same routing as tensor/cpu (Router, Dispatch, Combine and their backward),
// with everything kept on the device: expert counts, segment offsets and the aux
// loss never come back to the host. Copies are numbered i = t·K + j; each expert
// keeps its first `capacity` copies in that order. With `padded` set, expert e's
// segment starts at row e·capacity (static shapes: the experts' products run as one
// strided batch); otherwise segments are packed (the CPU layout).

#define MOE_MAXE 1024

// moe_router: one warp per token; probs (BT,E fp32) = softmax(logits), idx (BT,K) the
// top K by logit (ties to the lower index), gates (BT,K fp32) the softmax of the
// selected logits.
template <typename S> __device__ void moe_router(float* probs, int* idx, float* gates, const S* logits, int BT, int E, int K) {
    __shared__ float sh[4][MOE_MAXE];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long t = (long)blockIdx.x * 4 + w;
    if (t >= BT) return;
    float* z = sh[w];
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) { z[e] = ld(logits, t * E + e); mx = fmaxf(mx, z[e]); }
    mx = warp_max(mx);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) sum += __expf(z[e] - mx);
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) probs[t * E + e] = __expf(z[e] - mx) / sum;
    __syncwarp();
    float selv = 0.f, gmax = -INFINITY;
    for (int j = 0; j < K; j++) {
        float bv = -INFINITY;
        int bi = E;
        for (int e = lane; e < E; e += 32)
            if (z[e] > bv) { bv = z[e]; bi = e; } // lanes scan in index order: ties keep the lower
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffff, bv, o);
            int oi = __shfl_xor_sync(0xffffffff, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == j) selv = bv;
        if (lane == 0) idx[t * K + j] = bi;
        gmax = fmaxf(gmax, bv);
        __syncwarp();
        if (lane == 0) z[bi] = -INFINITY;
        __syncwarp();
    }
    float ex = lane < K ? __expf(selv - gmax) : 0.f;
    float den = warp_sum(ex);
    if (lane < K) gates[t * K + lane] = ex / den;
}

// moe_rank: one block per expert e; rank[i] = the number of copies before i that
// chose e (for the copies that chose e), counts[e] = min(copies of e, capacity).
// A block-wide scan in copy order: deterministic and free of atomics.
extern "C" __global__ void moe_rank(int* rank, int* counts, const int* idx, int n, int capacity) {
    __shared__ int warpTotals[32];
    __shared__ int base;
    int e = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (threadIdx.x == 0) base = 0;
    __syncthreads();
    for (int i0 = 0; i0 < n; i0 += blockDim.x) {
        int i = i0 + threadIdx.x;
        bool hit = i < n && idx[i] == e;
        unsigned mask = __ballot_sync(0xffffffff, hit);
        int before = __popc(mask & ((1u << lane) - 1));
        if (lane == 0) warpTotals[w] = __popc(mask);
        __syncthreads();
        int off = base;
        for (int k = 0; k < w; k++) off += warpTotals[k];
        if (hit) rank[i] = off + before;
        __syncthreads();
        if (threadIdx.x == 0) for (int k = 0; k < nw; k++) base += warpTotals[k];
        __syncthreads();
    }
    if (threadIdx.x == 0) counts[e] = min(base, capacity);
}

// moe_offsets: offsets (E+1) = exclusive prefix sum of counts (packed) or e·capacity
// (padded); one thread, E is small.
extern "C" __global__ void moe_offsets(int* offsets, const int* counts, int E, int capacity, int padded) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int s = 0;
    for (int e = 0; e < E; e++) {
        offsets[e] = padded ? e * capacity : s;
        s += counts[e];
    }
    offsets[E] = padded ? E * capacity : s;
}

// moe_place: row[i] = offsets[e] + rank[i] for kept copies (−1 past capacity) and
// tok[row] = the copy's token.
extern "C" __global__ void moe_place(int* row, int* tok, const int* rank, const int* idx, const int* offsets, int n, int K, int capacity) {
    GRID_STRIDE(i, n) {
        int e = idx[i], r = rank[i];
        if (r < capacity) {
            int p = offsets[e] + r;
            row[i] = p;
            tok[p] = i / K;
        } else {
            row[i] = -1;
        }
    }
}

// moe_gather: xperm[row[i]] = x[token of i] for kept copies; with padded set, the
// unused rows of each segment are zeroed first by the caller.
template <typename S> __device__ void moe_gather(S* xperm, const S* x, const int* row, int n, int K, int C) {
    GRID_STRIDE(e, (long)n * C) {
        long i = e / C;
        int c = e % C, r = row[i];
        if (r >= 0) xperm[(long)r * C + c] = x[(i / K) * C + c];
    }
}

// moe_scatter_back: dx[t] (+)= Σ_j dxperm[row[t,j]] (kept copies), per token: no atomics.
template <typename S> __device__ void moe_scatter_back(S* dx, const S* dxperm, const int* row, int BT, int K, int C, int accumulate) {
    GRID_STRIDE(e, (long)BT * C) {
        long t = e / C;
        int c = e % C;
        float s = accumulate ? ld(dx, e) : 0.f;
        for (int j = 0; j < K; j++) {
            int r = row[t * K + j];
            if (r >= 0) s += ld(dxperm, (long)r * C + c);
        }
        st(dx, e, s);
    }
}

// moe_combine: out[t] += Σ_j gates[t,j]·y[row[t,j]].
template <typename S> __device__ void moe_combine(S* out, const S* y, const float* gates, const int* row, int BT, int K, int C) {
    GRID_STRIDE(e, (long)BT * C) {
        long t = e / C;
        int c = e % C;
        float s = ld(out, e);
        for (int j = 0; j < K; j++) {
            int r = row[t * K + j];
            if (r >= 0) s += gates[t * K + j] * ld(y, (long)r * C + c);
        }
        st(out, e, s);
    }
}

// moe_combine_backward: one warp per copy; dy[row] = g·dout[t] and dgates = dout[t]·y[row]
// (0 for a dropped copy, whose dy row is left alone).
template <typename S> __device__ void moe_combine_backward(S* dy, float* dgates, const S* dout, const S* y, const float* gates, const int* row, int n, int K, int C) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (i >= n) return;
    int r = row[i];
    long t = i / K;
    if (r < 0) {
        if (lane == 0) dgates[i] = 0.f;
        return;
    }
    float g = gates[i], s = 0.f;
    for (int c = lane; c < C; c += 32) {
        float d = ld(dout, t * C + c);
        s += d * ld(y, (long)r * C + c);
        st(dy, (long)r * C + c, g * d);
    }
    s = warp_sum(s);
    if (lane == 0) dgates[i] = s;
}

#define EXPORT_MOE(S, N)                                                                                              \
    extern "C" __global__ void moe_router_##N(float* p, int* idx, float* g, const S* z, int BT, int E, int K) {      \
        moe_router(p, idx, g, z, BT, E, K);                                                                           \
    }                                                                                                                 \
    extern "C" __global__ void moe_gather_##N(S* xp, const S* x, const int* row, int n, int K, int C) {               \
        moe_gather(xp, x, row, n, K, C);                                                                              \
    }                                                                                                                 \
    extern "C" __global__ void moe_scatter_back_##N(S* dx, const S* dxp, const int* row, int BT, int K, int C, int a) { \
        moe_scatter_back(dx, dxp, row, BT, K, C, a);                                                                  \
    }                                                                                                                 \
    extern "C" __global__ void moe_combine_##N(S* out, const S* y, const float* g, const int* row, int BT, int K, int C) { \
        moe_combine(out, y, g, row, BT, K, C);                                                                        \
    }                                                                                                                 \
    extern "C" __global__ void moe_combine_backward_##N(S* dy, float* dg, const S* dout, const S* y, const float* g,   \
                                                        const int* row, int n, int K, int C) {                        \
        moe_combine_backward(dy, dg, dout, y, g, row, n, K, C);                                                       \
    }
FOR_S(EXPORT_MOE)

// ce_rows: one block per row of L (rows, V fp32: whole rows of logits); the row's
// log-sum-exp, its loss (0 where target < 0) and, in the same pass over the row,
// dL = (softmax − onehot)·dloss in storage S: the head's loss and gradient at once
// (a step whose gradient scale is known in the forward needs no second pass).
template <typename S> __device__ void ce_rows(float* losses, float* lse, S* dL, const float* L, const int* targets, const float* dloss, int V) {
    __shared__ float sh[32];
    long row = blockIdx.x;
    const float* z = L + row * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, z[j]);
    m = block_max(m, sh);
    float s = 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += __expf(z[j] - m);
    s = block_sum(s, sh);
    float l = m + logf(s);
    int t = targets[row];
    if (threadIdx.x == 0) {
        lse[row] = l;
        losses[row] = t < 0 ? 0.f : l - z[t];
    }
    float g = t < 0 ? 0.f : dloss[row];
    for (int j = threadIdx.x; j < V; j += blockDim.x) st(dL, row * V + j, (__expf(z[j] - l) - (j == t ? 1.f : 0.f)) * g);
}
extern "C" __global__ void ce_rows_f32(float* losses, float* lse, float* dL, const float* L, const int* t, const float* dloss, int V) {
    ce_rows(losses, lse, dL, L, t, dloss, V);
}
extern "C" __global__ void ce_rows_bf16(float* losses, float* lse, bf16* dL, const float* L, const int* t, const float* dloss, int V) {
    ce_rows(losses, lse, dL, L, t, dloss, V);
}

// ---- flash attention ----------------------------------------------------------------
//
// Layout: q, o (B,Tq,NH,HD); k, v (B,Tk,NKV,HD); lse (B,NH,Tq) fp32. Query i sits at
// position qoff+i, key j at koff+j; with causal set, query i sees key j iff
// flash_lo(i) ≤ koff+j ≤ qoff+i, where flash_lo is 0 unless a block mask narrows
// it (tensor.AttentionShape's Chunk and Starts): the first position of the
// query's chunk of chunk positions (chunk > 0) and its document's start
// starts[b·Tq+i] (starts not null), whichever is later. Query head h reads
// key/value head h/(NH/NKV). Only the output and each row's log-sum-exp (natural
// log, of the scaled scores) are saved; backward recomputes the probabilities. No
// (T,T) buffer exists anywhere. Key tiles no query of a block sees are skipped.
//
// These are the fp32 kernels, on the SIMT cores (the bf16 ones use tensor cores,
// further down).
// Forward: a block of FA_WARPS warps takes FA_ROWS query rows of one (batch, head);
// keys come in tiles of 32 through shared memory; a warp owns one query row at a
// time, lane j scoring key j of the tile, and each lane keeps HD/32 output columns
// (an online softmax rescales them as the running maximum grows).
#define FA_WARPS 4
#define FA_ROWS 16
#define FA_BC 32

// flash_lo: the first key position query i (of batch b, at position qoff+i) sees
// under the block masks; 0 without them.
__device__ __forceinline__ int flash_lo(const int* starts, int chunk, int b, int Tq, int i, int qoff) {
    int lo = starts ? starts[(long)b * Tq + i] : 0;
    if (chunk > 0) lo = max(lo, (qoff + i) / chunk * chunk);
    return lo;
}

// flash_kfirst: the first key index of query rows r0..r1−1 (of batch b) that any
// of them sees under the block masks, rounded down to a multiple of tile (0
// without masks, or without rows).
__device__ __forceinline__ int flash_kfirst(const int* starts, int chunk, int b, int Tq, int r0, int r1, int qoff, int koff,
                                            int tile) {
    if ((!starts && chunk <= 0) || r0 >= r1) return 0;
    int lo = flash_lo(starts, chunk, b, Tq, r0, qoff);
    if (starts)
        for (int i = r0 + 1; i < r1; i++) lo = min(lo, flash_lo(starts, chunk, b, Tq, i, qoff));
    return max(0, lo - koff) / tile * tile;
}

// flash_rows_see: whether any query row t0..t0+n−1 (below Tq) of batch b sees a key
// at positions kp0..kp1 (causally, under the block masks).
__device__ __forceinline__ bool flash_rows_see(const int* starts, int chunk, int b, int Tq, int t0, int n, int qoff, int kp0,
                                               int kp1) {
    for (int i = t0; i < min(Tq, t0 + n); i++)
        if (qoff + i >= kp0 && flash_lo(starts, chunk, b, Tq, i, qoff) <= min(kp1, qoff + i)) return true;
    return false;
}

// flash_qend: one past the last query row that can see a key at position kp1 or
// before under a chunk mask (Tq without one): the rows past its chunk's end see
// none.
__device__ __forceinline__ int flash_qend(int chunk, int Tq, int qoff, int kp1) {
    if (chunk <= 0) return Tq;
    return max(0, min(Tq, (kp1 / chunk + 1) * chunk - qoff));
}

template <typename S, int HD>
__device__ void flash_fwd(S* o, float* lse, const S* q, const S* k, const S* v, int Tq, int Tk, int NH, int NKV,
                          int qoff, int koff, int causal, float scale, const int* starts, int chunk) {
    constexpr int PER = HD / 32;
    __shared__ float ks[FA_BC][HD + 1];
    __shared__ float vs[FA_BC][HD];
    __shared__ float qs[FA_WARPS][HD];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int r0 = blockIdx.x * FA_ROWS;
    int rend = min(Tq, r0 + FA_ROWS);
    // the last key any row of this block can see
    int klast = Tk, kfirst = 0;
    if (causal) {
        klast = min(Tk, qoff + rend - 1 - koff + 1);
        kfirst = flash_kfirst(starts, chunk, b, Tq, r0, rend, qoff, koff, FA_BC);
    }
    // per-warp state for its rows: rows r0+w, r0+w+FA_WARPS, ...
    constexpr int RPW = FA_ROWS / FA_WARPS;
    float acc[RPW][PER], mrow[RPW], lrow[RPW];
    float qreg[RPW][PER];
    int lorow[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        mrow[rr] = -INFINITY;
        lrow[rr] = 0.f;
        int i = r0 + w + rr * FA_WARPS;
        lorow[rr] = i < Tq ? flash_lo(starts, chunk, b, Tq, i, qoff) : 0;
#pragma unroll
        for (int p = 0; p < PER; p++) {
            acc[rr][p] = 0.f;
            qreg[rr][p] = i < Tq ? ld(q, (((long)b * Tq + i) * NH + h) * HD + lane + 32 * p) * scale : 0.f;
        }
    }
    for (int j0 = kfirst; j0 < klast; j0 += FA_BC) {
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
            bool live = j < Tk && (!causal || (koff + j <= qoff + i && koff + j >= lorow[rr]));
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
                             int Tq, int Tk, int NH, int NKV, int qoff, int koff, int causal, float scale, const int* starts,
                             int chunk, int accumulate) {
    constexpr int PER = HD / 32;
    __shared__ float ks[FA_BC][HD + 1];
    __shared__ float vs[FA_BC][HD + 1];
    __shared__ float qs[FA_WARPS][HD];
    __shared__ float ds[FA_WARPS][HD];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int r0 = blockIdx.x * FA_ROWS;
    int rend = min(Tq, r0 + FA_ROWS);
    int klast = Tk, kfirst = 0;
    if (causal) {
        klast = min(Tk, qoff + rend - koff);
        kfirst = flash_kfirst(starts, chunk, b, Tq, r0, rend, qoff, koff, FA_BC);
    }
    constexpr int RPW = FA_ROWS / FA_WARPS;
    float acc[RPW][PER];
    int lorow[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        int i = r0 + w + rr * FA_WARPS;
        lorow[rr] = i < Tq ? flash_lo(starts, chunk, b, Tq, i, qoff) : 0;
#pragma unroll
        for (int p = 0; p < PER; p++) acc[rr][p] = 0.f;
    }
    for (int j0 = kfirst; j0 < klast; j0 += FA_BC) {
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
            bool live = j < Tk && (!causal || (koff + j <= qoff + i && koff + j >= lorow[rr]));
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
                               int Tq, int Tk, int NH, int NKV, int qoff, int koff, int causal, float scale, const int* starts,
                               int chunk, int accumulate) {
    constexpr int Q = HD / 4;
    __shared__ float qs[32][HD];
    __shared__ float dos[32][HD];
    __shared__ float ls[32], dsh[32];
    __shared__ int seen;
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
    // the first query row that can see any key of this tile, and one past the last
    int i0 = 0, iend = Tq;
    int kp0 = koff + (int)blockIdx.x * FB_KEYS, kp1 = koff + min(Tk, ((int)blockIdx.x + 1) * FB_KEYS) - 1;
    if (causal) {
        i0 = max(0, kp0 - qoff);
        iend = flash_qend(chunk, Tq, qoff, kp1);
    }
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        for (int t0 = (i0 / 32) * 32; t0 < iend; t0 += 32) {
            if (causal && starts) { // skip a query tile none of whose rows sees this key tile
                __syncthreads();
                if (threadIdx.x == 0) seen = flash_rows_see(starts, chunk, b, Tq, t0, 32, qoff, kp0, kp1);
                __syncthreads();
                if (!seen) continue;
            }
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
                bool live = jok && (!causal || (koff + j <= qoff + i && koff + j >= flash_lo(starts, chunk, b, Tq, i, qoff)));
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


#define EXPORT_ELEMENTWISE(S, N)                                                                                       \
    extern "C" __global__ void add_##N(S* out, const S* a, const S* b, long n) { add(out, a, b, n); }                  \
    extern "C" __global__ void add_into_##N(S* dst, const S* src, long n) { add_into(dst, src, n); }                   \
    extern "C" __global__ void rmsnorm_##N(S* out, float* rstd, const S* inp, const S* w, int rows, int C, float eps) { \
        rmsnorm(out, rstd, inp, w, rows, C, eps);                                                                     \
    }                                                                                                                 \
    extern "C" __global__ void rmsnorm_backward_##N(S* dinp, const S* dout, const S* inp, const S* w,                \
                                                    const float* rstd, int BT, int C, int acc) {                     \
        rmsnorm_backward(dinp, dout, inp, w, rstd, BT, C, acc);                                                       \
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
    extern "C" __global__ void flash_delta_##N(float* D, const S* o, const S* d, int B, int Tq, int NH, int HD) {     \
        flash_delta(D, o, d, B, Tq, NH, HD);                                                                          \
    }
FOR_S(EXPORT_ELEMENTWISE)

#define FA_ARGS int Tq, int Tk, int NH, int NKV, int qoff, int koff, int causal, float scale, const int *starts, int chunk
#define EXPORT_FLASH_HD(S, N, HD)                                                                                     \
    extern "C" __global__ void __launch_bounds__(128) flash_fwd_##N##_##HD(S* o, float* lse, const S* q, const S* k,   \
                                                                          const S* v, FA_ARGS) {                      \
        flash_fwd<S, HD>(o, lse, q, k, v, Tq, Tk, NH, NKV, qoff, koff, causal, scale, starts, chunk);                 \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_##N##_##HD(S* dq, const S* dout, const float* lse,  \
                                                                             const float* D, const S* q, const S* k,  \
                                                                             const S* v, FA_ARGS, int acc) {          \
        flash_bwd_dq<S, HD>(dq, dout, lse, D, q, k, v, Tq, Tk, NH, NKV, qoff, koff, causal, scale, starts, chunk, acc); \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkdv_##N##_##HD(S* dk, S* dv, const S* dout,           \
                                                                               const float* lse, const float* D,      \
                                                                               const S* q, const S* k, const S* v,    \
                                                                               FA_ARGS, int acc) {                    \
        flash_bwd_dkdv<S, HD>(dk, dv, dout, lse, D, q, k, v, Tq, Tk, NH, NKV, qoff, koff, causal, scale, starts, chunk, \
                              acc);                                                                                   \
    }
// The SIMT kernels serve fp32 storage; bf16 takes the tensor-core kernels below.
EXPORT_FLASH_HD(float, f32, 32)
EXPORT_FLASH_HD(float, f32, 64)
EXPORT_FLASH_HD(float, f32, 128)

#ifndef SHARDLINE_EMU // inline PTX (mma, ldmatrix, cp.async): device only
// ---- flash attention on tensor cores (bf16) ------------------------------------------
//
// The same contract as flash_fwd/flash_bwd_* above, for bf16 storage and head sizes
// 32/64/128, with the products on tensor cores (mma.sync m16n8k16, bf16 operands,
// fp32 accumulators; runs on sm_80 and later). Fragment layouts (PTX ISA, "Matrix
// Fragments for mma.m16n8k16"): with g = lane/4 and c = lane%4, A (16×16, row)
// holds (g, 2c..2c+1), (g+8, 2c..), (g, 2c+8..), (g+8, 2c+8..); B (16×8, col) holds
// (k 2c..2c+1, n g) and (k 2c+8.., n g); the accumulator (16×8) holds (g, 2c..2c+1)
// and (g+8, 2c..2c+1). An accumulator tile pair converts to an A fragment in
// registers, which is how P and dS feed the second product. B fragments come from
// row-major tiles in shared memory through ldmatrix: plain where B[k][n] = M[n][k],
// transposed (.trans) where B[k][n] = M[k][n], so no tile is stored twice. Tiles
// arrive by cp.async in 16-byte pieces. Softmax runs in the log2 domain (exp2);
// the saved lse is natural log.

__device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t ld2(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ void st2(bf16* p, uint32_t v) { *reinterpret_cast<uint32_t*>(p) = v; }
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ldm4 loads four 8×8 b16 matrices; lanes 8i..8i+7 give the row addresses of
// matrix i, and lane l receives row l/4, columns 2(l%4)..+1 of each.
__device__ __forceinline__ void ldm4(uint32_t* r, const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
// ldm4t is ldm4 with each matrix transposed.
__device__ __forceinline__ void ldm4t(uint32_t* r, const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
// cp16 copies 16 bytes from global to shared memory asynchronously, or writes
// zeros when !valid (src is then not read).
__device__ __forceinline__ void cp16(bf16* dst, const bf16* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// tile_async starts copying rows [r0, r0+R) of a (rows, stride) bf16 matrix (HD
// columns) into shared memory, row-major with pitch HD+8 (16-byte rows that keep
// ldmatrix free of bank conflicts); rows ≥ nrows become zeros.
template <int HD, int R>
__device__ __forceinline__ void tile_async(bf16* sm, const bf16* base, long stride, int r0, int nrows) {
    for (int e = threadIdx.x; e < R * HD / 8; e += blockDim.x) {
        int rr = e / (HD / 8), d = (e % (HD / 8)) * 8, r = r0 + rr;
        bool ok = r < nrows;
        cp16(sm + rr * (HD + 8) + d, ok ? base + (long)r * stride + d : base, ok);
    }
}

// bfrag_nk: B fragments for k-steps kk, kk+1 of n-tile n0 where B[k][n] = M[n][k]
// (M row-major, pitch P): r[0..1] for kk, r[2..3] for kk+1.
template <int P>
__device__ __forceinline__ void bfrag_nk(uint32_t* r, const bf16* M, int n0, int kk, int lane) {
    ldm4(r, M + (n0 + (lane & 7)) * P + kk * 16 + (lane >> 3) * 8);
}
// bfrag_kn: B fragments for n-tiles n0, n0+8 of k-step kk where B[k][n] = M[k][n]:
// r[0..1] for n0, r[2..3] for n0+8.
template <int P>
__device__ __forceinline__ void bfrag_kn(uint32_t* r, const bf16* M, int kk, int n0, int lane) {
    int mi = lane >> 3;
    ldm4t(r, M + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * P + n0 + (mi >> 1) * 8);
}

// load_afrag loads the A fragments (16 rows from row0, all HD columns) of a
// (rows, stride) bf16 matrix in global memory; rows ≥ nrows read as zero.
template <int HD>
__device__ __forceinline__ void load_afrag(uint32_t (*a)[4], const bf16* base, long stride, int row0, int nrows, int g, int c) {
    int ra = row0 + g, rb = row0 + g + 8;
#pragma unroll
    for (int s = 0; s < HD / 16; s++) {
        int col = s * 16 + 2 * c;
        a[s][0] = ra < nrows ? ld2(base + ra * stride + col) : 0u;
        a[s][1] = rb < nrows ? ld2(base + rb * stride + col) : 0u;
        a[s][2] = ra < nrows ? ld2(base + ra * stride + col + 8) : 0u;
        a[s][3] = rb < nrows ? ld2(base + rb * stride + col + 8) : 0u;
    }
}

// afrag_from_acc packs accumulator tiles 2kk and 2kk+1 into the A fragment of k-step kk.
__device__ __forceinline__ void afrag_from_acc(uint32_t* a, const float (*x)[4], int kk) {
    a[0] = pack2(x[2 * kk][0], x[2 * kk][1]);
    a[1] = pack2(x[2 * kk][2], x[2 * kk][3]);
    a[2] = pack2(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[3] = pack2(x[2 * kk + 1][2], x[2 * kk + 1][3]);
}

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// flash_fwd_tc: a block of 4 warps takes 64 query rows (16 per warp) of one (batch,
// head); key tiles of 64 pass through shared memory, the next K tile loading while
// P·V runs and the V tile while Q·Kᵀ runs.
template <int HD>
__device__ void flash_fwd_tc(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, int Tq, int Tk, int NH, int NKV,
                             int qoff, int koff, int causal, float scale, const int* starts, int chunk) {
    constexpr int BC = 64, KS = HD / 16, NT = BC / 8, OT = HD / 8, P = HD + 8;
    __shared__ __align__(16) bf16 ks[BC * P];
    __shared__ __align__(16) bf16 vs[BC * P];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int qt = gridDim.x - 1 - blockIdx.x; // causal: the last query tiles have the most keys, so they start first
    int r0 = qt * 64 + w * 16;
    long qstride = (long)NH * HD, kstride = (long)NKV * HD;
    const bf16* qb = q + ((long)b * Tq * NH + h) * HD;
    const bf16* kb = k + ((long)b * Tk * NKV + kh) * HD;
    const bf16* vb = v + ((long)b * Tk * NKV + kh) * HD;
    uint32_t qa[KS][4];
    load_afrag<HD>(qa, qb, qstride, r0, Tq, g, c);
    float acc[OT][4];
#pragma unroll
    for (int t = 0; t < OT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float sl2 = scale * LOG2E;
    int rows[2] = {r0 + g, r0 + g + 8};
    int lor[2] = {rows[0] < Tq ? flash_lo(starts, chunk, b, Tq, rows[0], qoff) : 0,
                  rows[1] < Tq ? flash_lo(starts, chunk, b, Tq, rows[1], qoff) : 0};
    int blast = min(Tq, qt * 64 + 64) - 1;
    int klast = causal ? min(Tk, qoff + blast - koff + 1) : Tk;
    int kfirst = causal ? flash_kfirst(starts, chunk, b, Tq, qt * 64, blast + 1, qoff, koff, BC) : 0;
    if (kfirst < klast) tile_async<HD, BC>(ks, kb, kstride, kfirst, Tk);
    cp_commit();
    for (int j0 = kfirst; j0 < klast; j0 += BC) {
        tile_async<HD, BC>(vs, vb, kstride, j0, Tk);
        cp_commit();
        cp_wait<1>(); // this K tile
        __syncthreads();
        float s[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KS; kk += 2) {
                uint32_t r[4];
                bfrag_nk<P>(r, ks, t * 8, kk, lane);
                mma_bf16(s[t], qa[kk], r[0], r[1]);
                mma_bf16(s[t], qa[kk + 1], r[2], r[3]);
            }
        }
        __syncthreads(); // every warp is done with ks
        if (j0 + BC < klast) tile_async<HD, BC>(ks, kb, kstride, j0 + BC, Tk);
        cp_commit();
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int key = j0 + t * 8 + 2 * c + e;
                    bool live = key < Tk && (!causal || (koff + key <= qoff + rows[r] && koff + key >= lor[r]));
                    float x = live ? s[t][2 * r + e] * sl2 : -INFINITY;
                    s[t][2 * r + e] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            float mnew = fmaxf(m[r], mx);
            float mref = mnew == -INFINITY ? 0.f : mnew;
            float corr = exp2f(m[r] - mref);
            float sum = 0.f;
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float p = exp2f(s[t][2 * r + e] - mref);
                    s[t][2 * r + e] = p;
                    sum += p;
                }
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
            l[r] = l[r] * corr + sum;
            m[r] = mnew;
#pragma unroll
            for (int t = 0; t < OT; t++) { acc[t][2 * r] *= corr; acc[t][2 * r + 1] *= corr; }
        }
        cp_wait<1>(); // this V tile
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t a[4];
            afrag_from_acc(a, s, kk);
#pragma unroll
            for (int t = 0; t < OT; t += 2) {
                uint32_t r[4];
                bfrag_kn<P>(r, vs, kk, t * 8, lane);
                mma_bf16(acc[t], a, r[0], r[1]);
                mma_bf16(acc[t + 1], a, r[2], r[3]);
            }
        }
        __syncthreads(); // every warp is done with vs
    }
    cp_wait<0>();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = rows[r];
        if (row >= Tq) continue;
        float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        bf16* op = o + (((long)b * Tq + row) * NH + h) * HD;
#pragma unroll
        for (int t = 0; t < OT; t++) st2(op + t * 8 + 2 * c, pack2(acc[t][2 * r] * inv, acc[t][2 * r + 1] * inv));
        if (c == 0) lse[((long)b * NH + h) * Tq + row] = l[r] > 0.f ? (m[r] + log2f(l[r])) * LN2 : -INFINITY;
    }
}

// flash_bwd_dq_tc: dq = Σ_j dS_ij·k_j with dS = P∘(dP − D)·scale, P recomputed from
// lse, dP = dO·vᵀ. 4 warps × 16 query rows; key tiles of 32 (K and V row-major).
template <int HD>
__device__ void flash_bwd_dq_tc(bf16* dq, const bf16* dout, const float* lse, const float* D, const bf16* q, const bf16* k,
                                const bf16* v, int Tq, int Tk, int NH, int NKV, int qoff, int koff, int causal, float scale,
                                const int* starts, int chunk, int accumulate) {
    constexpr int BC = 32, KS = HD / 16, NT = BC / 8, OT = HD / 8, P = HD + 8;
    __shared__ __align__(16) bf16 ks[BC * P];
    __shared__ __align__(16) bf16 vs[BC * P];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int qt = gridDim.x - 1 - blockIdx.x; // causal: the last query tiles have the most keys, so they start first
    int r0 = qt * 64 + w * 16;
    long qstride = (long)NH * HD, kstride = (long)NKV * HD;
    const bf16* qb = q + ((long)b * Tq * NH + h) * HD;
    const bf16* dob = dout + ((long)b * Tq * NH + h) * HD;
    const bf16* kb = k + ((long)b * Tk * NKV + kh) * HD;
    const bf16* vb = v + ((long)b * Tk * NKV + kh) * HD;
    uint32_t qa[KS][4], da[KS][4];
    load_afrag<HD>(qa, qb, qstride, r0, Tq, g, c);
    load_afrag<HD>(da, dob, qstride, r0, Tq, g, c);
    int rows[2] = {r0 + g, r0 + g + 8};
    float l2[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        long li = ((long)b * NH + h) * Tq + rows[r];
        l2[r] = rows[r] < Tq ? lse[li] * LOG2E : 0.f;
        Dr[r] = rows[r] < Tq ? D[li] : 0.f;
    }
    float acc[OT][4];
#pragma unroll
    for (int t = 0; t < OT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    float sl2 = scale * LOG2E;
    int lor[2] = {rows[0] < Tq ? flash_lo(starts, chunk, b, Tq, rows[0], qoff) : 0,
                  rows[1] < Tq ? flash_lo(starts, chunk, b, Tq, rows[1], qoff) : 0};
    int blast = min(Tq, qt * 64 + 64) - 1;
    int klast = causal ? min(Tk, qoff + blast - koff + 1) : Tk;
    int kfirst = causal ? flash_kfirst(starts, chunk, b, Tq, qt * 64, blast + 1, qoff, koff, BC) : 0;
    for (int j0 = kfirst; j0 < klast; j0 += BC) {
        __syncthreads();
        tile_async<HD, BC>(ks, kb, kstride, j0, Tk);
        tile_async<HD, BC>(vs, vb, kstride, j0, Tk);
        cp_commit();
        cp_wait<0>();
        __syncthreads();
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[t][e] = dp[t][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KS; kk += 2) {
                uint32_t r[4], rv[4];
                bfrag_nk<P>(r, ks, t * 8, kk, lane);
                bfrag_nk<P>(rv, vs, t * 8, kk, lane);
                mma_bf16(s[t], qa[kk], r[0], r[1]);
                mma_bf16(s[t], qa[kk + 1], r[2], r[3]);
                mma_bf16(dp[t], da[kk], rv[0], rv[1]);
                mma_bf16(dp[t], da[kk + 1], rv[2], rv[3]);
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1, key = j0 + t * 8 + 2 * c + (e & 1);
                bool live = rows[r] < Tq && key < Tk && (!causal || (koff + key <= qoff + rows[r] && koff + key >= lor[r]));
                float p = live ? exp2f(s[t][e] * sl2 - l2[r]) : 0.f;
                s[t][e] = p * (dp[t][e] - Dr[r]) * scale; // dS
            }
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t a[4];
            afrag_from_acc(a, s, kk);
#pragma unroll
            for (int t = 0; t < OT; t += 2) {
                uint32_t r[4];
                bfrag_kn<P>(r, ks, kk, t * 8, lane);
                mma_bf16(acc[t], a, r[0], r[1]);
                mma_bf16(acc[t + 1], a, r[2], r[3]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = rows[r];
        if (row >= Tq) continue;
        bf16* p = dq + (((long)b * Tq + row) * NH + h) * HD;
#pragma unroll
        for (int t = 0; t < OT; t++) {
            float x0 = acc[t][2 * r], x1 = acc[t][2 * r + 1];
            if (accumulate) {
                __nv_bfloat162 old = *reinterpret_cast<__nv_bfloat162*>(p + t * 8 + 2 * c);
                x0 += __bfloat162float(old.x);
                x1 += __bfloat162float(old.y);
            }
            st2(p + t * 8 + 2 * c, pack2(x0, x1));
        }
    }
}

// flash_bwd_dkdv_tc: 4 warps × 16 keys of one (batch, kv head); every query head of
// the group and every query tile (32 rows) that can see the keys passes through
// shared memory (Q and dO row-major). Per tile: Sᵀ = K·Qᵀ, Pᵀ = exp(Sᵀ − lse),
// dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dSᵀ = Pᵀ∘(dPᵀ − D)·scale, dK += dSᵀ·Q.
template <int HD>
__device__ void flash_bwd_dkdv_tc(bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* D, const bf16* q,
                                  const bf16* k, const bf16* v, int Tq, int Tk, int NH, int NKV, int qoff, int koff, int causal,
                                  float scale, const int* starts, int chunk, int accumulate) {
    constexpr int BQ = 32, KS = HD / 16, NT = BQ / 8, OT = HD / 8, P = HD + 8;
    __shared__ __align__(16) bf16 qs[BQ * P];
    __shared__ __align__(16) bf16 dos[BQ * P];
    __shared__ float ls[BQ], ds_[BQ];
    __shared__ int seen;
    int bk = blockIdx.y, b = bk / NKV, kh = bk % NKV, group = NH / NKV;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int j0 = blockIdx.x * 64 + w * 16; // the warp's first key
    long qstride = (long)NH * HD, kstride = (long)NKV * HD;
    const bf16* kb = k + ((long)b * Tk * NKV + kh) * HD;
    const bf16* vb = v + ((long)b * Tk * NKV + kh) * HD;
    uint32_t ka[KS][4], va[KS][4];
    load_afrag<HD>(ka, kb, kstride, j0, Tk, g, c);
    load_afrag<HD>(va, vb, kstride, j0, Tk, g, c);
    int keys[2] = {j0 + g, j0 + g + 8};
    float dka[OT][4], dva[OT][4];
#pragma unroll
    for (int t = 0; t < OT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[t][e] = dva[t][e] = 0.f;
    float sl2 = scale * LOG2E;
    int kp0 = koff + (int)blockIdx.x * 64, kp1 = koff + min(Tk, ((int)blockIdx.x + 1) * 64) - 1;
    int i0 = causal ? max(0, kp0 - qoff) : 0;
    int iend = causal ? flash_qend(chunk, Tq, qoff, kp1) : Tq;
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        const bf16* qb = q + ((long)b * Tq * NH + h) * HD;
        const bf16* dob = dout + ((long)b * Tq * NH + h) * HD;
        for (int t0 = (i0 / BQ) * BQ; t0 < iend; t0 += BQ) {
            if (causal && starts) { // skip a query tile none of whose rows sees this block's keys
                __syncthreads();
                if (threadIdx.x == 0) seen = flash_rows_see(starts, chunk, b, Tq, t0, BQ, qoff, kp0, kp1);
                __syncthreads();
                if (!seen) continue;
            }
            __syncthreads();
            tile_async<HD, BQ>(qs, qb, qstride, t0, Tq);
            tile_async<HD, BQ>(dos, dob, qstride, t0, Tq);
            cp_commit();
            if (threadIdx.x < BQ) {
                int i = t0 + threadIdx.x;
                long li = ((long)b * NH + h) * Tq + i;
                ls[threadIdx.x] = i < Tq ? lse[li] * LOG2E : 0.f;
                ds_[threadIdx.x] = i < Tq ? D[li] : 0.f;
            }
            cp_wait<0>();
            __syncthreads();
            float s[NT][4], dp[NT][4];
#pragma unroll
            for (int t = 0; t < NT; t++) {
#pragma unroll
                for (int e = 0; e < 4; e++) s[t][e] = dp[t][e] = 0.f;
#pragma unroll
                for (int kk = 0; kk < KS; kk += 2) {
                    uint32_t r[4], rd[4];
                    bfrag_nk<P>(r, qs, t * 8, kk, lane);
                    bfrag_nk<P>(rd, dos, t * 8, kk, lane);
                    mma_bf16(s[t], ka[kk], r[0], r[1]);
                    mma_bf16(s[t], ka[kk + 1], r[2], r[3]);
                    mma_bf16(dp[t], va[kk], rd[0], rd[1]);
                    mma_bf16(dp[t], va[kk + 1], rd[2], rd[3]);
                }
            }
            // s becomes Pᵀ, dp becomes dSᵀ
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = keys[e >> 1], qi = t * 8 + 2 * c + (e & 1), i = t0 + qi;
                    bool live = key < Tk && i < Tq &&
                                (!causal || (koff + key <= qoff + i && koff + key >= flash_lo(starts, chunk, b, Tq, i, qoff)));
                    float p = live ? exp2f(s[t][e] * sl2 - ls[qi]) : 0.f;
                    s[t][e] = p;
                    dp[t][e] = p * (dp[t][e] - ds_[qi]) * scale;
                }
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) {
                uint32_t pa[4], sa[4];
                afrag_from_acc(pa, s, kk);
                afrag_from_acc(sa, dp, kk);
#pragma unroll
                for (int t = 0; t < OT; t += 2) {
                    uint32_t ro[4], rq[4];
                    bfrag_kn<P>(ro, dos, kk, t * 8, lane);
                    bfrag_kn<P>(rq, qs, kk, t * 8, lane);
                    mma_bf16(dva[t], pa, ro[0], ro[1]);
                    mma_bf16(dva[t + 1], pa, ro[2], ro[3]);
                    mma_bf16(dka[t], sa, rq[0], rq[1]);
                    mma_bf16(dka[t + 1], sa, rq[2], rq[3]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = keys[r];
        if (key >= Tk) continue;
        long off = (((long)b * Tk + key) * NKV + kh) * HD;
#pragma unroll
        for (int t = 0; t < OT; t++) {
            float k0 = dka[t][2 * r], k1 = dka[t][2 * r + 1], v0 = dva[t][2 * r], v1 = dva[t][2 * r + 1];
            if (accumulate) {
                __nv_bfloat162 ok = *reinterpret_cast<__nv_bfloat162*>(dk + off + t * 8 + 2 * c);
                __nv_bfloat162 ov = *reinterpret_cast<__nv_bfloat162*>(dv + off + t * 8 + 2 * c);
                k0 += __bfloat162float(ok.x);
                k1 += __bfloat162float(ok.y);
                v0 += __bfloat162float(ov.x);
                v1 += __bfloat162float(ov.y);
            }
            st2(dk + off + t * 8 + 2 * c, pack2(k0, k1));
            st2(dv + off + t * 8 + 2 * c, pack2(v0, v1));
        }
    }
}

#define EXPORT_FLASH_TC(HD)                                                                                           \
    extern "C" __global__ void __launch_bounds__(128) flash_fwd_tc_##HD(bf16* o, float* lse, const bf16* q,           \
                                                                       const bf16* k, const bf16* v, FA_ARGS) {       \
        flash_fwd_tc<HD>(o, lse, q, k, v, Tq, Tk, NH, NKV, qoff, koff, causal, scale, starts, chunk);                 \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_tc_##HD(bf16* dq, const bf16* dout,                \
                                                                          const float* lse, const float* D,           \
                                                                          const bf16* q, const bf16* k, const bf16* v, \
                                                                          FA_ARGS, int acc) {                         \
        flash_bwd_dq_tc<HD>(dq, dout, lse, D, q, k, v, Tq, Tk, NH, NKV, qoff, koff, causal, scale, starts, chunk, acc); \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkdv_tc_##HD(bf16* dk, bf16* dv, const bf16* dout,    \
                                                                            const float* lse, const float* D,         \
                                                                            const bf16* q, const bf16* k,             \
                                                                            const bf16* v, FA_ARGS, int acc) {        \
        flash_bwd_dkdv_tc<HD>(dk, dv, dout, lse, D, q, k, v, Tq, Tk, NH, NKV, qoff, koff, causal, scale, starts, chunk, \
                              acc);                                                                                   \
    }
EXPORT_FLASH_TC(32)
EXPORT_FLASH_TC(64)
EXPORT_FLASH_TC(128)
#endif // SHARDLINE_EMU

// ---- f64 conversions (kept last, so that adding them renumbered no other kernel's labels in the PTX) ----

// f64 (a step's statistics) to and from the storage types, rounding as the CPU
// memory does: to f32 to nearest, to bf16 by way of f32.
extern "C" __global__ void cast_f64_f32(float* out, const double* in, long n) {
    GRID_STRIDE(i, n) out[i] = __double2float_rn(in[i]);
}
extern "C" __global__ void cast_f32_f64(double* out, const float* in, long n) {
    GRID_STRIDE(i, n) out[i] = (double)in[i];
}
extern "C" __global__ void cast_f64_bf16(bf16* out, const double* in, long n) {
    GRID_STRIDE(i, n) out[i] = __float2bfloat16_rn(__double2float_rn(in[i]));
}
extern "C" __global__ void cast_bf16_f64(double* out, const bf16* in, long n) {
    GRID_STRIDE(i, n) out[i] = (double)__bfloat162float(in[i]);
}

// ---- the engine's kernel set (tensor.Kernels on the device; cuda/engine.go) ----------
//
// Kept after the f64 conversions, so that adding them renumbered no other kernel's
// labels in the PTX. Activations and their gradients are fp32 here (the engine's F);
// weights and saved inputs may be bf16, read widened. A step's statistics are an f64
// buffer laid out as tensor's Stat constants (TestStatLayout checks these against
// them).
#define STAT_LOSS 0
#define STAT_TOKENS 1
#define STAT_SUMSQ 4
#define STAT_EXPERT_SUMSQ 5
#define STAT_NORM 6
#define STAT_CLIP 7
#define STAT_APPLIED 8
#define STAT_OPT_STEPS 9

__device__ __forceinline__ double warp_sum64(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// block_sum64 is block_sum in f64; sh holds 32 doubles.
__device__ double block_sum64(double v, double* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum64(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    return warp_sum64(v);
}

// Embedding over a table of vocabulary rows lo..lo+N−1: out (BT,C, fp32, or
// bf16 beside a bf16 table: _bf16_bf16, a bf16-native run's activations) is
// the row a token picks, zero for a token outside them.
template <typename O, typename S> __device__ void embedding_range(O* out, const int* tokens, const S* wte, int BT, int C, int lo, int N) {
    GRID_STRIDE(i, (long)BT * C) {
        long t = i / C;
        int c = i - t * C, row = tokens[t] - lo;
        st(out, i, (row >= 0 && row < N) ? ld(wte, (long)row * C + c) : 0.f);
    }
}
extern "C" __global__ void embedding_range_f32(float* out, const int* tok, const float* wte, int BT, int C, int lo, int N) {
    embedding_range(out, tok, wte, BT, C, lo, N);
}
extern "C" __global__ void embedding_range_bf16(float* out, const int* tok, const bf16* wte, int BT, int C, int lo, int N) {
    embedding_range(out, tok, wte, BT, C, lo, N);
}
extern "C" __global__ void embedding_range_bf16_bf16(bf16* out, const int* tok, const bf16* wte, int BT, int C, int lo, int N) {
    embedding_range(out, tok, wte, BT, C, lo, N);
}

// embedding_backward_classes adds dout's rows (fp32; bf16 in _bf16, widened as
// read) into the rows of dwte (fp32) their
// tokens pick, without atomics and in token order: block (x, y) owns channels
// x·blockDim.x.. of the table rows r with r % gridDim.y == y, and walks all BT
// tokens (staged through shared memory 1024 at a time), so every (row, channel)
// has one owner that adds its tokens' values in the order the CPU adds them.
#define EMB_STAGE 1024
template <typename S> __device__ void embedding_backward_classes_t(float* dwte, const S* dout, const int* tokens, int BT, int C, int lo, int N) {
    __shared__ int sh[EMB_STAGE];
    int c = blockIdx.x * blockDim.x + threadIdx.x, cls = blockIdx.y, G = gridDim.y;
    for (int t0 = 0; t0 < BT; t0 += EMB_STAGE) {
        int n = min(EMB_STAGE, BT - t0);
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += blockDim.x) sh[j] = tokens[t0 + j] - lo;
        __syncthreads();
        if (c >= C) continue;
        for (int j = 0; j < n; j++) {
            int row = sh[j];
            if (row >= 0 && row < N && row % G == cls) dwte[(long)row * C + c] += ld(dout, (long)(t0 + j) * C + c);
        }
    }
}
extern "C" __global__ void embedding_backward_classes(float* dwte, const float* dout, const int* tokens, int BT, int C, int lo, int N) {
    embedding_backward_classes_t(dwte, dout, tokens, BT, C, lo, N);
}
extern "C" __global__ void embedding_backward_classes_bf16(float* dwte, const bf16* dout, const int* tokens, int BT, int C, int lo, int N) {
    embedding_backward_classes_t(dwte, dout, tokens, BT, C, lo, N);
}

// merge_attention folds a key block's attention (outB, lseB) into the running
// (out, lse) of the same queries: one thread per (batch, head, query) row.
extern "C" __global__ void merge_attention(float* out, float* lse, const float* outB, const float* lseB, int B, int Tq, int NH, int HD) {
    GRID_STRIDE(li, (long)B * NH * Tq) {
        int t = li % Tq, h = (li / Tq) % NH, b = li / ((long)Tq * NH);
        float l1 = lse[li], l2 = lseB[li];
        if (l2 == -INFINITY) continue;
        long row = (((long)b * Tq + t) * NH + h) * HD;
        if (l1 == -INFINITY) {
            for (int d = 0; d < HD; d++) out[row + d] = outB[row + d];
            lse[li] = l2;
            continue;
        }
        double mx = fmax((double)l1, (double)l2);
        double l = mx + log(exp((double)l1 - mx) + exp((double)l2 - mx));
        double w1 = exp((double)l1 - l), w2 = exp((double)l2 - l);
        for (int d = 0; d < HD; d++) out[row + d] = (float)(w1 * out[row + d] + w2 * outB[row + d]);
        lse[li] = (float)l;
    }
}

// softmax_from_lse sets probs (BT,V) = exp(logits − lse[row]).
extern "C" __global__ void softmax_from_lse(float* probs, const float* logits, const float* lse, int BT, int V) {
    GRID_STRIDE(i, (long)BT * V) probs[i] = __expf(logits[i] - lse[i / V]);
}

// ce_parts: for a rank's V logits of each row (block per row), lse = the row's
// log-sum-exp and tlogit = the target's logit when target − lo lies in the rank's
// entries, 0 elsewhere.
extern "C" __global__ void ce_parts(float* lse, float* tlogit, const float* logits, const int* targets, int V, int lo) {
    __shared__ float sh[32];
    long row = blockIdx.x;
    const float* x = logits + row * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m, sh);
    float s = 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += __expf(x[j] - m);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        lse[row] = m + logf(s);
        int t = targets[row], k = t - lo;
        tlogit[row] = (t >= 0 && k >= 0 && k < V) ? x[k] : 0.f;
    }
}

// ce_combine: each row's log-sum-exp over the ranks' (lseAll, parts×BT, combined
// in rank order in f64), its loss lse − tlogit (0 for a target < 0) and the
// rank's part of its softmax. Block per row.
extern "C" __global__ void ce_combine(float* losses, float* probs, const float* logits, const float* lseAll, const float* tlogit, const int* targets, int BT, int V, int parts) {
    long row = blockIdx.x;
    double mx = -INFINITY;
    for (int p = 0; p < parts; p++) mx = fmax(mx, (double)lseAll[(long)p * BT + row]);
    double s = 0;
    for (int p = 0; p < parts; p++) s += exp((double)lseAll[(long)p * BT + row] - mx);
    float l = (float)(mx + log(s));
    if (threadIdx.x == 0) losses[row] = targets[row] < 0 ? 0.f : l - tlogit[row];
    for (int j = threadIdx.x; j < V; j += blockDim.x) probs[row * V + j] = __expf(logits[row * V + j] - l);
}

// ce_backward_probs: dlogits (BT,V) = (probs − onehot(target − lo))·dloss[row],
// 0 in rows whose target is < 0. dlogits may be probs: each element is read
// before it is written.
extern "C" __global__ void ce_backward_probs(float* dlogits, const float* dloss, const float* probs, const int* targets, int BT, int V, int lo) {
    GRID_STRIDE(i, (long)BT * V) {
        long row = i / V;
        int t = targets[row];
        if (t < 0) {
            dlogits[i] = 0.f;
            continue;
        }
        float g = dloss[row], d = probs[i] * g;
        if (i - row * V == (long)t - lo) d -= g;
        dlogits[i] = d;
    }
}

extern "C" __global__ void add_into_f32_bf16(float* dst, const bf16* src, long n) {
    GRID_STRIDE(i, n) dst[i] += __bfloat162float(src[i]);
}

// loss_sum sets dst[0] (f64) to Σ losses[i] over targets ≥ 0 (adds it with acc):
// one block, fixed order.
extern "C" __global__ void loss_sum(double* dst, const float* losses, const int* targets, int n, int acc) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (targets[i] >= 0) s += (double)losses[i];
    s = block_sum64(s, sh);
    if (threadIdx.x == 0) dst[0] = acc ? dst[0] + s : s;
}

// sumsq64_partial: part[block] = Σ x² (in f64) over the block's grid-stride
// share; sum64_finish adds the parts in order into dst[0] (one block).
template <typename S> __device__ void sumsq64_partial(double* part, const S* x, long n) {
    __shared__ double sh[32];
    double s = 0;
    GRID_STRIDE(i, n) {
        double v = ld(x, i);
        s += v * v;
    }
    s = block_sum64(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
extern "C" __global__ void sumsq64_partial_f32(double* part, const float* x, long n) { sumsq64_partial(part, x, n); }
extern "C" __global__ void sumsq64_partial_bf16(double* part, const bf16* x, long n) { sumsq64_partial(part, x, n); }
extern "C" __global__ void sum64_finish(double* dst, const double* part, int nb, int acc) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
    s = block_sum64(s, sh);
    if (threadIdx.x == 0) dst[0] = acc ? dst[0] + s : s;
}

// close_step finishes a step's statistics as tensor.Kernels.CloseStep says (one
// thread): the norm, the clip factor (tensor.ClipFactor), whether the step
// applies, and the optimizer steps taken.
extern "C" __global__ void close_step(double* st, double maxNorm) {
    double norm = sqrt(st[STAT_SUMSQ] + st[STAT_EXPERT_SUMSQ]);
    double loss = st[STAT_LOSS] / st[STAT_TOKENS];
    double clip = 1;
    if (!(maxNorm <= 0 || norm <= maxNorm || norm == 0)) clip = maxNorm / (norm + 1e-6);
    st[STAT_NORM] = norm;
    st[STAT_CLIP] = clip;
    st[STAT_APPLIED] = 0;
    if (isfinite(loss) && isfinite(norm)) {
        st[STAT_APPLIED] = 1;
        st[STAT_OPT_STEPS] += 1;
    }
}

extern "C" __global__ void axpy64(double* dst, const double* src, double a, long n) {
    GRID_STRIDE(i, n) dst[i] += a * src[i];
}

// adamw_stats is AdamW (tensor/cpu's formula, in fp32) at optimizer step
// st[STAT_OPT_STEPS], when st[STAT_APPLIED] is set, from the gradients clipped
// by st[STAT_CLIP] (each read as g·clip rounded to fp32, as the CPU reads it);
// compute, when not null, receives the updated weights rounded to bf16 (nearest,
// ties to even, as cast_f32_bf16) in the same pass. adamw_step is it over fp32
// or bf16 gradients (adamw_stats_bf16 below).
template <typename G>
__device__ void adamw_step(float* p, bf16* compute, const G* g, float* m, float* v, long n, float lr, float b1, float b2, float eps, float wd, const double* st) {
    if (st[STAT_APPLIED] == 0) return;
    double t = st[STAT_OPT_STEPS];
    float c1 = (float)(1 / (1 - pow((double)b1, t))), c2 = (float)(1 / (1 - pow((double)b2, t)));
    float clip = (float)st[STAT_CLIP];
    GRID_STRIDE(i, n) {
        float gi = __fmul_rn(ld(g, i), clip);
        float mi = b1 * m[i] + (1 - b1) * gi;
        float vi = b2 * v[i] + (1 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i];
        pi = pi - lr * (mi * c1 / (sqrtf(vi * c2) + eps) + wd * pi);
        p[i] = pi;
        if (compute) compute[i] = __float2bfloat16_rn(pi);
    }
}
extern "C" __global__ void adamw_stats(float* p, bf16* compute, const float* g, float* m, float* v, long n, float lr, float b1, float b2, float eps, float wd,
                                       const double* st) {
    adamw_step(p, compute, g, m, v, n, lr, b1, b2, eps, wd, st);
}

// sgd_stats: buf = μ·buf + g·clip; p −= lr·(buf + wd·p), when st[STAT_APPLIED]
// is set; clip and compute as adamw_stats's (sgd_step: sgd_stats_bf16 below).
template <typename G> __device__ void sgd_step(float* p, bf16* compute, const G* g, float* buf, long n, float lr, float mom, float wd, const double* st) {
    if (st[STAT_APPLIED] == 0) return;
    float clip = (float)st[STAT_CLIP];
    GRID_STRIDE(i, n) {
        float b = mom * buf[i] + __fmul_rn(ld(g, i), clip);
        buf[i] = b;
        float pi = p[i] - lr * (b + wd * p[i]);
        p[i] = pi;
        if (compute) compute[i] = __float2bfloat16_rn(pi);
    }
}
extern "C" __global__ void sgd_stats(float* p, bf16* compute, const float* g, float* buf, long n, float lr, float mom, float wd, const double* st) {
    sgd_step(p, compute, g, buf, n, lr, mom, wd, st);
}

// ---- the engine's mixture-of-experts kernels (tensor.Kernels' MoE on the device) ----
//
// Routing, permutation and combination reuse moe_router, moe_rank, moe_offsets,
// moe_place, moe_gather, moe_scatter_back, moe_combine and moe_combine_backward
// above; these are the parts whose contract differs from theirs.

// router_backward_add adds into dlogits (BT,E) the gradient through the gates
// (dgates (BT,K), softmax of the selected logits) and, with has_probs, through
// the probabilities (dprobs (BT,E)): one thread per token.
extern "C" __global__ void router_backward_add(float* dlogits, const float* dgates, const float* dprobs, const float* gates, const float* probs,
                                               const int* idx, int BT, int E, int K, int has_probs) {
    GRID_STRIDE(t, BT) {
        float dot = 0.f;
        for (int j = 0; j < K; j++) dot += gates[t * K + j] * dgates[t * K + j];
        for (int j = 0; j < K; j++) dlogits[t * E + idx[t * K + j]] += gates[t * K + j] * (dgates[t * K + j] - dot);
        if (!has_probs) continue;
        float pd = 0.f;
        for (int e = 0; e < E; e++) pd += probs[t * E + e] * dprobs[t * E + e];
        for (int e = 0; e < E; e++) dlogits[t * E + e] += probs[t * E + e] * (dprobs[t * E + e] - pd);
    }
}

// router_next is the index of the largest value of v (n values, stride 1), plus
// bias when not null, among the allowed ones that come after (lastV, lastI) in
// the order (value descending, index ascending): repeated, it lists the values
// in that order, as tensor/cpu's repeated maximum does, without scratch.
// allowed(e) is a group filter: gsel names the gk chosen groups of per experts
// (null: every expert).
__device__ int router_next(const float* v, const float* bias, int n, float lastV, int lastI, const int* gsel, int gk, int per) {
    int best = -1;
    float bv = 0.f;
    for (int e = 0; e < n; e++) {
        if (gsel) {
            bool ok = false;
            for (int q = 0; q < gk; q++) ok = ok || gsel[q] == e / per;
            if (!ok) continue;
        }
        float x = v[e] + (bias ? bias[e] : 0.f);
        bool after = lastI < 0 || x < lastV || (x == lastV && e > lastI);
        if (after && (best < 0 || x > bv)) { best = e; bv = x; }
    }
    return best;
}

#define ROUTER_MAXG 64

// router_general is Router for any tensor.RouterSpec but the default one (which
// moe_router runs): one thread per token. probs (BT,E) = softmax(logits) or
// sigmoid(logits); the experts are chosen by probs + bias (bias null: none),
// within the gk best of G groups (G 0: none) scored by the sum of their n best;
// gates = the chosen probs, divided by their sum (+1e-20 with sigmoid) unless
// raw, times scale.
extern "C" __global__ void router_general(float* probs, int* idx, float* gates, const float* logits, const float* bias, int BT, int E, int K,
                                          int sigmoid, int raw, float scale, int G, int gk, int n) {
    GRID_STRIDE(t, BT) {
        const float* z = logits + t * E;
        float* p = probs + t * E;
        if (sigmoid) {
            for (int e = 0; e < E; e++) p[e] = 1.f / (1.f + expf(-z[e]));
        } else {
            float mx = -INFINITY, sum = 0.f;
            for (int e = 0; e < E; e++) mx = fmaxf(mx, z[e]);
            for (int e = 0; e < E; e++) sum += expf(z[e] - mx);
            for (int e = 0; e < E; e++) p[e] = expf(z[e] - mx) / sum;
        }
        int gsel[ROUTER_MAXG];
        const int* gs = nullptr;
        int per = G > 0 ? E / G : E;
        if (G > 0) {
            float gscore[ROUTER_MAXG];
            for (int q = 0; q < G; q++) {
                float lastV = 0.f, sum = 0.f;
                int lastI = -1;
                for (int j = 0; j < n; j++) {
                    lastI = router_next(p + q * per, bias ? bias + q * per : nullptr, per, lastV, lastI, nullptr, 0, per);
                    lastV = p[q * per + lastI] + (bias ? bias[q * per + lastI] : 0.f);
                    sum += lastV;
                }
                gscore[q] = sum;
            }
            float lastV = 0.f;
            int lastI = -1;
            for (int j = 0; j < gk; j++) {
                lastI = router_next(gscore, nullptr, G, lastV, lastI, nullptr, 0, 1);
                lastV = gscore[lastI];
                gsel[j] = lastI;
            }
            gs = gsel;
        }
        float lastV = 0.f, sum = 0.f;
        int lastI = -1;
        for (int j = 0; j < K; j++) {
            lastI = router_next(p, bias, E, lastV, lastI, gs, gk, per);
            lastV = p[lastI] + (bias ? bias[lastI] : 0.f);
            idx[t * K + j] = lastI;
            gates[t * K + j] = p[lastI];
            sum += p[lastI];
        }
        if (sigmoid) sum += 1e-20f;
        for (int j = 0; j < K; j++) gates[t * K + j] = (raw ? gates[t * K + j] : gates[t * K + j] / sum) * scale;
    }
}

// router_general_backward adds into dlogits (BT,E) the gradient of router_general's
// gates (dgates) and, with has_probs, of the probabilities (dprobs): one thread
// per token; ds, (BT,E) scratch, holds each score's gradient.
extern "C" __global__ void router_general_backward(float* dlogits, float* ds, const float* dgates, const float* dprobs, const float* gates,
                                                   const float* probs, const int* idx, int BT, int E, int K, int sigmoid, int raw, float scale,
                                                   int has_probs) {
    GRID_STRIDE(t, BT) {
        const float* p = probs + t * E;
        float* d = ds + t * E;
        for (int e = 0; e < E; e++) d[e] = has_probs ? dprobs[t * E + e] : 0.f;
        const float *g = gates + t * K, *dg = dgates + t * K;
        const int* sel = idx + t * K;
        if (raw) {
            for (int j = 0; j < K; j++) d[sel[j]] += scale * dg[j];
        } else {
            float sum = 0.f, dot = 0.f;
            for (int j = 0; j < K; j++) { sum += p[sel[j]]; dot += dg[j] * g[j]; }
            if (sigmoid) sum += 1e-20f;
            for (int j = 0; j < K; j++) d[sel[j]] += (scale * dg[j] - dot) / sum;
        }
        if (sigmoid) {
            for (int e = 0; e < E; e++) dlogits[t * E + e] += d[e] * p[e] * (1.f - p[e]);
            continue;
        }
        float dot = 0.f;
        for (int e = 0; e < E; e++) dot += p[e] * d[e];
        for (int e = 0; e < E; e++) dlogits[t * E + e] += p[e] * (d[e] - dot);
    }
}

// scale_copies multiplies each kept copy's row of xperm (C values) by its gate:
// one thread per value of every copy.
extern "C" __global__ void scale_copies(float* xperm, const float* gates, const int* row, int n, int C) {
    GRID_STRIDE(i, (long)n * C) {
        long c = i / C;
        int r = row[c];
        if (r >= 0) xperm[(long)r * C + i % C] *= gates[c];
    }
}

// scale_copies_backward: one warp per copy; dgates[i] = dxperm[row]·x[token] (0
// when dropped), then dxperm[row] *= gates[i].
extern "C" __global__ void scale_copies_backward(float* dgates, float* dxperm, const float* x, const float* gates, const int* row, int n, int K, int C) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (i >= n) return;
    int r = row[i];
    if (r < 0) {
        if (lane == 0) dgates[i] = 0.f;
        return;
    }
    long t = i / K;
    float g = gates[i], s = 0.f;
    for (int c = lane; c < C; c += 32) {
        float d = dxperm[(long)r * C + c];
        s += d * x[t * C + c];
        dxperm[(long)r * C + c] = g * d;
    }
    s = warp_sum(s);
    if (lane == 0) dgates[i] = s;
}

// expert_bias_update: one thread; bias[i] += rate·sign(mean(load) − load[lo+i])
// for the n biases of experts lo.. (the mean of the E loads in f64, as
// tensor/cpu's).
extern "C" __global__ void expert_bias_update(float* bias, const float* load, int E, int lo, int n, float rate) {
    double mean = 0;
    for (int e = 0; e < E; e++) mean += (double)load[e];
    mean /= E;
    for (int i = 0; i < n; i++) {
        double d = mean - (double)load[lo + i];
        if (d > 0) bias[i] += rate;
        else if (d < 0) bias[i] -= rate;
    }
}

// router_stats sets stats (2E) to each expert's kept copies (offsets' differences)
// and its probability summed over the tokens in f64, token order: one thread per
// expert.
extern "C" __global__ void router_stats(float* stats, const float* probs, const int* offsets, int BT, int E) {
    GRID_STRIDE(e, E) {
        double p = 0;
        for (int t = 0; t < BT; t++) p += (double)probs[(long)t * E + e];
        stats[e] = (float)(offsets[e + 1] - offsets[e]);
        stats[E + e] = (float)p;
    }
}

// aux_loss sets dst[0] (f64) to E·Σ_e f_e·P_e from the stats over `tokens` tokens
// and dst[1] to the copies dropped (BT·K − offsets[E]), adding both with acc: one
// thread.
extern "C" __global__ void aux_loss(double* dst, const float* stats, const int* offsets, int BT, int E, int K, double tokens, int acc) {
    double aux = 0;
    for (int e = 0; e < E; e++) aux += (double)E * (double)stats[e] / (tokens * K) * (double)stats[E + e] / tokens;
    double dropped = (double)BT * K - (double)offsets[E];
    if (acc) {
        aux += dst[0];
        dropped += dst[1];
    }
    dst[0] = aux;
    dst[1] = dropped;
}

// aux_loss_backward sets dprobs (BT,E) to coeff·E·f_e/tokens.
extern "C" __global__ void aux_loss_backward(float* dprobs, const float* stats, int BT, int E, int K, double tokens, double coeff) {
    GRID_STRIDE(i, (long)BT * E) {
        int e = i % E;
        dprobs[i] = (float)(coeff * E * (double)stats[e] / (tokens * K) / tokens);
    }
}

// experts_swiglu is swiglu over the rows offsets[0]..offsets[E] (of width values)
// of buffers of n values, read on the device: no count goes back to the host.
extern "C" __global__ void experts_swiglu(float* out, const float* gate, const float* up, const int* offsets, int E, int width, long n) {
    long lo = (long)offsets[0] * width, hi = min((long)offsets[E] * width, n);
    for (long i = lo + blockIdx.x * (long)blockDim.x + threadIdx.x; i < hi; i += (long)gridDim.x * blockDim.x) {
        float g = gate[i], s = 1.f / (1.f + __expf(-g));
        out[i] = g * s * up[i];
    }
}
extern "C" __global__ void experts_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, const int* offsets,
                                                   int E, int width, long n, int accumulate) {
    long lo = (long)offsets[0] * width, hi = min((long)offsets[E] * width, n);
    for (long i = lo + blockIdx.x * (long)blockDim.x + threadIdx.x; i < hi; i += (long)gridDim.x * blockDim.x) {
        float g = gate[i], s = 1.f / (1.f + __expf(-g)), d = dout[i];
        float dg = d * up[i] * s * (1.f + g * (1.f - s)), du = d * g * s;
        if (accumulate) {
            dg += dgate[i];
            du += dup[i];
        }
        dgate[i] = dg;
        dup[i] = du;
    }
}

// ---- bf16 parameter gradients ------------------------------------------------------
//
// A run that reduces its gradients in bf16 (grad_reduce_in_bf16) holds them in bf16.
// Each kernel here adds into one in fp32 and rounds each element to bf16 once per
// call (to nearest, ties to even), as a product with a bf16 C computed in fp32
// (β = 1) leaves it.

// gemm_epilogue_bf16 finishes an fp32 product whose C is bf16 (cuBLASLt takes a
// bf16 C only beside bf16 operands): c = s + β·c over batch column-major m×n
// products, s dense (product i at i·m·n, column stride m), c at i·sc with column
// stride ldc.
extern "C" __global__ void gemm_epilogue_bf16(bf16* c, const float* s, int m, int n, long ldc, long sc, int batch, float beta) {
    long mn = (long)m * n;
    GRID_STRIDE(i, mn * batch) {
        long b = i / mn, r = i - b * mn, j = r / m, k = b * sc + j * ldc + (r - j * m);
        float v = s[i];
        if (beta != 0.f) v += beta * ld(c, k);
        st(c, k, v);
    }
}

// add_into_bf16_f32: dst (bf16) += src (fp32), in fp32, rounded.
extern "C" __global__ void add_into_bf16_f32(bf16* dst, const float* src, long n) {
    GRID_STRIDE(i, n) st(dst, i, ld(dst, i) + src[i]);
}

// sum_partials_bf16 is sum_partials into a bf16 dst: the partials summed in
// fp32, in order, then added once.
extern "C" __global__ void sum_partials_bf16(bf16* dst, const float* partial, int nb, int C) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int b = 0; b < nb; b++) s += partial[(long)b * C + c];
        st(dst, c, ld(dst, c) + s);
    }
}

// EmbeddingBackward into a bf16 table sums each row's tokens in fp32 before its
// one rounding, in two kernels. embedding_backward_links chains the tokens of
// each row in token order: link[j] is the next token with j's row (−1 after the
// last), last[row] the row's first token (−1 for a row no token picks); tokens
// outside rows lo..lo+N−1 are left unlinked. Thread t of the grid's
// EMB_LINK_CLASSES (a power of two) owns the rows r with r mod EMB_LINK_CLASSES
// = t and walks every token, last to first, staged through shared memory: no
// atomics, and the same links on every run.
#define EMB_LINK_CLASSES 1024
extern "C" __global__ void embedding_backward_links(int* link, int* last, const int* tokens, int BT, int lo, int N) {
    __shared__ int sh[EMB_STAGE];
    int cls = blockIdx.x * blockDim.x + threadIdx.x;
    for (int r = cls; r < N; r += EMB_LINK_CLASSES) last[r] = -1;
    for (int t1 = BT; t1 > 0; t1 -= EMB_STAGE) {
        int t0 = max(0, t1 - EMB_STAGE), n = t1 - t0;
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += blockDim.x) sh[j] = tokens[t0 + j] - lo;
        __syncthreads();
        for (int j = n - 1; j >= 0; j--) {
            int row = sh[j];
            if (row >= 0 && row < N && (row & (EMB_LINK_CLASSES - 1)) == cls) {
                link[t0 + j] = last[row];
                last[row] = t0 + j;
            }
        }
    }
}
// embedding_backward_chains: thread (token j, channel c), for j the first token
// of its row, sums dout[·, c] over the row's chain in token order (fp32) and adds
// the sum into dwte (bf16) once. dout is fp32 (_bf16_f32) or bf16 (_bf16_bf16).
template <typename S> __device__ void embedding_backward_chains(bf16* dwte, const S* dout, const int* tokens, const int* link, const int* last, int BT, int C, int lo, int N) {
    GRID_STRIDE(i, (long)BT * C) {
        long j = i / C;
        int c = i - j * C, row = tokens[j] - lo;
        if (row < 0 || row >= N || last[row] != j) continue;
        float s = 0.f;
        for (long k = j; k >= 0; k = link[k]) s += ld(dout, k * C + c);
        long w = (long)row * C + c;
        st(dwte, w, ld(dwte, w) + s);
    }
}
extern "C" __global__ void embedding_backward_chains_bf16_f32(bf16* dwte, const float* dout, const int* tok, const int* link, const int* last, int BT, int C, int lo,
                                                              int N) {
    embedding_backward_chains(dwte, dout, tok, link, last, BT, C, lo, N);
}
extern "C" __global__ void embedding_backward_chains_bf16_bf16(bf16* dwte, const bf16* dout, const int* tok, const int* link, const int* last, int BT, int C, int lo,
                                                               int N) {
    embedding_backward_chains(dwte, dout, tok, link, last, BT, C, lo, N);
}

// adamw_stats_bf16 and sgd_stats_bf16 are adamw_stats and sgd_stats reading bf16
// gradients (widened: exact).
extern "C" __global__ void adamw_stats_bf16(float* p, bf16* compute, const bf16* g, float* m, float* v, long n, float lr, float b1, float b2, float eps, float wd,
                                            const double* st) {
    adamw_step(p, compute, g, m, v, n, lr, b1, b2, eps, wd, st);
}
extern "C" __global__ void sgd_stats_bf16(float* p, bf16* compute, const bf16* g, float* buf, long n, float lr, float mom, float wd, const double* st) {
    sgd_step(p, compute, g, buf, n, lr, mom, wd, st);
}

// ---- FP8 conversions (kept last, so that adding them renumbered no other kernel's labels in the PTX) ----
//
// OCP E4M3 (bias 7, 3 mantissa bits, largest 448, S.1111.111 NaN, no inf) and
// E5M2 (bias 15, 2 mantissa bits, largest 57344, inf and NaN as IEEE), one
// byte a value, converted as the CPU memory converts (tensor/fp8.go): to FP8
// from float32 (f64 by way of f32) to nearest, ties to even, saturating at the
// largest finite value (inf too), NaN to S.1111111; from FP8 exactly.
__device__ __forceinline__ uint32_t fp8_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
__device__ __forceinline__ float fp8_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
__device__ __forceinline__ uint8_t fp8_rn(float f, int man, int bias, uint32_t maxc) {
    uint32_t b = fp8_bits(f), a = b & 0x7fffffffu;
    uint8_t sign = (uint8_t)((b >> 24) & 0x80);
    if (a > 0x7f800000u) return sign | 0x7f;
    uint32_t code;
    if (a < (uint32_t)(128 - bias) << 23) {
        // Below the smallest normal: units of the smallest subnormal, 2^(1-bias-man);
        // the power-of-two product is exact, rintf rounds to nearest even.
        code = (uint32_t)rintf(fp8_float(a) * fp8_float((uint32_t)(126 + bias + man) << 23));
    } else {
        int shift = 23 - man;
        uint32_t r = a + ((1u << (shift - 1)) - 1) + ((a >> shift) & 1);
        code = (r >> shift) - ((uint32_t)(127 - bias) << man);
    }
    return sign | (uint8_t)(code > maxc ? maxc : code);
}
__device__ __forceinline__ float fp8_value(uint8_t c, int man, int bias, bool ieee) {
    uint32_t sign = (uint32_t)(c & 0x80) << 24, mag = c & 0x7f, e = mag >> man, m = mag & ((1u << man) - 1);
    if ((!ieee && mag == 0x7f) || (ieee && e == 31 && m != 0)) return fp8_float(0x7fc00000u);
    if (ieee && e == 31) return fp8_float(sign | 0x7f800000u);
    if (e == 0) return fp8_float(sign | fp8_bits((float)m * fp8_float((uint32_t)(128 - bias - man) << 23)));
    return fp8_float(sign | ((e - bias + 127) << 23) | (m << (23 - man)));
}
__device__ __forceinline__ uint8_t e4m3_rn(float f) { return fp8_rn(f, 3, 7, 0x7e); }
__device__ __forceinline__ uint8_t e5m2_rn(float f) { return fp8_rn(f, 2, 15, 0x7b); }
__device__ __forceinline__ float e4m3_value(uint8_t c) { return fp8_value(c, 3, 7, false); }
__device__ __forceinline__ float e5m2_value(uint8_t c) { return fp8_value(c, 2, 15, true); }

#define FP8_CAST(name, OUT, IN, expr) \
    extern "C" __global__ void name(OUT* out, const IN* in, long n) { GRID_STRIDE(i, n) out[i] = expr; }
FP8_CAST(cast_f32_e4m3, uint8_t, float, e4m3_rn(in[i]))
FP8_CAST(cast_f32_e5m2, uint8_t, float, e5m2_rn(in[i]))
FP8_CAST(cast_bf16_e4m3, uint8_t, bf16, e4m3_rn(__bfloat162float(in[i])))
FP8_CAST(cast_bf16_e5m2, uint8_t, bf16, e5m2_rn(__bfloat162float(in[i])))
FP8_CAST(cast_f64_e4m3, uint8_t, double, e4m3_rn(__double2float_rn(in[i])))
FP8_CAST(cast_f64_e5m2, uint8_t, double, e5m2_rn(__double2float_rn(in[i])))
FP8_CAST(cast_e5m2_e4m3, uint8_t, uint8_t, e4m3_rn(e5m2_value(in[i])))
FP8_CAST(cast_e4m3_e5m2, uint8_t, uint8_t, e5m2_rn(e4m3_value(in[i])))
FP8_CAST(cast_e4m3_f32, float, uint8_t, e4m3_value(in[i]))
FP8_CAST(cast_e5m2_f32, float, uint8_t, e5m2_value(in[i]))
FP8_CAST(cast_e4m3_bf16, bf16, uint8_t, __float2bfloat16_rn(e4m3_value(in[i])))
FP8_CAST(cast_e5m2_bf16, bf16, uint8_t, __float2bfloat16_rn(e5m2_value(in[i])))
FP8_CAST(cast_e4m3_f64, double, uint8_t, (double)e4m3_value(in[i]))
FP8_CAST(cast_e5m2_f64, double, uint8_t, (double)e5m2_value(in[i]))

// ---- FP8 scaling and products (after the casts, for the same reason) ----
//
// The kernels behind tensor.Kernels' Amax, FP8Scale and Quantize and the FP8
// products' operands: amaxes in f64, scales and scale inverses in f32, all in
// device memory (tensor/fp8.go's definitions, which the CPU calls).

// nanmax is the larger of a and b, NaN where either is (tensor.Amax's rule).
__device__ __forceinline__ float nanmax(float a, float b) { return a != a ? a : (b != b ? b : (b > a ? b : a)); }
__device__ __forceinline__ float warp_nanmax(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = nanmax(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
// block_nanmax is block_max with nanmax over values ≥ 0; sh holds 32 floats.
__device__ float block_nanmax(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_nanmax(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.f;
    return warp_nanmax(v);
}

// amax_partial: part[block] = max |x| over the block's grid-stride share (NaN
// where it holds one); amax_finish takes the parts' largest into dst[0], or
// with acc raises dst[0] to it (a NaN in either stays).
template <typename S> __device__ void amax_partial(double* part, const S* x, long n) {
    __shared__ float sh[32];
    float m = 0.f;
    GRID_STRIDE(i, n) m = nanmax(m, fabsf(ld(x, i)));
    m = block_nanmax(m, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = (double)m;
}
extern "C" __global__ void amax_partial_f32(double* part, const float* x, long n) { amax_partial(part, x, n); }
extern "C" __global__ void amax_partial_bf16(double* part, const bf16* x, long n) { amax_partial(part, x, n); }
extern "C" __global__ void amax_finish(double* dst, const double* part, int nb, int acc) {
    __shared__ float sh[32];
    float m = 0.f;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) m = nanmax(m, (float)part[i]);
    m = block_nanmax(m, sh);
    if (threadIdx.x == 0) {
        double a = (double)m, d = dst[0];
        dst[0] = acc && !(a > d || a != a) ? d : a;
    }
}

// fp8_scale (one thread): scale[0] = (fmax·2^−margin) / amax[0] in fp32
// (tensor.FP8Format.ScaleFrom), fp32's largest finite value where the quotient
// overflows, 1 where the amax is 0, negative, inf or NaN. 0 ≤ margin ≤ 126, so
// that 2^−margin is an fp32 normal (the caller checks).
extern "C" __global__ void fp8_scale(float* scale, const double* amax, float fmax, int margin) {
    float a = __double2float_rn(amax[0]), s = 1.f;
    if (a > 0.f && a != INFINITY) {
        s = __fmul_rn(fmax, fp8_float((uint32_t)(127 - margin) << 23)) / a;
        if (s == INFINITY) s = fp8_float(0x7f7fffffu);
    }
    scale[0] = s;
}

// fp8_delayed_scale (a thread a tensor): the end of a step of delayed
// scaling (tensor.DelayedScaling's Record over the ranks' amaxes, then
// Update) for tensors 0..n−1, tensor i's history in column i of hist (steps
// rows stride apart, row 0 the step's slot), its amaxes in column i of amax
// (ranks rows stride apart), its scale in scale[i]. A NaN amax stays in row
// 0 (Record); max passes NaNs over (the comparisons are false), most_recent
// takes row 0; the scale is fp8_scale's where that amax is finite and above
// 0, kept otherwise.
extern "C" __global__ void fp8_delayed_scale(float* scale, float* hist, const float* amax, int n, int steps, int ranks, long stride,
                                             float fmax, int margin, int most_recent) {
    GRID_STRIDE(i, n) {
        float cur = hist[i];
        for (int r = 0; r < ranks; r++) {
            float v = amax[r * stride + i];
            if (v > cur || v != v) cur = v;
        }
        float m = cur;
        long last = (long)(steps - 1) * stride;
        if (!most_recent) {
            m = cur > 0.f ? cur : 0.f;
            for (long j = stride; j <= last; j += stride) {
                float v = hist[j + i];
                if (v > m) m = v;
            }
        }
        for (long j = 0; j < last; j += stride) hist[j + i] = hist[j + stride + i];
        hist[last + i] = cur;
        hist[i] = 0.f;
        if (m > 0.f && m != INFINITY) {
            float s = __fmul_rn(fmax, fp8_float((uint32_t)(127 - margin) << 23)) / m;
            if (s == INFINITY) s = fp8_float(0x7f7fffffu);
            scale[i] = s;
        }
    }
}

// quantize_S_F: out = each x·scale[0] (an fp32 product) rounded to format F,
// saturating; inv[0] = 1/scale[0] (the scale inverse products read; inv and
// scale are distinct buffers).
#define FP8_QUANTIZE(name, S, rn)                                                             \
    extern "C" __global__ void name(uint8_t* out, float* inv, const S* x, const float* scale, long n) { \
        float s = scale[0];                                                                   \
        GRID_STRIDE(i, n) out[i] = rn(__fmul_rn(ld(x, i), s));                               \
        if (blockIdx.x == 0 && threadIdx.x == 0) inv[0] = 1.f / s;                           \
    }
FP8_QUANTIZE(quantize_f32_e4m3, float, e4m3_rn)
FP8_QUANTIZE(quantize_bf16_e4m3, bf16, e4m3_rn)
FP8_QUANTIZE(quantize_f32_e5m2, float, e5m2_rn)
FP8_QUANTIZE(quantize_bf16_e5m2, bf16, e5m2_rn)

// widen_scaled_S: out (fp32) = each value of in times α = s1[0]·s2[0] (fp32;
// a null pointer counts 1): an FP8 product's first operand, which carries the
// operands' scale inverses as the CPU's Sgemm folds α into its A.
#define WIDEN_SCALED(name, IN, val)                                                                \
    extern "C" __global__ void name(float* out, const IN* in, const float* s1, const float* s2, long n) { \
        float a = __fmul_rn(s1 ? s1[0] : 1.f, s2 ? s2[0] : 1.f);                                     \
        GRID_STRIDE(i, n) out[i] = __fmul_rn(val, a);                                                 \
    }
WIDEN_SCALED(widen_scaled_f32, float, in[i])
WIDEN_SCALED(widen_scaled_bf16, bf16, __bfloat162float(in[i]))
WIDEN_SCALED(widen_scaled_e4m3, uint8_t, e4m3_value(in[i]))
WIDEN_SCALED(widen_scaled_e5m2, uint8_t, e5m2_value(in[i]))

// ---- FP8 operand transposes (after the products, for the same reason) ----

// transpose_u8: out (cols × rows, row-major) = in (rows × cols, row-major)
// transposed, a byte a value: the FP8 codes cuBLASLt's FP8 products read
// transposed, since they take "TN" operands only (cuda/fp8gemm.go). A block
// of 256 threads moves one 32×32 tile through shared memory (a padded row, so
// that the transposed reads do not share a bank); the grid is
// ⌈cols/32⌉ × ⌈rows/32⌉ tiles.
extern "C" __global__ void transpose_u8(uint8_t* out, const uint8_t* in, int rows, int cols) {
    __shared__ uint8_t tile[32][33];
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int j = ty; j < 32; j += 8) {
        int r = r0 + j, c = c0 + tx;
        if (r < rows && c < cols) tile[j][tx] = in[(long)r * cols + c];
    }
    __syncthreads();
    for (int j = ty; j < 32; j += 8) {
        int c = c0 + j, r = r0 + tx;
        if (c < cols && r < rows) out[(long)c * rows + r] = tile[tx][j];
    }
}
