// qkgeom — the plasticity's SSE2 loops (internal): absolute-value range of a
// row, the diagonal closed form m = w·δ, v = Σ σ²_l δ_l² of one key pair (with
// the split's content sums in the same pass), and
// the z column of a Gram tile (method §5). Each has one scalar tail (and a
// scalar body where SSE2 is unavailable); the arithmetic order of the vector
// body is part of the contract: the direct and Gram paths, and every caller,
// see the same sums in the same order (bit-identical results, tested).
// The split pass's kernel also has an AVX2 body (runtime dispatch,
// qkgeom/simd/dispatch.hpp) that keeps the SSE2 lanes' order: the same bits at every level.
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/simd/vec.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define QKGEOM_DETAIL_SSE2 1
#endif

namespace qkgeom::detail::sse2 {

/// Folds n values into (lo, hi): lo = min over nonzero |x| (+inf when none),
/// hi = max |x|. The values are finite (validated by the caller).
inline void abs_range(double const* p, index_t count, double& lo_io, double& hi_io) noexcept {
    constexpr double inf = std::numeric_limits<double>::infinity();
    double lo = lo_io, hi = hi_io;
    auto const n = static_cast<std::size_t>(count);
    std::size_t i = 0;
#ifdef QKGEOM_DETAIL_SSE2
    __m128d const absmask = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffffLL));
    __m128d const vinf = _mm_set1_pd(inf), zero = _mm_setzero_pd();
    __m128d vlo = _mm_set1_pd(lo), vhi = _mm_set1_pd(hi);
    for (; i + 2 <= n; i += 2) {
        __m128d const a = _mm_and_pd(_mm_loadu_pd(p + i), absmask);
        __m128d const z = _mm_cmpeq_pd(a, zero);
        vhi = _mm_max_pd(vhi, a);
        vlo = _mm_min_pd(vlo, _mm_or_pd(_mm_and_pd(z, vinf), _mm_andnot_pd(z, a)));
    }
    alignas(16) double l2[2], h2[2];
    _mm_store_pd(l2, vlo);
    _mm_store_pd(h2, vhi);
    lo = std::min(l2[0], l2[1]);
    hi = std::max(h2[0], h2[1]);
#endif
    for (; i < n; ++i) {
        double const a = std::abs(p[i]);
        lo = std::min(lo, a > 0.0 ? a : inf);
        hi = std::max(hi, a);
    }
    lo_io = lo;
    hi_io = hi;
}

/// m = Σ w_l (a_l − b_l) and v = Σ s2_l (a_l − b_l)² over l < d in one pass,
/// the difference never stored (four partial sums of two lanes each, then
/// the scalar tail).
inline void diag_pair_moments(double const* a, double const* b, double const* w, double const* s2, index_t d,
                              double& m_out, double& v_out) noexcept {
    double m = 0, v = 0;
    index_t l = 0;
#ifdef QKGEOM_DETAIL_SSE2
    __m128d m0 = _mm_setzero_pd(), m1 = m0, v0 = m0, v1 = m0;
    for (; l + 4 <= d; l += 4) {
        __m128d const d0 = _mm_sub_pd(_mm_loadu_pd(a + l), _mm_loadu_pd(b + l));
        __m128d const d1 = _mm_sub_pd(_mm_loadu_pd(a + l + 2), _mm_loadu_pd(b + l + 2));
        m0 = _mm_add_pd(m0, _mm_mul_pd(_mm_loadu_pd(w + l), d0));
        m1 = _mm_add_pd(m1, _mm_mul_pd(_mm_loadu_pd(w + l + 2), d1));
        v0 = _mm_add_pd(v0, _mm_mul_pd(_mm_loadu_pd(s2 + l), _mm_mul_pd(d0, d0)));
        v1 = _mm_add_pd(v1, _mm_mul_pd(_mm_loadu_pd(s2 + l + 2), _mm_mul_pd(d1, d1)));
    }
    alignas(16) double mm[2], vv[2];
    _mm_store_pd(mm, _mm_add_pd(m0, m1));
    _mm_store_pd(vv, _mm_add_pd(v0, v1));
    m = mm[0] + mm[1];
    v = vv[0] + vv[1];
#endif
    for (; l < d; ++l) {
        double const dl = a[l] - b[l];
        m += w[l] * dl;
        v += s2[l] * (dl * dl);
    }
    m_out = m;
    v_out = v;
}

/// The scalar tail of `diag_pair_moments_split` from coordinate l on (the
/// vector bodies' partial sums in m, v, c; c[2], c[3] only when `Frozen`).
template <bool Frozen>
QKGEOM_ALWAYS_INLINE void split_tail(double const* a, double const* b, double const* w, double const* s2,
                                     double const* wf, double const* s2f, index_t l, index_t d, double& m, double& v,
                                     double c[4]) noexcept {
    for (; l < d; ++l) {
        double const dl = a[l] - b[l];
        double const pm = w[l] * dl, pv = s2[l] * (dl * dl);
        m += pm;
        v += pv;
        if (l == 0) continue;
        c[0] += pm;
        c[1] += pv;
        if constexpr (Frozen) {
            c[2] += wf[l] * dl;
            c[3] += s2f[l] * (dl * dl);
        }
    }
}

/// The SSE2 body of `diag_pair_moments_split` (`Frozen`: with the frozen sums).
template <bool Frozen>
QKGEOM_ALWAYS_INLINE void split_sse2(double const* a, double const* b, double const* w, double const* s2,
                                     double const* wf, double const* s2f, index_t d, double& m_out, double& v_out,
                                     double c[4]) noexcept {
    double m = 0, v = 0;
    c[0] = c[1] = c[2] = c[3] = 0;
    index_t l = 0;
#ifdef QKGEOM_DETAIL_SSE2
    // m0, m1, v0, v1: the accumulators of diag_pair_moments. Lanes 1 of m0
    // and all of m1 hold content products only, so the content sums need one
    // more accumulator each (cm0, cv0: m0, v0 without the l = 0 product).
    __m128d const zero = _mm_setzero_pd();
    __m128d const hi = _mm_castsi128_pd(_mm_set_epi64x(-1LL, 0LL));  // lane 1 kept
    __m128d m0 = zero, m1 = zero, v0 = zero, v1 = zero, cm0 = zero, cv0 = zero;
    __m128d fm0 = zero, fm1 = zero, fv0 = zero, fv1 = zero;
    auto step = [&](index_t k, bool first) {
        __m128d const d0 = _mm_sub_pd(_mm_loadu_pd(a + k), _mm_loadu_pd(b + k));
        __m128d const d1 = _mm_sub_pd(_mm_loadu_pd(a + k + 2), _mm_loadu_pd(b + k + 2));
        __m128d const q0 = _mm_mul_pd(d0, d0), q1 = _mm_mul_pd(d1, d1);
        __m128d const pm0 = _mm_mul_pd(_mm_loadu_pd(w + k), d0), pv0 = _mm_mul_pd(_mm_loadu_pd(s2 + k), q0);
        m0 = _mm_add_pd(m0, pm0);
        m1 = _mm_add_pd(m1, _mm_mul_pd(_mm_loadu_pd(w + k + 2), d1));
        v0 = _mm_add_pd(v0, pv0);
        v1 = _mm_add_pd(v1, _mm_mul_pd(_mm_loadu_pd(s2 + k + 2), q1));
        cm0 = _mm_add_pd(cm0, first ? _mm_and_pd(pm0, hi) : pm0);
        cv0 = _mm_add_pd(cv0, first ? _mm_and_pd(pv0, hi) : pv0);
        if constexpr (Frozen) {
            __m128d const pf0 = _mm_mul_pd(_mm_loadu_pd(wf + k), d0), pg0 = _mm_mul_pd(_mm_loadu_pd(s2f + k), q0);
            fm0 = _mm_add_pd(fm0, first ? _mm_and_pd(pf0, hi) : pf0);
            fv0 = _mm_add_pd(fv0, first ? _mm_and_pd(pg0, hi) : pg0);
            fm1 = _mm_add_pd(fm1, _mm_mul_pd(_mm_loadu_pd(wf + k + 2), d1));
            fv1 = _mm_add_pd(fv1, _mm_mul_pd(_mm_loadu_pd(s2f + k + 2), q1));
        }
    };
    if (d >= 4) {
        step(0, true);
        for (l = 4; l + 4 <= d; l += 4) step(l, false);
    }
    alignas(16) double r[12];
    _mm_store_pd(r, _mm_add_pd(m0, m1));
    _mm_store_pd(r + 2, _mm_add_pd(v0, v1));
    _mm_store_pd(r + 4, _mm_add_pd(cm0, m1));
    _mm_store_pd(r + 6, _mm_add_pd(cv0, v1));
    _mm_store_pd(r + 8, _mm_add_pd(fm0, fm1));
    _mm_store_pd(r + 10, _mm_add_pd(fv0, fv1));
    m = r[0] + r[1], v = r[2] + r[3], c[0] = r[4] + r[5], c[1] = r[6] + r[7], c[2] = r[8] + r[9], c[3] = r[10] + r[11];
#endif
    split_tail<Frozen>(a, b, w, s2, wf, s2f, l, d, m, v, c);
    m_out = m;
    v_out = v;
}

#if QKGEOM_SIMD_X86 && QKGEOM_COMPILED_BODIES
/// (x0 + x2) + (x1 + x3): the SSE2 body's reduction of its pair (x0, x1), (x2, x3).
QKGEOM_TARGET("avx2")
QKGEOM_ALWAYS_INLINE double fold4(vx::f64x4 x) noexcept { return vx::f64v4::fold(x); }

/// The AVX body of `diag_pair_moments_split`: each 4-wide accumulator holds
/// the SSE2 body's pair side by side (M = (m0, m1), CM = (cm0, m1), …), so
/// every lane adds the same products in the same order and the results are
/// bit-identical to the SSE2 body (and m, v to `diag_pair_moments`). Target
/// "avx2" without "fma": no multiply-add can be contracted.
template <bool Frozen>
QKGEOM_TARGET("avx2")
inline void split_avx2(double const* a, double const* b, double const* w, double const* s2, double const* wf,
                       double const* s2f, index_t d, double& m_out, double& v_out, double c[4]) noexcept {
    using Y = vx::f64v4;
    double m = 0, v = 0;
    c[0] = c[1] = c[2] = c[3] = 0;
    index_t l = 0;
    Y::type const zero = Y::zero();
    Y::type M = zero, V = zero, CM = zero, CV = zero, FM = zero, FV = zero;
    if (d >= 4) {
        vx::i64x4 const keep = {0LL, -1LL, -1LL, -1LL};  // all but lane 0
        Y::type const d0 = Y::sub(Y::loadu(a), Y::loadu(b));
        Y::type const q0 = Y::mul(d0, d0);
        // 0 + p as the SSE2 body (−0 becomes +0); the content sums without lane 0 (l = 0)
        M = Y::add(zero, Y::mul(Y::loadu(w), d0));
        V = Y::add(zero, Y::mul(Y::loadu(s2), q0));
        CM = Y::and_mask(M, keep);
        CV = Y::and_mask(V, keep);
        if constexpr (Frozen) {
            FM = Y::add(zero, Y::and_mask(Y::mul(Y::loadu(wf), d0), keep));
            FV = Y::add(zero, Y::and_mask(Y::mul(Y::loadu(s2f), q0), keep));
        }
        for (l = 4; l + 4 <= d; l += 4) {
            Y::type const dl = Y::sub(Y::loadu(a + l), Y::loadu(b + l));
            Y::type const ql = Y::mul(dl, dl);
            Y::type const pm = Y::mul(Y::loadu(w + l), dl), pv = Y::mul(Y::loadu(s2 + l), ql);
            M = Y::add(M, pm);
            V = Y::add(V, pv);
            CM = Y::add(CM, pm);
            CV = Y::add(CV, pv);
            if constexpr (Frozen) {
                FM = Y::add(FM, Y::mul(Y::loadu(wf + l), dl));
                FV = Y::add(FV, Y::mul(Y::loadu(s2f + l), ql));
            }
        }
    }
    m = fold4(M), v = fold4(V), c[0] = fold4(CM), c[1] = fold4(CV);
    if constexpr (Frozen) c[2] = fold4(FM), c[3] = fold4(FV);
    split_tail<Frozen>(a, b, w, s2, wf, s2f, l, d, m, v, c);
    m_out = m;
    v_out = v;
}
#endif

/// `diag_pair_moments` (m and v bit-identical to it: the same products added
/// in the same order) and, in the same pass, the split's content sums over
/// l = 1..d−1 (docs/beyond-split.md): c = (Σ w δ, Σ s2 δ², Σ wf δ, Σ s2f δ²);
/// `wf` null: no frozen model, c[2] = c[0] and c[3] = c[1]. The content sums
/// take the same products but the l = 0 one (wf[0] and s2f[0] do not count).
/// `level` (simd::active()) picks the body (AVX2 at avx2 and avx512, else
/// SSE2); every body gives the same bits.
#if QKGEOM_COMPILED_BODIES
QKGEOM_COMPILED_API void diag_pair_moments_split(simd::isa level, double const* a, double const* b, double const* w,
                                                 double const* s2, double const* wf, double const* s2f, index_t d,
                                                 double& m_out, double& v_out, double c[4]) noexcept {
    bool const frozen = wf != nullptr;
#if QKGEOM_SIMD_X86
    if (level != simd::isa::generic) {
        if (frozen) split_avx2<true>(a, b, w, s2, wf, s2f, d, m_out, v_out, c);
        else split_avx2<false>(a, b, w, s2, wf, s2f, d, m_out, v_out, c);
    } else
#endif
    {
        (void)level;
        if (frozen) split_sse2<true>(a, b, w, s2, wf, s2f, d, m_out, v_out, c);
        else split_sse2<false>(a, b, w, s2, wf, s2f, d, m_out, v_out, c);
    }
    if (!frozen) c[2] = c[0], c[3] = c[1];
}
#else
QKGEOM_COMPILED_API void diag_pair_moments_split(simd::isa level, double const* a, double const* b, double const* w,
                                                 double const* s2, double const* wf, double const* s2f, index_t d,
                                                 double& m_out, double& v_out, double c[4]) noexcept;
#endif

/// The z of the split pass's counterfactuals (docs/beyond-split.md) for k
/// pairs (v ≤ 0 gives ±inf or NaN: the caller replaces those):
///   zn[i] = (al t[i] + mc[i]) / √(s0 t[i]² + vc[i])   (no drift)
/// and, when `mf` is not null, with r = √(s0 t[i]² + vf[i]) (one root for both),
///   zf[i] = (w0 t[i] + mf[i]) / r,   ze[i] = (al t[i] + mf[i]) / r
/// (frozen content, neither). Every level computes each value with the same
/// operations in the same order (no multiply-add): the same bits.
struct split_z_args {
    double const *t, *mc, *vc, *mf, *vf;
    double al, w0, s0;
    std::size_t k;
    double *zn, *zf, *ze;
};

/// The scalar loop of `split_z` over pairs [i, k).
inline void split_z_tail(split_z_args const& g, std::size_t i) noexcept {
    for (; i < g.k; ++i) {
        double const t = g.t[i], tt = t * t;
        g.zn[i] = (g.al * t + g.mc[i]) / std::sqrt(g.s0 * tt + g.vc[i]);
        if (g.mf == nullptr) continue;
        double const r = std::sqrt(g.s0 * tt + g.vf[i]);
        g.zf[i] = (g.w0 * t + g.mf[i]) / r;
        g.ze[i] = (g.al * t + g.mf[i]) / r;
    }
}

#if QKGEOM_SIMD_X86 && QKGEOM_COMPILED_BODIES
/// The AVX body of `split_z` (target "avx2" without "fma": no contraction).
QKGEOM_TARGET("avx2")
inline void split_z_avx2(split_z_args const& g) noexcept {
    using Y = vx::f64v4;
    Y::type const alv = Y::set1(g.al), w0v = Y::set1(g.w0), s0v = Y::set1(g.s0);
    std::size_t i = 0;
    for (; i + 4 <= g.k; i += 4) {
        Y::type const tv = Y::loadu(g.t + i);
        Y::type const tt = Y::mul(s0v, Y::mul(tv, tv)), at = Y::mul(alv, tv);
        Y::type const vn = Y::add(tt, Y::loadu(g.vc + i));
        Y::storeu(g.zn + i, Y::div(Y::add(at, Y::loadu(g.mc + i)), Y::sqrt(vn)));
        if (g.mf == nullptr) continue;
        Y::type const r = Y::sqrt(Y::add(tt, Y::loadu(g.vf + i)));
        Y::type const mf = Y::loadu(g.mf + i);
        Y::storeu(g.zf + i, Y::div(Y::add(Y::mul(w0v, tv), mf), r));
        Y::storeu(g.ze + i, Y::div(Y::add(at, mf), r));
    }
    split_z_tail(g, i);
}
#endif

/// `split_z_args`' z at `level` (AVX2 at avx2 and avx512, else SSE2).
#if QKGEOM_COMPILED_BODIES
QKGEOM_COMPILED_API void split_z(simd::isa level, split_z_args const& g) noexcept {
#if QKGEOM_SIMD_X86
    if (level != simd::isa::generic) return split_z_avx2(g);
#endif
    (void)level;
    std::size_t i = 0;
#ifdef QKGEOM_DETAIL_SSE2
    __m128d const alv = _mm_set1_pd(g.al), w0v = _mm_set1_pd(g.w0), s0v = _mm_set1_pd(g.s0);
    for (; i + 2 <= g.k; i += 2) {
        __m128d const tv = _mm_loadu_pd(g.t + i);
        __m128d const tt = _mm_mul_pd(s0v, _mm_mul_pd(tv, tv)), at = _mm_mul_pd(alv, tv);
        __m128d const vn = _mm_add_pd(tt, _mm_loadu_pd(g.vc + i));
        _mm_storeu_pd(g.zn + i, _mm_div_pd(_mm_add_pd(at, _mm_loadu_pd(g.mc + i)), _mm_sqrt_pd(vn)));
        if (g.mf == nullptr) continue;
        __m128d const r = _mm_sqrt_pd(_mm_add_pd(tt, _mm_loadu_pd(g.vf + i)));
        __m128d const mf = _mm_loadu_pd(g.mf + i);
        _mm_storeu_pd(g.zf + i, _mm_div_pd(_mm_add_pd(_mm_mul_pd(w0v, tv), mf), r));
        _mm_storeu_pd(g.ze + i, _mm_div_pd(_mm_add_pd(at, mf), r));
    }
#endif
    split_z_tail(g, i);
}
#else
QKGEOM_COMPILED_API void split_z(simd::isa level, split_z_args const& g) noexcept;
#endif

/// One Gram-tile column: z[a] = (s[a] − sb)/√max(v, 0), v = nrm[a] + nb − 2 col[a],
/// a < n (v ≤ 0 gives ±inf or NaN; the caller sends such pairs to the direct path).
inline void z_column(double const* nrm, double nb, double const* s, double sb, double const* col, index_t n,
                     double* z) noexcept {
    index_t a = 0;
#ifdef QKGEOM_DETAIL_SSE2
    __m128d const nbv = _mm_set1_pd(nb), sbv = _mm_set1_pd(sb), two = _mm_set1_pd(2.0);
    for (; a + 2 <= n; a += 2) {
        __m128d const v = _mm_sub_pd(_mm_add_pd(_mm_loadu_pd(nrm + a), nbv), _mm_mul_pd(two, _mm_loadu_pd(col + a)));
        __m128d const d = _mm_sqrt_pd(_mm_max_pd(v, _mm_setzero_pd()));
        _mm_storeu_pd(z + a, _mm_div_pd(_mm_sub_pd(_mm_loadu_pd(s + a), sbv), d));
    }
#endif
    for (; a < n; ++a) {
        double const v = nrm[a] + nb - 2.0 * col[a];
        z[a] = (s[a] - sb) / std::sqrt(v > 0.0 ? v : 0.0);
    }
}

}  // namespace qkgeom::detail::sse2
