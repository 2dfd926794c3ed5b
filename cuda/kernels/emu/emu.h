// emu.h runs shardline's CUDA kernels on the host, for tests on machines
// without a GPU: kernels.cu compiles as C++ after it (SHARDLINE_EMU defined,
// which leaves out the tensor-core section and its inline PTX), and
// emu::launch runs a kernel over a grid the way the device does, one block at
// a time, each CUDA thread a fiber (ucontext) on one OS thread. Fibers switch
// only at __syncthreads, __syncwarp and the warp intrinsics, which are
// barriers here as on the device: a block whose threads do not all reach the
// same barrier (a divergent __syncthreads) is reported as a deadlock, not run
// past. Shared memory is the kernels' static locals (one block runs at a
// time). Deterministic: warps run in order, lanes in order within a warp.
// A fiber is made once
// (makecontext) and serves every block after; switches are _setjmp/_longjmp,
// which save no signal mask (swapcontext's system call per switch made the
// emulator five times slower).
//
// What it does not model: warp-level timing (the lanes of a warp do not run
// in lockstep between barriers, which correct kernels do not rely on),
// memory fences beyond the barriers, and the device's fast-math rounding
// (__expf is expf here), so results agree with a GPU's within rounding.
#pragma once
#undef _FORTIFY_SOURCE // its longjmp check refuses the jumps between fiber stacks below
#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <algorithm>
#include <vector>

struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {
inline uint3 thread_idx, block_idx;
inline dim3 block_dim, grid_dim;

enum State { RUN, BLOCK_BAR, WARP_BAR, DONE };
struct Fiber {
    ucontext_t ctx; // its first entry
    jmp_buf jb;     // where it yielded
    std::vector<char> stack;
    State state = DONE;
    bool started = false;
};
inline std::vector<Fiber> fibers;
inline ucontext_t scheduler_ctx;
inline jmp_buf scheduler;
inline int current = -1;
inline const std::function<void()>* body = nullptr;
inline uint64_t warp_slots[32][32]; // per warp, per lane: the values the warp intrinsics exchange
constexpr size_t stack_bytes = 64 << 10;

// yield gives the OS thread back to the scheduler until it resumes the fiber.
inline void yield() {
    if (!_setjmp(fibers[current].jb)) _longjmp(scheduler, 1);
}

// fiber_main runs the body for every block the fiber takes part in.
inline void fiber_main() {
    for (;;) {
        (*body)();
        fibers[current].state = DONE;
        yield();
    }
}

// resume runs fiber i until it yields.
inline void resume(int i) {
    current = i;
    if (_setjmp(scheduler)) return;
    Fiber& f = fibers[i];
    if (!f.started) {
        f.started = true;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
        swapcontext(&scheduler_ctx, &f.ctx);
        return; // not reached: the fiber comes back by _longjmp
    }
    _longjmp(f.jb, 1);
}

// wait yields the current fiber at barrier s until the scheduler releases it.
inline void wait(State s) {
    fibers[current].state = s;
    yield();
}

// run_block runs every thread of the current block to its end, a warp at a
// time: a warp's lanes run until each waits at a barrier; a warp barrier all
// its live lanes reached releases them at once (so the warp runs on with its
// 32 stacks in cache), and once every warp waits at __syncthreads or has
// ended, the block's barrier releases them all.
inline void run_block(int n) {
    for (int i = 0; i < n; i++) fibers[i].state = RUN;
    for (;;) {
        for (int w = 0; w * 32 < n; w++) {
            int lo = w * 32, hi = std::min(n, lo + 32);
            for (;;) {
                bool ran = false;
                for (int i = lo; i < hi; i++) {
                    if (fibers[i].state != RUN) continue;
                    thread_idx = {(unsigned)i % block_dim.x, (unsigned)i / block_dim.x % block_dim.y, (unsigned)i / (block_dim.x * block_dim.y)};
                    resume(i);
                    ran = true;
                }
                if (ran) continue;
                bool any = false, all_warp = true;
                for (int i = lo; i < hi; i++) {
                    if (fibers[i].state == DONE) continue;
                    any = true;
                    all_warp = all_warp && fibers[i].state == WARP_BAR;
                }
                if (!any || !all_warp) break;
                for (int i = lo; i < hi; i++)
                    if (fibers[i].state == WARP_BAR) fibers[i].state = RUN;
            }
        }
        bool live = false, all_block = true;
        for (int i = 0; i < n; i++) {
            if (fibers[i].state == DONE) continue;
            live = true;
            all_block = all_block && fibers[i].state == BLOCK_BAR;
        }
        if (!live) return;
        if (!all_block) {
            fprintf(stderr, "emu: block (%u,%u) deadlocked: its threads wait at different barriers\n", block_idx.x, block_idx.y);
            exit(3);
        }
        for (int i = 0; i < n; i++) fibers[i].state = fibers[i].state == BLOCK_BAR ? RUN : fibers[i].state;
    }
}

// launch runs kernel (a call of it with its arguments bound) over grid × block.
inline void launch(dim3 grid, dim3 block, const std::function<void()>& kernel) {
    int n = block.x * block.y * block.z;
    if (n > 1024 || n <= 0) {
        fprintf(stderr, "emu: %d threads per block\n", n);
        exit(3);
    }
    if ((int)fibers.size() < n) {
        // Growing moves the Fiber records, not their stacks (a vector's move
        // keeps its buffer), so the jmp_bufs, which point into the stacks, stay
        // good.
        fibers.resize(n);
        for (auto& f : fibers)
            if (f.stack.empty()) f.stack.resize(stack_bytes);
    }
    body = &kernel;
    block_dim = block;
    grid_dim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                block_idx = {x, y, z};
                run_block(n);
            }
}

template <typename T> inline uint64_t bits(T v) {
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename T> inline T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}
// check_aligned stops the emulator where a kernel makes a vector access the
// device would fault on (an x86 host would not): p not a multiple of n bytes.
inline void check_aligned(const void* p, int n) {
    if ((uintptr_t)p % n != 0) {
        fprintf(stderr, "emu: misaligned %d-byte vector access at %p (block %u,%u thread %u)\n", n, p, block_idx.x, block_idx.y, thread_idx.x);
        abort();
    }
}
inline int lane() { return thread_idx.x & 31; }
inline int warp() { return (thread_idx.x + thread_idx.y * block_dim.x) >> 5; }

// exchange publishes v for the warp and returns lane src's value, between two
// warp barriers (the second keeps a lane from publishing its next value
// before every lane has read this one).
inline uint64_t exchange(uint64_t v, int src) {
    warp_slots[warp()][lane()] = v;
    wait(WARP_BAR);
    uint64_t r = warp_slots[warp()][src & 31];
    wait(WARP_BAR);
    return r;
}
} // namespace emu

#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

inline void __syncthreads() { emu::wait(emu::BLOCK_BAR); }
inline void __syncwarp(unsigned = 0xffffffff) { emu::wait(emu::WARP_BAR); }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask) {
    return emu::from_bits<T>(emu::exchange(emu::bits(v), emu::lane() ^ mask));
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src) { return emu::from_bits<T>(emu::exchange(emu::bits(v), src)); }
inline unsigned __ballot_sync(unsigned, int pred) {
    emu::warp_slots[emu::warp()][emu::lane()] = pred != 0;
    emu::wait(emu::WARP_BAR);
    unsigned m = 0;
    for (int l = 0; l < 32; l++)
        if (emu::warp_slots[emu::warp()][l]) m |= 1u << l;
    emu::wait(emu::WARP_BAR);
    return m;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }

// The device's fast-math and conversion intrinsics, at host precision.
inline float __expf(float x) { return expf(x); }
inline float __fmul_rn(float a, float b) { return a * b; } // a product of its own: never contracted into an FMA
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __double2float_rn(double x) { return (float)x; }
template <typename A, typename B> inline auto min(A a, B b) -> decltype(a + b) { return a < b ? a : b; }
template <typename A, typename B> inline auto max(A a, B b) -> decltype(a + b) { return a > b ? a : b; }

// bf16 as the device stores it: the top 16 bits of an fp32, rounded to
// nearest, ties to even (NaN kept quiet).
struct __nv_bfloat16 {
    uint16_t x;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return {(uint16_t)((u >> 16) | 0x40)};
    u += 0x7fff + ((u >> 16) & 1);
    return {(uint16_t)(u >> 16)};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) { return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)}; }
