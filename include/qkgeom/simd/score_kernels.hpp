// qkgeom — the empirical cross-check's kernels (internal), method §6 / §9.14.
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
// (SIMD kernels live in include/qkgeom/simd/; the dispatch is qkgeom/simd/dispatch.hpp.)
//
// For one query bucket the check needs the scores q_r·k_c of the bucket's
// queries against every key that takes part in a pair, then, per evaluated
// pair (i, j), the number of queries with q·k_i > q·k_j. Both run here, in
// single precision for the product (the comparisons are certified in
// plasticity/empirical.hpp) at the widest instruction set `simd::active()`
// allows:
//
//   packed_queries   the bucket's queries, f32, in panels of P rows stored
//                    transposed (panel p: d × P, row l = coordinate l of the
//                    panel's P queries), rows past n zero
//   packed_keys      the scored keys, f32, in blocks of NB keys stored
//                    transposed (block b: d × NB), keys past n zero
//   score_product    S (column-major, leading dimension = padded query
//                    count, one column per key): the register-blocked
//                    product panel × block, P × NB accumulators held in
//                    vector registers across the whole d loop (AVX-512:
//                    P = 32, NB = 14, 28 zmm accumulators; AVX2: P = 16,
//                    NB = 6, 12 ymm), each score a plain d-term dot product.
//   count_wins       wins and undecided comparisons of one pair, the undecided
//                    queries returned as a bit mask.
//   panel_counts     the same comparisons for every pair of a query bucket
//                    against the scores of one query panel (P rows × every
//                    scored key, key-major, in L2): the query-blocked key
//                    form, which never writes the bucket's whole score matrix.
//   pair_counts      the fused pair-difference form: the same register block
//                    against columns kᵢ − kⱼ, each query's sign decided and
//                    counted in registers (no score matrix), undecided
//                    queries returned as bit masks.
//
// The generic level is not here: it keeps Eigen's f32 GEMM on unpacked
// matrices (plasticity/empirical.hpp).
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/simd/vec.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace qkgeom::detail::scores {

/// Rows per query panel and keys per key block of a level (generic: 1, unused).
struct blocking {
    index_t panel = 1;
    index_t block = 1;
};

[[nodiscard]] constexpr blocking blocking_of(simd::isa level) noexcept {
    switch (level) {
        case simd::isa::avx512: return {32, 14};
        case simd::isa::avx2: return {16, 6};
        default: return {1, 1};
    }
}

[[nodiscard]] constexpr index_t round_up(index_t n, index_t m) noexcept { return (n + m - 1) / m * m; }

/// Transposed panels of `width` rows: out[(p·d + l)·width + t] = x(p·width + t, l),
/// zero for rows ≥ n. `x(r, l)` is any callable returning the value as double
/// (rounded to float here).
template <class At>
void pack_transposed(At const& x, index_t n, index_t d, index_t width, std::vector<float>& out) {
    index_t const np = round_up(n, width) / width;
    out.assign(static_cast<std::size_t>(np * d * width), 0.0f);
    for (index_t p = 0; p < np; ++p) {
        index_t const r0 = p * width;
        index_t const m = n - r0 < width ? n - r0 : width;
        float* dst = out.data() + p * d * width;
        for (index_t l = 0; l < d; ++l)
            for (index_t t = 0; t < m; ++t) dst[l * width + t] = static_cast<float>(x(r0 + t, l));
    }
}

/// `pack_transposed` of n rows of a row-major matrix (row r at x + r·ld),
/// read row by row: the same `out`, bit for bit.
inline void pack_rows_transposed(double const* x, index_t ld, index_t n, index_t d, index_t width,
                                 std::vector<float>& out) {
    out.assign(static_cast<std::size_t>(round_up(n, width) * d), 0.0f);
    for (index_t r = 0; r < n; ++r) {
        double const* src = x + r * ld;
        float* dst = out.data() + (r / width) * d * width + r % width;
        for (index_t l = 0; l < d; ++l) dst[l * width] = static_cast<float>(src[l]);
    }
}

// --- entry points (defined below; in src/qkgeom_compiled.cpp with compiled kernels)

/// S = Q Kᵀ from packed operands (see the file header): `qp` holds
/// nq_pad / P panels, `kp` holds ceil(nk / NB) blocks, S is column-major with
/// leading dimension nq_pad = round_up(nq, P) and nk columns. Requires a
/// level > generic that the CPU supports.
QKGEOM_COMPILED_API void score_product(simd::isa level, float const* qp, index_t nq_pad,
                                       std::vector<float> const& kp, index_t nk, index_t d, float* s);

/// Certified counts over pair-difference columns (method §9.14), the fused
/// form of `score_product` + `count_wins` for buckets with fewer pairs than
/// keys: `qp` the packed queries (nq_pad / P panels), `qn` per query row an
/// upper bound of ‖q‖ in float (nq_pad entries, padding rows 0), `dp` the
/// packed difference columns (ceil(nc / NB) blocks), `kk` per column the
/// bound factor (float, rounded up; +inf: never decided), `ka` the absolute
/// term (a normal float). Adds to `wins[c]` the queries decided as
/// q·dᵢⱼ > 0 and writes `und[p·ldu + c]`, the bit mask of panel p's queries
/// left undecided for column c (bit t = row p·P + t). Requires a level >
/// generic that the CPU supports.
QKGEOM_COMPILED_API void pair_counts(simd::isa level, std::vector<float> const& qp, float const* qn, index_t nq,
                                     index_t nq_pad, float const* dp, float const* kk, float ka, index_t nc, index_t d,
                                     std::int32_t* wins, std::uint32_t* und, index_t ldu);

/// Wins and undecided comparisons of one pair (method §9.14), see
/// `empirical_wins`: a query is decided when |fl32(sᵢ − sⱼ)| exceeds the f32
/// threshold kk·‖q‖ + ka (kk, ‖q‖ and ka rounded up to float with slack, so
/// that a query decided here is decided by `decided` below too) and is
/// finite, and counts as a win when it is decided and sᵢ > sⱼ; NaN, ±∞ and
/// small differences are undecided.
struct counts {
    std::int64_t wins = 0;
    std::int64_t undecided = 0;
};

/// Words of the undecided bit mask of `count_wins` for n queries (bit r%32
/// of word r/32 is query r).
constexpr index_t mask_words(index_t n) noexcept { return (n + 31) / 32; }

/// The counts of one pair at `level` (`counts`; the f32 test of `count_body`
/// below) and, when `und` is not null, the mask of the undecided queries
/// (`mask_words(n)` words, all written; bits past n are 0). The mask and the
/// wins come from one computation: each query is either counted in `wins`
/// or set in `und`, never both. The dispatched levels write the mask in the
/// same pass; the generic level, when some query is undecided, makes a
/// second (scalar) pass whose wins and mask replace the first's.
QKGEOM_COMPILED_API counts count_wins(simd::isa level, float const* si, float const* sj, float const* qn, float kk,
                                      float ka, index_t n, std::uint32_t* und) noexcept;

/// One pair of the query-blocked key form: its two score columns (key
/// indices of the panel's score block) and its threshold factor kk as
/// `count_wins` takes it.
struct pair_columns {
    std::int32_t i = 0;
    std::int32_t j = 0;
    float kk = 0.0f;
};

/// A pair with undecided queries in one panel: the pair's index and the
/// panel's undecided queries (bit t = row t of the panel).
struct undecided_panel {
    std::int32_t pair = 0;
    std::uint32_t mask = 0;
};

/// The counts of `count_wins` for `npairs` pairs against one query panel:
/// `s` the panel's scores, key c at s[c·P … c·P + P) (P = blocking_of(level)
/// .panel; `score_product` with nq_pad = P writes that layout), `qn` the
/// panel's P query norms rounded up to float, `valid` its real rows (bit t =
/// row t). Adds the decided wins of pair k to wins[k] and appends each pair
/// with an undecided real query to `und`. The test of each query is
/// `count_wins`'s at the same level, bit for bit. Requires a level > generic
/// that the CPU supports.
QKGEOM_COMPILED_API void panel_counts(simd::isa level, float const* s, float const* qn, std::uint32_t valid,
                                      pair_columns const* pc, float ka, index_t npairs, std::int32_t* wins,
                                      std::vector<undecided_panel>& und);

/// One comparison decided by the scores, in double: |sᵢ − sⱼ| (exact in
/// double) > tol, the test the f32 counts are certified against (a query
/// they decide is decided by this test too; tests/runtime/plasticity_test.cpp).
QKGEOM_ALWAYS_INLINE bool decided(float si, float sj, double tol) noexcept {
    double const a = std::abs(double(si) - double(sj));  // the difference is exact in double
    return (a > tol) & (a < std::numeric_limits<double>::infinity());
}

#if QKGEOM_COMPILED_BODIES
#if QKGEOM_SIMD_X86

/// The register block of one query panel (32 rows) and one column block (14
/// columns): 28 zmm accumulators over the whole d loop.
QKGEOM_TARGET("avx512f")
QKGEOM_ALWAYS_INLINE void panel_block_avx512(float const* qp, float const* kb, index_t d, vx::f32x16 (&acc)[14][2]) {
    using V = vx::f32v16;
#pragma GCC unroll 14
    for (int j = 0; j < 14; ++j) acc[j][0] = acc[j][1] = V::zero();
    for (index_t l = 0; l < d; ++l) {
        V::type const a0 = V::loadu(qp + l * 32);
        V::type const a1 = V::loadu(qp + l * 32 + 16);
        float const* kl = kb + l * 14;
#pragma GCC unroll 14
        for (int j = 0; j < 14; ++j) {
            V::type const b = V::set1(kl[j]);
            acc[j][0] = V::fmadd(a0, b, acc[j][0]);
            acc[j][1] = V::fmadd(a1, b, acc[j][1]);
        }
    }
}

/// The same for AVX2 + FMA: 16 rows × 6 columns, 12 ymm accumulators.
QKGEOM_TARGET("avx2,fma")
QKGEOM_ALWAYS_INLINE void panel_block_avx2(float const* qp, float const* kb, index_t d, vx::f32x8 (&acc)[6][2]) {
    using V = vx::f32v8;
#pragma GCC unroll 6
    for (int j = 0; j < 6; ++j) acc[j][0] = acc[j][1] = V::zero();
    for (index_t l = 0; l < d; ++l) {
        V::type const a0 = V::loadu(qp + l * 16);
        V::type const a1 = V::loadu(qp + l * 16 + 8);
        float const* kl = kb + l * 6;
#pragma GCC unroll 6
        for (int j = 0; j < 6; ++j) {
            V::type const b = V::set1(kl[j]);
            acc[j][0] = vx::fmadd(a0, b, acc[j][0]);
            acc[j][1] = vx::fmadd(a1, b, acc[j][1]);
        }
    }
}

/// S(:, c0 .. c0+nvalid) for one query panel (32 rows) and one key block (14
/// keys).
QKGEOM_TARGET("avx512f")
inline void micro_avx512(float const* qp, float const* kb, index_t d, float* s, index_t lds, index_t nvalid) {
    vx::f32x16 acc[14][2];
    panel_block_avx512(qp, kb, d, acc);
#pragma GCC unroll 14
    for (int j = 0; j < 14; ++j) {
        if (j >= nvalid) break;
        vx::f32v16::storeu(s + j * lds, acc[j][0]);
        vx::f32v16::storeu(s + j * lds + 16, acc[j][1]);
    }
}

/// The same for AVX2 + FMA: 16 rows × 6 keys.
QKGEOM_TARGET("avx2,fma")
inline void micro_avx2(float const* qp, float const* kb, index_t d, float* s, index_t lds, index_t nvalid) {
    vx::f32x8 acc[6][2];
    panel_block_avx2(qp, kb, d, acc);
#pragma GCC unroll 6
    for (int j = 0; j < 6; ++j) {
        if (j >= nvalid) break;
        vx::f32v8::storeu(s + j * lds, acc[j][0]);
        vx::f32v8::storeu(s + j * lds + 8, acc[j][1]);
    }
}

/// Pair-difference columns (see `pair_counts`): the panel × block product of
/// the queries against 14 difference columns dᵢⱼ = kᵢ − kⱼ, then per column
/// the certified decision of every query in registers: threshold
/// t = qn_r·kk_c + ka (one FMA, rounded up by construction of the factors),
/// win when s > t, decided when s > t or s < −t; the undecided queries of
/// the panel (NaN included, padding rows masked out by `valid`) are
/// returned as a bit mask per column.
QKGEOM_TARGET("avx512f,popcnt")
inline void pair_micro_avx512(float const* qp, float const* qn, float const* db, float const* kk, float ka,
                              index_t d, std::uint32_t valid, std::int32_t* wins, std::uint32_t* und,
                              index_t nvalid) {
    using V = vx::f32v16;
    V::type acc[14][2];
    panel_block_avx512(qp, db, d, acc);
    V::type const n0 = V::loadu(qn), n1 = V::loadu(qn + 16), kav = V::set1(ka);
#pragma GCC unroll 14
    for (int j = 0; j < 14; ++j) {
        if (j >= nvalid) break;
        V::type const f = V::set1(kk[j]);
        V::type const t0 = V::fmadd(n0, f, kav), t1 = V::fmadd(n1, f, kav);
        vx::mask16 const w0 = V::gt(0xffffu, acc[j][0], t0);
        vx::mask16 const w1 = V::gt(0xffffu, acc[j][1], t1);
        vx::mask16 const l0 = V::lt(0xffffu, acc[j][0], V::negate(t0));
        vx::mask16 const l1 = V::lt(0xffffu, acc[j][1], V::negate(t1));
        std::uint32_t const won = std::uint32_t(w0) | (std::uint32_t(w1) << 16);
        std::uint32_t const lost = std::uint32_t(l0) | (std::uint32_t(l1) << 16);
        wins[j] += __builtin_popcount(won & valid);
        und[j] = ~(won | lost) & valid;
    }
}

/// The same for AVX2 + FMA: 16 rows × 6 difference columns.
QKGEOM_TARGET("avx2,fma,popcnt")
inline void pair_micro_avx2(float const* qp, float const* qn, float const* db, float const* kk, float ka, index_t d,
                            std::uint32_t valid, std::int32_t* wins, std::uint32_t* und, index_t nvalid) {
    using V = vx::f32v8;
    V::type acc[6][2];
    panel_block_avx2(qp, db, d, acc);
    V::type const n0 = V::loadu(qn), n1 = V::loadu(qn + 8), kav = V::set1(ka);
#pragma GCC unroll 6
    for (int j = 0; j < 6; ++j) {
        if (j >= nvalid) break;
        V::type const f = V::set1(kk[j]);
        V::type const t0 = vx::fmadd(n0, f, kav), t1 = vx::fmadd(n1, f, kav);
        std::uint32_t const w0 = V::bits(V::gt(acc[j][0], t0)), w1 = V::bits(V::gt(acc[j][1], t1));
        std::uint32_t const l0 = V::bits(V::lt(acc[j][0], V::negate(t0)));
        std::uint32_t const l1 = V::bits(V::lt(acc[j][1], V::negate(t1)));
        std::uint32_t const won = w0 | (w1 << 8), lost = l0 | (l1 << 8);
        wins[j] += __builtin_popcount(won & valid);
        und[j] = ~(won | lost) & valid;
    }
}

#endif  // QKGEOM_SIMD_X86

QKGEOM_COMPILED_API void score_product(simd::isa level, float const* qp, index_t nq_pad,
                                       std::vector<float> const& kp, index_t nk, index_t d, float* s) {
#if QKGEOM_SIMD_X86
    auto const [P, NB] = blocking_of(level);
    index_t const np = nq_pad / P;
    // Chunks of 252 keys (≈ 126 KiB at d = 128) stay in L2 while every query
    // panel (P·d floats, in L1) meets each of the chunk's key blocks in turn.
    index_t const chunk = 252;  // a multiple of both block widths
    for (index_t k0 = 0; k0 < nk; k0 += chunk) {
        index_t const k1 = nk - k0 < chunk ? nk : k0 + chunk;
        for (index_t p = 0; p < np; ++p) {
            float const* q = qp + p * d * P;
            for (index_t c0 = k0; c0 < k1; c0 += NB) {
                float const* kb = kp.data() + (c0 / NB) * d * NB;
                index_t const nvalid = nk - c0 < NB ? nk - c0 : NB;
                float* out = s + c0 * nq_pad + p * P;
                if (level == simd::isa::avx512) micro_avx512(q, kb, d, out, nq_pad, nvalid);
                else micro_avx2(q, kb, d, out, nq_pad, nvalid);
            }
        }
    }
#else
    (void)level, (void)qp, (void)nq_pad, (void)kp, (void)nk, (void)d, (void)s;
#endif
}

QKGEOM_COMPILED_API void pair_counts(simd::isa level, std::vector<float> const& qp, float const* qn, index_t nq,
                                     index_t nq_pad, float const* dp, float const* kk, float ka, index_t nc, index_t d,
                                     std::int32_t* wins, std::uint32_t* und, index_t ldu) {
#if QKGEOM_SIMD_X86
    auto const [P, NB] = blocking_of(level);
    index_t const np = nq_pad / P;
    index_t const chunk = 252;  // as in score_product
    for (index_t k0 = 0; k0 < nc; k0 += chunk) {
        index_t const k1 = nc - k0 < chunk ? nc : k0 + chunk;
        for (index_t p = 0; p < np; ++p) {
            float const* q = qp.data() + p * d * P;
            index_t const rows = nq - p * P < P ? nq - p * P : P;
            std::uint32_t const valid = rows >= 32 ? ~std::uint32_t(0) : (std::uint32_t(1) << rows) - 1u;
            for (index_t c0 = k0; c0 < k1; c0 += NB) {
                float const* db = dp + (c0 / NB) * d * NB;
                index_t const nvalid = nc - c0 < NB ? nc - c0 : NB;
                if (level == simd::isa::avx512)
                    pair_micro_avx512(q, qn + p * P, db, kk + c0, ka, d, valid, wins + c0, und + p * ldu + c0, nvalid);
                else
                    pair_micro_avx2(q, qn + p * P, db, kk + c0, ka, d, valid, wins + c0, und + p * ldu + c0, nvalid);
            }
        }
    }
#else
    (void)level, (void)qp, (void)qn, (void)nq, (void)nq_pad, (void)dp, (void)kk, (void)ka, (void)nc, (void)d,
        (void)wins, (void)und, (void)ldu;
#endif
}

/// The f32 test of one query at the generic level: |fl32(sᵢ − sⱼ)| above
/// the threshold kk·‖q‖ + ka and finite (see count_body).
QKGEOM_ALWAYS_INLINE bool f32_decided(float si, float sj, float qn, float kk, float ka) noexcept {
    float const a = std::abs(si - sj);
    return (a > kk * qn + ka) & (a < std::numeric_limits<float>::infinity());  // non-short-circuit: vectorisable
}

/// The counts in single precision (the generic level): `qn` the queries'
/// norms rounded up to float, `kk` and `ka` the pair's threshold factors as
/// float (empirical_wins). fl32(sᵢ − sⱼ) is within 2⁻²⁴ (relative) of the
/// exact difference and the threshold carries ≥ 2⁻²² of slack, so every query
/// decided here has |sᵢ − sⱼ| > tol in double: the decided set is a subset
/// of `decided`'s.
QKGEOM_ALWAYS_INLINE counts count_body(float const* si, float const* sj, float const* qn, float kk, float ka,
                                       index_t n) noexcept {
    std::int32_t wins = 0, undecided = 0;  // n < 2³¹ queries
    for (index_t r = 0; r < n; ++r) {
        bool const ok = f32_decided(si[r], sj[r], qn[r], kk, ka);
        wins += (ok & (si[r] > sj[r])) ? 1 : 0;  // non-short-circuit: the loop can vectorise (-O3)
        undecided += ok ? 0 : 1;
    }
    return {wins, undecided};
}

/// The generic counts with the undecided mask: count_body (which the
/// compiler may vectorise) and, when a query is undecided and a mask is
/// wanted, one scalar pass that decides each query once for both outputs.
inline counts count_generic(float const* si, float const* sj, float const* qn, float kk, float ka, index_t n,
                            std::uint32_t* und) noexcept {
    counts const c = count_body(si, sj, qn, kk, ka, n);
    if (und == nullptr) return c;
    std::fill(und, und + mask_words(n), 0u);
    if (c.undecided == 0) return c;
    counts out;
    for (index_t r = 0; r < n; ++r) {
        if (f32_decided(si[r], sj[r], qn[r], kk, ka)) {
            out.wins += si[r] > sj[r] ? 1 : 0;
        } else {
            ++out.undecided;
            und[r >> 5] |= 1u << (r & 31);
        }
    }
    return out;
}

#if QKGEOM_SIMD_X86
// The levels' counts with explicit vectors: GCC 12 does not vectorise
// count_body's loop at -O2 (its "very cheap" cost model refuses the
// remainder loop), which made the key form ~6× slower there than at -O3. The
// threshold is one FMA here (kk·‖q‖ + ka rounded once; count_body rounds twice
// unless the compiler contracts): either rounding is inside the 2⁻²¹ slack.
QKGEOM_TARGET("avx2,fma,popcnt")
inline counts count_avx2(float const* si, float const* sj, float const* qn, float kk, float ka, index_t n,
                         std::uint32_t* und) noexcept {
    using V = vx::f32v8;
    V::type const kkv = V::set1(kk), kav = V::set1(ka);
    V::type const inf = V::set1(std::numeric_limits<float>::infinity());
    if (und != nullptr) std::fill(und, und + mask_words(n), 0u);
    std::int64_t wins = 0, decided = 0;
    for (index_t r = 0; r < n; r += 8) {
        // the last block: masked loads (lanes past n read 0 and are not counted)
        vx::i32x8 const in = V::first(static_cast<int>(std::min<index_t>(n - r, 8)));
        V::type const a = V::maskload(si + r, in), b = V::maskload(sj + r, in);
        V::type const d = V::abs(V::sub(a, b));
        V::type const thr = vx::fmadd(kkv, V::maskload(qn + r, in), kav);
        V::type const ok = V::both(V::gt(d, thr), V::lt(d, inf));
        unsigned const inm = V::bits(in);
        unsigned const okm = V::bits(ok) & inm;
        unsigned const winm = V::bits(V::gt(a, b)) & okm;
        decided += __builtin_popcount(okm);
        wins += __builtin_popcount(winm);
        if (und != nullptr) und[r >> 5] |= (inm & ~okm) << (r & 31);
    }
    return {wins, n - decided};
}
QKGEOM_TARGET("avx512f,popcnt")
inline counts count_avx512(float const* si, float const* sj, float const* qn, float kk, float ka, index_t n,
                           std::uint32_t* und) noexcept {
    using V = vx::f32v16;
    V::type const kkv = V::set1(kk), kav = V::set1(ka);
    V::type const inf = V::set1(std::numeric_limits<float>::infinity());
    if (und != nullptr) std::fill(und, und + mask_words(n), 0u);
    std::int64_t wins = 0, decided = 0;
    for (index_t r = 0; r < n; r += 16) {
        auto const m = static_cast<vx::mask16>(n - r >= 16 ? 0xffffu : (1u << (n - r)) - 1u);
        V::type const a = V::maskz_loadu(m, si + r), b = V::maskz_loadu(m, sj + r);
        V::type const d = V::abs(V::sub(a, b));
        V::type const thr = V::fmadd(kkv, V::maskz_loadu(m, qn + r), kav);
        vx::mask16 const ok = V::lt(V::gt(m, d, thr), d, inf);
        decided += __builtin_popcount(ok);
        wins += __builtin_popcount(V::gt(ok, a, b));
        if (und != nullptr) und[r >> 5] |= static_cast<std::uint32_t>(m & ~ok & 0xffffu) << (r & 31);
    }
    return {wins, n - decided};
}
#endif

QKGEOM_COMPILED_API counts count_wins(simd::isa level, float const* si, float const* sj, float const* qn, float kk,
                                      float ka, index_t n, std::uint32_t* und) noexcept {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) return count_avx512(si, sj, qn, kk, ka, n, und);
    if (level == simd::isa::avx2) return count_avx2(si, sj, qn, kk, ka, n, und);
#endif
    (void)level;  // QKGEOM_NO_SIMD_DISPATCH: the generic kernel only
    return count_generic(si, sj, qn, kk, ka, n, und);
}

#if QKGEOM_SIMD_X86
// The panel kernels: count_avx512 / count_avx2's test (one FMA threshold,
// |a − b| above it and finite, win when decided and a > b) on one panel's
// two score columns per pair, read from the L2-resident panel block.
QKGEOM_TARGET("avx512f,popcnt")
inline void panel_counts_avx512(float const* s, float const* qn, std::uint32_t valid, pair_columns const* pc, float ka,
                                index_t npairs, std::int32_t* wins, std::vector<undecided_panel>& und) {
    using V = vx::f32v16;
    V::type const n0 = V::loadu(qn), n1 = V::loadu(qn + 16), kav = V::set1(ka);
    V::type const inf = V::set1(std::numeric_limits<float>::infinity());
    for (index_t k = 0; k < npairs; ++k) {
        float const* a = s + std::size_t(pc[k].i) * 32;
        float const* b = s + std::size_t(pc[k].j) * 32;
        V::type const a0 = V::loadu(a), a1 = V::loadu(a + 16);
        V::type const b0 = V::loadu(b), b1 = V::loadu(b + 16);
        V::type const f = V::set1(pc[k].kk);
        V::type const d0 = V::abs(V::sub(a0, b0)), d1 = V::abs(V::sub(a1, b1));
        V::type const t0 = V::fmadd(f, n0, kav), t1 = V::fmadd(f, n1, kav);
        vx::mask16 const ok0 = V::lt(V::gt(0xffffu, d0, t0), d0, inf);
        vx::mask16 const ok1 = V::lt(V::gt(0xffffu, d1, t1), d1, inf);
        vx::mask16 const w0 = V::gt(ok0, a0, b0);
        vx::mask16 const w1 = V::gt(ok1, a1, b1);
        std::uint32_t const ok = std::uint32_t(ok0) | (std::uint32_t(ok1) << 16);
        std::uint32_t const won = std::uint32_t(w0) | (std::uint32_t(w1) << 16);
        wins[k] += __builtin_popcount(won & valid);
        if (std::uint32_t const u = ~ok & valid; u != 0) und.push_back({static_cast<std::int32_t>(k), u});
    }
}

QKGEOM_TARGET("avx2,fma,popcnt")
inline void panel_counts_avx2(float const* s, float const* qn, std::uint32_t valid, pair_columns const* pc, float ka,
                              index_t npairs, std::int32_t* wins, std::vector<undecided_panel>& und) {
    using V = vx::f32v8;
    V::type const n0 = V::loadu(qn), n1 = V::loadu(qn + 8), kav = V::set1(ka);
    V::type const inf = V::set1(std::numeric_limits<float>::infinity());
    for (index_t k = 0; k < npairs; ++k) {
        float const* a = s + std::size_t(pc[k].i) * 16;
        float const* b = s + std::size_t(pc[k].j) * 16;
        V::type const a0 = V::loadu(a), a1 = V::loadu(a + 8);
        V::type const b0 = V::loadu(b), b1 = V::loadu(b + 8);
        V::type const f = V::set1(pc[k].kk);
        V::type const d0 = V::abs(V::sub(a0, b0)), d1 = V::abs(V::sub(a1, b1));
        V::type const t0 = vx::fmadd(f, n0, kav), t1 = vx::fmadd(f, n1, kav);
        V::type const ok0 = V::both(V::gt(d0, t0), V::lt(d0, inf)), ok1 = V::both(V::gt(d1, t1), V::lt(d1, inf));
        std::uint32_t const ok = V::bits(ok0) | (V::bits(ok1) << 8);
        std::uint32_t const gt = V::bits(V::gt(a0, b0)) | (V::bits(V::gt(a1, b1)) << 8);
        wins[k] += __builtin_popcount(gt & ok & valid);
        if (std::uint32_t const u = ~ok & valid; u != 0) und.push_back({static_cast<std::int32_t>(k), u});
    }
}
#endif

QKGEOM_COMPILED_API void panel_counts(simd::isa level, float const* s, float const* qn, std::uint32_t valid,
                                      pair_columns const* pc, float ka, index_t npairs, std::int32_t* wins,
                                      std::vector<undecided_panel>& und) {
#if QKGEOM_SIMD_X86
    if (level == simd::isa::avx512) panel_counts_avx512(s, qn, valid, pc, ka, npairs, wins, und);
    else panel_counts_avx2(s, qn, valid, pc, ka, npairs, wins, und);
#else
    (void)level, (void)s, (void)qn, (void)valid, (void)pc, (void)ka, (void)npairs, (void)wins, (void)und;
#endif
}

#endif  // QKGEOM_COMPILED_BODIES

}  // namespace qkgeom::detail::scores
