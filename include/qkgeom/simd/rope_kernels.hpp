// qkgeom — the RoPE band analysis' kernels (docs/beyond-rope.md, "Cost").
// IWYU pragma: private, include <qkgeom/beyond/rope_bands.hpp>
// (SIMD kernels live in include/qkgeom/simd/; the dispatch is qkgeom/simd/dispatch.hpp.)
//
// `unrotate_block` runs the pair loop of one bucket in register blocks: per
// chunk of W rotary pairs (AVX-512: W = 8 doubles per zmm; AVX2: 4 per ymm)
// the ten per-pair sums (raw Σx, Σx²; unrotated Σu, Σu²; mirror Σ R(t)x) stay
// in registers over all the bucket's rows, cos/sin of t·θ_i are formed in
// registers from the two angle tables (t = a + K·h), and the unrotated pair
// u = R(t)ᵀx is written out when asked. Each lane does the operations of the
// scalar loop in the same order (multiply, then add: no fused multiply-add),
// so every level gives the scalar loop's sums bit for bit.
//
// `sq_residual_runs` adds, per run of rows of one cluster, Σ (x − μ)² per
// column (the content residuals); `centre_scale_into` writes one group of
// rows centred and scaled at a stride (the key groups straight into the
// packed panels of the band Gram update).
//
// The pairs past the last full chunk (h not a multiple of W) run the scalar
// loop. Below AVX2 nothing here is used: beyond/rope_bands.hpp keeps its loops.
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/simd/moment_kernels.hpp>
#include <qkgeom/simd/vec.hpp>

#include <cstdint>

namespace qkgeom {
namespace detail {
namespace ropek {

/// The operands of `unrotate_block`: n rows of x (row stride ldx) with the
/// first coordinates of pairs 0 .. h − 1 at x[0 .. h) and the second ones at
/// x[h .. 2h); per row the offsets o1 = (t mod K)·h, o2 = ⌊t / K⌋·h into the
/// angle tables lc, ls (cos, sin of a·θ_i at [a·h + i]) and hc, hs (of a·K·θ_i).
/// Sums added to: ra, rq (2h: Σx, Σx²), oa, oq (2h: Σu, Σu²), m1, m2 (h: Σ R(t)x).
/// u (row stride ldu): the unrotated pairs, written when not null.
struct unrotate_args {
    double const* x = nullptr;
    index_t ldx = 0, n = 0, h = 0;
    index_t const* o1 = nullptr;
    index_t const* o2 = nullptr;
    double const *lc = nullptr, *ls = nullptr, *hc = nullptr, *hs = nullptr;
    double* u = nullptr;
    index_t ldu = 0;
    double *ra = nullptr, *rq = nullptr, *oa = nullptr, *oq = nullptr, *m1 = nullptr, *m2 = nullptr;
};

/// v, opaque to the optimiser: a product passed through it is not fused with
/// the following add (GCC contracts a * b + c into an FMA inside the AVX2 /
/// AVX-512 functions this is inlined into, -ffp-contract=fast being its C++
/// default).
[[nodiscard]] QKGEOM_ALWAYS_INLINE double unfused(double v) noexcept {
#if QKGEOM_SIMD_X86
    __asm__("" : "+x"(v));
#endif
    return v;
}

// --- entry points (defined below; in src/qkgeom_compiled.cpp with compiled kernels)

/// The pair loop of one bucket at `level` (see the file comment and
/// `unrotate_args`); generic: `unrotate_lanes` over all pairs.
QKGEOM_COMPILED_API void unrotate_block(simd::isa level, unrotate_args const& g) noexcept;

/// acc[j] = Σ_{r < n} (x[r·ldx + j] − mu[j])², j < m, at `level` (rows in
/// order per column: the same sum at every level).
QKGEOM_COMPILED_API void sq_residual(simd::isa level, double const* x, index_t ldx, index_t n, double const* mu, index_t m,
                                     double* acc) noexcept;

/// acc[j] += Σ_{r < n} x[r·ldx + j], j < m, at `level` (rows in order per
/// column: the same sums as the scalar loop at every level).
QKGEOM_COMPILED_API void col_sums(simd::isa level, double const* x, index_t ldx, index_t n, index_t m, double* acc) noexcept;

/// The group mean and centred, scaled quads of `centre_group_*` at `level`
/// (avx2 or avx512; nothing at generic: beyond/rope_bands.hpp keeps its loops).
QKGEOM_COMPILED_API void centre_group(simd::isa level, double const* x, index_t ldx, index_t m, index_t d, double* mu,
                                      double scale, index_t const* src, index_t const* dst, index_t nq, double* out,
                                      index_t stride) noexcept;

#if QKGEOM_COMPILED_BODIES

/// Pairs [i0, i1) of `unrotate_block` one lane at a time (the tail, and the
/// reference order of every level).
inline void unrotate_lanes(unrotate_args const& g, index_t i0, index_t i1) noexcept {
    index_t const h = g.h;
    for (index_t i = i0; i < i1; ++i) {
        double ra1 = g.ra[i], rq1 = g.rq[i], ra2 = g.ra[h + i], rq2 = g.rq[h + i];
        double oa1 = g.oa[i], oq1 = g.oq[i], oa2 = g.oa[h + i], oq2 = g.oq[h + i], n1 = g.m1[i], n2 = g.m2[i];
        for (index_t r = 0; r < g.n; ++r) {
            double const a = g.x[r * g.ldx + i], b = g.x[r * g.ldx + h + i];
            double const c1 = g.lc[g.o1[r] + i], s1 = g.ls[g.o1[r] + i], c2 = g.hc[g.o2[r] + i], s2 = g.hs[g.o2[r] + i];
            double const c = unfused(c1 * c2) - unfused(s1 * s2), s = unfused(s1 * c2) + unfused(c1 * s2);
            ra1 += a, rq1 += unfused(a * a), ra2 += b, rq2 += unfused(b * b);
            double const ca = unfused(c * a), sa = unfused(s * a), cb = unfused(c * b), sb = unfused(s * b);
            n1 += ca - sb;
            n2 += sa + cb;
            double const ua = ca + sb, ub = cb - sa;
            if (g.u) g.u[r * g.ldu + i] = ua, g.u[r * g.ldu + h + i] = ub;
            oa1 += ua, oq1 += unfused(ua * ua), oa2 += ub, oq2 += unfused(ub * ub);
        }
        g.ra[i] = ra1, g.rq[i] = rq1, g.ra[h + i] = ra2, g.rq[h + i] = rq2;
        g.oa[i] = oa1, g.oq[i] = oq1, g.oa[h + i] = oa2, g.oq[h + i] = oq2, g.m1[i] = n1, g.m2[i] = n2;
    }
}

#if QKGEOM_SIMD_X86

// The vector operations are the moments kernels' (mom::vec512, mom::vec256).
using rv512 = mom::vec512;
using rv256 = mom::vec256;

// The multiply-then-add of the scalar loop, kept unfused at every level (GCC
// contracts a * b + c into an FMA under -ffp-contract=fast, the GNU dialects'
// default): an empty asm makes the product opaque. Zero cost beyond the mul.
#define QKGEOM_ROPEK_OPAQUE(v) __asm__("" : "+v"(v))

/// The chunk loop of `unrotate_block` at one level (one definition per level:
/// the body must carry its level's target attribute).
#define QKGEOM_ROPEK_UNROTATE(NAME, TARGET_STRING, V)                                                                 \
QKGEOM_TARGET(TARGET_STRING)                                                                                          \
inline void NAME(unrotate_args const& g) noexcept {                                                                  \
    using T = typename V::type;                                                                                       \
    constexpr int W = V::w;                                                                                           \
    index_t const h = g.h, full = h / W * W;                                                                          \
    for (index_t i = 0; i < full; i += W) {                                                                           \
        T ra1 = V::loadu(g.ra + i), rq1 = V::loadu(g.rq + i), ra2 = V::loadu(g.ra + h + i), rq2 = V::loadu(g.rq + h + i);        \
        T oa1 = V::loadu(g.oa + i), oq1 = V::loadu(g.oq + i), oa2 = V::loadu(g.oa + h + i), oq2 = V::loadu(g.oq + h + i);        \
        T n1 = V::loadu(g.m1 + i), n2 = V::loadu(g.m2 + i);                                                                 \
        for (index_t r = 0; r < g.n; ++r) {                                                                           \
            double const* xr = g.x + r * g.ldx + i;                                                                   \
            T const a = V::loadu(xr), b = V::loadu(xr + h);                                                                 \
            T const c1 = V::loadu(g.lc + g.o1[r] + i), s1 = V::loadu(g.ls + g.o1[r] + i);                                  \
            T const c2 = V::loadu(g.hc + g.o2[r] + i), s2 = V::loadu(g.hs + g.o2[r] + i);                                  \
            T p1 = V::mul(c1, c2), p2 = V::mul(s1, s2), p3 = V::mul(s1, c2), p4 = V::mul(c1, s2);                     \
            QKGEOM_ROPEK_OPAQUE(p1); QKGEOM_ROPEK_OPAQUE(p2); QKGEOM_ROPEK_OPAQUE(p3); QKGEOM_ROPEK_OPAQUE(p4);        \
            T const c = V::sub(p1, p2), s = V::add(p3, p4);                                                           \
            T aa = V::mul(a, a), bb = V::mul(b, b);                                                                   \
            QKGEOM_ROPEK_OPAQUE(aa); QKGEOM_ROPEK_OPAQUE(bb);                                                         \
            ra1 = V::add(ra1, a), rq1 = V::add(rq1, aa), ra2 = V::add(ra2, b), rq2 = V::add(rq2, bb);                 \
            T ca = V::mul(c, a), sa = V::mul(s, a), cb = V::mul(c, b), sb = V::mul(s, b);                             \
            QKGEOM_ROPEK_OPAQUE(ca); QKGEOM_ROPEK_OPAQUE(sa); QKGEOM_ROPEK_OPAQUE(cb); QKGEOM_ROPEK_OPAQUE(sb);        \
            n1 = V::add(n1, V::sub(ca, sb));                                                                          \
            n2 = V::add(n2, V::add(sa, cb));                                                                          \
            T const ua = V::add(ca, sb), ub = V::sub(cb, sa);                                                         \
            if (g.u) V::storeu(g.u + r * g.ldu + i, ua), V::storeu(g.u + r * g.ldu + h + i, ub);                              \
            T uu = V::mul(ua, ua), vv = V::mul(ub, ub);                                                               \
            QKGEOM_ROPEK_OPAQUE(uu); QKGEOM_ROPEK_OPAQUE(vv);                                                         \
            oa1 = V::add(oa1, ua), oq1 = V::add(oq1, uu), oa2 = V::add(oa2, ub), oq2 = V::add(oq2, vv);               \
        }                                                                                                             \
        V::storeu(g.ra + i, ra1), V::storeu(g.rq + i, rq1), V::storeu(g.ra + h + i, ra2), V::storeu(g.rq + h + i, rq2);              \
        V::storeu(g.oa + i, oa1), V::storeu(g.oq + i, oq1), V::storeu(g.oa + h + i, oa2), V::storeu(g.oq + h + i, oq2);              \
        V::storeu(g.m1 + i, n1), V::storeu(g.m2 + i, n2);                                                                     \
    }                                                                                                                 \
    unrotate_lanes(g, full, h);                                                                                       \
}
QKGEOM_ROPEK_UNROTATE(unrotate_avx512, "avx512f", rv512)
QKGEOM_ROPEK_UNROTATE(unrotate_avx2, "avx2,fma", rv256)
#undef QKGEOM_ROPEK_UNROTATE

/// Σ over rows r of one run of (x_r − μ)², per column j < m, into acc
/// (the order of the sum per column: rows in order), at one level.
#define QKGEOM_ROPEK_SQRES(NAME, TARGET_STRING, V)                                                                    \
QKGEOM_TARGET(TARGET_STRING)                                                                                          \
inline void NAME(double const* x, index_t ldx, index_t n, double const* mu, index_t m, double* acc) noexcept {      \
    using T = typename V::type;                                                                                       \
    constexpr int W = V::w;                                                                                           \
    index_t const full = m / W * W;                                                                                   \
    for (index_t j = 0; j < full; j += W) {                                                                           \
        T s = V::zero();                                                                                              \
        T const mj = V::loadu(mu + j);                                                                                   \
        for (index_t r = 0; r < n; ++r) {                                                                             \
            T const e = V::sub(V::loadu(x + r * ldx + j), mj);                                                           \
            T ee = V::mul(e, e);                                                                                      \
            QKGEOM_ROPEK_OPAQUE(ee);                                                                                  \
            s = V::add(s, ee);                                                                                        \
        }                                                                                                             \
        V::storeu(acc + j, s);                                                                                            \
    }                                                                                                                 \
    for (index_t j = full; j < m; ++j) {                                                                              \
        double s = 0;                                                                                                 \
        for (index_t r = 0; r < n; ++r) s += unfused((x[r * ldx + j] - mu[j]) * (x[r * ldx + j] - mu[j]));          \
        acc[j] = s;                                                                                                   \
    }                                                                                                                 \
}

/// acc[j] += Σ_{r < n} x[r·ldx + j] (rows in order), j < m, at one level.
#define QKGEOM_ROPEK_COLSUM(NAME, TARGET_STRING, V)                                                                   \
QKGEOM_TARGET(TARGET_STRING)                                                                                          \
inline void NAME(double const* x, index_t ldx, index_t n, index_t m, double* acc) noexcept {                         \
    using T = typename V::type;                                                                                       \
    constexpr int W = V::w;                                                                                           \
    index_t const full = m / W * W;                                                                                   \
    for (index_t j = 0; j < full; j += W) {                                                                           \
        T s = V::loadu(acc + j);                                                                                         \
        for (index_t r = 0; r < n; ++r) s = V::add(s, V::loadu(x + r * ldx + j));                                        \
        V::storeu(acc + j, s);                                                                                            \
    }                                                                                                                 \
    for (index_t j = full; j < m; ++j)                                                                                \
        for (index_t r = 0; r < n; ++r) acc[j] += x[r * ldx + j];                                                     \
}
QKGEOM_ROPEK_COLSUM(col_sums_avx512, "avx512f", rv512)
QKGEOM_ROPEK_COLSUM(col_sums_avx2, "avx2,fma", rv256)
#undef QKGEOM_ROPEK_COLSUM
QKGEOM_ROPEK_SQRES(sq_residual_avx512, "avx512f", rv512)
QKGEOM_ROPEK_SQRES(sq_residual_avx2, "avx2,fma", rv256)
#undef QKGEOM_ROPEK_SQRES

#undef QKGEOM_ROPEK_OPAQUE

/// The mean of m rows (Σ in row order per column, then / m) and the rows
/// centred and scaled, (x − mean)·scale, written per quad q of 4 contiguous
/// source columns src[q] .. src[q] + 3 to dst[q] + i·stride (row i) — the
/// same operations as the scalar loops, so the same values at every level.
/// mu: d entries (work). One definition per level (ymm for the quads).
#define QKGEOM_ROPEK_GROUP(NAME, TARGET_STRING, V)                                                                    \
QKGEOM_TARGET(TARGET_STRING)                                                                                          \
inline void NAME(double const* x, index_t ldx, index_t m, index_t d, double* mu, double scale, index_t const* src,   \
                 index_t const* dst, index_t nq, double* out, index_t stride) noexcept {                             \
    using T = typename V::type;                                                                                       \
    constexpr int W = V::w;                                                                                           \
    index_t const full = d / W * W;                                                                                   \
    T const dm = V::set1(static_cast<double>(m));                                                                     \
    for (index_t j = 0; j < full; j += W) {                                                                           \
        T s = V::zero();                                                                                              \
        for (index_t i = 0; i < m; ++i) s = V::add(s, V::loadu(x + i * ldx + j));                                        \
        V::storeu(mu + j, V::div(s, dm));                                                                                 \
    }                                                                                                                 \
    for (index_t j = full; j < d; ++j) {                                                                              \
        double s = 0;                                                                                                 \
        for (index_t i = 0; i < m; ++i) s += x[i * ldx + j];                                                          \
        mu[j] = s / static_cast<double>(m);                                                                           \
    }                                                                                                                 \
    using Q = vx::f64v4;                                                                                              \
    Q::type const sc = Q::set1(scale);                                                                                \
    for (index_t q = 0; q < nq; ++q) {                                                                                \
        Q::type const mq = Q::loadu(mu + src[q]);                                                                     \
        double const* xq = x + src[q];                                                                                \
        double* o = out + dst[q];                                                                                     \
        for (index_t i = 0; i < m; ++i) Q::storeu(o + i * stride, Q::mul(Q::sub(Q::loadu(xq + i * ldx), mq), sc));   \
    }                                                                                                                 \
}
QKGEOM_ROPEK_GROUP(centre_group_avx512, "avx512f", rv512)
QKGEOM_ROPEK_GROUP(centre_group_avx2, "avx2,fma", rv256)
#undef QKGEOM_ROPEK_GROUP

#endif  // QKGEOM_SIMD_X86

QKGEOM_COMPILED_API void unrotate_block(simd::isa level, unrotate_args const& g) noexcept {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) return unrotate_avx512(g);
    if (level == simd::isa::avx2) return unrotate_avx2(g);
#endif
    (void)level;
    unrotate_lanes(g, 0, g.h);
}

QKGEOM_COMPILED_API void sq_residual(simd::isa level, double const* x, index_t ldx, index_t n, double const* mu, index_t m,
                                     double* acc) noexcept {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) return sq_residual_avx512(x, ldx, n, mu, m, acc);
    if (level == simd::isa::avx2) return sq_residual_avx2(x, ldx, n, mu, m, acc);
#endif
    (void)level;
    for (index_t j = 0; j < m; ++j) {
        double s = 0;
        for (index_t r = 0; r < n; ++r) s += unfused((x[r * ldx + j] - mu[j]) * (x[r * ldx + j] - mu[j]));
        acc[j] = s;
    }
}

QKGEOM_COMPILED_API void col_sums(simd::isa level, double const* x, index_t ldx, index_t n, index_t m, double* acc) noexcept {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) return col_sums_avx512(x, ldx, n, m, acc);
    if (level == simd::isa::avx2) return col_sums_avx2(x, ldx, n, m, acc);
#endif
    (void)level;
    for (index_t j = 0; j < m; ++j)
        for (index_t r = 0; r < n; ++r) acc[j] += x[r * ldx + j];
}

QKGEOM_COMPILED_API void centre_group(simd::isa level, double const* x, index_t ldx, index_t m, index_t d, double* mu,
                                      double scale, index_t const* src, index_t const* dst, index_t nq, double* out,
                                      index_t stride) noexcept {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) return centre_group_avx512(x, ldx, m, d, mu, scale, src, dst, nq, out, stride);
    if (level == simd::isa::avx2) return centre_group_avx2(x, ldx, m, d, mu, scale, src, dst, nq, out, stride);
#endif
    (void)level, (void)x, (void)ldx, (void)m, (void)d, (void)mu, (void)scale, (void)src, (void)dst, (void)nq;
    (void)out, (void)stride;
}

#endif  // QKGEOM_COMPILED_BODIES

}  // namespace ropek
}  // namespace detail
}  // namespace qkgeom
