//go:build cudaemu

// The host emulator's side of driver_emu.go: kernels.cu compiled for the host
// under kernels/emu/emu.h, and a launcher that finds a kernel by name and
// calls it with its arguments taken from 8-byte slots, as cuLaunchKernel
// takes them.
//
// sources: 326904edd72d0c1c025c4f65bcff9b4cc4200c85e3ca94d8134433a1da3404f6
#include "emu.h"
#include "kernels.cu"

#include <type_traits>
#include <utility>

namespace {
// slot is argument slot v as parameter type T: an address, an integer (its
// low bytes, as the driver copies them), a float or a double (their bits).
template <typename T> T slot(uint64_t v) {
    if constexpr (std::is_pointer_v<T>) {
        return reinterpret_cast<T>(static_cast<uintptr_t>(v));
    } else {
        T x;
        memcpy(&x, &v, sizeof x);
        return x;
    }
}
template <typename... A, size_t... I> void call(void (*f)(A...), const uint64_t* a, std::index_sequence<I...>) { f(slot<A>(a[I])...); }
template <typename... A> void call(void (*f)(A...), const uint64_t* a, int n, int* bad) {
    if (n != (int)sizeof...(A)) {
        *bad = (int)sizeof...(A);
        return;
    }
    call(f, a, std::index_sequence_for<A...>{});
}
struct entry {
    const char* name;
    void (*run)(const uint64_t*, int, int*);
};
#define K(n) {#n, [](const uint64_t* a, int c, int* bad) { call(n, a, c, bad); }},
const entry table[] = {
#include "table.inc"
};
#undef K
} // namespace

// emu_launch runs kernel name over grid (gx, gy) of blocks of threads: 0, or
// -1 for an unknown kernel, or the kernel's parameter count when nargs is not
// it.
extern "C" int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned threads, const uint64_t* args, int nargs) {
    for (const entry& e : table)
        if (strcmp(e.name, name) == 0) {
            int bad = 0;
            emu::launch(dim3(gx, gy), dim3(threads), [&] { e.run(args, nargs, &bad); });
            return bad;
        }
    return -1;
}
