// qkgeom — a seeded synthetic GQA attention layer with planted, known
// structure, and its exact ground truth (for tests of method §1–§6).
//
// Model (docs/synthetic.md has the full description). A head vector of
// dimension d is, before an optional fixed orthogonal mixing M, the stack
// [rotary block (rotary_dims coordinates) ; plain block (p = d − rotary_dims)].
// For a token at position t in bucket b (method §0.1) of one kind (query/key):
//
//   plain  = c + (intercept + slope·t)·δ + m(b) + s(b) ⊙ ε,      ε ~ N(0, I_p)
//   rotary = R(t)·r,                                           r ~ N(0, rope_sd² I)
//   x      = M · [rotary ; plain]
//
// δ (the drift, a unit vector of the plain block) is shared by a kv head and
// all query heads of its GQA group (method §0: h_k = ⌊h_q / (n_q / n_kv)⌋), and
// so is M, so that q·k is a genuine dot product of one head pair. R(t) is
// RoPE: pairs (i, i + rotary_dims/2) (`rotate_half`) or (2i, 2i+1)
// (`interleaved`) rotated by the angle t·θ_i, θ_i = theta^(−2i/rotary_dims).
// m(b) are seeded random per-bucket semantic means, orthogonal to δ and with
// zero weighted mean and zero weighted covariance with both the bucket index
// and the mean bucket position τ_b (weights: expected kept tokens per bucket),
// so they add no linear position trend: the population OLS slope of the
// queries on t is exactly slope_q·M·δ (method §4).
//
// Reproducibility: every random draw comes from std::mt19937_64 (fully
// specified by the standard) through a Box–Muller transform written here, so
// a seed gives the same capture with every standard library (up to the last
// bit of libm's log/sin/cos). Keep decisions are `qkgeom::keep_token`.
#pragma once

#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>

#include <Eigen/Core>
#include <Eigen/QR>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom::synthetic {

/// \brief Which coordinates RoPE rotates together.
enum class rope_pairing : std::uint8_t {
    rotate_half = 0,  ///< pairs (i, i + rotary_dims/2) (GPT-NeoX / Llama `rotate_half`)
    interleaved = 1,  ///< pairs (2i, 2i + 1) (GPT-J / original RoFormer)
};

/// \brief Parameters of one kind (queries of a q head, or keys of a kv head).
///
/// Plain block of a token at position t in bucket b:
/// `centroid + (intercept + slope·t)·drift + bucket_mean_scale·m̃(b) + s(b)·ε`,
/// with `s(b) = noise_sd·(1 + noise_sd_ramp·j/(n_buckets − 1))` (times
/// `noise_axis_scale(c)` on plain coordinate c when given), j = b − b_min
/// the rank of the bucket among the buckets of the context (s = noise_sd when
/// there is one bucket). Rotary block: R(t)·r, r ~ N(0, rope_sd² I).
struct kind_params {
    double intercept = 0.0;          ///< drift-axis intercept (plain units)
    double slope = 0.0;              ///< drift-axis slope per token
    Eigen::VectorXd centroid;        ///< plain-block offset (length d − rotary_dims); empty = 0
    double noise_sd = 1.0;           ///< s at the first bucket; >= 0
    double noise_sd_ramp = 0.0;      ///< relative growth of s to the last bucket; >= −1
    double bucket_mean_scale = 0.0;  ///< sd of the raw per-bucket means before projection; >= 0
    double rope_sd = 1.0;            ///< sd of each rotary content coordinate; >= 0
    /// Per plain coordinate multiplier of s(b) (anisotropic noise: plain
    /// coordinate c has sd s(b)·noise_axis_scale(c)); empty = all ones.
    Eigen::VectorXd noise_axis_scale;
};

/// \brief One query head: its query parameters. Its drift and mixing are those
/// of its kv head (method §0 GQA mapping).
struct q_head_params {
    kind_params query;  ///< the query parameters
};

/// \brief One kv head: its key parameters and the drift direction δ shared by
/// the keys and by every query head of its GQA group.
struct kv_head_params {
    kind_params key;        ///< the key parameters
    Eigen::VectorXd drift;  ///< plain-block direction (normalised here); empty = first plain axis
};

/// \brief The default query head: intercept 2, slope 1e-3, bucket_mean_scale 0.5.
/// \returns those parameters, the other fields at their defaults.
inline q_head_params default_q_head() {
    q_head_params h;
    h.query.intercept = 2.0;
    h.query.slope = 1e-3;
    h.query.bucket_mean_scale = 0.5;
    return h;
}

/// \brief The default kv head: intercept −1, slope 2e-3, bucket_mean_scale 0.5,
/// drift = first plain axis.
/// \returns those parameters, the other fields at their defaults.
inline kv_head_params default_kv_head() {
    kv_head_params h;
    h.key.intercept = -1.0;
    h.key.slope = 2e-3;
    h.key.bucket_mean_scale = 0.5;
    return h;
}

/// \brief One attention layer: geometry, GQA layout and per-head parameters.
struct layer_spec {
    index_t d = 64;                                    ///< head dimension
    index_t rotary_dims = 32;                          ///< even, d − rotary_dims >= 2
    double rope_theta = 10000.0;                       ///< RoPE base; finite, > 0
    rope_pairing pairing = rope_pairing::rotate_half;  ///< RoPE coordinate pairing
    bool mix = false;                                  ///< apply a Haar-random M per kv head (else M = I)
    std::int64_t n_q_heads = 4;                        ///< query heads; a multiple of n_kv_heads
    std::int64_t n_kv_heads = 2;                       ///< key/value heads
    std::int64_t layer = 0;                            ///< layer index (enters the keep hash); >= 0
    std::uint64_t model_seed = 0;                      ///< seeds M and the per-bucket means m(b)
    std::vector<q_head_params> q_heads;                ///< size n_q_heads, or empty = default_q_head()
    std::vector<kv_head_params> kv_heads;              ///< size n_kv_heads, or empty = default_kv_head()
};

/// \brief What is captured: examples 0..n_examples−1, each of context_length
/// tokens, sampled per (example, layer, kind) by `keep_token` (method §0.1).
struct capture_spec {
    std::int64_t n_examples = 64;      ///< sequences; >= 1
    std::int64_t context_length = 4096;///< tokens per sequence; >= 1
    bucket_spec buckets;               ///< bucket scheme and keep rate
    std::uint64_t seed = 1;            ///< keep hash seed and token-noise seed
};

/// \brief Ground truth of one head pair. Unless noted, vectors live in the
/// original (post-mixing) basis of dimension d; `Md` is M·[0; δ] (unit).
///
/// Two kinds of value. *Population* values use the sampling distribution of
/// positions (bucket weights = expected kept tokens). *Conditional* values are
/// expectations given the realised positions of this capture (only the token
/// noise ε, r is averaged over); they are marked (cond.). n, t̄, m2 = Σ(t − t̄)²
/// and Var t = m2/(n − 1) below are realised per kind.
struct head_truth {
    // --- the model, as generated ---
    Eigen::MatrixXd mixing;  ///< M (d × d), identity when layer_spec::mix is false
    Eigen::VectorXd drift;   ///< Md = M·[0; δ], the planted drift direction (unit)

    // --- realised positions ---
    std::int64_t n_q = 0, n_k = 0;  ///< rows per kind
    double mean_t_q = std::numeric_limits<double>::quiet_NaN();  ///< t̄ of the queries
    double mean_t_k = std::numeric_limits<double>::quiet_NaN();  ///< t̄ of the keys
    double var_t_q = std::numeric_limits<double>::quiet_NaN();   ///< sample (n−1) Var t of the queries
    double var_t_k = std::numeric_limits<double>::quiet_NaN();   ///< sample (n−1) Var t of the keys

    // --- method §3 planar rotation ---
    /// a = sign(S)·Md, S = slope_q·m2_q + slope_k·m2_k (so a·Cov(x_pool, t) >= 0 in
    /// population); NaN and `a_defined = false` when S = 0. Population pooled
    /// drift direction: the Q/K offset term f(μ_K − μ_Q)(t̄_K − t̄_Q) of the
    /// pooled covariance vanishes in expectation (Q and K share one keep law).
    /// alpha_q, alpha_k, mu_q_a, mu_k_a, bias_strength, r_q_a and r_k_a below
    /// are NaN when a is undefined.
    Eigen::VectorXd a;
    bool a_defined = false;  ///< S ≠ 0: a and the a-metrics are defined
    /// b = P(μ_q − μ_k)/‖P(μ_q − μ_k)‖, P = I − a aᵀ (method §3 `centroid`),
    /// from the conditional means; NaN and `b_defined = false` when degenerate
    /// (method §9.5) or when a is undefined.
    Eigen::VectorXd b;
    bool b_defined = false;  ///< b is defined (implies a_defined)
    double alpha_q = std::numeric_limits<double>::quiet_NaN();  ///< slope_q·(a·Md): slope of q·a on t
    double alpha_k = std::numeric_limits<double>::quiet_NaN();  ///< slope_k·(a·Md): slope of k·a on t
    double mu_q_a = std::numeric_limits<double>::quiet_NaN();   ///< a·mu_q (cond.)
    double mu_k_a = std::numeric_limits<double>::quiet_NaN();   ///< a·mu_k (cond.)
    double bias_strength = std::numeric_limits<double>::quiet_NaN();  ///< mu_q_a·alpha_k
    /// a·cov_qt / sqrt(aᵀ cov_q a · var_t_q) = alpha_q·sd_t / sqrt(alpha_q² Var t + mean s_q(b_i)²):
    /// Pearson r of q·a with t as a ratio of conditional expected moments.
    /// NaN also when n_q < 2 (var_t_q NaN).
    double r_q_a = std::numeric_limits<double>::quiet_NaN();
    double r_k_a = std::numeric_limits<double>::quiet_NaN();  ///< likewise for the keys

    // --- method §4 query regression ---
    Eigen::VectorXd beta;  ///< slope_q·Md: population OLS slope of Q on t (exact)
    /// M·[0; c_q + intercept_q·δ + m̄_q], m̄_q = Σ_i m_q(b_i)/n_q over the realised
    /// query buckets (≈ 0: m_q has zero mean under the population weights). (cond.)
    Eigen::VectorXd alpha;
    double beta_pos = 0.0;  ///< ‖beta‖ = |slope_q|
    /// β̂·alpha with β̂ = sign(slope_q)·Md (= sign(slope_q)(δ·c_q + intercept_q));
    /// NaN when slope_q = 0 (β̂ undefined).
    double alpha_pos = std::numeric_limits<double>::quiet_NaN();
    /// Residual variance of β̂·q around alpha_pos + beta_pos·t: mean over the
    /// realised queries of s_q(b_i)², times Σ_c δ_c² noise_axis_scale(c)²
    /// (δ ⟂ m, δ unit). NaN when slope_q = 0. (cond.)
    double sigma2_pos = std::numeric_limits<double>::quiet_NaN();

    // --- means and covariances (cond.) ---
    Eigen::VectorXd mu_q;    ///< alpha + beta·t̄_q = expected sample mean of the query rows
    Eigen::VectorXd mu_k;    ///< M·[0; c_k + (intercept_k + slope_k t̄_k)·δ + m̄_k] likewise for keys
    Eigen::MatrixXd cov_q;   ///< expected sample (n−1) covariance of the query rows
    Eigen::MatrixXd cov_k;   ///< expected sample (n−1) covariance of the key rows
    Eigen::VectorXd cov_qt;  ///< expected sample (n−1) Cov(Q, t)
    Eigen::VectorXd cov_kt;  ///< expected sample (n−1) Cov(K, t)

    // --- per bucket (all buckets of the context, ascending) ---
    std::vector<std::int64_t> buckets;  ///< bucket ids b_min..b_max
    Eigen::VectorXd tau;                ///< population mean position in each bucket (positions < L)
    Eigen::VectorXd bucket_weight;      ///< expected kept tokens per bucket: n_examples·count_b·p_b
    Eigen::MatrixXd m_q;                ///< per-bucket query semantic means, rows = buckets, M·[0; m(b)]
    Eigen::MatrixXd m_k;                ///< per-bucket key semantic means (of the kv head)
    Eigen::VectorXd sigma_q;            ///< s_q(b) per bucket (sd of every plain query coordinate)
    Eigen::VectorXd sigma_k;            ///< s_k(b) per bucket
};

/// \brief Rows of one (query head, kv head) pair, with the ground truth: a
/// qkgeom::head_capture (identity, capture facts, query and key rows) plus
/// `truth`, so every analysis takes it as it is.
///
/// The vectors are Eigen::MatrixXd (column-major storage), one row per token
/// (n × d). Rows are ordered by example, then position. Query heads of one GQA
/// group hold identical key rows and key metadata. The facts carry the
/// capture's bucket scheme and context length (no sliding window).
struct head_capture : qkgeom::head_capture<Eigen::MatrixXd> {
    head_truth truth;  ///< the ground truth of this head pair
};

// ---------------------------------------------------------------------------
// RoPE
// ---------------------------------------------------------------------------

/// \brief θ_i = theta^(−2i/rotary_dims), i = 0..rotary_dims/2 − 1.
/// \param[in] rotary_dims the rotated coordinates, even and ≥ 0.
/// \param[in] theta       the RoPE base, finite and > 0.
/// \returns the rotary_dims/2 frequencies (empty for 0).
/// \throws std::invalid_argument when rotary_dims is odd or negative, or
///         theta is not finite and > 0.
/// \throws std::bad_alloc if the result cannot be allocated.
template <class = void>  // instantiated on use
Eigen::VectorXd rope_frequencies(index_t rotary_dims, double theta) {
    constexpr std::string_view fn = "qkgeom::synthetic::rope_frequencies";
    if (rotary_dims < 0 || rotary_dims % 2 != 0)
        qkgeom::detail::fail_arg(fn, "rotary_dims: must be even and >= 0", rotary_dims);
    if (!(std::isfinite(theta) && theta > 0.0))
        qkgeom::detail::fail_arg(fn, "rope_theta: must be finite and > 0", theta);
    index_t const h = rotary_dims / 2;
    Eigen::VectorXd f(h);
    for (index_t i = 0; i < h; ++i)
        f(i) = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dims));
    return f;
}

namespace detail {

/// Rotates the rotary block v[0..2h) in place by the angles position·freq[i].
inline void rope_apply(double* v, index_t half, double const* freq, double position, rope_pairing pairing) {
    for (index_t i = 0; i < half; ++i) {
        index_t const j1 = pairing == rope_pairing::rotate_half ? i : 2 * i;
        index_t const j2 = pairing == rope_pairing::rotate_half ? i + half : 2 * i + 1;
        double const ang = position * freq[i];
        double const c = std::cos(ang), s = std::sin(ang);
        double const x1 = v[j1], x2 = v[j2];
        v[j1] = x1 * c - x2 * s;
        v[j2] = x1 * s + x2 * c;
    }
}

}  // namespace detail

/// \brief Applies RoPE at `position` to a rotary block `v` (even length) in
/// place: each pair (x1, x2) becomes (x1 cos φ − x2 sin φ, x1 sin φ + x2 cos φ),
/// φ = position·θ_i. R(t) is orthogonal and R(t_q)ᵀR(t_k) = R(t_k − t_q), so
/// R(t_q)r_q · R(t_k)r_k depends on the positions only through t_k − t_q.
/// \param[in,out] v      the rotary block (length rotary_dims, even), rotated in place.
/// \param[in]     position the token position t (any finite value).
/// \param[in]     theta    the RoPE base, finite and > 0.
/// \param[in]     pairing  which coordinates are rotated together.
/// \throws std::invalid_argument when v.size() is odd or theta is not finite
///         and > 0 (as rope_frequencies).
/// \throws std::bad_alloc if the frequencies cannot be allocated.
template <class = void>  // instantiated on use
void rope_rotate(Eigen::Ref<Eigen::VectorXd> v, double position, double theta,
                        rope_pairing pairing = rope_pairing::rotate_half) {
    Eigen::VectorXd const f = rope_frequencies(v.size(), theta);
    detail::rope_apply(v.data(), f.size(), f.data(), position, pairing);
}

// ---------------------------------------------------------------------------
// Random numbers
// ---------------------------------------------------------------------------

/// \brief Standard normal variates from std::mt19937_64 by Box–Muller (both
/// variates of a pair are used: cos first, then sin). Identical sequences
/// with every standard library.
class normal_stream {
public:
    /// \brief A stream seeded with `seed` (std::mt19937_64's seeding).
    /// \param[in] seed the seed.
    explicit normal_stream(std::uint64_t seed) : gen_(seed) {}

    /// \brief 53-bit uniform in [0, 1): the top 53 bits of one mt19937_64 draw.
    /// Consumes one draw (does not touch a pending Box–Muller spare).
    /// \returns a multiple of 2^−53 in [0, 1).
    double uniform() { return qkgeom::detail::unit_interval(static_cast<std::uint64_t>(gen_())); }

    /// \brief The next standard normal variate.
    /// \returns a finite N(0, 1) draw (|x| < 8.6): the spare of the last pair
    ///          when there is one, otherwise the first of a new pair (two draws).
    double operator()() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        double const u1 = 1.0 - uniform();  // (0, 1]: log is finite
        double const u2 = uniform();
        double const r = std::sqrt(-2.0 * std::log(u1));
        double const th = 2.0 * std::numbers::pi * u2;
        spare_ = r * std::sin(th);
        has_spare_ = true;
        return r * std::cos(th);
    }

private:
    std::mt19937_64 gen_;
    double spare_ = 0.0;
    bool has_spare_ = false;
};

/// \brief A Haar-random d × d orthogonal matrix: QR of a Gaussian matrix
/// (filled column by column from `rng`), Q's columns signed by diag(R).
/// \param[in]     d   the dimension, ≥ 0.
/// \param[in,out] rng the normal stream; d² variates are consumed.
/// \returns the d × d orthogonal matrix.
/// \throws std::bad_alloc if the matrices cannot be allocated.
template <class = void>  // instantiated on use
Eigen::MatrixXd haar_orthogonal(index_t d, normal_stream& rng) {
    Eigen::MatrixXd g(d, d);
    for (index_t j = 0; j < d; ++j)
        for (index_t i = 0; i < d; ++i) g(i, j) = rng();
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
    Eigen::MatrixXd q = qr.householderQ() * Eigen::MatrixXd::Identity(d, d);
    Eigen::MatrixXd const& r = qr.matrixQR();
    for (index_t j = 0; j < d; ++j)
        if (r(j, j) < 0) q.col(j) = -q.col(j);
    return q;
}

namespace detail {

using qkgeom::detail::bucket_of_unchecked;
using qkgeom::detail::check_bucket_spec;
using qkgeom::detail::fail_arg;
using qkgeom::detail::hash_step;
using qkgeom::detail::keep_probability_unchecked;
using qkgeom::detail::splitmix64;

/// Stream tags: which part of the model a random stream feeds.
enum class stream_tag : std::uint64_t { mixing = 1, query_means = 2, key_means = 3, query_tokens = 4, key_tokens = 5 };

/// Seed of one random stream: splitmix64 chain of (seed, tag, layer, head).
inline std::uint64_t stream_seed(std::uint64_t seed, stream_tag tag, std::int64_t layer, std::int64_t head) {
    std::uint64_t h = splitmix64(seed);
    h = hash_step(h, static_cast<std::uint64_t>(tag));
    h = hash_step(h, static_cast<std::uint64_t>(layer));
    h = hash_step(h, static_cast<std::uint64_t>(head));
    return h;
}

/// The buckets of positions 0..L−1: ids, counts, mean positions, keep probability.
struct bucket_table {
    std::int64_t b_min = 0;
    std::vector<std::int64_t> ids;
    Eigen::VectorXd tau, weight;  // weight: expected kept tokens over all examples
    [[nodiscard]] index_t size() const noexcept { return static_cast<index_t>(ids.size()); }
    [[nodiscard]] index_t rank(std::int64_t b) const noexcept { return static_cast<index_t>(b - b_min); }
};

inline bucket_table make_bucket_table(capture_spec const& cap) {
    bucket_table tb;
    std::int64_t const L = cap.context_length;
    tb.b_min = bucket_of_unchecked(cap.buckets, 0);
    std::int64_t const b_max = bucket_of_unchecked(cap.buckets, L - 1);
    auto const nb = static_cast<std::size_t>(b_max - tb.b_min + 1);
    std::vector<double> count(nb, 0.0), sum_t(nb, 0.0), prob(nb, 0.0);
    for (std::int64_t t = 0; t < L; ++t) {
        auto const j = static_cast<std::size_t>(bucket_of_unchecked(cap.buckets, t) - tb.b_min);
        count[j] += 1.0;
        sum_t[j] += static_cast<double>(t);
        prob[j] = keep_probability_unchecked(cap.buckets, t);  // constant within a bucket
    }
    tb.ids.resize(nb);
    tb.tau.resize(static_cast<index_t>(nb));
    tb.weight.resize(static_cast<index_t>(nb));
    for (std::size_t j = 0; j < nb; ++j) {
        auto const jj = static_cast<index_t>(j);
        tb.ids[j] = tb.b_min + static_cast<std::int64_t>(j);
        tb.tau(jj) = sum_t[j] / count[j];  // every bucket b_min..b_max holds a position < L
        tb.weight(jj) = static_cast<double>(cap.n_examples) * count[j] * prob[j];
    }
    return tb;
}

/// Kept (example, position) pairs of one (layer, kind), in example-then-position order.
struct kept_tokens {
    std::vector<std::int64_t> example, position, bucket;
};

inline kept_tokens make_kept(capture_spec const& cap, std::int64_t layer, kind k) {
    kept_tokens out;
    for (std::int64_t e = 0; e < cap.n_examples; ++e)
        for (std::int64_t t = 0; t < cap.context_length; ++t) {
            double const p = keep_probability_unchecked(cap.buckets, t);
            if (p >= 1.0 || keep_uniform(cap.seed, e, layer, k, t) < p) {
                out.example.push_back(e);
                out.position.push_back(t);
                out.bucket.push_back(bucket_of_unchecked(cap.buckets, t));
            }
        }
    return out;
}

/// Per-bucket plain-block means m(b) (rows = buckets, p columns):
/// bucket_mean_scale · G, G ~ N(0,1) drawn bucket by bucket, then
///   (1) each row projected orthogonal to δ:           G ← G (I − δδᵀ)
///   (2) the columns made W-orthogonal to {1, j, τ}:   G ← (I − U Uᵀ W) G
/// with W = diag(weight) and U a W-orthonormal basis of span{1, j, τ_j}
/// (modified Gram–Schmidt, twice; dependent vectors dropped). (1) and (2) act
/// on different sides of G, so they commute and both hold exactly.
template <class = void>  // instantiated on use
Eigen::MatrixXd make_bucket_means(bucket_table const& tb, Eigen::VectorXd const& drift, double scale,
                                         normal_stream& rng) {
    index_t const nb = tb.size(), p = drift.size();
    Eigen::MatrixXd g = Eigen::MatrixXd::Zero(nb, p);
    if (scale == 0.0) return g;
    for (index_t b = 0; b < nb; ++b)
        for (index_t j = 0; j < p; ++j) g(b, j) = scale * rng();
    g -= (g * drift) * drift.transpose();
    // W-orthonormal basis of span{1, j, τ}.
    Eigen::MatrixXd z(nb, 3);
    for (index_t b = 0; b < nb; ++b) {
        z(b, 0) = 1.0;
        z(b, 1) = static_cast<double>(b);
        z(b, 2) = tb.tau(b);
    }
    Eigen::VectorXd const& w = tb.weight;
    auto wdot = [&](Eigen::VectorXd const& x, Eigen::VectorXd const& y) {
        return (w.array() * x.array() * y.array()).sum();
    };
    std::vector<Eigen::VectorXd> basis;
    for (index_t c = 0; c < 3; ++c) {
        Eigen::VectorXd v = z.col(c);
        double const n0 = std::sqrt(wdot(v, v));
        for (int pass = 0; pass < 2; ++pass)
            for (auto const& u : basis) v -= wdot(u, v) * u;
        double const n1 = std::sqrt(wdot(v, v));
        if (n0 > 0 && n1 > 1e-9 * n0) basis.push_back(v / n1);
    }
    for (int pass = 0; pass < 2; ++pass)
        for (auto const& u : basis) {
            Eigen::RowVectorXd const coef = (u.array() * w.array()).matrix().transpose() * g;
            g -= u * coef;
        }
    return g;
}

/// s(b) per bucket rank: noise_sd·(1 + ramp·j/(nb − 1)).
template <class = void>  // instantiated on use
Eigen::VectorXd make_sigma(kind_params const& kp, index_t nb) {
    Eigen::VectorXd s(nb);
    for (index_t j = 0; j < nb; ++j)
        s(j) = nb <= 1 ? kp.noise_sd
                       : kp.noise_sd * (1.0 + kp.noise_sd_ramp * static_cast<double>(j) / static_cast<double>(nb - 1));
    return s;
}

/// Everything of one kind of one head that the truth needs.
struct kind_block {
    Eigen::MatrixXd rows;         // n × d, original basis
    Eigen::MatrixXd means;        // nb × p, plain block m(b)
    Eigen::VectorXd sigma;        // nb
    Eigen::VectorXd centroid;     // p
    Eigen::VectorXd axis_scale;   // p: noise_axis_scale, ones when not given
    kind_params const* kp = nullptr;
};

/// Generates the rows of one kind of one head (queries of a q head, keys of a
/// kv head). Per row, in row order: rotary_dims normals (r), then p normals (ε).
template <class = void>  // instantiated on use
void make_rows(kind_block& blk, kept_tokens const& kt, bucket_table const& tb, layer_spec const& L,
                      Eigen::VectorXd const& freq, Eigen::MatrixXd const* mixing, Eigen::VectorXd const& drift,
                      normal_stream& rng) {
    index_t const d = L.d, rd = L.rotary_dims, p = d - rd;
    auto const n = static_cast<index_t>(kt.position.size());
    kind_params const& kp = *blk.kp;
    Eigen::MatrixXd raw(n, d);
    Eigen::VectorXd v(d);
    for (index_t i = 0; i < n; ++i) {
        auto const si = static_cast<std::size_t>(i);
        double const t = static_cast<double>(kt.position[si]);
        index_t const j = tb.rank(kt.bucket[si]);
        for (index_t c = 0; c < rd; ++c) v(c) = kp.rope_sd * rng();
        rope_apply(v.data(), rd / 2, freq.data(), t, L.pairing);
        double const s = blk.sigma(j);
        double const lin = kp.intercept + kp.slope * t;
        for (index_t c = 0; c < p; ++c)
            v(rd + c) = blk.centroid(c) + lin * drift(c) + blk.means(j, c) + s * blk.axis_scale(c) * rng();
        raw.row(i) = v.transpose();
    }
    if (mixing != nullptr) {
        blk.rows.noalias() = raw * mixing->transpose();  // x = M v  ⇔  X = V Mᵀ
    } else {
        blk.rows = std::move(raw);
    }
}

/// Resolved, validated per-head parameters of a layer.
struct resolved_layer {
    std::vector<q_head_params> q;
    std::vector<kv_head_params> kv;  // drift normalised, centroids filled
    std::int64_t group = 1;          // n_q / n_kv
};

inline void check_kind(std::string_view fn, std::string const& field, kind_params const& kp, index_t p) {
    if (kp.centroid.size() != 0 && kp.centroid.size() != p)
        fail_arg(fn, field + ".centroid: length must be 0 or d - rotary_dims = " + std::to_string(p) + "; length",
                 kp.centroid.size());
    if (kp.centroid.size() != 0 && !kp.centroid.allFinite())
        fail_arg(fn, field + ".centroid: must be finite; first entry", kp.centroid(0));
    if (kp.noise_axis_scale.size() != 0 && kp.noise_axis_scale.size() != p)
        fail_arg(fn, field + ".noise_axis_scale: length must be 0 or d - rotary_dims = " + std::to_string(p) +
                         "; length",
                 kp.noise_axis_scale.size());
    if (kp.noise_axis_scale.size() != 0 && !(kp.noise_axis_scale.allFinite() && kp.noise_axis_scale.minCoeff() >= 0))
        fail_arg(fn, field + ".noise_axis_scale: must be finite and >= 0; min entry", kp.noise_axis_scale.minCoeff());
    if (!std::isfinite(kp.intercept)) fail_arg(fn, field + ".intercept: must be finite", kp.intercept);
    if (!std::isfinite(kp.slope)) fail_arg(fn, field + ".slope: must be finite", kp.slope);
    if (!(std::isfinite(kp.noise_sd) && kp.noise_sd >= 0))
        fail_arg(fn, field + ".noise_sd: must be finite and >= 0", kp.noise_sd);
    if (!(std::isfinite(kp.noise_sd_ramp) && kp.noise_sd_ramp >= -1))
        fail_arg(fn, field + ".noise_sd_ramp: must be finite and >= -1", kp.noise_sd_ramp);
    if (!(std::isfinite(kp.bucket_mean_scale) && kp.bucket_mean_scale >= 0))
        fail_arg(fn, field + ".bucket_mean_scale: must be finite and >= 0", kp.bucket_mean_scale);
    if (!(std::isfinite(kp.rope_sd) && kp.rope_sd >= 0))
        fail_arg(fn, field + ".rope_sd: must be finite and >= 0", kp.rope_sd);
}

template <class = void>  // instantiated on use
resolved_layer resolve(std::string_view fn, layer_spec const& L, capture_spec const& cap) {
    if (L.d < 2) fail_arg(fn, "layer_spec.d: head dimension must be >= 2", L.d);
    if (L.rotary_dims < 0) fail_arg(fn, "layer_spec.rotary_dims: must be >= 0", L.rotary_dims);
    if (L.rotary_dims % 2 != 0) fail_arg(fn, "layer_spec.rotary_dims: must be even", L.rotary_dims);
    if (L.d - L.rotary_dims < 2)
        fail_arg(fn, "layer_spec.d - layer_spec.rotary_dims (plain coordinates): must be >= 2", L.d - L.rotary_dims);
    if (!(std::isfinite(L.rope_theta) && L.rope_theta > 0))
        fail_arg(fn, "layer_spec.rope_theta: must be finite and > 0", L.rope_theta);
    if (L.pairing != rope_pairing::rotate_half && L.pairing != rope_pairing::interleaved)
        fail_arg(fn, "layer_spec.pairing: unknown RoPE pairing", static_cast<int>(L.pairing));
    if (L.n_q_heads < 1) fail_arg(fn, "layer_spec.n_q_heads: must be >= 1", L.n_q_heads);
    if (L.n_kv_heads < 1) fail_arg(fn, "layer_spec.n_kv_heads: must be >= 1", L.n_kv_heads);
    if (L.n_q_heads % L.n_kv_heads != 0)
        fail_arg(fn,
                 "layer_spec.n_q_heads: must be a multiple of layer_spec.n_kv_heads = " +
                     std::to_string(L.n_kv_heads) + " (method §0 GQA); n_q_heads",
                 L.n_q_heads);
    if (L.layer < 0) fail_arg(fn, "layer_spec.layer: must be >= 0", L.layer);
    if (!L.q_heads.empty() && static_cast<std::int64_t>(L.q_heads.size()) != L.n_q_heads)
        fail_arg(fn, "layer_spec.q_heads: size must be 0 or n_q_heads = " + std::to_string(L.n_q_heads) + "; size",
                 L.q_heads.size());
    if (!L.kv_heads.empty() && static_cast<std::int64_t>(L.kv_heads.size()) != L.n_kv_heads)
        fail_arg(fn,
                 "layer_spec.kv_heads: size must be 0 or n_kv_heads = " + std::to_string(L.n_kv_heads) + "; size",
                 L.kv_heads.size());
    if (cap.n_examples < 1) fail_arg(fn, "capture_spec.n_examples: must be >= 1", cap.n_examples);
    if (cap.context_length < 1) fail_arg(fn, "capture_spec.context_length: must be >= 1", cap.context_length);
    check_bucket_spec(fn, cap.buckets);

    index_t const p = L.d - L.rotary_dims;
    resolved_layer r;
    r.group = L.n_q_heads / L.n_kv_heads;
    r.q = L.q_heads.empty() ? std::vector<q_head_params>(static_cast<std::size_t>(L.n_q_heads), default_q_head())
                            : L.q_heads;
    r.kv = L.kv_heads.empty()
               ? std::vector<kv_head_params>(static_cast<std::size_t>(L.n_kv_heads), default_kv_head())
               : L.kv_heads;
    for (std::size_t h = 0; h < r.q.size(); ++h) {
        std::string const f = "layer_spec.q_heads[" + std::to_string(h) + "].query";
        check_kind(fn, f, r.q[h].query, p);
        if (r.q[h].query.centroid.size() == 0) r.q[h].query.centroid = Eigen::VectorXd::Zero(p);
    }
    for (std::size_t g = 0; g < r.kv.size(); ++g) {
        std::string const f = "layer_spec.kv_heads[" + std::to_string(g) + "]";
        check_kind(fn, f + ".key", r.kv[g].key, p);
        if (r.kv[g].key.centroid.size() == 0) r.kv[g].key.centroid = Eigen::VectorXd::Zero(p);
        Eigen::VectorXd& dr = r.kv[g].drift;
        if (dr.size() == 0) {
            dr = Eigen::VectorXd::Zero(p);
            dr(0) = 1.0;
        } else if (dr.size() != p) {
            fail_arg(fn, f + ".drift: length must be 0 or d - rotary_dims = " + std::to_string(p) + "; length",
                     dr.size());
        } else {
            double const nrm = dr.norm();
            if (!(std::isfinite(nrm) && nrm > 0)) fail_arg(fn, f + ".drift: must be finite and nonzero; norm", nrm);
            dr /= nrm;
        }
    }
    return r;
}

/// Sum over the rows of one kind of the squared deviations of t, and the mean.
inline std::pair<double, double> position_moments(std::vector<std::int64_t> const& t) {
    if (t.empty()) return {std::numeric_limits<double>::quiet_NaN(), 0.0};
    double mean = 0;
    for (auto v : t) mean += static_cast<double>(v);
    mean /= static_cast<double>(t.size());
    double m2 = 0;
    for (auto v : t) m2 += (static_cast<double>(v) - mean) * (static_cast<double>(v) - mean);
    return {mean, m2};
}

/// Conditional moments of one kind (plain block, before M) given the realised
/// positions: μ_i = c + (intercept + slope·t_i)·δ + m(b_i) is the expected row,
/// noise has covariance blockdiag(rope_sd² I, s(b_i)² I).
struct cond_moments {
    Eigen::VectorXd sem_mean;     // c + intercept·δ + m̄, m̄ = Σ_i m(b_i)/n   (p)
    Eigen::VectorXd cov_t_plain;  // Σ_i (t_i − t̄) μ_i / (n − 1)             (p)
    Eigen::MatrixXd cov_plain;    // Σ_i (μ_i − μ̄)(μ_i − μ̄)ᵀ/(n − 1) + mean_i s(b_i)² diag(scale²)
    double mean_s2 = std::numeric_limits<double>::quiet_NaN();  // mean_i s(b_i)²
};

template <class = void>  // instantiated on use
cond_moments conditional(kind_block const& blk, kept_tokens const& kt, bucket_table const& tb,
                                Eigen::VectorXd const& drift, double mean_t) {
    index_t const p = drift.size();
    auto const n = static_cast<index_t>(kt.position.size());
    double const nan = std::numeric_limits<double>::quiet_NaN();
    kind_params const& kp = *blk.kp;
    cond_moments cm;
    cm.sem_mean = Eigen::VectorXd::Constant(p, nan);
    cm.cov_t_plain = Eigen::VectorXd::Constant(p, nan);
    cm.cov_plain = Eigen::MatrixXd::Constant(p, p, nan);
    if (n == 0) return cm;
    // μ_i without the constant part c + intercept·δ.
    Eigen::MatrixXd mu(n, p);
    Eigen::VectorXd msum = Eigen::VectorXd::Zero(p);
    Eigen::VectorXd tc(n);
    double s2 = 0;
    for (index_t i = 0; i < n; ++i) {
        auto const si = static_cast<std::size_t>(i);
        double const t = static_cast<double>(kt.position[si]);
        index_t const j = tb.rank(kt.bucket[si]);
        mu.row(i) = (kp.slope * t) * drift.transpose() + blk.means.row(j);
        msum += blk.means.row(j).transpose();
        s2 += blk.sigma(j) * blk.sigma(j);
        tc(i) = t - mean_t;
    }
    cm.mean_s2 = s2 / static_cast<double>(n);
    cm.sem_mean = blk.centroid + kp.intercept * drift + msum / static_cast<double>(n);
    if (n < 2) return cm;
    Eigen::RowVectorXd const mbar = mu.colwise().mean();
    Eigen::MatrixXd const c = mu.rowwise() - mbar;
    double const inv = 1.0 / static_cast<double>(n - 1);
    cm.cov_t_plain = inv * (c.transpose() * tc);
    cm.cov_plain = inv * (c.transpose() * c);
    cm.cov_plain.diagonal().array() += cm.mean_s2 * blk.axis_scale.array().square();
    return cm;
}

/// Embeds a plain-block vector into the original basis: M·[0; v].
template <class = void>  // instantiated on use
Eigen::VectorXd embed(Eigen::MatrixXd const& m, Eigen::VectorXd const& v) {
    return m.rightCols(v.size()) * v;
}

/// Parameters, per-bucket means and rows of one kind of one head (queries of
/// a q head or keys of a kv head), each from its own seeded stream.
template <class = void>  // instantiated on use
kind_block make_kind_block(kind_params const& kp, kept_tokens const& kt, bucket_table const& tb,
                                  layer_spec const& L, capture_spec const& cap, Eigen::VectorXd const& freq,
                                  Eigen::MatrixXd const* mixing, Eigen::VectorXd const& drift, stream_tag means_tag,
                                  stream_tag tokens_tag, std::int64_t head) {
    kind_block blk;
    blk.kp = &kp;
    blk.centroid = kp.centroid;
    blk.axis_scale = kp.noise_axis_scale.size() != 0 ? kp.noise_axis_scale
                                                     : Eigen::VectorXd(Eigen::VectorXd::Ones(L.d - L.rotary_dims));
    blk.sigma = make_sigma(kp, tb.size());
    normal_stream mrng(stream_seed(L.model_seed, means_tag, L.layer, head));
    blk.means = make_bucket_means(tb, drift, kp.bucket_mean_scale, mrng);
    normal_stream trng(stream_seed(cap.seed, tokens_tag, L.layer, head));
    make_rows(blk, kt, tb, L, freq, mixing, drift, trng);
    return blk;
}

template <class = void>  // instantiated on use
head_truth make_truth(layer_spec const& L, bucket_table const& tb, Eigen::MatrixXd const& mixing,
                             Eigen::VectorXd const& drift, kind_block const& qb, kind_block const& kb,
                             kept_tokens const& kq, kept_tokens const& kk) {
    double const nan = std::numeric_limits<double>::quiet_NaN();
    index_t const d = L.d, rd = L.rotary_dims, p = d - rd;
    kind_params const& qp = *qb.kp;
    kind_params const& kp = *kb.kp;
    head_truth tr;
    tr.mixing = mixing;
    tr.drift = embed(mixing, drift);
    Eigen::VectorXd const& md = tr.drift;

    tr.n_q = static_cast<std::int64_t>(kq.position.size());
    tr.n_k = static_cast<std::int64_t>(kk.position.size());
    auto const [mtq, m2q] = position_moments(kq.position);
    auto const [mtk, m2k] = position_moments(kk.position);
    tr.mean_t_q = mtq;
    tr.mean_t_k = mtk;
    tr.var_t_q = tr.n_q >= 2 ? m2q / static_cast<double>(tr.n_q - 1) : nan;
    tr.var_t_k = tr.n_k >= 2 ? m2k / static_cast<double>(tr.n_k - 1) : nan;

    cond_moments const cq = conditional(qb, kq, tb, drift, mtq);
    cond_moments const ck = conditional(kb, kk, tb, drift, mtk);

    // method §4: β = slope_q·Md exactly; α = M·[0; c + intercept·δ + m̄]; μ = α + β t̄.
    tr.beta = qp.slope * md;
    tr.beta_pos = std::abs(qp.slope);
    tr.alpha = embed(mixing, cq.sem_mean);
    tr.mu_q = tr.alpha + (qp.slope * mtq) * md;
    tr.mu_k = embed(mixing, ck.sem_mean) + (kp.slope * mtk) * md;
    if (qp.slope != 0.0) {
        Eigen::VectorXd const bhat = (qp.slope > 0 ? 1.0 : -1.0) * md;
        tr.alpha_pos = bhat.dot(tr.alpha);
        tr.sigma2_pos = cq.mean_s2 * drift.cwiseProduct(qb.axis_scale).squaredNorm();
    }

    // Conditional covariances: M · blockdiag(rope_sd² I, cov_plain) · Mᵀ.
    auto full_cov = [&](cond_moments const& cm, kind_params const& k) {
        Eigen::MatrixXd blk = Eigen::MatrixXd::Zero(d, d);
        blk.topLeftCorner(rd, rd).diagonal().setConstant(k.rope_sd * k.rope_sd);
        blk.bottomRightCorner(p, p) = cm.cov_plain;
        return Eigen::MatrixXd(mixing * blk * mixing.transpose());
    };
    tr.cov_q = full_cov(cq, qp);
    tr.cov_k = full_cov(ck, kp);
    tr.cov_qt = embed(mixing, cq.cov_t_plain);
    tr.cov_kt = embed(mixing, ck.cov_t_plain);

    // method §3: a, b and the a-metrics.
    double const s = qp.slope * m2q + kp.slope * m2k;
    tr.a = Eigen::VectorXd::Constant(d, nan);
    tr.b = Eigen::VectorXd::Constant(d, nan);
    if (s != 0.0 && std::isfinite(s)) {
        double const sg = s > 0 ? 1.0 : -1.0;
        tr.a = sg * md;
        tr.a_defined = true;
        tr.alpha_q = qp.slope * sg;
        tr.alpha_k = kp.slope * sg;
        tr.mu_q_a = tr.a.dot(tr.mu_q);
        tr.mu_k_a = tr.a.dot(tr.mu_k);
        tr.bias_strength = tr.mu_q_a * tr.alpha_k;
        tr.r_q_a = tr.a.dot(tr.cov_qt) / std::sqrt(tr.a.dot(tr.cov_q * tr.a) * tr.var_t_q);
        tr.r_k_a = tr.a.dot(tr.cov_kt) / std::sqrt(tr.a.dot(tr.cov_k * tr.a) * tr.var_t_k);
        Eigen::VectorXd const diff = tr.mu_q - tr.mu_k;
        Eigen::VectorXd const pd = diff - tr.a * tr.a.dot(diff);
        double const nd = diff.norm(), npd = pd.norm();
        if (std::isfinite(npd) && npd > 0 && npd > 1e-12 * nd) {  // method §9.5
            tr.b = pd / npd;
            tr.b_defined = true;
        }
    }

    // Per bucket.
    tr.buckets = tb.ids;
    tr.tau = tb.tau;
    tr.bucket_weight = tb.weight;
    tr.m_q = qb.means * mixing.rightCols(p).transpose();
    tr.m_k = kb.means * mixing.rightCols(p).transpose();
    tr.sigma_q = qb.sigma;
    tr.sigma_k = kb.sigma;
    return tr;
}

/// Shared implementation of generate_layer / generate_head: all query heads,
/// or only `only` (and its kv head).
template <class = void>  // instantiated on use
std::vector<head_capture> generate(std::string_view fn, layer_spec const& L, capture_spec const& cap,
                                          std::optional<std::int64_t> only) {
    resolved_layer const rl = resolve(fn, L, cap);
    if (only && (*only < 0 || *only >= L.n_q_heads))
        fail_arg(fn, "q_head: must be in [0, n_q_heads = " + std::to_string(L.n_q_heads) + ")", *only);
    index_t const d = L.d, rd = L.rotary_dims;
    bucket_table const tb = make_bucket_table(cap);
    kept_tokens const kq = make_kept(cap, L.layer, kind::query);
    kept_tokens const kk = make_kept(cap, L.layer, kind::key);
    Eigen::VectorXd const freq = rope_frequencies(rd, L.rope_theta);

    std::int64_t const h_lo = only ? *only : 0, h_hi = only ? *only + 1 : L.n_q_heads;
    std::int64_t const g_lo = h_lo / rl.group, g_hi = (h_hi - 1) / rl.group + 1;

    // kv heads: mixing, key means, key rows.
    auto const ng = static_cast<std::size_t>(g_hi - g_lo);
    std::vector<Eigen::MatrixXd> mixing(ng);
    std::vector<kind_block> keys(ng);
    for (std::int64_t g = g_lo; g < g_hi; ++g) {
        auto const gi = static_cast<std::size_t>(g - g_lo);
        kv_head_params const& kv = rl.kv[static_cast<std::size_t>(g)];
        if (L.mix) {
            normal_stream rng(stream_seed(L.model_seed, stream_tag::mixing, L.layer, g));
            mixing[gi] = haar_orthogonal(d, rng);
        } else {
            mixing[gi] = Eigen::MatrixXd::Identity(d, d);
        }
        keys[gi] = make_kind_block(kv.key, kk, tb, L, cap, freq, L.mix ? &mixing[gi] : nullptr, kv.drift,
                                   stream_tag::key_means, stream_tag::key_tokens, g);
    }

    std::vector<head_capture> out;
    out.reserve(static_cast<std::size_t>(h_hi - h_lo));
    for (std::int64_t h = h_lo; h < h_hi; ++h) {
        std::int64_t const g = h / rl.group;  // method §0 GQA mapping
        auto const gi = static_cast<std::size_t>(g - g_lo);
        kv_head_params const& kv = rl.kv[static_cast<std::size_t>(g)];
        q_head_params const& qh = rl.q[static_cast<std::size_t>(h)];
        kind_block qb = make_kind_block(qh.query, kq, tb, L, cap, freq, L.mix ? &mixing[gi] : nullptr, kv.drift,
                                        stream_tag::query_means, stream_tag::query_tokens, h);

        head_capture hc;
        hc.id = {L.layer, h, g};
        hc.facts.buckets = cap.buckets;
        hc.facts.context_length = cap.context_length;
        hc.truth = make_truth(L, tb, mixing[gi], kv.drift, qb, keys[gi], kq, kk);
        hc.queries = {std::move(qb.rows), token_positions(kq.position), token_buckets(kq.bucket),
                      example_ids(kq.example)};
        hc.keys = {keys[gi].rows, token_positions(kk.position), token_buckets(kk.bucket), example_ids(kk.example)};
        out.push_back(std::move(hc));
    }
    return out;
}

}  // namespace detail

/// \brief The GQA kv head of a query head (method §0): ⌊h_q / (n_q / n_kv)⌋.
/// The same function as qkgeom::key_head_of (capture/protocol.hpp), kept under this
/// name for the synthetic generator's users.
/// \param[in] q_head     the query head h_q, in [0, n_q_heads).
/// \param[in] n_q_heads  query heads n_q, ≥ 1.
/// \param[in] n_kv_heads key/value heads n_kv, ≥ 1, dividing n_q.
/// \returns the kv head, in [0, n_kv_heads).
/// \throws std::invalid_argument when n_q, n_kv < 1, n_q % n_kv ≠ 0 or h_q ∉ [0, n_q).
inline std::int64_t kv_head_of(std::int64_t q_head, std::int64_t n_q_heads, std::int64_t n_kv_heads) {
    return qkgeom::key_head_of(q_head, n_q_heads, n_kv_heads);
}

/// \brief Generates every query head of a layer, each paired with its GQA kv
/// head: element h is query head h. Deterministic in (layer, capture).
///
/// A kind may end up with no rows (or one) when the keep rate is small
/// against n_examples × context_length; the conditional (cond.) truth
/// fields of that kind are then NaN.
/// \param[in] layer   geometry, GQA layout and per-head parameters.
/// \param[in] capture examples, context length, bucket scheme and seed.
/// \returns n_q_heads heads with their ground truth.
/// \pre the fields satisfy the constraints of layer_spec, capture_spec and
///      kind_params (all checked).
/// \throws std::invalid_argument naming the offending field (see docs/synthetic.md):
///         d < 2, rotary_dims odd or negative, d − rotary_dims < 2, rope_theta
///         not finite and > 0, an unknown pairing, n_q_heads or n_kv_heads
///         < 1 or not a multiple, layer < 0, q_heads / kv_heads of the wrong
///         size, n_examples or context_length < 1, an invalid bucket spec,
///         or a kind_params / drift field out of range.
/// \throws std::bad_alloc if the rows cannot be allocated (n × d doubles per
///         kind and head).
template <class = void>  // instantiated on use
std::vector<head_capture> generate_layer(layer_spec const& layer, capture_spec const& capture) {
    return detail::generate("qkgeom::synthetic::generate_layer", layer, capture, std::nullopt);
}

/// \brief Generates one (query head, kv head) pair; identical to
/// `generate_layer(layer, capture)[q_head]` but only that pair is computed.
/// With all defaults: query head 0 of the default layer (d = 64, 32 rotary
/// dims, 4 query / 2 kv heads) over 64 examples of 4096 tokens, uniform
/// buckets of 128 at rate 1.
/// \param[in] layer   geometry, GQA layout and per-head parameters.
/// \param[in] capture examples, context length, bucket scheme and seed.
/// \param[in] q_head  the query head, in [0, layer.n_q_heads).
/// \returns the head pair with its ground truth.
/// \throws std::invalid_argument as generate_layer, or when q_head is
///         outside [0, n_q_heads).
/// \throws std::bad_alloc if the rows cannot be allocated.
/// \sa generate_layer
template <class = void>  // instantiated on use
head_capture generate_head(layer_spec const& layer = {}, capture_spec const& capture = {},
                                  std::int64_t q_head = 0) {
    return std::move(detail::generate("qkgeom::synthetic::generate_head", layer, capture, q_head).front());
}

}  // namespace qkgeom::synthetic
