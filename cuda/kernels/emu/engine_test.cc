// The engine's device kernels (the ones cuda/engine.go launches that no GPU
// has run yet) on the host emulator, against plain loops that state what
// each must compute: each launched with the grid, block and arguments
// engine.go gives it. Built and run by cuda's TestKernelsOnTheEmulator (g++,
// no GPU); prints one line per check and exits 1 on a mismatch.
#include "emu.h"
#include "kernels.cu"

#include <random>
#include <string>

static int failures = 0, checks = 0;
static std::mt19937 rng(7);

static std::vector<float> draw(size_t n, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<float> x(n);
    for (auto& v : x) v = u(rng);
    return x;
}

// near checks got against want: |got − want| ≤ tol·(|want| + rms(want)), and
// equal non-finite values.
template <typename G, typename W> static void near(const std::string& what, const G& got, const W& want, double tol) {
    checks++;
    double ss = 0;
    for (double w : want)
        if (std::isfinite(w)) ss += w * w;
    double rms = std::sqrt(ss / std::max<size_t>(want.size(), 1)), worst = 0;
    if (got.size() != want.size()) {
        printf("FAIL %s: %zu values, want %zu\n", what.c_str(), got.size(), want.size());
        failures++;
        return;
    }
    for (size_t i = 0; i < want.size(); i++) {
        double g = got[i], w = want[i];
        bool ok = std::isfinite(w) ? std::fabs(g - w) <= tol * (std::fabs(w) + rms) : (std::isnan(w) ? std::isnan(g) : g == w);
        if (!ok) {
            printf("FAIL %s[%zu] = %.9g, want %.9g\n", what.c_str(), i, g, w);
            failures++;
            return;
        }
        if (std::isfinite(w) && rms > 0) worst = std::max(worst, std::fabs(g - w) / (tol * (std::fabs(w) + rms)));
    }
    printf("ok   %s (%zu values, worst error %.2g of the bound)\n", what.c_str(), want.size(), worst);
}

// grid is cuda's Device.grid on a device of 132 SMs: blocks of 256 threads for
// n values, capped at 32 per SM.
static unsigned grid(long n) { return (unsigned)std::max<long>(1, std::min<long>((n + 255) / 256, 32 * 132)); }

static void embedding() {
    const int BT = 3000, C = 200, lo = 20, N = 37, V = 80; // more tokens than one staging of 1024; two channel blocks
    std::vector<int> tok(BT);
    for (int t = 0; t < BT; t++) tok[t] = (t * 7919 + t / 3) % V;
    auto wte = draw((size_t)N * C, 1), dout = draw((size_t)BT * C, 1), dwte = draw((size_t)N * C, 1);
    std::vector<float> out(BT * C, 9.f), want(BT * C), dwant = dwte;
    for (int t = 0; t < BT; t++)
        for (int c = 0; c < C; c++) {
            int r = tok[t] - lo;
            want[t * C + c] = r >= 0 && r < N ? wte[r * C + c] : 0.f;
            if (r >= 0 && r < N) dwant[r * C + c] += dout[t * C + c]; // token order, as the CPU adds
        }
    emu::launch(grid((long)BT * C), 256, [&] { embedding_range_f32(out.data(), tok.data(), wte.data(), BT, C, lo, N); });
    near("embedding_range_f32", out, want, 0);
    std::vector<bf16> wb(wte.size());
    std::vector<float> wantb(BT * C);
    for (size_t i = 0; i < wte.size(); i++) wb[i] = __float2bfloat16_rn(wte[i]);
    for (int t = 0; t < BT; t++)
        for (int c = 0; c < C; c++) {
            int r = tok[t] - lo;
            wantb[t * C + c] = r >= 0 && r < N ? __bfloat162float(wb[r * C + c]) : 0.f;
        }
    emu::launch(grid((long)BT * C), 256, [&] { embedding_range_bf16(out.data(), tok.data(), wb.data(), BT, C, lo, N); });
    near("embedding_range_bf16", out, wantb, 0);
    // engine.go: grid ((C+127)/128, min(64, N)), 128 threads; bit for bit.
    emu::launch(dim3((C + 127) / 128, std::min(64, N)), 128,
                [&] { embedding_backward_classes(dwte.data(), dout.data(), tok.data(), BT, C, lo, N); });
    near("embedding_backward_classes (bit for bit)", dwte, dwant, 0);
}

static void merge() {
    const int B = 2, Tq = 5, NH = 3, HD = 8, rows = B * NH * Tq;
    auto out = draw(rows * HD, 1), outB = draw(rows * HD, 1), lse = draw(rows, 3), lseB = draw(rows, 3);
    lse[0] = lse[7] = lseB[1] = lseB[7] = -INFINITY;
    std::vector<double> want(out.begin(), out.end()), wlse(lse.begin(), lse.end());
    for (int li = 0; li < rows; li++) {
        int t = li % Tq, h = li / Tq % NH, b = li / (Tq * NH);
        long row = ((long)(b * Tq + t) * NH + h) * HD;
        double l1 = lse[li], l2 = lseB[li];
        if (std::isinf(l2)) continue;
        if (std::isinf(l1)) {
            for (int d = 0; d < HD; d++) want[row + d] = outB[row + d];
            wlse[li] = l2;
            continue;
        }
        double l = std::log(std::exp(l1) + std::exp(l2));
        for (int d = 0; d < HD; d++) want[row + d] = std::exp(l1 - l) * out[row + d] + std::exp(l2 - l) * outB[row + d];
        wlse[li] = l;
    }
    emu::launch(grid(rows), 256, [&] { merge_attention(out.data(), lse.data(), outB.data(), lseB.data(), B, Tq, NH, HD); });
    near("merge_attention out", out, want, 1e-6);
    near("merge_attention lse", lse, wlse, 1e-6);
}

// lse_of is a row's log-sum-exp in double.
static double lse_of(const float* x, int V) {
    double m = -INFINITY, s = 0;
    for (int j = 0; j < V; j++) m = std::max(m, (double)x[j]);
    for (int j = 0; j < V; j++) s += std::exp(x[j] - m);
    return m + std::log(s);
}

static void cross_entropy() {
    const int BT = 9, V = 1500, lo = 30, Vp = 25, parts = 3; // V over one block of 1024 threads
    auto logits = draw((size_t)BT * V, 4);
    std::vector<int> tgt(BT);
    for (int i = 0; i < BT; i++) tgt[i] = (i * 37) % V;
    tgt[2] = tgt[6] = -1;
    // CrossEntropy: cross_entropy_f32 (BT blocks of 1024) then softmax_from_lse.
    std::vector<float> losses(BT), lse(BT), probs((size_t)BT * V);
    std::vector<double> wl(BT), wp((size_t)BT * V);
    for (int i = 0; i < BT; i++) {
        double l = lse_of(&logits[(size_t)i * V], V);
        wl[i] = tgt[i] < 0 ? 0 : l - logits[(size_t)i * V + tgt[i]];
        for (int j = 0; j < V; j++) wp[(size_t)i * V + j] = std::exp(logits[(size_t)i * V + j] - l);
    }
    emu::launch(BT, 1024, [&] { cross_entropy_f32(losses.data(), lse.data(), logits.data(), tgt.data(), V); });
    emu::launch(grid((long)BT * V), 256, [&] { softmax_from_lse(probs.data(), logits.data(), lse.data(), BT, V); });
    near("cross_entropy_f32 losses", losses, wl, 1e-5);
    near("softmax_from_lse", probs, wp, 1e-5);

    // A vocabulary part: entries lo..lo+Vp−1 of parts·Vp; targets from all of it.
    auto part = draw((size_t)BT * Vp, 4);
    std::vector<int> pt(BT);
    for (int i = 0; i < BT; i++) pt[i] = (i * 11) % (parts * Vp);
    pt[4] = -1;
    std::vector<float> plse(BT), tl(BT, 5.f);
    std::vector<double> wplse(BT), wtl(BT);
    for (int i = 0; i < BT; i++) {
        wplse[i] = lse_of(&part[(size_t)i * Vp], Vp);
        int k = pt[i] - lo;
        wtl[i] = pt[i] >= 0 && k >= 0 && k < Vp ? part[(size_t)i * Vp + k] : 0;
    }
    emu::launch(BT, 256, [&] { ce_parts(plse.data(), tl.data(), part.data(), pt.data(), Vp, lo); });
    near("ce_parts lse", plse, wplse, 1e-6);
    near("ce_parts tlogit", tl, wtl, 0);

    auto lseAll = draw((size_t)parts * BT, 1);
    for (auto& v : lseAll) v += 4;
    auto tsum = draw(BT, 3);
    std::vector<float> closs(BT), cprobs((size_t)BT * Vp);
    std::vector<double> wcl(BT), wcp((size_t)BT * Vp);
    for (int i = 0; i < BT; i++) {
        double m = -INFINITY, s = 0;
        for (int p = 0; p < parts; p++) m = std::max(m, (double)lseAll[p * BT + i]);
        for (int p = 0; p < parts; p++) s += std::exp(lseAll[p * BT + i] - m);
        double l = m + std::log(s);
        wcl[i] = pt[i] < 0 ? 0 : l - tsum[i];
        for (int j = 0; j < Vp; j++) wcp[(size_t)i * Vp + j] = std::exp(part[(size_t)i * Vp + j] - l);
    }
    emu::launch(BT, 256, [&] { ce_combine(closs.data(), cprobs.data(), part.data(), lseAll.data(), tsum.data(), pt.data(), BT, Vp, parts); });
    near("ce_combine losses", closs, wcl, 1e-6);
    near("ce_combine probs", cprobs, wcp, 1e-5);

    // ce_backward_probs overwrites dlogits (drawn nonzero: what was there goes),
    // and in place over the probabilities gives the same.
    auto dl = draw((size_t)BT * Vp, 1), pr = draw((size_t)BT * Vp, 0.5), dloss = draw(BT, 1);
    std::vector<double> wdl((size_t)BT * Vp, 0.0);
    for (int i = 0; i < BT; i++) {
        if (pt[i] < 0) continue;
        for (int j = 0; j < Vp; j++) wdl[(size_t)i * Vp + j] = pr[(size_t)i * Vp + j] * dloss[i] - (j == pt[i] - lo ? dloss[i] : 0);
    }
    emu::launch(grid((long)BT * Vp), 256, [&] { ce_backward_probs(dl.data(), dloss.data(), pr.data(), pt.data(), BT, Vp, lo); });
    near("ce_backward_probs", dl, wdl, 1e-6);
    emu::launch(grid((long)BT * Vp), 256, [&] { ce_backward_probs(pr.data(), dloss.data(), pr.data(), pt.data(), BT, Vp, lo); });
    near("ce_backward_probs in place", pr, wdl, 1e-6);
}

static void statistics() {
    const int n = 5000; // more than one block of 1024
    auto losses = draw(n, 5);
    std::vector<int> tgt(n);
    for (int i = 0; i < n; i++) tgt[i] = i % 7 == 3 ? -1 : i % 10;
    std::vector<double> dst{7.5}, want{7.5};
    double s = 0;
    for (int i = 0; i < n; i++)
        if (tgt[i] >= 0) s += losses[i];
    want[0] += s;
    emu::launch(1, 1024, [&] { loss_sum(dst.data(), losses.data(), tgt.data(), n, 1); });
    near("loss_sum (accumulate)", dst, want, 1e-12);

    const long m = 70001;
    auto x = draw(m, 1);
    std::vector<bf16> xb(m);
    double sq = 0, sqb = 0;
    for (long i = 0; i < m; i++) {
        xb[i] = __float2bfloat16_rn(x[i]);
        sq += (double)x[i] * x[i];
        sqb += (double)__bfloat162float(xb[i]) * __bfloat162float(xb[i]);
    }
    std::vector<double> part(512), out{1};
    // engine.go: 512 blocks of 256, then one block of 1024.
    emu::launch(512, 256, [&] { sumsq64_partial_f32(part.data(), x.data(), m); });
    emu::launch(1, 1024, [&] { sum64_finish(out.data(), part.data(), 512, 0); });
    near("sumsq64 f32", out, std::vector<double>{sq}, 1e-12);
    emu::launch(512, 256, [&] { sumsq64_partial_bf16(part.data(), xb.data(), m); });
    emu::launch(1, 1024, [&] { sum64_finish(out.data(), part.data(), 512, 1); });
    near("sumsq64 bf16 (accumulate)", out, std::vector<double>{sq + sqb}, 1e-12);

    // close_step on the statistics layout: loss 20 over 10 tokens, Σg² 9 + 7.
    struct {
        const char* name;
        double loss, sumsq, maxNorm, norm, clip, applied, steps;
    } cs[] = {{"clipped", 20, 9, 1, 4, 1 / (4 + 1e-6), 1, 4}, {"not clipped", 20, 9, 10, 4, 1, 1, 4}, {"off", 20, 9, 0, 4, 1, 1, 4},
              {"non-finite loss", NAN, 9, 1, 4, 1 / (4 + 1e-6), 0, 3}, {"non-finite norm", 20, INFINITY, 1, INFINITY, 1 / (INFINITY + 1e-6), 0, 3}};
    for (auto& c : cs) {
        std::vector<double> st(10, 0);
        st[STAT_LOSS] = c.loss, st[STAT_TOKENS] = 10, st[STAT_SUMSQ] = c.sumsq, st[STAT_EXPERT_SUMSQ] = 7, st[STAT_OPT_STEPS] = 3;
        auto w = st;
        w[STAT_NORM] = c.norm, w[STAT_CLIP] = c.clip, w[STAT_APPLIED] = c.applied, w[STAT_OPT_STEPS] = c.steps;
        emu::launch(1, 1, [&] { close_step(st.data(), c.maxNorm); });
        near(std::string("close_step ") + c.name, st, w, 0);
    }
    std::vector<double> a{1, 2, 3}, b{0.5, -1, 2};
    emu::launch(grid(3), 256, [&] { axpy64(a.data(), b.data(), -0.25, 3); });
    near("axpy64", a, std::vector<double>{0.875, 2.25, 2.5}, 0);
}

static void optimizers() {
    const long n = 1003;
    for (int applied = 0; applied < 2; applied++) {
        std::vector<double> st(10, 0);
        st[STAT_CLIP] = 0.5, st[STAT_APPLIED] = applied, st[STAT_OPT_STEPS] = 3;
        // The optimizers read the gradients clipped (by 0.5: g·0.5 rounded to
        // fp32, as a pass scaling them in place would leave them) and write the
        // bf16 compute copy when given one; not applied, nothing moves.
        auto p = draw(n, 1), g = draw(n, 1), m = draw(n, 0.1), v = draw(n, 0.01);
        for (auto& e : v) e = std::fabs(e);
        auto wp = p, wm = m, wv = v, g0 = g, p2 = p, m2 = m, v2 = v;
        std::vector<bf16> c(n), wc(n);
        for (long i = 0; i < n; i++) c[i] = wc[i] = __float2bfloat16_rn(-7.f);
        const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
        if (applied) {
            float c1 = (float)(1 / (1 - std::pow((double)b1, 3.0))), c2 = (float)(1 / (1 - std::pow((double)b2, 3.0)));
            for (long i = 0; i < n; i++) {
                float gi = g[i] * 0.5f;
                float mi = b1 * wm[i] + (1 - b1) * gi, vi = b2 * wv[i] + (1 - b2) * gi * gi;
                wm[i] = mi, wv[i] = vi;
                wp[i] = wp[i] - lr * (mi * c1 / (std::sqrt(vi * c2) + eps) + wd * wp[i]);
                wc[i] = __float2bfloat16_rn(wp[i]);
            }
        }
        emu::launch(grid(n), 256, [&] { adamw_stats(p.data(), c.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, st.data()); });
        near("adamw_stats params", p, wp, 1e-6);
        near("adamw_stats m", m, wm, 1e-6);
        near("adamw_stats v", v, wv, 1e-6);
        near("adamw_stats gradients (left as they were)", g, g0, 0);
        std::vector<float> cf(n), wcf(n);
        for (long i = 0; i < n; i++) cf[i] = __bfloat162float(c[i]), wcf[i] = __bfloat162float(wc[i]);
        near("adamw_stats compute", cf, wcf, 8e-3);
        // Without a compute copy (a null pointer): the same update.
        emu::launch(grid(n), 256, [&] { adamw_stats(p2.data(), nullptr, g.data(), m2.data(), v2.data(), n, lr, b1, b2, eps, wd, st.data()); });
        near("adamw_stats params without a compute copy", p2, p, 0);

        auto sp = draw(n, 1), sg = draw(n, 1), sb = draw(n, 1);
        auto wsp = sp, wsb = sb;
        std::vector<bf16> sc(n), wsc(n);
        if (applied)
            for (long i = 0; i < n; i++) {
                wsb[i] = 0.9f * wsb[i] + sg[i] * 0.5f;
                wsp[i] -= 1e-2f * (wsb[i] + 0.1f * wsp[i]);
                wsc[i] = __float2bfloat16_rn(wsp[i]);
            }
        emu::launch(grid(n), 256, [&] { sgd_stats(sp.data(), sc.data(), sg.data(), sb.data(), n, 1e-2f, 0.9f, 0.1f, st.data()); });
        near("sgd_stats params", sp, wsp, 1e-6);
        near("sgd_stats momentum", sb, wsb, 1e-6);
        std::vector<float> scf(n), wscf(n);
        for (long i = 0; i < n; i++) scf[i] = __bfloat162float(sc[i]), wscf[i] = __bfloat162float(wsc[i]);
        near("sgd_stats compute", scf, wscf, 8e-3);
    }
    auto dst = draw(333, 1), src = draw(333, 1);
    std::vector<bf16> sb(333);
    std::vector<float> want = dst;
    for (int i = 0; i < 333; i++) {
        sb[i] = __float2bfloat16_rn(src[i]);
        want[i] += __bfloat162float(sb[i]);
    }
    emu::launch(grid(333), 256, [&] { add_into_f32_bf16(dst.data(), sb.data(), 333); });
    near("add_into_f32_bf16", dst, want, 0);
}

static void moe() {
    const int BT = 23, E = 8, K = 2, n = BT * K, cap = 4;
    auto logits = draw((size_t)BT * E, 3);
    std::vector<float> probs((size_t)BT * E), gates(n);
    std::vector<int> idx(n), row(n), rank(n), counts(E), offsets(E + 1), padOff(E + 1), tok(E * cap + n);
    // Router then a padded dispatch as engine.go runs it: placed by the static
    // segments, then the routing's offsets set to the running kept counts.
    emu::launch((BT + 3) / 4, 128, [&] { moe_router_f32(probs.data(), idx.data(), gates.data(), logits.data(), BT, E, K); });
    emu::launch(E, 1024, [&] { moe_rank(rank.data(), counts.data(), idx.data(), n, cap); });
    emu::launch(1, 32, [&] { moe_offsets(padOff.data(), counts.data(), E, cap, 1); });
    emu::launch(grid(n), 256, [&] { moe_place(row.data(), tok.data(), rank.data(), idx.data(), padOff.data(), n, K, cap); });
    emu::launch(1, 32, [&] { moe_offsets(offsets.data(), counts.data(), E, cap, 0); });
    std::vector<int> wcount(E + 1, 0), wrow(n);
    for (int i = 0; i < n; i++) {
        int e = idx[i];
        wrow[i] = wcount[e + 1] < cap ? e * cap + wcount[e + 1]++ : -1;
    }
    for (int e = 0; e < E; e++) wcount[e + 1] += wcount[e];
    near("padded dispatch rows", row, wrow, 0);
    near("padded dispatch offsets (running kept counts)", offsets, wcount, 0);

    auto dlogits = draw((size_t)BT * E, 1), dgates = draw(n, 1), dprobs = draw((size_t)BT * E, 0.1);
    for (int has = 0; has < 2; has++) {
        auto got = dlogits;
        std::vector<double> want(got.begin(), got.end());
        for (int t = 0; t < BT; t++) {
            double dot = 0;
            for (int j = 0; j < K; j++) dot += gates[t * K + j] * dgates[t * K + j];
            for (int j = 0; j < K; j++) want[t * E + idx[t * K + j]] += gates[t * K + j] * (dgates[t * K + j] - dot);
            if (!has) continue;
            double pd = 0;
            for (int e = 0; e < E; e++) pd += probs[t * E + e] * dprobs[t * E + e];
            for (int e = 0; e < E; e++) want[t * E + e] += probs[t * E + e] * (dprobs[t * E + e] - pd);
        }
        emu::launch(grid(BT), 256, [&] {
            router_backward_add(got.data(), dgates.data(), has ? dprobs.data() : nullptr, gates.data(), probs.data(), idx.data(), BT, E, K, has);
        });
        near(has ? "router_backward_add (aux loss)" : "router_backward_add", got, want, 1e-5);
    }

    std::vector<float> stats(2 * E);
    std::vector<double> wstats(2 * E);
    for (int e = 0; e < E; e++) {
        double p = 0;
        for (int t = 0; t < BT; t++) p += probs[t * E + e];
        wstats[e] = offsets[e + 1] - offsets[e], wstats[E + e] = p;
    }
    emu::launch(grid(E), 256, [&] { router_stats(stats.data(), probs.data(), offsets.data(), BT, E); });
    near("router_stats", stats, wstats, 1e-7);
    std::vector<double> aux{0.25, 3}, waux{0.25, 3};
    double tokens = BT;
    for (int e = 0; e < E; e++) waux[0] += E * (double)stats[e] / (tokens * K) * (double)stats[E + e] / tokens;
    waux[1] += (double)BT * K - offsets[E];
    emu::launch(1, 1, [&] { aux_loss(aux.data(), stats.data(), offsets.data(), BT, E, K, tokens, 1); });
    near("aux_loss (accumulate)", aux, waux, 1e-12);
    std::vector<float> dp((size_t)BT * E);
    std::vector<double> wdp((size_t)BT * E);
    for (int i = 0; i < BT * E; i++) wdp[i] = 0.01 * E * (double)stats[i % E] / (tokens * K) / tokens;
    emu::launch(grid(BT * E), 256, [&] { aux_loss_backward(dp.data(), stats.data(), BT, E, K, tokens, 0.01); });
    near("aux_loss_backward", dp, wdp, 1e-6);

    // experts_swiglu over rows offsets[0]..offsets[E] of buffers of 40 rows.
    const int W = 12, rows = 40;
    std::vector<int> seg{3, 5, 5, 9, 14, 20, 20, 27, 31};
    auto gate = draw(rows * W, 4), up = draw(rows * W, 2), out = draw(rows * W, 1), dout = draw(rows * W, 1);
    auto dg = draw(rows * W, 1), du = draw(rows * W, 1);
    std::vector<double> wout(out.begin(), out.end()), wdg(dg.begin(), dg.end()), wdu(du.begin(), du.end());
    for (int i = seg[0] * W; i < seg[E] * W; i++) {
        double g = gate[i], s = 1 / (1 + std::exp(-g));
        wout[i] = g * s * up[i];
        wdg[i] += dout[i] * up[i] * s * (1 + g * (1 - s));
        wdu[i] += dout[i] * g * s;
    }
    emu::launch(grid(rows * W), 256, [&] { experts_swiglu(out.data(), gate.data(), up.data(), seg.data(), E, W, rows * W); });
    near("experts_swiglu", out, wout, 1e-6);
    emu::launch(grid(rows * W), 256,
                [&] { experts_swiglu_backward(dg.data(), du.data(), dout.data(), gate.data(), up.data(), seg.data(), E, W, rows * W, 1); });
    near("experts_swiglu_backward dgate (accumulate)", dg, wdg, 1e-6);
    near("experts_swiglu_backward dup (accumulate)", du, wdu, 1e-6);
}

int main() {
    embedding();
    merge();
    cross_entropy();
    statistics();
    optimizers();
    moe();
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
