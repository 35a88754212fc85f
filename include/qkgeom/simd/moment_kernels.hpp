// qkgeom — the moments' kernels (method §1) and the FMA peak probe.
// IWYU pragma: private, include <qkgeom/stats/moments.hpp>
// (SIMD kernels live in include/qkgeom/simd/; the dispatch is qkgeom/simd/dispatch.hpp.)
//
// One block of nb ≤ 256 rows of dimension d (row-major doubles or floats) is
// absorbed into the moments in two dispatched steps, at the widest
// level `simd::active()` allows (AVX-512: W = 8 doubles per zmm; AVX2 + FMA:
// W = 4 per ymm):
//
//   centre_pack   two passes over the block's rows, four panels at a time
//                 with the sums in registers, reading the rows where they are
//                 (double, or f32 widened on load; optionally gathered through
//                 a row index, so no widened copy of the block is made): the
//                 column sums (first-pass block mean x̃), then rᵢ = xᵢ − x̃
//                 written into the packed layout with Σ rᵢ and Σ rᵢ τᵢ (τ the
//                 centred positions). ε = Σ rᵢ / nb is the correction of the
//                 two-pass block mean (x̃ + ε is returned); the corrected sums
//                 follow without a third pass: Σ (rᵢ − ε) τᵢ = Σ rᵢ τᵢ − ε Σ τᵢ
//                 here, and Σ (rᵢ − ε)(rᵢ − ε)ᵀ = Σ rᵢ rᵢᵀ − nb ε εᵀ by the
//                 caller (a rank-1 update after syrk_packed).
//                 Packed layout: panels of W coordinates, panel p holds the
//                 nb rows' coordinates pW … pW+W−1 row after row
//                 (pk[(p·nb + k)·W + l] = r_k[pW + l]), coordinates ≥ d zero.
//   syrk_packed   C (column-major, leading dimension ldc, lower triangle)
//                 += Σ_k r_k r_kᵀ: per column panel q (W columns), the row
//                 panels p ≥ q in register tiles of MV·W rows × W columns
//                 (AVX-512: MV ≤ 3, 8 columns, 24 zmm accumulators; AVX2:
//                 MV ≤ 3, 4 columns, 12 ymm) held over all nb rows, one FMA
//                 per entry and row, then added to C under a mask that keeps
//                 the lower triangle (i ≥ j) and i, j < d.
//
// The generic level is not here: stats/moments.hpp keeps Eigen's rankUpdate for it.
// The levels differ in rounding (FMA, summation order), not in formula: see
// docs/moments.md for the tolerance the tests hold them to.
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/simd/vec.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if QKGEOM_SIMD_X86 && QKGEOM_COMPILED_BODIES
#include <emmintrin.h>  // probe_sse2 (SSE2: cheap, and <Eigen/Dense> includes it anyway)
#endif

namespace qkgeom {
namespace detail {
namespace mom {

/// Doubles per panel (one vector register) at a level; 1 for generic (unused).
[[nodiscard]] constexpr index_t panel_width(simd::isa level) noexcept {
    switch (level) {
        case simd::isa::avx512: return 8;
        case simd::isa::avx2: return 4;
        default: return 1;
    }
}

/// Doubles of work space `centre_pack` + `syrk_packed` need for d and nb:
/// the packed block, three d-vectors (padded: mean, cxt, ε) and 64 bytes of
/// alignment slack.
[[nodiscard]] constexpr index_t work_size(simd::isa level, index_t d, index_t nb) noexcept {
    index_t const w = panel_width(level);
    index_t const dp = (d + w - 1) / w * w;
    return dp * nb + 3 * dp + 8;
}

/// The first 64-byte aligned address at or after p.
[[nodiscard]] inline double* align64(double* p) noexcept {
    auto const a = reinterpret_cast<std::uintptr_t>(p);
    return p + ((64 - a % 64) % 64) / sizeof(double);
}

/// Lanes [lo, hi) of a W-lane vector starting at row i0 of column j: the lower
/// triangle (i ≥ j) and i < d, as a bit mask.
[[nodiscard]] QKGEOM_ALWAYS_INLINE unsigned lane_mask(index_t i0, index_t j, index_t d, int w) noexcept {
    index_t lo = j - i0, hi = d - i0;
    lo = lo < 0 ? 0 : (lo > w ? w : lo);
    hi = hi < 0 ? 0 : (hi > w ? w : hi);
    if (hi <= lo) return 0u;
    return ((1u << hi) - 1u) & ~((1u << lo) - 1u);
}

// --- entry points (defined below; in src/qkgeom_compiled.cpp with compiled kernels)

/// Whether some f32 value of p[0..n) is NaN or ±inf, at `level`.
QKGEOM_COMPILED_API bool any_nonfinite_f32(simd::isa level, float const* p, index_t n) noexcept;

/// out[j] = p[j] widened, j < n, at `level` (exact at every level).
QKGEOM_COMPILED_API void widen_f32(simd::isa level, float const* p, double* out, index_t n) noexcept;

/// Centre and pack one block at `level` (avx2 or avx512; see the file comment
/// and the level kernels below): row k is x + rows[k]·ld (x + k·ld when
/// `rows` is null), S = double or float.
/// \pre level is avx2 or avx512 and ≤ simd::detected(); nb ≥ 1; `pk` 64-byte
///      aligned with room for work_size(level, d, nb) − 8 doubles from pk.
template <class S>
QKGEOM_COMPILED_API void centre_pack(simd::isa level, S const* x, index_t ld, index_t const* rows, double const* tau,
                                     index_t nb, index_t d, double* pk, double* mean, double* cxt, double* eps);

/// C (lower triangle, column-major, leading dimension ldc) += Σ_k r_k r_kᵀ over
/// the packed block `pk` of `centre_pack` at the same level.
QKGEOM_COMPILED_API void syrk_packed(simd::isa level, double const* pk, index_t nb, index_t d, double* c, index_t ldc);

}  // namespace mom
}  // namespace detail

namespace simd {

/// \brief What `fma_peak_probe` did: the double-precision flops it executed
/// (a multiply and an add per lane per fused multiply-add) and a value that
/// depends on all of them (keeps the work observable).
struct fma_probe_result {
    double flops = 0;     ///< flops executed
    double checksum = 0;  ///< sum of the final accumulators
};

/// \brief Measures nothing itself: runs `iterations` rounds of independent
/// double-precision multiply-add chains (x ← x·a + b) at the level
/// `active()` allows — AVX-512: 24 zmm FMA chains, AVX2: 12 ymm FMA chains,
/// generic: 12 SSE2 multiply-then-add chains of 2 doubles on x86-64 (16
/// scalar chains elsewhere) — enough independent
/// chains to keep every FMA (or multiply and add) port busy. Time it to get
/// the machine's double-precision peak for that level (the moments'
/// benchmark divides its rate by this one, docs/performance.md).
/// \param[in] iterations rounds of the chains; ≤ 0 runs none.
/// \returns the flops executed (2 per lane per multiply-add) and a checksum.
[[nodiscard]] QKGEOM_COMPILED_API fma_probe_result fma_peak_probe(std::int64_t iterations) noexcept;

}  // namespace simd

#if QKGEOM_COMPILED_BODIES
namespace detail {
namespace mom {

#if QKGEOM_SIMD_X86

/// The vector operations of the dispatched kernels (moments here, the RoPE
/// bands in rope_kernels.hpp), for zmm (8 doubles): simd/vec.hpp's, and the
/// partial loads and masked accumulation of the kernels.
struct vec512 : vx::f64v8 {
    static constexpr int w = 8;
    /// The first n lanes (1 ≤ n ≤ 8) from p, zeros past them.
    QKGEOM_TARGET("avx512f") static QKGEOM_ALWAYS_INLINE type load_n(double const* p, index_t n) noexcept {
        return n >= 8 ? loadu(p) : maskz_loadu(static_cast<vx::mask8>((1u << n) - 1u), p);
    }
    /// The first n floats (1 ≤ n ≤ 8) from p, widened; zeros past them.
    QKGEOM_TARGET("avx512f") static QKGEOM_ALWAYS_INLINE type load_n(float const* p, index_t n) noexcept {
        using f8 = vx::f32v8;
        return widen(n >= 8 ? f8::loadu(p) : f8::maskload(p, f8::first(static_cast<int>(n))));
    }
    /// p[l] += v[l] for the lanes l set in the bit mask m (unaligned p).
    QKGEOM_TARGET("avx512f") static QKGEOM_ALWAYS_INLINE void add_to(double* p, unsigned m, type v) noexcept {
        if (m == 0xffu) {
            storeu(p, add(loadu(p), v));
        } else if (m != 0u) {
            auto const mk = static_cast<vx::mask8>(m);
            mask_storeu(p, mk, add(maskz_loadu(mk, p), v));
        }
    }
};

/// The same for ymm (4 doubles, AVX2 + FMA).
struct vec256 : vx::f64v4 {
    static constexpr int w = 4;
    QKGEOM_TARGET("avx2,fma") static QKGEOM_ALWAYS_INLINE type load_n(double const* p, index_t n) noexcept {
        if (n >= 4) return loadu(p);
        return maskload(p, vx::i64x4{n, n, n, n} > vx::i64x4{0, 1, 2, 3});
    }
    QKGEOM_TARGET("avx2,fma") static QKGEOM_ALWAYS_INLINE type load_n(float const* p, index_t n) noexcept {
        using f4 = vx::f32v4;
        if (n >= 4) return f4::widen(f4::loadu(p));
        return f4::widen(f4::load_first(p, static_cast<int>(n)));
    }
    QKGEOM_TARGET("avx2,fma") static QKGEOM_ALWAYS_INLINE type fmadd(type a, type b, type c) noexcept {
        return vx::fmadd(a, b, c);
    }
    QKGEOM_TARGET("avx2,fma") static QKGEOM_ALWAYS_INLINE void add_to(double* p, unsigned m, type v) noexcept {
        if (m == 0xfu) {
            storeu(p, add(loadu(p), v));
        } else if (m != 0u) {
            vx::i64x4 const mk = {-static_cast<long long>(m & 1u), -static_cast<long long>((m >> 1) & 1u),
                                  -static_cast<long long>((m >> 2) & 1u), -static_cast<long long>((m >> 3) & 1u)};
            maskstore(p, mk, add(maskload(p, mk), v));
        }
    }
};

/// Centre and pack G panels of one block (see the file comment), panels p0 …
/// p0 + G − 1, the last with `last` lanes (1 … W; the others full): pass 1
/// (rows in order) x̃ = Σ x / nb, pass 2 (rows in order) r = x − x̃ into the
/// panels with Σ r and Σ r τ, all in registers. Row k is x + rows[k]·ld, or
/// x + k·ld when `rows` is null; S is double or float (widened on load).
/// Writes `mean` = x̃ + ε, `eps` = ε = Σ r / nb and `cxt` = Σ r τ − ε Σ τ
/// (= Σ (r − ε) τ) for the G panels; `st` = Σ τ, `inv` = 1/nb.
/// (One definition per level: the body must carry its level's target attribute.)
#define QKGEOM_MOM_CENTRE_GROUP(NAME, TARGET_STRING, V)                                                               \
template <int G, class S>                                                                                             \
QKGEOM_TARGET(TARGET_STRING)                                                                                          \
QKGEOM_ALWAYS_INLINE void NAME(S const* x, index_t ld, index_t const* rows, double const* tau, index_t nb,            \
                               index_t p0, index_t last, double st, double* pk, double* mean, double* cxt,           \
                               double* eps) {                                                                         \
    using T = typename V::type;                                                                                       \
    constexpr int W = V::w;                                                                                           \
    T const inv = V::set1(1.0 / static_cast<double>(nb));                                                             \
    auto const row = [=](index_t k) { return x + (rows != nullptr ? rows[k] : k) * ld + p0 * W; };                  \
    T a0[G], a1[G];                                                                                                   \
    _Pragma("GCC unroll 4") for (int g = 0; g < G; ++g) a0[g] = a1[g] = V::zero();                                    \
    index_t const nb2 = nb / 2 * 2;                                                                                   \
    for (index_t k = 0; k < nb2; k += 2) {                                                                            \
        S const* r0 = row(k);                                                                                         \
        S const* r1 = row(k + 1);                                                                                     \
        _Pragma("GCC unroll 4") for (int g = 0; g < G; ++g) {                                                         \
            index_t const n = g + 1 < G ? W : last;                                                                   \
            a0[g] = V::add(a0[g], V::load_n(r0 + g * W, n));                                                          \
            a1[g] = V::add(a1[g], V::load_n(r1 + g * W, n));                                                          \
        }                                                                                                             \
    }                                                                                                                 \
    if (nb2 < nb) {                                                                                                   \
        S const* r0 = row(nb2);                                                                                       \
        _Pragma("GCC unroll 4") for (int g = 0; g < G; ++g)                                                           \
            a0[g] = V::add(a0[g], V::load_n(r0 + g * W, g + 1 < G ? W : last));                                      \
    }                                                                                                                 \
    T m[G], sr[G], srt[G];                                                                                            \
    _Pragma("GCC unroll 4") for (int g = 0; g < G; ++g) {                                                             \
        m[g] = V::mul(V::add(a0[g], a1[g]), inv);                                                                     \
        sr[g] = srt[g] = V::zero();                                                                                   \
    }                                                                                                                 \
    for (index_t k = 0; k < nb; ++k) {                                                                                \
        S const* r0 = row(k);                                                                                         \
        T const tk = V::set1(tau[k]);                                                                                 \
        _Pragma("GCC unroll 4") for (int g = 0; g < G; ++g) {                                                         \
            T const r = V::sub(V::load_n(r0 + g * W, g + 1 < G ? W : last), m[g]);                                    \
            V::store(pk + ((p0 + g) * nb + k) * W, r);                                                                \
            sr[g] = V::add(sr[g], r);                                                                                 \
            srt[g] = V::fmadd(r, tk, srt[g]);                                                                         \
        }                                                                                                             \
    }                                                                                                                 \
    T const vst = V::set1(st);                                                                                        \
    _Pragma("GCC unroll 4") for (int g = 0; g < G; ++g) {                                                             \
        T const e = V::mul(sr[g], inv);                                                                               \
        V::store(eps + (p0 + g) * W, e);                                                                              \
        V::store(mean + (p0 + g) * W, V::add(m[g], e));                                                               \
        V::store(cxt + (p0 + g) * W, V::sub(srt[g], V::mul(e, vst)));                                                 \
    }                                                                                                                 \
}

/// Centre and pack one block (see the file comment): the panels four at a
/// time through the level's group kernel. `x`, `ld`, `rows`: as the group
/// kernel; `tau`: nb centred positions; out: `pk` (dp·nb, 64-byte aligned),
/// `mean` (x̃ + ε), `cxt` (Σ (r − ε) τ) and `eps` (ε), dp each (lanes past d
/// are 0: x loads as 0 there). `pk` holds r = x − x̃ (not r − ε): the caller
/// subtracts nb·ε εᵀ from the rank-k update (method §1's corrected two-pass
/// sum of squares).
#define QKGEOM_MOM_CENTRE_PACK(NAME, TARGET_STRING, GROUP, W)                                                         \
template <class S>                                                                                                    \
QKGEOM_TARGET(TARGET_STRING)                                                                                          \
inline void NAME(S const* x, index_t ld, index_t const* rows, double const* tau, index_t nb, index_t d, double* pk,  \
                 double* mean, double* cxt, double* eps) {                                                            \
    index_t const np = (d + (W) - 1) / (W);                                                                           \
    index_t const last = d - (np - 1) * (W);                                                                          \
    double st = 0;                                                                                                    \
    for (index_t k = 0; k < nb; ++k) st += tau[k];                                                                    \
    index_t p0 = 0;                                                                                                   \
    for (; p0 + 4 < np; p0 += 4) GROUP<4>(x, ld, rows, tau, nb, p0, (W), st, pk, mean, cxt, eps);                    \
    switch (np - p0) {                                                                                                \
        case 4: GROUP<4>(x, ld, rows, tau, nb, p0, last, st, pk, mean, cxt, eps); break;                              \
        case 3: GROUP<3>(x, ld, rows, tau, nb, p0, last, st, pk, mean, cxt, eps); break;                              \
        case 2: GROUP<2>(x, ld, rows, tau, nb, p0, last, st, pk, mean, cxt, eps); break;                              \
        default: GROUP<1>(x, ld, rows, tau, nb, p0, last, st, pk, mean, cxt, eps); break;                             \
    }                                                                                                                 \
}

QKGEOM_MOM_CENTRE_GROUP(centre_group_avx512, "avx512f", vec512)
QKGEOM_MOM_CENTRE_GROUP(centre_group_avx2, "avx2,fma", vec256)
QKGEOM_MOM_CENTRE_PACK(centre_pack_avx512, "avx512f", centre_group_avx512, 8)
QKGEOM_MOM_CENTRE_PACK(centre_pack_avx2, "avx2,fma", centre_group_avx2, 4)
#undef QKGEOM_MOM_CENTRE_PACK
#undef QKGEOM_MOM_CENTRE_GROUP

/// One register tile at a level (V = vec512: 8 columns of zmm; vec256: 4 of
/// ymm): rows i0 … i0 + W·MV of the column panel at `b` (W columns from j0),
/// accumulated over the nb rows, added to C under the triangle mask (one
/// definition per level, as QKGEOM_MOM_CENTRE_PACK).
#define QKGEOM_MOM_TILE(NAME, TARGET_STRING, V)                                                                       \
template <int MV>                                                                                                     \
QKGEOM_TARGET(TARGET_STRING)                                                                                          \
QKGEOM_ALWAYS_INLINE void NAME(double const* a, double const* b, index_t nb, index_t ps, double* c, index_t ldc,      \
                               index_t i0, index_t j0, index_t d) {                                                   \
    using T = typename V::type;                                                                                       \
    constexpr int W = V::w;                                                                                           \
    T acc[W][MV];                                                                                                     \
    _Pragma("GCC unroll 8") for (int j = 0; j < W; ++j)                                                               \
        _Pragma("GCC unroll 3") for (int v = 0; v < MV; ++v) acc[j][v] = V::zero();                                   \
    for (index_t k = 0; k < nb; ++k) {                                                                                \
        T av[MV];                                                                                                     \
        _Pragma("GCC unroll 3") for (int v = 0; v < MV; ++v) av[v] = V::load(a + v * ps + k * W);                     \
        double const* bk = b + k * W;                                                                                 \
        _Pragma("GCC unroll 8") for (int j = 0; j < W; ++j) {                                                         \
            T const bj = V::set1(bk[j]);                                                                              \
            _Pragma("GCC unroll 3") for (int v = 0; v < MV; ++v) acc[j][v] = V::fmadd(av[v], bj, acc[j][v]);          \
        }                                                                                                             \
    }                                                                                                                 \
    _Pragma("GCC unroll 8") for (int j = 0; j < W; ++j) {                                                             \
        index_t const col = j0 + j;                                                                                   \
        if (col >= d) break;                                                                                          \
        _Pragma("GCC unroll 3") for (int v = 0; v < MV; ++v) {                                                        \
            index_t const ii = i0 + W * v;                                                                            \
            V::add_to(c + col * ldc + ii, lane_mask(ii, col, d, W), acc[j][v]);                                       \
        }                                                                                                             \
    }                                                                                                                 \
}
QKGEOM_MOM_TILE(tile_avx512, "avx512f", vec512)
QKGEOM_MOM_TILE(tile_avx2, "avx2,fma", vec256)
#undef QKGEOM_MOM_TILE

/// Row panels per tile for the n panels left in a column: 3s, ending 2+2 or 2.
[[nodiscard]] constexpr int tile_panels(index_t n) noexcept { return n == 1 ? 1 : (n == 2 || n == 4) ? 2 : 3; }

/// The lower-triangle tiles of the packed block at one level: W doubles per
/// panel, TILE the level's register tile (one definition per level, as
/// QKGEOM_MOM_CENTRE_PACK: the body must carry its level's target attribute).
#define QKGEOM_MOM_SYRK(NAME, TARGET_STRING, W, TILE)                                                                 \
QKGEOM_TARGET(TARGET_STRING)                                                                                  \
inline void NAME(double const* pk, index_t nb, index_t d, double* c, index_t ldc) {                                 \
    index_t const np = (d + (W) - 1) / (W), ps = nb * (W);                                                          \
    for (index_t q = 0; q < np; ++q) {                                                                              \
        for (index_t p = q; p < np;) {                                                                              \
            int const mv = tile_panels(np - p);                                                                     \
            double const* a = pk + p * ps;                                                                          \
            double const* b = pk + q * ps;                                                                          \
            if (mv == 3) TILE<3>(a, b, nb, ps, c, ldc, p * (W), q * (W), d);                                        \
            else if (mv == 2) TILE<2>(a, b, nb, ps, c, ldc, p * (W), q * (W), d);                                   \
            else TILE<1>(a, b, nb, ps, c, ldc, p * (W), q * (W), d);                                                \
            p += mv;                                                                                                \
        }                                                                                                           \
    }                                                                                                               \
}
QKGEOM_MOM_SYRK(syrk_avx512, "avx512f", 8, tile_avx512)
QKGEOM_MOM_SYRK(syrk_avx2, "avx2,fma", 4, tile_avx2)
#undef QKGEOM_MOM_SYRK

/// f32 → f64 of n values (the reading of a block's rows).
QKGEOM_TARGET("avx512f")
inline void widen_avx512(float const* p, double* out, index_t n) noexcept {
    index_t j = 0;
    for (; j + 8 <= n; j += 8) vx::f64v8::storeu(out + j, vx::f64v8::widen(vx::f32v8::loadu(p + j)));
    for (; j < n; ++j) out[j] = static_cast<double>(p[j]);
}

QKGEOM_TARGET("avx2,fma")
inline void widen_avx2(float const* p, double* out, index_t n) noexcept {
    index_t j = 0;
    for (; j + 4 <= n; j += 4) vx::f64v4::storeu(out + j, vx::f32v4::widen(vx::f32v4::loadu(p + j)));
    for (; j < n; ++j) out[j] = static_cast<double>(p[j]);
}

/// Whether some f32 value of p[0..n) is NaN or ±inf (exponent all ones): for
/// f32 that is exactly "outside |x| < 2¹²⁸" (every finite f32 is below it).
QKGEOM_TARGET("avx512f")
inline bool any_nonfinite_f32_avx512(float const* p, index_t n) noexcept {
    using V = vx::i32v16;
    int const e = 0x7f800000;
    V::type const ev = {e, e, e, e, e, e, e, e, e, e, e, e, e, e, e, e};
    vx::mask16 bad = 0;
    index_t j = 0;
    for (; j + 16 <= n; j += 16) bad |= V::eq(0xffffu, V::loadu(p + j) & e, ev);
    if (j < n) {
        auto const m = static_cast<vx::mask16>((1u << (n - j)) - 1u);
        bad |= V::eq(m, V::maskz_loadu(m, p + j) & e, ev);
    }
    return bad != 0;
}

#endif  // QKGEOM_SIMD_X86

/// Scalar form of the f32 finiteness scan (generic and AVX2 levels).
inline bool any_nonfinite_f32_generic(float const* p, index_t n) noexcept {
    std::uint32_t bad = 0;
    for (index_t j = 0; j < n; ++j) {
        std::uint32_t u;
        std::memcpy(&u, p + j, sizeof u);
        bad |= static_cast<std::uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad != 0;
}

QKGEOM_COMPILED_API bool any_nonfinite_f32(simd::isa level, float const* p, index_t n) noexcept {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) return any_nonfinite_f32_avx512(p, n);
#endif
    (void)level;
    return any_nonfinite_f32_generic(p, n);
}

QKGEOM_COMPILED_API void widen_f32(simd::isa level, float const* p, double* out, index_t n) noexcept {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) return widen_avx512(p, out, n);
    if (level == simd::isa::avx2) return widen_avx2(p, out, n);
#endif
    (void)level;
    for (index_t j = 0; j < n; ++j) out[j] = static_cast<double>(p[j]);
}

template <class S>
QKGEOM_COMPILED_API void centre_pack(simd::isa level, S const* x, index_t ld, index_t const* rows, double const* tau,
                                     index_t nb, index_t d, double* pk, double* mean, double* cxt, double* eps) {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) centre_pack_avx512(x, ld, rows, tau, nb, d, pk, mean, cxt, eps);
    else if (level == simd::isa::avx2) centre_pack_avx2(x, ld, rows, tau, nb, d, pk, mean, cxt, eps);
#else
    (void)level, (void)x, (void)ld, (void)rows, (void)tau, (void)nb, (void)d, (void)pk, (void)mean, (void)cxt,
        (void)eps;
#endif
}

QKGEOM_COMPILED_API void syrk_packed(simd::isa level, double const* pk, index_t nb, index_t d, double* c, index_t ldc) {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) syrk_avx512(pk, nb, d, c, ldc);
    else if (level == simd::isa::avx2) syrk_avx2(pk, nb, d, c, ldc);
#else
    (void)level, (void)pk, (void)nb, (void)d, (void)c, (void)ldc;
#endif
}

}  // namespace mom
}  // namespace detail

namespace simd {
namespace detail {

/// Independent chains x ← x·a + b (generic: SSE2 multiply then add, no FMA).
inline double probe_generic(std::int64_t it, double a, double b) noexcept {
    double acc[16];
    for (int u = 0; u < 16; ++u) acc[u] = 1e-3 * u;
    for (std::int64_t i = 0; i < it; ++i)
#pragma GCC unroll 16
        for (int u = 0; u < 16; ++u) acc[u] = acc[u] * a + b;
    double s = 0;
    for (double v : acc) s += v;
    return s;
}

#if QKGEOM_SIMD_X86
/// Generic on x86-64: 12 SSE2 (baseline) chains of 2 doubles, multiply then add.
inline double probe_sse2(std::int64_t it, double a, double b) noexcept {
    __m128d acc[12];
    __m128d const va = _mm_set1_pd(a), vb = _mm_set1_pd(b);
#pragma GCC unroll 12
    for (int u = 0; u < 12; ++u) acc[u] = _mm_set1_pd(1e-3 * u);
    for (std::int64_t i = 0; i < it; ++i)
#pragma GCC unroll 12
        for (int u = 0; u < 12; ++u) acc[u] = _mm_add_pd(_mm_mul_pd(acc[u], va), vb);
    __m128d s = acc[0];
#pragma GCC unroll 12
    for (int u = 1; u < 12; ++u) s = _mm_add_pd(s, acc[u]);
    double out[2];
    _mm_storeu_pd(out, s);
    return out[0] + out[1];
}

/// N independent chains x ← x·a + b of V's width, fused (one definition per
/// level, as QKGEOM_MOM_CENTRE_PACK).
#define QKGEOM_MOM_PROBE(NAME, TARGET_STRING, V, N)                                                                   \
QKGEOM_TARGET(TARGET_STRING)                                                                                          \
inline double NAME(std::int64_t it, double a, double b) noexcept {                                                   \
    using T = typename V::type;                                                                                       \
    T acc[N];                                                                                                         \
    T const va = V::set1(a), vb = V::set1(b);                                                                         \
    _Pragma("GCC unroll 24") for (int u = 0; u < (N); ++u) acc[u] = V::set1(1e-3 * u);                                \
    for (std::int64_t i = 0; i < it; ++i)                                                                             \
        _Pragma("GCC unroll 24") for (int u = 0; u < (N); ++u) acc[u] = V::fmadd(acc[u], va, vb);                     \
    T s = acc[0];                                                                                                     \
    _Pragma("GCC unroll 24") for (int u = 1; u < (N); ++u) s = V::add(s, acc[u]);                                    \
    alignas(64) double out[8];                                                                                        \
    V::store(out, s);                                                                                                 \
    double r = 0;                                                                                                     \
    for (int l = 0; l < V::w; ++l) r += out[l];                                                                       \
    return r;                                                                                                         \
}
QKGEOM_MOM_PROBE(probe_avx2, "avx2,fma", qkgeom::detail::mom::vec256, 12)
QKGEOM_MOM_PROBE(probe_avx512, "avx512f", qkgeom::detail::mom::vec512, 24)
#undef QKGEOM_MOM_PROBE
#endif

}  // namespace detail

QKGEOM_COMPILED_API fma_probe_result fma_peak_probe(std::int64_t iterations) noexcept {
    double const a = 0.999999, b = 1e-6;
    std::int64_t const it = iterations > 0 ? iterations : 0;
    auto const n = static_cast<double>(it);
#if QKGEOM_SIMD_X86
    switch (active()) {
        case isa::avx512: return {n * 24 * 8 * 2, detail::probe_avx512(it, a, b)};
        case isa::avx2: return {n * 12 * 4 * 2, detail::probe_avx2(it, a, b)};
        default: return {n * 12 * 2 * 2, detail::probe_sse2(it, a, b)};
    }
#endif
    return {n * 16 * 2, detail::probe_generic(it, a, b)};
}

}  // namespace simd
#endif  // QKGEOM_COMPILED_BODIES
}  // namespace qkgeom
