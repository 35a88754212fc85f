// qkgeom — pairwise preference and pairwise plasticity of the Gaussian
// closed form (method §5; thesis eqs. 4.13–4.14), accurate in the tails.
//
//   p(z)  = Φ(z)
//   PP(z) = 4 p (1 − p) = 4 Φ(−|z|) (1 − Φ(−|z|)),  Φ(−|z|) = erfc(|z|/√2) / 2
//
// Φ(−|z|) ≤ 1/2 is computed directly by erfc, so nothing cancels: PP stays
// within 1e-12 relative (method §5) wherever Φ(−|z|) is a normal double,
// i.e. for |z| up to ≈ 37.5, and then underflows gracefully through the
// subnormals to exactly 0 (|z| ≳ 38.6). Against a 50-digit reference
// (tests/runtime/reference_test.cpp) the error is a few ulp for moderate |z|
// and grows to ≈ 2e-13 near |z| = 37: the rounding of |z|/√2 to a double is
// amplified by erfc's slope, ≈ z² relative.
//
// The batched PP of the dense Gram path (`detail::vpp::pairwise_plasticity`;
// the public span overload stays the exact element-wise loop) evaluates erfc
// with W. J. Cody's rational approximations (Math. Comp. 23, 1969: |x| ≤
// 0.46875, ≤ 4, > 4) and its own exp(−x²), as straight-line code the compiler
// vectorises (no branches, no calls): relative error ≤ 1e-13 against the
// scalar `pairwise_plasticity` (std::erfc) for |z| ≤ 37 (measured ≈ 1.1e-15,
// a few ulp), same limits, NaN → NaN (tests/runtime/gaussian_vector_test.cpp).
//
// The kernel body is written once (always-inline) and instantiated three
// times (simd/dispatch.hpp): a generic entry, compiled for whatever the build targets
// (SSE2 without -march), and, on x86-64 with GCC/Clang, entries compiled with
// `target("avx2")` (ymm) and `target("avx512f")` (zmm); `batch` picks one by
// `simd::active()`. The results are bit-identical at every level: no
// multiply–add is fused. target("avx2") deliberately omits "fma", but
// avx512f implies FMA in both GCC 12 and Clang 14 (and -march flags may add
// it to every entry), so contraction is switched off for the kernel itself:
// `#pragma clang fp contract(off)` in the bodies (Clang contracts within an
// expression by default) and `optimize("fp-contract=off")` on the entries
// (GCC's C++ default, -ffp-contract=fast, contracts across statements, with
// -std=c++20 as with gnu++20). Every operation is then the same IEEE
// operation in every lane at every width (tests/runtime/gaussian_vector_test.cpp
// checks this). One exception: Clang 14 applies a user's -ffp-contract=fast in
// its back end, over the pragma; the AVX-512 entry then fuses and agrees with
// the others to the 1e-13 bound only (measured ≈ 1e-15), not bit for bit.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include <qkgeom/core/errors.hpp>
#include <qkgeom/simd/dispatch.hpp>

namespace qkgeom {

namespace detail {
inline constexpr double inv_sqrt2 = 0.70710678118654752440084436210484903928;  // 1/√2
}  // namespace detail

/// \brief Upper-tail Φ(−|z|) = erfc(|z|/√2)/2, without cancellation.
/// \param[in] z a standard-normal quantile; any double.
/// \returns Φ(−|z|) ∈ [0, 1/2]; 1/2 at z = 0, 0 at ±∞, NaN for NaN.
[[nodiscard]] inline double normal_tail(double z) noexcept {
    return 0.5 * std::erfc(std::abs(z) * detail::inv_sqrt2);
}

/// \brief p(z) = Φ(z): probability that key i beats key j (method §5).
/// Accurate relative to p for every z (small p are not lost to 1 − tail).
/// \param[in] z the standardised score difference of the pair; any double.
/// \returns Φ(z) ∈ [0, 1]; NaN for NaN.
[[nodiscard]] inline double preference_probability(double z) noexcept {
    return 0.5 * std::erfc(-z * detail::inv_sqrt2);
}

/// \brief PP(z) = 4 p (1 − p) computed as 4 Φ(−|z|)(1 − Φ(−|z|)) (method §5).
/// NaN in, NaN out; PP(0) = 1; PP(±∞) = 0.
/// \param[in] z the standardised score difference of the pair; any double.
/// \returns PP(z) ∈ [0, 1], even in z.
[[nodiscard]] inline double pairwise_plasticity(double z) noexcept {
    double const t = normal_tail(z);
    return 4.0 * t * (1.0 - t);
}

namespace detail {
namespace vpp {

// Batched PP. Every lane runs the same straight-line code (selections are bit
// masks, not branches, so the compiler can neither branch nor sink one arm's
// arithmetic into a branch), hence loops of `block` lanes vectorise (SSE2 in
// the generic entry, ymm/zmm in the AVX2/AVX-512 ones: the always-inline
// helpers are compiled inside each entry). Inputs are split into
// |z|/√2 ≤ 0.46875 (erf series, no exp) and the rest (exp(−x²) × rational);
// the split and the padding never change a value: a lane's result depends on
// its input only.

using u64 = std::uint64_t;
// Lanes per kernel call (`Block` below): 8, or 16 for AVX-512, where GCC sizes
// the vectors by the loop's narrowest type (the int32 conversions of
// block_large): 16 lanes make those one zmm and the doubles two.
inline constexpr std::size_t block = 8;
inline constexpr std::size_t block_wide = 16;
inline constexpr std::size_t chunk = 256;  // lanes classified per pass (stack buffers); a multiple of every Block
inline constexpr double small_max = 0.46875;  // Cody's first interval, in x = |z|/√2

[[nodiscard]] QKGEOM_ALWAYS_INLINE u64 bits(double x) noexcept { return std::bit_cast<u64>(x); }
[[nodiscard]] QKGEOM_ALWAYS_INLINE double from_bits(u64 x) noexcept { return std::bit_cast<double>(x); }
/// All ones when a < b (neither NaN), from the sign bit of a − b (a − a = +0).
[[nodiscard]] QKGEOM_ALWAYS_INLINE u64 lt_mask(double a, double b) noexcept { return u64{0} - (bits(a - b) >> 63); }
[[nodiscard]] QKGEOM_ALWAYS_INLINE double sel(u64 m, double a, double b) noexcept {
    return from_bits((bits(a) & m) | (bits(b) & ~m));
}

/// PP for x = |z|/√2 ≤ 0.46875: erf(x) = x A(x²)/B(x²) (Cody), PP = 1 − erf².
template <std::size_t Block>
QKGEOM_ALWAYS_INLINE void block_small(double const* __restrict z, double* __restrict out) noexcept {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    constexpr double a0 = 3.16112374387056560e00, a1 = 1.13864154151050156e02, a2 = 3.77485237685302021e02,
                     a3 = 3.20937758913846947e03, a4 = 1.85777706184603153e-1;
    constexpr double b0 = 2.36012909523441209e01, b1 = 2.44024637934444173e02, b2 = 1.28261652607737228e03,
                     b3 = 2.84423683343917062e03;
    for (std::size_t i = 0; i < Block; ++i) {
        double const x = std::abs(z[i]) * inv_sqrt2;
        double const s1 = x * x, s2 = s1 * s1, s4 = s2 * s2;  // Estrin; all terms positive
        double const na = a4 * s4 + ((a0 * s1 + a1) * s2 + (a2 * s1 + a3));
        double const da = s4 + ((b0 * s1 + b1) * s2 + (b2 * s1 + b3));
        double const e = x * na / da;  // erf(x) <= 0.493
        out[i] = (1.0 - e) * (1.0 + e);
    }
}

/// PP for x = |z|/√2 > 0.46875 (and NaN): erfc(x) = e^{−x²} R(x), R Cody's
/// rational of (0.46875, 4] or, when `Tail`, of (4, ∞) as well.
template <bool Tail, std::size_t Block>
QKGEOM_ALWAYS_INLINE void block_large(double const* __restrict z, double* __restrict out) noexcept {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    constexpr double c0 = 5.64188496988670089e-1, c1 = 8.88314979438837594e00, c2 = 6.61191906371416295e01,
                     c3 = 2.98635138197400131e02, c4 = 8.81952221241769090e02, c5 = 1.71204761263407058e03,
                     c6 = 2.05107837782607147e03, c7 = 1.23033935479799725e03, c8 = 2.15311535474403846e-8;
    constexpr double d0 = 1.57449261107098347e01, d1 = 1.17693950891312499e02, d2 = 5.37181101862009858e02,
                     d3 = 1.62138957456669019e03, d4 = 3.29079923573345963e03, d5 = 4.36261909014324716e03,
                     d6 = 3.43936767414372164e03, d7 = 1.23033935480374942e03;
    constexpr double p0 = 3.05326634961232344e-1, p1 = 3.60344899949804439e-1, p2 = 1.25781726111229246e-1,
                     p3 = 1.60837851487422766e-2, p4 = 6.58749161529837803e-4, p5 = 1.63153871373020978e-2;
    constexpr double q0 = 2.56852019228982242e00, q1 = 1.87295284992346047e00, q2 = 5.27905102951428412e-1,
                     q3 = 6.05183413124413191e-2, q4 = 2.33520497626869185e-3;
    constexpr double sqrpi = 5.6418958354775628695e-1;  // 1/√π
    constexpr double log2e = 1.44269504088896338700e+00;
    constexpr double ln2_hi = 6.93147180369123816490e-01;  // 32 significant bits: k·ln2_hi exact
    constexpr double ln2_lo = 1.90821492927058770002e-10;
    constexpr double shifter = 0x1.8p52;
    constexpr u64 bias = 1023 + 600;  // 2^(k+600) is normal for every k here; 2^-600 applied last
    constexpr double unscale = 0x1p-600;
    for (std::size_t i = 0; i < Block; ++i) {
        double const zi = z[i];
        double const az = std::abs(zi);
        u64 const nan = u64{0} - ((u64{0x7ff0000000000000} - bits(az)) >> 63);  // |z| is NaN
        double x = from_bits(bits(az * inv_sqrt2) & ~nan);                     // NaN -> 0, restored at the end
        // erfc(28) < 2^-1075 rounds to 0, as does everything beyond; keeps the arithmetic finite.
        x = sel(lt_mask(x, 28.0), x, 28.0);
        // (0.46875, 4]: R = C(x)/D(x), degree 8/8 (Estrin; all terms positive).
        double const t2 = x * x, t4 = t2 * t2, t8 = t4 * t4;
        double num = c8 * t8 + (((c0 * x + c1) * t2 + (c2 * x + c3)) * t4 + ((c4 * x + c5) * t2 + (c6 * x + c7)));
        double den = t8 + (((d0 * x + d1) * t2 + (d2 * x + d3)) * t4 + ((d4 * x + d5) * t2 + (d6 * x + d7)));
        if constexpr (Tail) {
            // (4, ∞): R = (1/√π − u P(u)/Q(u))/x, u = 1/x²; P, Q of degree 5 reversed in
            // w = x² (u P(u)/Q(u) = Pr(w)/(w Qr(w))), so one division serves all intervals.
            double const x3 = sel(lt_mask(4.0, x), x, 4.0);
            double const w = x3 * x3, w2 = w * w;
            double const pr = ((p4 * w + p3) * w2 + (p2 * w + p1)) * w2 + (p0 * w + p5);
            double const qr = ((q4 * w + q3) * w2 + (q2 * w + q1)) * w2 + (q0 * w + 1.0);
            double const wq = w * qr;
            u64 const mid = lt_mask(x, 4.0);  // x = 4 itself: either interval is accurate
            num = sel(mid, num, sqrpi * wq - pr);
            den = sel(mid, den, x3 * wq);
        }
        // e^{−x²} = e^{−(h² + δ)}, h = trunc(16x)/16 (h² exact), δ = (x − h)(x + h): no
        // amplification of the rounding of x² (Cody). One reduction by ln2 (Cody–Waite):
        // h² − k·ln2_hi is exact, |r| ≤ ln2/2 (+ rounding), exp(r) by its Taylor series
        // to degree 13 (truncation < 5e-18), 2^k by building the exponent bits.
        double const h = static_cast<double>(static_cast<std::int32_t>(x * 16.0)) * 0.0625;
        double const ah = -(h * h);
        double const del = (x - h) * (x + h);
        double const kd = static_cast<double>(static_cast<std::int32_t>((ah - del) * log2e - 0.5));  // round, arg <= 0
        double const r = ((ah - kd * ln2_hi) - del) - kd * ln2_lo;
        double const r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
        double const g0 = ((1.0 + r) + r2 * (0.5 + r * (1.0 / 6))) +
                          r4 * ((1.0 / 24 + r * (1.0 / 120)) + r2 * (1.0 / 720 + r * (1.0 / 5040)));
        double const g1 = ((1.0 / 40320 + r * (1.0 / 362880)) + r2 * (1.0 / 3628800 + r * (1.0 / 39916800))) +
                          r4 * (1.0 / 479001600 + r * (1.0 / 6227020800.0));
        double const er = g0 + r8 * g1;
        u64 const k = bits(kd + shifter) - bits(shifter);  // kd + 1.5·2^52 holds k in its low bits
        double const scale = from_bits((k + bias) << 52);
        // (R e^r 2^(k+600)) is normal and exact to scale; × 2^-600 rounds once (into the
        // subnormals when the result is that small).
        double const erfc = ((er * (num / den)) * scale) * unscale;
        out[i] = sel(nan, zi, erfc * (2.0 - erfc));
    }
}

/// The body of every entry below: PP of n values (out may equal z; otherwise
/// they must not overlap).
template <std::size_t Block>
QKGEOM_ALWAYS_INLINE void batch_body(double const* z, double* out, std::size_t n) noexcept {
    static_assert(chunk % Block == 0);
    alignas(64) double zs[chunk + Block], zl[chunk + Block], ps[chunk + Block], pl[chunk + Block];
    std::uint32_t is[chunk], il[chunk];
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
        std::size_t const m = n - c0 < chunk ? n - c0 : chunk;
        std::size_t ns = 0, nl = 0;
        bool tail = false;
        for (std::size_t i = 0; i < m; ++i) {  // branch-free split
            double const v = z[c0 + i];
            double const x = std::abs(v) * inv_sqrt2;
            bool const small = x <= small_max;  // NaN: large
            tail |= x > 4.0;
            zs[ns] = v;
            zl[nl] = v;
            is[ns] = static_cast<std::uint32_t>(i);
            il[nl] = static_cast<std::uint32_t>(i);
            ns += small ? 1 : 0;
            nl += small ? 0 : 1;
        }
        for (std::size_t i = ns; i % Block != 0; ++i) zs[i] = 0.0;
        for (std::size_t i = nl; i % Block != 0; ++i) zl[i] = 1.0;
        for (std::size_t i = 0; i < ns; i += Block) block_small<Block>(zs + i, ps + i);
        if (tail) {
            for (std::size_t i = 0; i < nl; i += Block) block_large<true, Block>(zl + i, pl + i);
        } else {
            for (std::size_t i = 0; i < nl; i += Block) block_large<false, Block>(zl + i, pl + i);
        }
        double* o = out + c0;
        for (std::size_t i = 0; i < ns; ++i) o[is[i]] = ps[i];
        for (std::size_t i = 0; i < nl; ++i) o[il[i]] = pl[i];
    }
}

// GCC fuses a·b + c across statements (-ffp-contract=fast) wherever the
// function's ISA has FMA (avx512f does): not in these kernels (file header).
// The option belongs to the function the code ends up in, hence noinline: an
// entry is never merged into a caller compiled with contraction (it is one
// call per batch, and keeps the large body out of the callers).
#if defined(__GNUC__) && !defined(__clang__)
#define QKGEOM_DETAIL_VPP_NO_CONTRACT __attribute__((noinline, optimize("fp-contract=off")))
#elif defined(__clang__)
#define QKGEOM_DETAIL_VPP_NO_CONTRACT __attribute__((noinline))
#else
#define QKGEOM_DETAIL_VPP_NO_CONTRACT
#endif

/// The generic entry: the build's own ISA (SSE2 without -march).
QKGEOM_DETAIL_VPP_NO_CONTRACT inline void batch_generic(double const* z, double* out, std::size_t n) noexcept {
    batch_body<block>(z, out, n);
}
#if QKGEOM_SIMD_X86
/// AVX2 entry (ymm; "fma" is left out on purpose: no fused multiply–add).
QKGEOM_TARGET("avx2")
QKGEOM_DETAIL_VPP_NO_CONTRACT inline void batch_avx2(double const* z, double* out, std::size_t n) noexcept {
    batch_body<block>(z, out, n);
}
/// AVX-512 F entry (zmm).
QKGEOM_TARGET("avx512f")
QKGEOM_DETAIL_VPP_NO_CONTRACT inline void batch_avx512(double const* z, double* out, std::size_t n) noexcept {
    batch_body<block_wide>(z, out, n);
}
#endif
#undef QKGEOM_DETAIL_VPP_NO_CONTRACT

/// PP of n values with the kernel of one level (bit-identical results at
/// every level). Precondition: `level <= simd::detected()` (a wider level
/// faults on this CPU); on builds without dispatch every level runs the
/// generic kernel.
inline void batch_at(simd::isa level, double const* z, double* out, std::size_t n) noexcept {
#if QKGEOM_SIMD_X86
    switch (level) {
        case simd::isa::avx512: batch_avx512(z, out, n); return;
        case simd::isa::avx2: batch_avx2(z, out, n); return;
        case simd::isa::generic: break;
    }
#else
    (void)level;
#endif
    batch_generic(z, out, n);
}

/// PP of n values at `simd::active()` (out may equal z; otherwise they must
/// not overlap).
inline void batch(double const* z, double* out, std::size_t n) noexcept { batch_at(simd::active(), z, out, n); }

/// PP over arrays, vectorised (see the file header): within 1e-13 relative of
/// the scalar `pairwise_plasticity` (not bit-identical to it). `out` may be `z`
/// itself; otherwise the two must not overlap.
/// \throws std::invalid_argument when the spans differ in length.
inline void pairwise_plasticity(std::span<double const> z, std::span<double> out) {
    if (z.size() != out.size())
        fail_arg("qkgeom::detail::vpp::pairwise_plasticity", "output length differs from input length; output length",
                 out.size());
    batch(z.data(), out.data(), z.size());
}

}  // namespace vpp
}  // namespace detail

/// \brief Element-wise PP over arrays: exactly the scalar `pairwise_plasticity`
/// of each element. (The dense Gram path uses the vectorised
/// `detail::vpp::pairwise_plasticity`, equal to within 1e-13 relative.)
/// \param[in] z the inputs.
/// \param[out] out receives PP(z[i]) at index i.
/// \pre `out` is `z` itself or does not overlap it.
/// \throws std::invalid_argument when the spans differ in length.
/// \sa pairwise_plasticity(double)
inline void pairwise_plasticity(std::span<double const> z, std::span<double> out) {
    if (z.size() != out.size())
        detail::fail_arg("qkgeom::pairwise_plasticity", "output length differs from input length; output length",
                         out.size());
    for (std::size_t i = 0; i < z.size(); ++i) out[i] = pairwise_plasticity(z[i]);
}

}  // namespace qkgeom
