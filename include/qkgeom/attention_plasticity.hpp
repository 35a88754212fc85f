// qkgeom — attention plasticity: the Gaussian closed form per key pair and
// query bucket (method §5) and its aggregation into cells, profiles, AP_drop,
// quantile profiles, the 2D heatmap and the empirical cross-check (method §6;
// thesis §4.4).
//
// For a query bucket b with rotated-basis mean w_b = [α_pos + β_pos τ_b, μ_b]
// and variances V_b = diag(σ²_pos, σ²_b) (or blockdiag(σ²_pos, Σ_b)), and a
// key pair (i, j) with rotated keys k̃ = H k:
//   m = w_b·(k̃_i − k̃_j) = s_i − s_j,        s_i = w_b·k̃_i
//   v = (k̃_i − k̃_j)ᵀ V_b (k̃_i − k̃_j) = n_i + n_j − 2 g_ij,  g_ij = k̃_iᵀ V_b k̃_j
//   PP = 4 Φ(−|z|)(1 − Φ(−|z|)),  z = m/√v
// Small groups of keys are evaluated pair by pair ("direct"); groups with at
// least `dense_min_keys` keys form the weighted Gram matrix G = K̃ V_b K̃ᵀ
// tile by tile (GEMM) followed by an element-wise Φ ("dense"); both give the
// same PP to rounding (tested to 1e-12).
#pragma once

#include <qkgeom/buckets.hpp>
#include <qkgeom/config.hpp>
#include <qkgeom/detail/score_kernels.hpp>
#include <qkgeom/detail/stats.hpp>
#include <qkgeom/errors.hpp>
#include <qkgeom/gaussian.hpp>
#include <qkgeom/householder.hpp>
#include <qkgeom/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define QKGEOM_DETAIL_SSE2 1
#endif

namespace qkgeom {

/// \brief Which key pairs a query bucket is evaluated on (method §6).
enum class pair_policy {
    same_bucket,  ///< default: pairs of one example's keys in one earlier bucket c; a cell per (b, c)
    prefix,       ///< pairs of one example's keys anywhere in the earlier buckets (thesis' pooled prefix)
};

/// \brief How AP_overall weights the query buckets (method §6).
enum class ap_weighting {
    query_count,  ///< default: w_b = number of queries in bucket b
    cell_mean,    ///< plain mean over the non-empty cells (as the prior tool did)
};

/// \brief Exact enumeration of every admissible pair, or seeded sampling.
enum class enumeration_policy {
    automatic,  ///< exact when the head's admissible pair count ≤ max_exact_pairs, else sampled
    exact,
    sampled,
};

/// \brief How the empirical cross-check (method §9.14) forms its
/// single-precision products: a speed choice only, the counts are the same
/// (docs/plasticity.md, "How the counts are computed").
enum class empirical_columns {
    automatic,  ///< pair differences for a query bucket with no more pairs than scored keys, else keys
    keys,       ///< score every key that takes part in a pair, then compare pairs of scores
    pairs,      ///< one column kᵢ − kⱼ per pair wherever that form applies (see docs)
};

/// \brief Bin edges of the 2D heatmap (method §6, §9.13): half-open bins
/// [e_j, e_{j+1}), the last one closed. Empty = 16 equal bins over [0, L]
/// (distance) and [−L, L] (offset), L the context length.
struct heatmap_grid {
    std::vector<double> distance_edges;  ///< inter-key distance |t_i − t_j|
    std::vector<double> offset_edges;    ///< query-to-midpoint distance τ_b − (t_i + t_j)/2
};

/// \brief Options of `attention_plasticity` (defaults are the thesis').
struct plasticity_options {
    pair_policy pairs = pair_policy::same_bucket;
    ap_weighting weighting = ap_weighting::query_count;
    enumeration_policy enumeration = enumeration_policy::automatic;
    std::int64_t max_exact_pairs = 4'000'000;  ///< automatic: exact up to this many (query bucket, pair) evaluations
    std::int64_t samples_per_cell = 2000;      ///< sampled: pairs drawn per cell
    std::uint64_t seed = 0;                    ///< sampled: seed (a cell's draws depend on (seed, b, c) only)
    std::int64_t sliding_window = 0;           ///< attention span in tokens; 0 = full attention
    std::optional<bucket_spec> buckets;        ///< scheme of the capture: validates buckets, converts the window
    std::int64_t context_length = 0;           ///< L; 0 = max position over queries and keys + 1 (method §9.12)
    heatmap_grid heatmap{};
    index_t dense_min_keys = 48;  ///< groups with at least this many keys use the Gram (GEMM) path
    index_t tile_keys = 256;      ///< Gram tile edge: memory stays O(tile² + group·d)
    empirical_columns empirical = empirical_columns::automatic;  ///< the check's product form (same counts)
};

/// \brief One (query bucket, key bucket) cell: a row of head_bucket_plasticity.csv.
/// For `prefix` there is one cell per query bucket, with k_bucket = −1.
struct plasticity_cell {
    std::int64_t q_bucket = 0;
    std::int64_t k_bucket = 0;
    double plasticity = detail::nan;  ///< mean PP over the evaluated pairs (NaN when n_pairs = 0)
    std::int64_t n_pairs = 0;         ///< evaluated pairs (v > 0)
    double std_error = 0.0;           ///< sampled: sd(PP)/√n (method §9.16); exact: 0
    double empirical = detail::nan;   ///< mean unbiased 4p̂(1−p̂)n/(n−1) over the same pairs (needs queries)
};

/// \brief One query bucket of the plasticity profile.
struct plasticity_bucket {
    std::int64_t q_bucket = 0;
    std::int64_t n_queries = 0;        ///< w_b
    double tau = detail::nan;          ///< τ_b, exact mean query position
    double ap = detail::nan;           ///< AP_b (NaN: no non-empty cell; excluded everywhere)
    double ap_empirical = detail::nan; ///< the same aggregate of the empirical values
    double std_error = 0.0;            ///< sampled: standard error of AP_b
    std::int64_t n_pairs = 0;
    std::int64_t n_cells = 0;          ///< non-empty cells
    int quintile = 0;                  ///< ⌊5 τ_b / L⌋, clipped to 4
    int decile = 0;                    ///< ⌊10 τ_b / L⌋, clipped to 9
};

/// \brief The 2D heatmap: sum and count of PP per (distance, offset) bin.
struct plasticity_heatmap {
    std::vector<double> distance_edges, offset_edges;
    Eigen::MatrixXd sum;                                           ///< distance bins × offset bins
    Eigen::Matrix<std::int64_t, Eigen::Dynamic, Eigen::Dynamic> count;
    std::int64_t n_outside = 0;  ///< points outside the grid: counted, not binned
};

/// \brief Result of the plasticity analysis of one head (method §6); scalar
/// fields are columns of head_metrics.csv.
struct plasticity_result {
    std::vector<plasticity_cell> cells;      ///< non-empty and empty cells, ascending (q_bucket, k_bucket)
    std::vector<plasticity_bucket> profile;  ///< ascending q_bucket (buckets with a model)
    double ap_overall = detail::nan;
    double ap_first_20pct = detail::nan;
    double ap_last_20pct = detail::nan;
    double ap_drop = detail::nan;  ///< ap_first_20pct − ap_last_20pct
    std::array<double, 5> ap_quintile{detail::nan, detail::nan, detail::nan, detail::nan, detail::nan};
    std::array<double, 10> ap_decile{};
    double gaussian_gap = detail::nan;  ///< mean |AP_b − AP_b,empirical| (needs queries)
    plasticity_heatmap heatmap;
    std::int64_t n_pairs = 0;                ///< evaluated (query bucket, pair) evaluations
    std::int64_t n_pairs_skipped = 0;        ///< pairs with v ≤ 0 (identical keys), not averaged (method §9.9)
    std::int64_t n_query_buckets_skipped = 0;  ///< no earlier key bucket, or no bucket model
    bool sampled = false;
    std::int64_t context_length = 0;  ///< L used for the quantiles
};

namespace detail {

/// The keys of one head, rotated (k̃ = H k) and in the original basis, with
/// their integer annotations.
struct key_store {
    index_t d = 0;
    Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rot, orig;
    std::vector<std::int64_t> position, bucket, example;
};

/// Query rows of one bucket (original basis), for the empirical cross-check.
using query_rows = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The first token position of a bucket (for the sliding window).
inline std::int64_t bucket_first_position(bucket_spec const& s, std::int64_t b) {
    if (s.scheme == bucket_scheme::log) {
        std::int64_t const i_min = ceil_log2(static_cast<std::uint64_t>(s.width));
        return b <= i_min ? 0 : (std::int64_t{1} << b) - 1;
    }
    return b * s.width;
}
/// The last token position of a bucket.
inline std::int64_t bucket_last_position(bucket_spec const& s, std::int64_t b) {
    if (s.scheme == bucket_scheme::log) return (std::int64_t{1} << (b + 1)) - 2;
    return (b + 1) * s.width - 1;
}

/// Is key bucket c < b inside the window of query bucket b? Uniform/all:
/// c ≥ b − span, span = max(1, ⌈W/B⌉) (method §6). Log: the bucket's last
/// position reaches the query bucket's first position minus W (which is the
/// same rule for uniform buckets).
inline bool in_window(plasticity_options const& o, std::int64_t b, std::int64_t c) {
    if (o.sliding_window <= 0) return true;
    bucket_spec const& s = *o.buckets;
    if (s.scheme != bucket_scheme::log) {
        std::int64_t const span = std::max<std::int64_t>(1, (o.sliding_window + s.width - 1) / s.width);
        return c >= b - span;
    }
    return bucket_last_position(s, c) >= bucket_first_position(s, b) - o.sliding_window;
}

/// ⌊k·τ_b/L⌋ in integer arithmetic (method §9.12): τ_b = S/n with S integer.
inline int quantile_of(double tau, std::int64_t n, std::int64_t L, int k) {
    auto const S = static_cast<std::int64_t>(std::llround(tau * static_cast<double>(n)));
    long double const q = static_cast<long double>(k) * static_cast<long double>(S) /
                          (static_cast<long double>(n) * static_cast<long double>(L));
    std::int64_t num = 0;
    bool const exact = S <= std::numeric_limits<std::int64_t>::max() / k && n <= std::numeric_limits<std::int64_t>::max() / L;
    if (exact) {
        num = (static_cast<std::int64_t>(k) * S) / (n * L);
    } else {
        num = static_cast<std::int64_t>(std::floor(q));
    }
    return static_cast<int>(std::clamp<std::int64_t>(num, 0, k - 1));
}

/// Accumulates one cell.
struct cell_acc {
    double sum = 0, sumsq = 0, emp_sum = 0;
    std::int64_t n = 0, emp_n = 0;
};

/// Everything one query bucket needs to evaluate pairs.
struct bucket_eval {
    Eigen::VectorXd w;     ///< rotated mean
    Eigen::VectorXd var;   ///< diag variances (diag / global_linear)
    Eigen::MatrixXd V;     ///< full: d × d blockdiag(σ²_pos, Σ_b); empty otherwise
    double tau = nan;
    query_rows const* queries = nullptr;  ///< original-basis queries of the bucket (≥ 2 rows) or null
    double emp_scale = 1.0;               ///< n/(n−1)
    /// Scores q·k of the bucket's queries (rows 0 … nq−1; more rows may be
    /// padding) against every key that takes part in a pair (columns), one
    /// single-precision product per query bucket (`detail::scores`);
    /// `column[i]` is key i's column (−1: not scored). See `empirical_wins`.
    Eigen::MatrixXf scores;
    index_t nq = 0;           ///< the bucket's query count
    simd::isa level = simd::isa::generic;  ///< kernels' instruction set
    Eigen::VectorXd q_norm;   ///< ‖q_r‖ (original basis), per query row
    Eigen::VectorXd k_norm;   ///< ‖k‖ per score column
    double score_err = 0.0;   ///< certified bound: |fl32(q·k) − q·k| <= score_err·‖q‖‖k‖ + score_abs
    double score_abs = 0.0;   ///< absolute part of the bound (underflow), see f32_dot_abs_error
    /// Original-basis key rows (double): score column c is row (*scored)[c] (exact fallback).
    Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> const* k_orig = nullptr;
    std::vector<index_t> const* scored = nullptr;
    std::vector<index_t> const* column = nullptr;
    /// Pair-difference form (`empirical_columns`): the bucket's pairs in
    /// evaluation order (padding {−1, −1}) and their counted wins.
    std::vector<std::array<index_t, 2>> const* pair_keys = nullptr;
    std::vector<std::int32_t> const* pair_wins = nullptr;
};

/// Certified error factor of a single-precision dot product of length d whose
/// operands were rounded from double: each operand carries a relative
/// rounding u = 2⁻²⁴, the products and the sum (any order, FMA or not) at
/// most γ_d; so |fl32(q·k) − q·k| <= γ_{d+3} Σ|q_l k_l| <= γ_{d+3} ‖q‖‖k‖,
/// γ_n = n u/(1 − n u), plus the absolute term `f32_dot_abs_error` when a
/// product or partial sum is subnormal. Valid while every operand is zero or
/// a normal float and nothing overflows (`f32_certifiable`). The factor
/// 1 + 2⁻³⁰ covers the double rounding of the norms and of the bound itself
/// (relative ≈ d·2⁻⁵³).
inline double f32_dot_error_factor(index_t d) {
    double const u = 0x1p-24, nu = double(d + 3) * u;
    return nu / (1.0 - nu) * (1.0 + 0x1p-30);
}

/// Absolute part of the bound: each of the d multiply–adds may round a
/// subnormal result by at most 2⁻¹⁵⁰ (half the smallest subnormal).
inline double f32_dot_abs_error(index_t d) { return double(d + 3) * 0x1p-149; }

/// Error factor of a double-precision dot product of length d (any order,
/// FMA or not): |fl64(q·k) − q·k| <= γ_{d+3}‖q‖‖k‖ with u = 2⁻⁵³. The
/// pair-difference form adds it so that a decided query is also decided the
/// same way by the double-precision scores of the fallback.
inline double f64_dot_error_factor(index_t d) {
    double const nu = double(d + 3) * 0x1p-53;
    return nu / (1.0 - nu) * (1.0 + 0x1p-30);
}

/// Absolute term of the pair-difference form's threshold: (d + 3)·2⁻¹²⁵, a
/// normal float that covers a subnormal product or partial sum even when
/// the FPU flushes them to zero (FTZ/DAZ, e.g. -ffast-math).
inline float f32_pair_abs_error(index_t d) { return static_cast<float>(double(d + 3) * 0x1p-125); }

/// The smallest float ≥ x, at least the smallest normal float (so the value
/// is never flushed by DAZ); +inf for NaN and x beyond the float range.
inline float float_up(double x) {
    if (!(x <= double(std::numeric_limits<float>::max()))) return std::numeric_limits<float>::infinity();
    auto f = static_cast<float>(x);
    if (double(f) < x) f = std::nextafter(f, std::numeric_limits<float>::infinity());
    return std::max(f, std::numeric_limits<float>::min());
}

/// Whether single-precision scores of these rows can be certified: every
/// nonzero |x| ≥ 2⁻¹²⁶ (f32 rounding is then relative) and
/// d·max|q|·max|k| ≤ 2¹²⁶ (no partial sum overflows). Otherwise every
/// comparison goes to the double-precision fallback.
struct f32_range {
    double min_nonzero = std::numeric_limits<double>::infinity();
    double max_abs = 0.0;
    /// Folds in n finite values (validated by the caller).
    void add(double const* p, index_t count) {
        constexpr double inf = std::numeric_limits<double>::infinity();
        double lo = min_nonzero, hi = max_abs;
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
        min_nonzero = lo;
        max_abs = hi;
    }
};
inline bool f32_certifiable(f32_range const& q, f32_range const& k, index_t d) {
    return q.min_nonzero >= 0x1p-126 && k.min_nonzero >= 0x1p-126 &&
           double(d) * q.max_abs * k.max_abs <= 0x1p126;
}

/// method §9.14: the number of the bucket's queries r with q_r·k_i > q_r·k_j.
/// The single-precision scores decide every query whose score difference
/// exceeds the certified error bound of both scores; the (rare) undecided
/// ones are recomputed in double from the original rows, so the count is that
/// of double-precision scores (ties within double rounding aside).
inline std::int64_t empirical_wins(bucket_eval const& e, index_t ci, index_t cj) {
    index_t const nq = e.nq;
    float const* si = e.scores.col(ci).data();
    float const* sj = e.scores.col(cj).data();
    double const* qn = e.q_norm.data();
    double const kk = e.score_err * (e.k_norm(ci) + e.k_norm(cj));
    double const ka = 2.0 * e.score_abs;
    auto const [wins0, undecided] = scores::count_wins(e.level, si, sj, qn, kk, ka, nq);
    if (undecided == 0) return wins0;
    // Recount every query with one decision function here (the dispatched
    // kernel may round its bound differently, e.g. with an FMA: each is
    // certified, but a query must not be counted by both).
    auto const& sc = *e.scored;
    auto const ki = e.k_orig->row(sc[static_cast<std::size_t>(ci)]), kj = e.k_orig->row(sc[static_cast<std::size_t>(cj)]);
    std::int64_t wins = 0;
    for (index_t r = 0; r < nq; ++r) {
        if (scores::decided(si[r], sj[r], kk * qn[r] + ka)) {
            wins += si[r] > sj[r] ? 1 : 0;
        } else {
            auto const q = e.queries->row(r);
            wins += q.dot(ki) > q.dot(kj) ? 1 : 0;
        }
    }
    return wins;
}

class pair_evaluator {
public:
    pair_evaluator(key_store const& keys, plasticity_heatmap& hm, std::int64_t& skipped)
        : k_(keys), hm_(hm), skipped_(skipped), dist_(hm.distance_edges), offs_(hm.offset_edges) {}

    /// The closed form of one pair, direct path. Returns false (and counts it)
    /// when the keys are identical (v ≤ 0).
    /// Identical keys give v = 0 and are skipped by the same test as v < 0.
    bool pp_direct(bucket_eval const& e, index_t i, index_t j, double& pp) {
        double m = 0, v = 0;
        if (e.V.size() != 0) {
            auto& delta = delta_;  // member scratch: no allocation per pair
            delta = (k_.rot.row(i) - k_.rot.row(j)).transpose();
            m = e.w.dot(delta);
            vdelta_.noalias() = e.V * delta;
            v = delta.dot(vdelta_);
        } else {
            // m = w·δ and v = Σ var_l δ_l² in one pass, δ never stored
            double const* a = k_.rot.row(i).data();
            double const* b = k_.rot.row(j).data();
            double const* w = e.w.data();
            double const* s2 = e.var.data();
            index_t const d = k_.d;
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
        }
        if (!(v > 0)) return false;
        pp = pairwise_plasticity(m / std::sqrt(v));
        return true;
    }

    /// Record an evaluated pair: cell accumulators, heatmap, empirical value.
    void record(bucket_eval const& e, index_t i, index_t j, double pp, cell_acc& acc) {
        acc.sum += pp;
        acc.sumsq += pp * pp;
        ++acc.n;
        double const ti = static_cast<double>(k_.position[static_cast<std::size_t>(i)]);
        double const tj = static_cast<double>(k_.position[static_cast<std::size_t>(j)]);
        bin(std::abs(ti - tj), e.tau - 0.5 * (ti + tj), pp);
        if (e.queries == nullptr) return;
        // method §9.14: the fraction of the bucket's queries whose score for key i
        // is strictly larger than for key j (original basis).
        index_t const nq = e.nq;
        std::int64_t wins = 0;
        if (e.pair_wins != nullptr) {
            wins = paired_wins(e, i, j);
        } else {
            index_t const ci = (*e.column)[static_cast<std::size_t>(i)], cj = (*e.column)[static_cast<std::size_t>(j)];
            wins = empirical_wins(e, ci, cj);
        }
        double const p = static_cast<double>(wins) / static_cast<double>(nq);
        acc.emp_sum += 4.0 * p * (1.0 - p) * e.emp_scale;
        ++acc.emp_n;
    }

    void skip() { ++skipped_; }

    /// A new query bucket: its pair list (if any) is read from the start.
    void begin_bucket() { cursor_ = 0; }

    /// Dense path without the empirical check: the pairs (i_a, j), a < n, in
    /// order, skipping those with skip[a] ≠ 0; t_i[a] and t_j are the keys'
    /// positions. The same additions in the same order as `record` pair by pair
    /// (bit-identical), with the running sums and heatmap bin in registers.
    void record_column(bucket_eval const& e, double const* t_i, double t_j, double const* pp,
                       unsigned char const* skip, index_t n, cell_acc& acc) {
        double sum = acc.sum, sumsq = acc.sumsq;
        std::int64_t cnt = 0, outside = 0, hc = 0;
        index_t hx = -1, hy = -1, cur_x = -1, cur_y = -1;
        double hs = 0;
        for (index_t a = 0; a < n; ++a) {
            if (skip[a] != 0) continue;
            double const p = pp[a];
            sum += p;
            sumsq += p * p;
            ++cnt;
            double const ti = t_i[a];
            index_t const bx = dist_.locate_hint(std::abs(ti - t_j), hx);
            index_t const by = offs_.locate_hint(e.tau - 0.5 * (ti + t_j), hy);
            if (bx < 0 || by < 0) {
                ++outside;
                continue;
            }
            hx = bx;
            hy = by;
            if (bx != cur_x || by != cur_y) {
                if (cur_x >= 0) {
                    hm_.sum(cur_x, cur_y) = hs;
                    hm_.count(cur_x, cur_y) += hc;
                }
                cur_x = bx;
                cur_y = by;
                hs = hm_.sum(bx, by);
                hc = 0;
            }
            hs += p;
            ++hc;
        }
        if (cur_x >= 0) {
            hm_.sum(cur_x, cur_y) = hs;
            hm_.count(cur_x, cur_y) += hc;
        }
        acc.sum = sum;
        acc.sumsq = sumsq;
        acc.n += cnt;
        hm_.n_outside += outside;
    }

private:
    /// The counted wins of pair (i, j) in the pair-difference form. Pairs are
    /// recorded in the order they were listed (pairs of identical keys are
    /// listed but never recorded, so they are passed over).
    std::int64_t paired_wins(bucket_eval const& e, index_t i, index_t j) {
        auto const& keys = *e.pair_keys;
        while (cursor_ < keys.size() && !(keys[cursor_][0] == i && keys[cursor_][1] == j)) ++cursor_;
        if (cursor_ == keys.size())
            throw std::logic_error("qkgeom::attention_plasticity: internal error: pair " + std::to_string(i) + ", " +
                                   std::to_string(j) + " is not in the empirical check's pair list");
        return (*e.pair_wins)[cursor_++];
    }

    /// Bin lookup on a grid of edges (half-open bins, the last one closed;
    /// method §9.13). Equally spaced grids (the default) take a first guess by
    /// arithmetic and correct it against the stored edges, so the result is
    /// exactly that of a binary search; other grids use the binary search.
    struct grid {
        std::vector<double> const& e;
        double lo = 0, scale = 0;
        bool uniform = false;
        explicit grid(std::vector<double> const& edges) : e(edges) {
            if (e.size() < 2) return;
            auto const bins = static_cast<double>(e.size() - 1);
            lo = e.front();
            scale = bins / (e.back() - e.front());
            uniform = std::isfinite(scale);
        }
        [[nodiscard]] index_t locate(double v) const {
            if (e.size() < 2 || !(v >= e.front()) || !(v <= e.back())) return -1;
            auto const last = static_cast<index_t>(e.size()) - 2;
            if (v == e.back()) return last;  // last bin closed
            if (!uniform) {
                auto const it = std::upper_bound(e.begin(), e.end(), v);
                return static_cast<index_t>(it - e.begin()) - 1;
            }
            auto j = static_cast<index_t>((v - lo) * scale);
            j = std::clamp<index_t>(j, 0, last);
            while (j > 0 && v < e[static_cast<std::size_t>(j)]) --j;
            while (j < last && v >= e[static_cast<std::size_t>(j + 1)]) ++j;
            return j;
        }
        /// `locate(v)`, trying bin h (≥ 0) first.
        [[nodiscard]] index_t locate_hint(double v, index_t h) const {
            if (h >= 0 && v >= e[static_cast<std::size_t>(h)] && v < e[static_cast<std::size_t>(h + 1)]) return h;
            return locate(v);
        }
    };

    void bin(double x, double y, double pp) {
        index_t const a = dist_.locate(x), c = offs_.locate(y);
        if (a < 0 || c < 0) {
            ++hm_.n_outside;
            return;
        }
        hm_.sum(a, c) += pp;
        ++hm_.count(a, c);
    }

    key_store const& k_;
    plasticity_heatmap& hm_;
    std::int64_t& skipped_;
    grid dist_, offs_;
    Eigen::VectorXd delta_, vdelta_;
    std::size_t cursor_ = 0;
};

/// The weighted Gram matrix of one dense group of rotated keys K̃ (m × d) for
/// one query bucket (method §5): s = K̃ w, B = K̃ V, n_i = (B ⊙ K̃) 1, and
/// G = B K̃ᵀ formed tile by tile (GEMM), so memory stays O(tile² + m·d).
struct dense_group {
    Eigen::MatrixXd const& K;
    Eigen::VectorXd s, nrm;
    Eigen::MatrixXd B, G;

    /// `V` non-empty: full model (d × d); otherwise the diagonal `var`.
    dense_group(Eigen::MatrixXd const& keys, Eigen::VectorXd const& w, Eigen::VectorXd const& var,
                Eigen::MatrixXd const& V)
        : K(keys) {
        s.noalias() = K * w;
        if (V.size() != 0) B.noalias() = K * V;
        else B = K * var.asDiagonal();
        nrm = (B.array() * K.array()).rowwise().sum();
    }

    /// Calls f(a0, na, b0, nb, G) for every tile of the upper triangle
    /// (b0 >= a0): G(a, b) = g_{a0+a, b0+b}. Diagonal tiles hold both triangles.
    template <class F>
    void for_each_tile(index_t tile, F&& f) {
        index_t const m = K.rows();
        index_t const T = std::max<index_t>(1, tile);
        for (index_t a0 = 0; a0 < m; a0 += T) {
            index_t const na = std::min(T, m - a0);
            for (index_t b0 = a0; b0 < m; b0 += T) {
                index_t const nb = std::min(T, m - b0);
                G.noalias() = B.middleRows(a0, na) * K.middleRows(b0, nb).transpose();
                f(a0, na, b0, nb, static_cast<Eigen::MatrixXd const&>(G));
            }
        }
    }
};

/// All pairs of one group of keys (indices `idx`, one example) for one query
/// bucket, exactly. Dense groups use the tiled Gram path.
inline void evaluate_group_exact(pair_evaluator& ev, key_store const& k, bucket_eval const& e,
                                 std::vector<index_t> const& idx, cell_acc& acc, plasticity_options const& o) {
    auto const m = static_cast<index_t>(idx.size());
    if (m < 2) return;
    auto record = [&](index_t a, index_t b, double pp) {
        ev.record(e, idx[static_cast<std::size_t>(a)], idx[static_cast<std::size_t>(b)], pp, acc);
    };
    if (m < o.dense_min_keys) {
        for (index_t a = 0; a < m; ++a)
            for (index_t b = a + 1; b < m; ++b) {
                double pp = 0;
                if (ev.pp_direct(e, idx[static_cast<std::size_t>(a)], idx[static_cast<std::size_t>(b)], pp))
                    record(a, b, pp);
                else
                    ev.skip();
            }
        return;
    }
    // Dense path (method §5 exactness identity): s = K̃ w, B = K̃ V, n_i = (B ⊙ K̃) 1, G = B K̃ᵀ per tile.
    Eigen::MatrixXd K(m, k.d);
    for (index_t a = 0; a < m; ++a) K.row(a) = k.rot.row(idx[static_cast<std::size_t>(a)]);
    dense_group g(K, e.w, e.var, e.V);
    // The Φ pass reads each Gram tile column by column (contiguous): pair
    // (a, b) of the group with a < b, b in the column's key block. Per column:
    // z into a buffer, PP in one batched (vectorised) call, the rare pairs of
    // (near-)identical keys by the direct path, then the pairs are recorded in
    // the same order as one by one (same sums in the same order).
    auto const T = static_cast<std::size_t>(std::max<index_t>(1, o.tile_keys));
    std::vector<double> zbuf(T), ppbuf(T), tpos(static_cast<std::size_t>(m));
    std::vector<unsigned char> skip(T);
    for (std::size_t a = 0; a < tpos.size(); ++a)
        tpos[a] = static_cast<double>(k.position[static_cast<std::size_t>(idx[a])]);
    bool const empirical = e.queries != nullptr;
    g.for_each_tile(o.tile_keys, [&](index_t a0, index_t na, index_t b0, index_t nb, Eigen::MatrixXd const& G) {
        double const* nrm = g.nrm.data() + a0;
        double const* sa = g.s.data() + a0;
        double* const z = zbuf.data();
        for (index_t b = 0; b < nb; ++b) {
            index_t const ib = b0 + b;
            double const nb_ = g.nrm(ib), sb = g.s(ib);
            double const* col = G.col(b).data();
            index_t const a_end = (b0 == a0) ? b : na;
            if (a_end == 0) continue;
            // z = (s_a − s_b)/√v, v = n_a + n_b − 2 g_ab (v ≤ 0 gives ±inf/NaN: such pairs go direct below).
            index_t a = 0;
#ifdef QKGEOM_DETAIL_SSE2
            __m128d const nbv = _mm_set1_pd(nb_), sbv = _mm_set1_pd(sb), two = _mm_set1_pd(2.0);
            for (; a + 2 <= a_end; a += 2) {
                __m128d const v =
                    _mm_sub_pd(_mm_add_pd(_mm_loadu_pd(nrm + a), nbv), _mm_mul_pd(two, _mm_loadu_pd(col + a)));
                __m128d const d = _mm_sqrt_pd(_mm_max_pd(v, _mm_setzero_pd()));
                _mm_storeu_pd(z + a, _mm_div_pd(_mm_sub_pd(_mm_loadu_pd(sa + a), sbv), d));
            }
#endif
            for (; a < a_end; ++a) {
                double const v = nrm[a] + nb_ - 2.0 * col[a];
                z[a] = (sa[a] - sb) / std::sqrt(v > 0.0 ? v : 0.0);
            }
            auto const n = static_cast<std::size_t>(a_end);
            vpp::pairwise_plasticity(std::span<double const>(z, n), std::span<double>(ppbuf.data(), n));
            for (a = 0; a < a_end; ++a) {
                double const v = nrm[a] + nb_ - 2.0 * col[a];
                skip[static_cast<std::size_t>(a)] = 0;
                // method §9.9: rounding must never turn identical keys into a random PP.
                if (!(v > 1e-12 * (nrm[a] + nb_))) {
                    double pp = 0;
                    if (ev.pp_direct(e, idx[static_cast<std::size_t>(a0 + a)], idx[static_cast<std::size_t>(ib)], pp)) {
                        ppbuf[static_cast<std::size_t>(a)] = pp;
                    } else {
                        skip[static_cast<std::size_t>(a)] = 1;
                        ev.skip();
                    }
                }
            }
            if (!empirical) {
                ev.record_column(e, tpos.data() + a0, tpos[static_cast<std::size_t>(ib)], ppbuf.data(), skip.data(),
                                 a_end, acc);
                continue;
            }
            for (a = 0; a < a_end; ++a)
                if (skip[static_cast<std::size_t>(a)] == 0) record(a0 + a, ib, ppbuf[static_cast<std::size_t>(a)]);
        }
    });
}

/// Seeded sampling of one cell (method §6): a group with probability ∝ its pair
/// count, then two distinct keys uniformly. Draws depend on (seed, b, c) only.
inline void evaluate_cell_sampled(pair_evaluator& ev, bucket_eval const& e,
                                  std::vector<std::vector<index_t> const*> const& groups, cell_acc& acc,
                                  plasticity_options const& o, std::int64_t b, std::int64_t c) {
    std::vector<double> cum;
    double total = 0;
    for (auto const* g : groups) {
        auto const m = static_cast<double>(g->size());
        total += m * (m - 1) / 2;
        cum.push_back(total);
    }
    if (!(total > 0)) return;
    std::uint64_t const seed = hash_step(hash_step(splitmix64(o.seed), static_cast<std::uint64_t>(b)),
                                         static_cast<std::uint64_t>(c));
    std::mt19937_64 gen(seed);
    for (std::int64_t s = 0; s < o.samples_per_cell; ++s) {
        double const u = unit_interval(gen()) * total;
        auto gi = static_cast<std::size_t>(std::upper_bound(cum.begin(), cum.end(), u) - cum.begin());
        gi = std::min(gi, groups.size() - 1);
        auto const& g = *groups[gi];
        auto const m = static_cast<std::uint64_t>(g.size());
        auto const a = static_cast<std::size_t>(gen() % m);
        auto bb = static_cast<std::size_t>(gen() % (m - 1));
        if (bb >= a) ++bb;
        double pp = 0;
        if (ev.pp_direct(e, g[a], g[bb], pp)) ev.record(e, g[a], g[bb], pp, acc);
        else ev.skip();
    }
}

inline std::vector<double> default_edges(double lo, double hi, int bins) {
    std::vector<double> e(static_cast<std::size_t>(bins) + 1);
    for (int i = 0; i <= bins; ++i) e[static_cast<std::size_t>(i)] = lo + (hi - lo) * i / bins;
    return e;
}

inline void check_edges(std::vector<double> const& e, std::string_view name) {
    if (e.size() < 2) fail_arg("qkgeom::attention_plasticity", std::string(name) + ": need at least 2 edges; edges", e.size());
    for (std::size_t i = 0; i < e.size(); ++i)
        if (!std::isfinite(e[i]) || (i > 0 && !(e[i] > e[i - 1])))
            fail_arg("qkgeom::attention_plasticity",
                     std::string(name) + ": edges must be finite and strictly increasing; edge " + std::to_string(i),
                     e[i]);
}

/// Widened copies of the annotations, validated (lengths, non-negative
/// positions/buckets, consistency with the bucket scheme when given).
template <IndexVector V>
std::vector<std::int64_t> read_ids(std::string_view field, V const& v, index_t n) {
    auto const r = as_indices(v);
    if (r.size() != n)
        fail_arg("qkgeom::attention_plasticity",
                 std::string(field) + ": length differs from the " + std::to_string(n) + " rows; length", r.size());
    std::vector<std::int64_t> out(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = r[i];
    return out;
}

inline void check_buckets(std::string_view kind_name, std::vector<std::int64_t> const& pos,
                          std::vector<std::int64_t> const& bucket, std::optional<bucket_spec> const& spec) {
    if (!spec) return;
    for (std::size_t i = 0; i < pos.size(); ++i) {
        std::int64_t const expect = bucket_of(*spec, pos[i]);
        if (bucket[i] != expect)
            fail_arg("qkgeom::attention_plasticity",
                     std::string(kind_name) + " buckets: bucket does not match position " + std::to_string(pos[i]) +
                         " at row " + std::to_string(i) + " (scheme " + bucket_scheme_name(spec->scheme) +
                         ", width " + std::to_string(spec->width) + " gives " + std::to_string(expect) +
                         "); bucket",
                     bucket[i]);
    }
}

}  // namespace detail

/// \brief Attention plasticity of one head (method §5–6) from the Householder
/// model of its queries and the key rows; optionally the query rows for the
/// empirical cross-check (pass `nullptr`-like empty queries to skip it via the
/// overload without queries).
///
/// \param model      householder(...) of the head's queries (bucket models, H)
/// \param keys       key rows (any RowMatrix, n_k × d)
/// \param k_position, k_bucket, k_example  per key row
/// \throws std::invalid_argument on mismatched dimensions or lengths, NaN/Inf
///         in a key, negative positions, buckets that do not match positions
///         (when `opt.buckets` is given), bad options.
template <RowMatrix XK, IndexVector PK, IndexVector BK, IndexVector EK, RowMatrix XQ, IndexVector PQ, IndexVector BQ>
plasticity_result attention_plasticity(householder_result const& model, XK const& keys, PK const& k_position,
                                       BK const& k_bucket, EK const& k_example, XQ const* queries,
                                       PQ const* q_position, BQ const* q_bucket, plasticity_options const& opt = {});

namespace detail {
/// `attention_plasticity`; `rows_checked`: the caller has validated the key
/// and query row values already (analyze_head), only shapes, integers and
/// options are checked again.
template <RowMatrix XK, IndexVector PK, IndexVector BK, IndexVector EK, RowMatrix XQ, IndexVector PQ, IndexVector BQ>
plasticity_result plasticity_of(householder_result const& model, XK const& keys, PK const& k_position,
                                BK const& k_bucket, EK const& k_example, XQ const* queries, PQ const* q_position,
                                BQ const* q_bucket, plasticity_options const& opt, bool rows_checked) {
    constexpr std::string_view fn = "qkgeom::attention_plasticity";
    index_t const d = model.beta.size();
    if (d < 1) detail::fail_arg(fn, "the Householder model is empty (d)", d);
    if (opt.samples_per_cell < 1) detail::fail_arg(fn, "samples_per_cell must be >= 1", opt.samples_per_cell);
    if (opt.sliding_window < 0) detail::fail_arg(fn, "sliding_window must be >= 0 tokens", opt.sliding_window);
    if (opt.sliding_window > 0 && !opt.buckets)
        detail::fail_arg(fn, "a sliding window needs the bucket scheme (options.buckets); sliding_window",
                         opt.sliding_window);
    if (opt.buckets) detail::check_bucket_spec(fn, *opt.buckets);

    // --- keys: validate, widen, rotate (k̃ = H k; H never formed densely)
    auto const kr = as_matrix(keys);
    if (kr.cols() != d)
        detail::fail_arg(fn, "keys: head dimension differs from the queries' model: model has d = " +
                                 std::to_string(d) + ", keys have",
                         kr.cols());
    auto const kp = as_indices(k_position);
    detail::check_batch(fn, d, kr, kp, static_cast<decltype(kp) const*>(nullptr), !rows_checked);
    detail::key_store ks;
    ks.d = d;
    index_t const nk = kr.rows();
    ks.position = detail::read_ids("keys: positions", k_position, nk);
    ks.bucket = detail::read_ids("keys: buckets", k_bucket, nk);
    ks.example = detail::read_ids("keys: example ids", k_example, nk);
    for (index_t i = 0; i < nk; ++i)
        if (ks.bucket[static_cast<std::size_t>(i)] < 0)
            detail::fail_arg(fn, "keys: buckets: negative bucket at row " + std::to_string(i),
                             ks.bucket[static_cast<std::size_t>(i)]);
    detail::check_buckets("keys", ks.position, ks.bucket, opt.buckets);
    ks.orig.resize(nk, d);
    detail::f32_range k_range;  // for the empirical check, folded into the read (the row is in L1)
    for (index_t i = 0; i < nk; ++i) {
        kr.read_row(i, ks.orig.row(i).data());
        if (queries != nullptr) k_range.add(ks.orig.row(i).data(), d);
    }
    ks.rot = ks.orig;
    model.H.apply_rows(ks.rot);

    // --- queries (optional): per-bucket original-basis rows for the empirical check
    std::map<std::int64_t, detail::query_rows> qrows;
    detail::f32_range q_range;
    std::int64_t max_pos = 0;
    for (auto t : ks.position) max_pos = std::max(max_pos, t);
    if (queries != nullptr) {
        auto const qr = as_matrix(*queries);
        if (qr.cols() != d)
            detail::fail_arg(fn, "queries: head dimension differs from the keys' (" + std::to_string(d) + "); queries have",
                             qr.cols());
        auto const qp = as_indices(*q_position);
        detail::check_batch(fn, d, qr, qp, static_cast<decltype(qp) const*>(nullptr), !rows_checked);
        auto const qpos = detail::read_ids("queries: positions", *q_position, qr.rows());
        auto const qb = detail::read_ids("queries: buckets", *q_bucket, qr.rows());
        detail::check_buckets("queries", qpos, qb, opt.buckets);
        std::map<std::int64_t, std::vector<index_t>> rows_of;
        for (index_t i = 0; i < qr.rows(); ++i) {
            rows_of[qb[static_cast<std::size_t>(i)]].push_back(i);
            max_pos = std::max(max_pos, qpos[static_cast<std::size_t>(i)]);
        }
        for (auto const& [b, rows] : rows_of) {
            detail::query_rows m(static_cast<index_t>(rows.size()), d);
            for (std::size_t r = 0; r < rows.size(); ++r) {
                qr.read_row(rows[r], m.row(static_cast<index_t>(r)).data());
                q_range.add(m.row(static_cast<index_t>(r)).data(), d);
            }
            qrows.emplace(b, std::move(m));
        }
    }
    max_pos = std::max(max_pos, model.max_position);  // the queries' largest position, from their moments

    plasticity_result res;
    std::int64_t const L = opt.context_length > 0 ? opt.context_length : max_pos + 1;
    res.context_length = L;
    res.ap_decile.fill(detail::nan);
    auto& hm = res.heatmap;
    hm.distance_edges = opt.heatmap.distance_edges.empty() ? detail::default_edges(0, double(L), 16)
                                                            : opt.heatmap.distance_edges;
    hm.offset_edges = opt.heatmap.offset_edges.empty() ? detail::default_edges(-double(L), double(L), 16)
                                                        : opt.heatmap.offset_edges;
    detail::check_edges(hm.distance_edges, "heatmap.distance_edges");
    detail::check_edges(hm.offset_edges, "heatmap.offset_edges");
    hm.sum = Eigen::MatrixXd::Zero(index_t(hm.distance_edges.size()) - 1, index_t(hm.offset_edges.size()) - 1);
    hm.count.setZero(hm.sum.rows(), hm.sum.cols());

    // --- groups: key bucket -> (example, key indices ascending), ascending by
    // example (a flat vector per bucket: iterated once per later query bucket)
    std::map<std::int64_t, std::vector<std::pair<std::int64_t, std::vector<index_t>>>> groups;
    {
        std::map<std::int64_t, std::map<std::int64_t, std::vector<index_t>>> by_example;
        for (index_t i = 0; i < nk; ++i)
            by_example[ks.bucket[static_cast<std::size_t>(i)]][ks.example[static_cast<std::size_t>(i)]].push_back(i);
        for (auto& [c, m] : by_example) {
            auto& v = groups[c];
            v.reserve(m.size());
            for (auto& [ex, idx] : m) v.emplace_back(ex, std::move(idx));
        }
    }

    // Admissible key buckets of each query bucket; total pair count for `automatic`.
    auto admissible = [&](std::int64_t b) {
        std::vector<std::int64_t> cs;
        for (auto const& [c, g] : groups)
            if (c < b && detail::in_window(opt, b, c)) cs.push_back(c);
        return cs;
    };
    auto pairs_of = [](std::size_t m) { return static_cast<std::int64_t>(m * (m > 0 ? m - 1 : 0) / 2); };
    // Per key bucket: its keys in groups of ≥ 2, its pairs and its largest
    // group (the pair count for `automatic`, and for same_bucket the choice
    // of the empirical check's form).
    struct cell_size {
        std::int64_t keys = 0, pairs = 0;
        std::size_t largest = 0;
    };
    std::map<std::int64_t, cell_size> cell_sizes;
    for (auto const& [c, g] : groups) {
        auto& z = cell_sizes[c];
        for (auto const& [ex, idx] : g)
            if (idx.size() >= 2) {
                z.keys += static_cast<std::int64_t>(idx.size());
                z.pairs += pairs_of(idx.size());
                z.largest = std::max(z.largest, idx.size());
            }
    }
    std::int64_t total_pairs = 0;
    for (auto const& s : model.buckets) {
        if (!s.used) continue;  // no bucket model: never evaluated
        auto const cs = admissible(s.bucket);
        if (opt.pairs == pair_policy::same_bucket) {
            for (auto c : cs) total_pairs += cell_sizes[c].pairs;
        } else {
            std::map<std::int64_t, std::size_t> per_example;
            for (auto c : cs)
                for (auto const& [e, idx] : groups[c]) per_example[e] += idx.size();
            for (auto const& [e, m] : per_example) total_pairs += pairs_of(m);
        }
    }
    res.sampled = opt.enumeration == enumeration_policy::sampled ||
                  (opt.enumeration == enumeration_policy::automatic && total_pairs > opt.max_exact_pairs);

    detail::pair_evaluator ev(ks, hm, res.n_pairs_skipped);
    std::vector<index_t> column(static_cast<std::size_t>(nk), -1);  // key -> score column (per query bucket)
    std::vector<index_t> scored;  // the scored keys of the current query bucket, one per score column
    simd::isa const level = simd::active();
    bool certifiable = false;  // single-precision scores certifiable for these rows
    double q_max_abs = 0.0;
    if (!qrows.empty()) {
        certifiable = detail::f32_certifiable(q_range, k_range, d);
        q_max_abs = q_range.max_abs;
    }
    auto const blk = detail::scores::blocking_of(level);
    std::vector<float> qpack;  // the query bucket's packed f32 panels (dispatched product)
    // The scored keys of one key bucket c (those of examples with ≥ 2 keys in c
    // for same_bucket, all for prefix), padded with −1 to whole key blocks, and
    // packed once (dispatched levels): a query bucket's score columns are the
    // concatenation of its admissible buckets' segments.
    struct key_segment {
        std::vector<index_t> keys;
        std::vector<float> packed;
    };
    std::map<std::int64_t, key_segment> segments;
    auto segment_of = [&](std::int64_t c) -> key_segment const& {
        auto [it, fresh] = segments.try_emplace(c);
        if (fresh) {
            auto& seg = it->second;
            for (auto const& [ex, idx] : groups[c])
                if (opt.pairs == pair_policy::prefix || idx.size() >= 2) seg.keys.insert(seg.keys.end(), idx.begin(), idx.end());
            auto const n = static_cast<index_t>(seg.keys.size());
            if (level != simd::isa::generic)
                detail::scores::pack_transposed(
                    [&](index_t a, index_t l) { return ks.orig(seg.keys[static_cast<std::size_t>(a)], l); }, n, d,
                    blk.block, seg.packed);
            seg.keys.resize(static_cast<std::size_t>(detail::scores::round_up(n, blk.block)), -1);
        }
        return it->second;
    };
    Eigen::VectorXd k_norm_all;  // ‖k‖ of every key (original basis)
    if (!qrows.empty()) k_norm_all = ks.orig.rowwise().norm();

    // The pair-difference form of the check (`empirical_columns`; same_bucket,
    // exact, groups below dense_min_keys, a dispatched level): per key bucket
    // c its pairs in evaluation order (groups ascending by example, (a, b)
    // with a < b, as evaluate_group_exact records them), the packed f32
    // columns kᵢ − kⱼ (difference in double, rounded once) and per column the
    // bound factor kk = (γ32‖kᵢ − kⱼ‖ + γ64(‖kᵢ‖ + ‖kⱼ‖))(1 + 2⁻²⁰) rounded up
    // to float: with the query's ‖q‖ rounded up and one FMA, the threshold
    // qn·kk + ka is ≥ the certified error of the f32 score q·(kᵢ − kⱼ) plus
    // the rounding of the double scores (detail::scores::pair_counts).
    // Columns with a subnormal-range component or beyond the float range get
    // kk = +inf (all their queries go to the double fallback).
    struct pair_segment {
        std::vector<std::array<index_t, 2>> keys;  // padded with {−1, −1} to whole blocks
        index_t n = 0;                             // pairs (unpadded)
        std::vector<float> packed, kk;
    };
    std::map<std::int64_t, pair_segment> pair_segments;
    double const gamma32 = detail::f32_dot_error_factor(d), gamma64 = detail::f64_dot_error_factor(d);
    auto pair_segment_of = [&](std::int64_t c) -> pair_segment const& {
        auto [it, fresh] = pair_segments.try_emplace(c);
        if (fresh) {
            auto& seg = it->second;
            for (auto const& [ex, idx] : groups[c])
                for (std::size_t a = 0; a < idx.size(); ++a)
                    for (std::size_t b = a + 1; b < idx.size(); ++b) seg.keys.push_back({idx[a], idx[b]});
            seg.n = static_cast<index_t>(seg.keys.size());
            detail::scores::pack_transposed(
                [&](index_t a, index_t l) {
                    auto const& pk = seg.keys[static_cast<std::size_t>(a)];
                    return ks.orig(pk[0], l) - ks.orig(pk[1], l);
                },
                seg.n, d, blk.block, seg.packed);
            auto const padded = detail::scores::round_up(seg.n, blk.block);
            seg.kk.assign(static_cast<std::size_t>(padded), 0.0f);
            for (index_t a = 0; a < seg.n; ++a) {
                auto const [i, j] = seg.keys[static_cast<std::size_t>(a)];
                double norm2 = 0.0, big = 0.0;
                bool tiny = false;
                for (index_t l = 0; l < d; ++l) {
                    double const x = ks.orig(i, l) - ks.orig(j, l);
                    norm2 += x * x;
                    big = std::max(big, std::abs(x));
                    tiny = tiny || (x != 0.0 && std::abs(x) < 0x1p-126);
                }
                bool const ok = certifiable && !tiny && big <= 0x1p126 && double(d) * q_max_abs * big <= 0x1p126;
                seg.kk[static_cast<std::size_t>(a)] =
                    ok ? detail::float_up((gamma32 * std::sqrt(norm2) + gamma64 * (k_norm_all(i) + k_norm_all(j))) *
                                          (1.0 + 0x1p-20))
                       : std::numeric_limits<float>::infinity();
            }
            seg.keys.resize(static_cast<std::size_t>(padded), {-1, -1});
        }
        return it->second;
    };
    std::vector<std::array<index_t, 2>> pair_keys;  // the current query bucket's pairs (pair-difference form)
    std::vector<std::int32_t> pair_wins;
    std::vector<std::uint32_t> undecided;  // per (query panel, pair column): undecided queries
    std::vector<float> q_norm_up;          // ‖q‖ rounded up to float, per padded query row
    for (auto const& s : model.buckets) {
        plasticity_bucket pb;
        pb.q_bucket = s.bucket;
        pb.n_queries = s.n_queries;
        pb.tau = s.tau;
        pb.quintile = detail::quantile_of(s.tau, s.n_queries, L, 5);
        pb.decile = detail::quantile_of(s.tau, s.n_queries, L, 10);
        auto const cs = admissible(s.bucket);
        if (cs.empty() || !s.used) {  // method §6: no earlier key bucket; §9.8: no bucket model
            ++res.n_query_buckets_skipped;
            res.profile.push_back(pb);
            continue;
        }
        detail::bucket_eval e;
        e.w = s.mean;
        e.tau = s.tau;
        if (s.cov.size() != 0) {
            e.V = Eigen::MatrixXd::Zero(d, d);
            e.V(0, 0) = s.var(0);
            e.V.bottomRightCorner(d - 1, d - 1) = s.cov;
        } else {
            e.var = s.var;
        }
        ev.begin_bucket();
        auto const qit = qrows.find(s.bucket);
        bool use_pairs = false;
        if (qit != qrows.end() && qit->second.rows() >= 2 && level != simd::isa::generic &&
            opt.pairs == pair_policy::same_bucket && !res.sampled && opt.empirical != empirical_columns::keys) {
            cell_size total;
            for (auto c : cs) {
                auto const& z = cell_sizes[c];
                total.keys += z.keys;
                total.pairs += z.pairs;
                total.largest = std::max(total.largest, z.largest);
            }
            use_pairs = static_cast<index_t>(total.largest) < opt.dense_min_keys &&
                        (opt.empirical == empirical_columns::pairs || total.pairs <= total.keys);
        }
        if (use_pairs) {  // method §9.14, pair-difference form (see pair_segment_of)
            auto const& q = qit->second;
            e.queries = &q;
            e.emp_scale = double(q.rows()) / double(q.rows() - 1);
            e.nq = q.rows();
            e.level = level;
            pair_keys.clear();
            for (auto c : cs) {
                auto const& seg = pair_segment_of(c);
                pair_keys.insert(pair_keys.end(), seg.keys.begin(), seg.keys.end());
            }
            auto const nc = static_cast<index_t>(pair_keys.size());
            index_t const nq_pad = detail::scores::round_up(e.nq, blk.panel);
            detail::scores::pack_transposed([&](index_t r, index_t l) { return q(r, l); }, e.nq, d, blk.panel, qpack);
            q_norm_up.assign(static_cast<std::size_t>(nq_pad), 0.0f);
            for (index_t r = 0; r < e.nq; ++r) q_norm_up[static_cast<std::size_t>(r)] = detail::float_up(q.row(r).norm());
            pair_wins.assign(static_cast<std::size_t>(nc), 0);
            index_t const np = nq_pad / blk.panel;
            undecided.assign(static_cast<std::size_t>(np * nc), 0u);
            float const ka = detail::f32_pair_abs_error(d);
            index_t offset = 0;
            for (auto c : cs) {
                auto const& seg = pair_segment_of(c);
                detail::scores::pair_counts(level, qpack, q_norm_up.data(), e.nq, nq_pad, seg.packed.data(),
                                            seg.kk.data(), ka, seg.n, d, pair_wins.data() + offset,
                                            undecided.data() + offset, nc);
                offset += static_cast<index_t>(seg.keys.size());
            }
            // The undecided queries (≈ 1 in 10⁴ on real heads; all of a
            // column with kk = +inf), in double from the original rows.
            for (index_t p = 0; p < np; ++p)
                for (index_t c = 0; c < nc; ++c) {
                    std::uint32_t m = undecided[static_cast<std::size_t>(p * nc + c)];
                    if (m == 0) continue;
                    auto const [i, j] = pair_keys[static_cast<std::size_t>(c)];
                    auto const ki = ks.orig.row(i), kj = ks.orig.row(j);
                    std::int32_t w = 0;
                    for (; m != 0; m &= m - 1u) {
                        auto const qrow = q.row(p * blk.panel + std::countr_zero(m));
                        w += qrow.dot(ki) > qrow.dot(kj) ? 1 : 0;
                    }
                    pair_wins[static_cast<std::size_t>(c)] += w;
                }
            e.pair_keys = &pair_keys;
            e.pair_wins = &pair_wins;
        } else if (qit != qrows.end() && qit->second.rows() >= 2) {  // method §9.14
            e.queries = &qit->second;
            e.emp_scale = double(qit->second.rows()) / double(qit->second.rows() - 1);
            // One GEMM: the bucket's queries against every key of the admissible
            // buckets that belongs to an example with at least two such keys.
            scored.clear();
            for (auto c : cs) {
                auto const& seg = segment_of(c);
                scored.insert(scored.end(), seg.keys.begin(), seg.keys.end());
            }
            index_t const nks = static_cast<index_t>(scored.size());
            e.k_norm.resize(nks);
            for (index_t a = 0; a < nks; ++a) {
                auto const key = scored[static_cast<std::size_t>(a)];
                if (key < 0) {  // padding: never a pair's column
                    e.k_norm(a) = 0.0;
                    continue;
                }
                column[static_cast<std::size_t>(key)] = a;
                e.k_norm(a) = k_norm_all(key);
            }
            // Single-precision product (twice the double rate, and AVX2/AVX-512
            // kernels where the CPU has them), certified by empirical_wins.
            auto const& q = qit->second;
            e.nq = q.rows();
            e.level = level;
            if (level == simd::isa::generic) {  // blocks of one key: no padding
                Eigen::MatrixXf kf(nks, d);
                for (index_t a = 0; a < nks; ++a) kf.row(a) = ks.orig.row(scored[static_cast<std::size_t>(a)]).template cast<float>();
                e.scores.noalias() = q.template cast<float>() * kf.transpose();
            } else {
                index_t const nq_pad = detail::scores::round_up(e.nq, blk.panel);
                detail::scores::pack_transposed([&](index_t r, index_t l) { return q(r, l); }, e.nq, d, blk.panel, qpack);
                e.scores.resize(nq_pad, nks);
                index_t offset = 0;
                for (auto c : cs) {
                    auto const& seg = segment_of(c);
                    auto const n = static_cast<index_t>(seg.keys.size());
                    detail::scores::score_product(level, qpack, nq_pad, seg.packed, n, d, e.scores.data() + offset * nq_pad);
                    offset += n;
                }
            }
            e.q_norm = q.rowwise().norm();
            // not certifiable (subnormal or huge values): every comparison in double
            e.score_err = certifiable ? detail::f32_dot_error_factor(d) : std::numeric_limits<double>::infinity();
            e.score_abs = detail::f32_dot_abs_error(d);
            e.k_orig = &ks.orig;
            e.scored = &scored;
            e.column = &column;
        }
        auto finish_cell = [&](detail::cell_acc const& acc, std::int64_t c) {
            plasticity_cell cell;
            cell.q_bucket = s.bucket;
            cell.k_bucket = c;
            cell.n_pairs = acc.n;
            if (acc.n > 0) {
                cell.plasticity = acc.sum / double(acc.n);
                if (res.sampled && acc.n > 1) {
                    double const var = std::max(0.0, (acc.sumsq - acc.sum * acc.sum / double(acc.n)) / double(acc.n - 1));
                    cell.std_error = std::sqrt(var / double(acc.n));
                }
                if (acc.emp_n > 0) cell.empirical = acc.emp_sum / double(acc.emp_n);
            }
            res.cells.push_back(cell);
            return cell;
        };
        if (opt.pairs == pair_policy::same_bucket) {
            double sum = 0, emp_sum = 0, se2 = 0;
            std::int64_t n_emp = 0;
            for (auto c : cs) {
                detail::cell_acc acc;
                if (res.sampled) {
                    std::vector<std::vector<index_t> const*> gs;
                    for (auto const& [ex, idx] : groups[c])
                        if (idx.size() >= 2) gs.push_back(&idx);
                    detail::evaluate_cell_sampled(ev, e, gs, acc, opt, s.bucket, c);
                } else {
                    for (auto const& [ex, idx] : groups[c]) detail::evaluate_group_exact(ev, ks, e, idx, acc, opt);
                }
                auto const cell = finish_cell(acc, c);
                if (cell.n_pairs == 0) continue;  // method §9.10: empty cells excluded
                ++pb.n_cells;
                pb.n_pairs += cell.n_pairs;
                sum += cell.plasticity;
                se2 += cell.std_error * cell.std_error;
                if (std::isfinite(cell.empirical)) {
                    emp_sum += cell.empirical;
                    ++n_emp;
                }
            }
            if (pb.n_cells > 0) {  // method §9.11: unweighted mean of the non-empty cells
                pb.ap = sum / double(pb.n_cells);
                pb.std_error = std::sqrt(se2) / double(pb.n_cells);
                if (n_emp == pb.n_cells) pb.ap_empirical = emp_sum / double(n_emp);
            }
        } else {
            // prefix: per example, its keys in all admissible buckets
            std::map<std::int64_t, std::vector<index_t>> per_example;
            for (auto c : cs)
                for (auto const& [ex, idx] : groups[c])
                    per_example[ex].insert(per_example[ex].end(), idx.begin(), idx.end());
            for (auto& [ex, idx] : per_example) std::sort(idx.begin(), idx.end());
            detail::cell_acc acc;
            if (res.sampled) {
                std::vector<std::vector<index_t> const*> gs;
                for (auto const& [ex, idx] : per_example)
                    if (idx.size() >= 2) gs.push_back(&idx);
                detail::evaluate_cell_sampled(ev, e, gs, acc, opt, s.bucket, -1);
            } else {
                for (auto const& [ex, idx] : per_example) detail::evaluate_group_exact(ev, ks, e, idx, acc, opt);
            }
            auto const cell = finish_cell(acc, -1);
            if (cell.n_pairs > 0) {  // method §9.11: mean over its pairs
                pb.n_cells = 1;
                pb.n_pairs = cell.n_pairs;
                pb.ap = cell.plasticity;
                pb.std_error = cell.std_error;
                pb.ap_empirical = cell.empirical;
            }
        }
        res.n_pairs += pb.n_pairs;
        res.profile.push_back(pb);
    }

    // --- aggregates (method §6, §9.10–9.12)
    double wsum = 0, wap = 0;
    for (auto const& pb : res.profile)
        if (std::isfinite(pb.ap)) {
            wsum += double(pb.n_queries);
            wap += double(pb.n_queries) * pb.ap;
        }
    if (opt.weighting == ap_weighting::query_count) {
        if (wsum > 0) res.ap_overall = wap / wsum;
    } else {
        double cs = 0;
        std::int64_t cn = 0;
        for (auto const& c : res.cells)
            if (c.n_pairs > 0) {
                cs += c.plasticity;
                ++cn;
            }
        if (cn > 0) res.ap_overall = cs / double(cn);
    }
    auto quantile_profile = [&](int k, auto member) {
        std::vector<double> num(static_cast<std::size_t>(k), 0.0), den(static_cast<std::size_t>(k), 0.0);
        for (auto const& pb : res.profile)
            if (std::isfinite(pb.ap)) {
                auto const q = static_cast<std::size_t>(pb.*member);
                num[q] += double(pb.n_queries) * pb.ap;
                den[q] += double(pb.n_queries);
            }
        std::vector<double> out(static_cast<std::size_t>(k), detail::nan);
        for (std::size_t q = 0; q < out.size(); ++q)
            if (den[q] > 0) out[q] = num[q] / den[q];
        return out;
    };
    auto const qp = quantile_profile(5, &plasticity_bucket::quintile);
    auto const dp = quantile_profile(10, &plasticity_bucket::decile);
    std::copy(qp.begin(), qp.end(), res.ap_quintile.begin());
    std::copy(dp.begin(), dp.end(), res.ap_decile.begin());
    res.ap_first_20pct = res.ap_quintile[0];
    res.ap_last_20pct = res.ap_quintile[4];
    res.ap_drop = res.ap_first_20pct - res.ap_last_20pct;
    double gap = 0;
    std::int64_t ng = 0;
    for (auto const& pb : res.profile)
        if (std::isfinite(pb.ap) && std::isfinite(pb.ap_empirical)) {
            gap += std::abs(pb.ap - pb.ap_empirical);
            ++ng;
        }
    if (ng > 0) res.gaussian_gap = gap / double(ng);
    return res;
}
}  // namespace detail

template <RowMatrix XK, IndexVector PK, IndexVector BK, IndexVector EK, RowMatrix XQ, IndexVector PQ, IndexVector BQ>
plasticity_result attention_plasticity(householder_result const& model, XK const& keys, PK const& k_position,
                                       BK const& k_bucket, EK const& k_example, XQ const* queries,
                                       PQ const* q_position, BQ const* q_bucket, plasticity_options const& opt) {
    return detail::plasticity_of(model, keys, k_position, k_bucket, k_example, queries, q_position, q_bucket, opt,
                                 false);
}

/// \brief Attention plasticity with the empirical cross-check from the query rows.
template <RowMatrix XK, IndexVector PK, IndexVector BK, IndexVector EK, RowMatrix XQ, IndexVector PQ, IndexVector BQ>
plasticity_result attention_plasticity(householder_result const& model, XK const& keys, PK const& k_position,
                                       BK const& k_bucket, EK const& k_example, XQ const& queries,
                                       PQ const& q_position, BQ const& q_bucket, plasticity_options const& opt = {}) {
    return attention_plasticity(model, keys, k_position, k_bucket, k_example, &queries, &q_position, &q_bucket, opt);
}

/// \brief Attention plasticity without query rows (no empirical cross-check:
/// `empirical`, `ap_empirical` and `gaussian_gap` stay NaN).
template <RowMatrix XK, IndexVector PK, IndexVector BK, IndexVector EK>
plasticity_result attention_plasticity(householder_result const& model, XK const& keys, PK const& k_position,
                                       BK const& k_bucket, EK const& k_example, plasticity_options const& opt = {}) {
    using none_rows = matrix_view<double>;
    using none_ids = std::vector<std::int64_t>;
    return attention_plasticity<XK, PK, BK, EK, none_rows, none_ids, none_ids>(
        model, keys, k_position, k_bucket, k_example, nullptr, nullptr, nullptr, opt);
}

}  // namespace qkgeom
