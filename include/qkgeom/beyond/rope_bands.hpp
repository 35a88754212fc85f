// qkgeom — RoPE bands (issue 17, docs/beyond-rope.md): with the RoPE a head's
// rows were captured after (capture_facts::rope), undo the rotation of every
// query and key row by its position and measure
//   * per rotary pair, how stable the pre-rotation mean is across position
//     buckets (the coherence; an end-to-end check of the capture settings:
//     a post-RoPE capture with the right settings is consistent, a wrong
//     pairing or pre-RoPE rows are flagged inconsistent);
//   * per frequency band, the share of the queries' content variance (with a
//     cluster standard error) and, per query bucket, the band's share of the
//     score-difference variance v = Δᵀ Σ_b Δ of the key pairs the pair policy
//     forms (same example, same earlier key bucket c < b, inside the window).
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/plasticity/pair_plan.hpp>
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/simd/moment_kernels.hpp>
#include <qkgeom/simd/rope_kernels.hpp>
#include <qkgeom/stats/moments.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <numeric>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkgeom {

/// \brief Outcome of the RoPE band analysis (docs/beyond-rope.md).
enum class rope_status : std::uint8_t {
    consistent = 0,           ///< the unrotated means are stable: the settings fit the rows
    inconsistent = 1,         ///< the unrotated means rotate: wrong pairing/theta, or pre-RoPE rows
    undetermined = 2,         ///< too little signal for the check (no powered pair, or in between)
    not_applicable = 3,       ///< facts.rope is empty (no rope block, or pre-RoPE rows): all NaN
    unsupported_scaling = 4,  ///< a scaling whose inverse needs unrecorded parameters: all NaN
    too_few_rows = 5,         ///< fewer than 2 query buckets with min_bucket_rows rows: all NaN
};

/// \brief Name of a status as written in reports ("consistent", "inconsistent",
/// "undetermined", "not_applicable", "unsupported_scaling", "too_few_rows").
/// \param[in] s the status.
/// \returns a static string ("unknown" for a value outside the enumeration).
constexpr const char* rope_status_name(rope_status s) noexcept {
    switch (s) {
        case rope_status::consistent: return "consistent";
        case rope_status::inconsistent: return "inconsistent";
        case rope_status::undetermined: return "undetermined";
        case rope_status::not_applicable: return "not_applicable";
        case rope_status::unsupported_scaling: return "unsupported_scaling";
        case rope_status::too_few_rows: return "too_few_rows";
    }
    return "unknown";
}

/// \brief Options of `rope_bands` (docs/beyond-rope.md has the thresholds).
struct rope_band_options {
    index_t n_bands = 8;                              ///< frequency bands over the rotary pairs; >= 1
    double min_angle_span = 2.0 * std::numbers::pi;   ///< radians θ_i·(τ_max − τ_min) a powered pair needs; > 0
    double min_energy_z = 10.0;                       ///< bucket-mean energy / its noise sd a powered pair needs; > 0
    double consistent_above = 0.8;                    ///< coherence ≥ this → consistent; in (0, 1]
    double inconsistent_below = 0.5;                  ///< coherence < this → inconsistent; in [0, consistent_above]
    index_t min_bucket_rows = 2;                      ///< rows a bucket needs to enter the statistics; >= 2
    double max_mirror_ratio = 0.5;                    ///< a powered pair's mirror_ratio ≥ this → inconsistent; > 0
};

/// \brief The check of one rotary pair for one kind (queries or keys).
struct rope_pair_kind {
    double coherence = detail::nan;        ///< C_i of the unrotated rows (NaN when the energy is ≤ 0)
    double coherence_raw = detail::nan;    ///< C_i of the rows as given
    double energy_z = detail::nan;         ///< debiased bucket-mean energy / its noise sd, unrotated rows
    double energy_z_raw = detail::nan;     ///< the same for the rows as given
    double angle_span = detail::nan;       ///< θ_i·(τ_max − τ_min) over the kind's used buckets (radians)
    bool powered = false;          ///< enters the unrotated coherence (span and energy_z large enough)
    bool powered_raw = false;      ///< enters the raw coherence
    /// Debiased ‖mean of R(t)·y‖² (the rows rotated once more, the opposite
    /// sense to the undoing) over Den: ≈ 0 for a true RoPE pair, ≈ 1 for a
    /// single coordinate rotating at θ_i (a pair with the wrong partner).
    double mirror_ratio = detail::nan;
};

/// \brief One rotary pair: its frequency and its check for queries and keys.
struct rope_pair_check {
    index_t pair = 0;          ///< i (coordinates (i, i + r/2) or (2i, 2i + 1))
    double frequency = detail::nan;    ///< θ_i in radians per token (after the scaling)
    double wavelength = detail::nan;   ///< 2π/θ_i in tokens
    rope_pair_kind query;      ///< the queries' check
    rope_pair_kind key;        ///< the keys' check
};

/// \brief The consistency check of one kind (energy-weighted over its powered pairs).
struct rope_kind_check {
    rope_status status = rope_status::undetermined;  ///< consistent / inconsistent / undetermined
    double coherence = detail::nan;      ///< Σ_powered Num_i / Σ_powered Den_i, unrotated rows
    double coherence_raw = detail::nan;  ///< the same for the rows as given, over its own powered pairs
    double coherence_min = detail::nan;  ///< the smallest C_i over the powered pairs, unrotated rows
    double coherence_min_raw = detail::nan;  ///< the same for the rows as given
    double mirror_max = detail::nan;     ///< the largest mirror_ratio over the powered pairs
    index_t powered_pairs = 0;   ///< pairs entering `coherence`
    index_t powered_pairs_raw = 0;  ///< pairs entering `coherence_raw`
    index_t buckets = 0;         ///< buckets with ≥ min_bucket_rows rows
};

/// \brief One frequency band (rotary pairs high → low frequency, or the unrotated coordinates).
struct rope_band {
    bool rotary = true;              ///< false for the band of unrotated coordinates (rotary_dim < d)
    index_t first_pair = 0;          ///< first rotary pair of the band (−1 for the unrotated band)
    index_t n_pairs = 0;             ///< rotary pairs in the band (0 for the unrotated band)
    index_t n_coords = 0;            ///< coordinates in the band
    double freq_lo = detail::nan;            ///< lowest θ_i of the band, radians per token (0 unrotated)
    double freq_hi = detail::nan;            ///< highest θ_i of the band (0 unrotated)
    double wavelength_lo = detail::nan;      ///< 2π/freq_hi, tokens (inf unrotated)
    double wavelength_hi = detail::nan;      ///< 2π/freq_lo, tokens (inf unrotated)
    double content_var_share = detail::nan;  ///< share of the queries' within-bucket variance (unrotated rows)
    double content_var_share_se = detail::nan;  ///< its cluster (per example, else per row) standard error
    double v_share_first_20pct = detail::nan;   ///< query-count weighted mean v share over quintile 0 buckets
    double v_share_last_20pct = detail::nan;    ///< the same over quintile 4
};

/// \brief The v shares of one query bucket.
struct rope_bucket_bands {
    std::int64_t bucket = 0;       ///< query bucket b
    std::int64_t n_queries = 0;    ///< its query rows
    double tau = detail::nan;              ///< mean position of its queries
    int quintile = 0;              ///< ⌊5 τ_b / L⌋ (method §9.12)
    std::int64_t n_pairs = 0;      ///< key pairs of its admissible cells
    std::vector<double> v_share;   ///< per band: V_bB / Σ_B' V_bB' (NaN when no pair or Σ = 0)
};

/// \brief Result of `rope_bands` (docs/beyond-rope.md): the columns of the
/// per-head, per-band and per-(bucket, band) tables.
struct rope_band_result {
    rope_status status = rope_status::not_applicable;  ///< overall status (see rope_status)
    double coherence = detail::nan;       ///< queries and keys pooled: Σ Num / Σ Den over powered pairs
    double coherence_raw = detail::nan;   ///< the same for the rows as given
    rope_kind_check queries;      ///< the queries' check
    rope_kind_check keys;         ///< the keys' check
    bool clusters_are_examples = false;  ///< SE clusters: query example ids (true) or rows (false)
    std::int64_t context_length = 0;     ///< L of the quintiles
    std::vector<rope_pair_check> pairs;  ///< per rotary pair
    std::vector<rope_band> bands;        ///< per band, high → low frequency, unrotated last
    std::vector<rope_bucket_bands> buckets;  ///< per query bucket with ≥ min_bucket_rows rows
};

namespace detail {
namespace rope {

/// The geometry: scaled frequencies, band layout, column permutation. The
/// permuted columns are planar: the first coordinates of pairs 0 .. half − 1
/// at columns 0 .. half − 1, the second ones at half .. r − 1 (so the per-pair
/// loops run over contiguous memory; for rotate_half this is the identity),
/// the unrotated coordinates last. Band k with pairs p0 .. p1 − 1 holds the
/// columns p0 .. p1 − 1 and half + p0 .. half + p1 − 1 (in that order).
struct geometry {
    index_t d = 0, r = 0, half = 0;
    std::vector<double> freq;              // per pair, radians per token
    std::vector<index_t> perm;             // permuted column → original coordinate
    bool identity = false;                 // perm is the identity
    std::vector<std::vector<index_t>> band_cols;  // per band: its permuted columns, in band order
    std::vector<rope_band> bands;
};

template <class = void>  // instantiated on use
geometry make_geometry(rope_spec const& s, index_t d, index_t n_bands, double scale) {
    geometry g;
    g.d = d;
    g.r = s.rotary_dim == 0 ? d : s.rotary_dim;
    g.half = g.r / 2;
    for (index_t i = 0; i < g.half; ++i)
        g.freq.push_back(std::pow(s.theta, -2.0 * double(i) / double(g.r)) / scale);
    bool const rh = s.pairing == rope_pairing::rotate_half;
    for (index_t i = 0; i < g.half; ++i) g.perm.push_back(rh ? i : 2 * i);  // first coordinates
    for (index_t i = 0; i < g.half; ++i) g.perm.push_back(rh ? i + g.half : 2 * i + 1);  // second ones
    for (index_t j = g.r; j < d; ++j) g.perm.push_back(j);
    g.identity = true;
    for (index_t j = 0; j < d; ++j) g.identity = g.identity && g.perm[std::size_t(j)] == j;
    index_t const nb = std::min(n_bands, g.half);
    for (index_t k = 0; k < nb; ++k) {
        index_t const p0 = k * g.half / nb, p1 = (k + 1) * g.half / nb;
        rope_band b;
        b.first_pair = p0;
        b.n_pairs = p1 - p0;
        b.n_coords = 2 * b.n_pairs;
        b.freq_hi = g.freq[std::size_t(p0)];
        b.freq_lo = g.freq[std::size_t(p1 - 1)];
        b.wavelength_lo = 2 * std::numbers::pi / b.freq_hi;
        b.wavelength_hi = 2 * std::numbers::pi / b.freq_lo;
        std::vector<index_t> cols;
        for (index_t i = p0; i < p1; ++i) cols.push_back(i);
        for (index_t i = p0; i < p1; ++i) cols.push_back(g.half + i);
        g.band_cols.push_back(std::move(cols));
        g.bands.push_back(b);
    }
    if (g.r < d) {
        rope_band b;
        b.rotary = false;
        b.first_pair = -1;
        b.n_coords = d - g.r;
        b.freq_lo = b.freq_hi = 0.0;
        b.wavelength_lo = b.wavelength_hi = std::numeric_limits<double>::infinity();
        std::vector<index_t> cols;
        for (index_t j = g.r; j < d; ++j) cols.push_back(j);
        g.band_cols.push_back(std::move(cols));
        g.bands.push_back(b);
    }
    return g;
}

/// Calls f(p0, np, c0) for the rotary pairs as one block: pairs 0 .. half − 1,
/// first coordinates at permuted columns 0 .. half − 1, second ones at
/// half .. r − 1 (the planar layout of `geometry`).
template <class F>
void for_pair_blocks(geometry const& g, F&& f) {
    if (g.half > 0) f(index_t(0), g.half, index_t(0));
}

/// cos/sin of t·θ_i for integer t in [0, max_t]: t = a + K·h, two tables of
/// K = ⌈√(max_t + 1)⌉ angles per pair, combined by the angle-addition formula.
/// Positions ≥ 2^24 (tables over 4,096 angles per pair) are computed directly.
struct trig_table {
    static constexpr std::int64_t direct_from = std::int64_t{1} << 24;
    index_t K = 1, half = 0;
    std::vector<double> lc, ls, hc, hs;  // [a * half + i], [h * half + i]
    std::vector<double> freq;            // direct computation (max_t ≥ direct_from)
    template <class = void>  // instantiated on use
    trig_table(std::vector<double> const& f, std::int64_t max_t) : half(index_t(f.size())) {
        if (max_t >= direct_from) {
            freq = f;
            return;
        }
        K = std::max<index_t>(1, index_t(std::ceil(std::sqrt(double(max_t) + 1.0))));
        index_t const H = max_t / K + 1;
        lc.resize(std::size_t(K * half)), ls.resize(lc.size());
        hc.resize(std::size_t(H * half)), hs.resize(hc.size());
        for (index_t a = 0; a < K; ++a)
            for (index_t i = 0; i < half; ++i) {
                lc[std::size_t(a * half + i)] = std::cos(double(a) * f[std::size_t(i)]);
                ls[std::size_t(a * half + i)] = std::sin(double(a) * f[std::size_t(i)]);
            }
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < half; ++i) {
                hc[std::size_t(h * half + i)] = std::cos(double(h * K) * f[std::size_t(i)]);
                hs[std::size_t(h * half + i)] = std::sin(double(h * K) * f[std::size_t(i)]);
            }
    }
    /// cs[i], sn[i] = cos, sin of t·θ_i for every pair i (`half` entries each).
    template <class = void>  // instantiated on use
    void angles(std::int64_t t, double* __restrict cs, double* __restrict sn) const {
        if (!freq.empty()) {
            for (index_t i = 0; i < half; ++i) {
                cs[i] = std::cos(double(t) * freq[std::size_t(i)]);
                sn[i] = std::sin(double(t) * freq[std::size_t(i)]);
            }
            return;
        }
        double const* __restrict c1 = lc.data() + std::size_t(t % K) * std::size_t(half);
        double const* __restrict s1 = ls.data() + std::size_t(t % K) * std::size_t(half);
        double const* __restrict c2 = hc.data() + std::size_t(t / K) * std::size_t(half);
        double const* __restrict s2 = hs.data() + std::size_t(t / K) * std::size_t(half);
        for (index_t i = 0; i < half; ++i) {
            cs[i] = c1[i] * c2[i] - s1[i] * s2[i];
            sn[i] = s1[i] * c2[i] + c1[i] * s2[i];
        }
    }
};

using dmat = Eigen::MatrixXd;
using rmat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// One kind's rows sorted by (bucket, example id, row), with the bucket
/// segments [start, start + count) of the sorted order. The vectors stay in
/// the caller's matrix: `gather` reads a segment (permuted columns, widened
/// to double, validated) into a reused buffer.
template <class Reader>
struct sorted_rows {
    Reader reader;
    std::string_view fn;
    std::string_view kind_name;
    geometry const* g = nullptr;
    std::vector<index_t> order;  // sorted position → row of the input
    std::vector<std::int64_t> position, bucket, example;
    std::vector<std::pair<index_t, index_t>> segment;  // (start, count) per bucket
    std::int64_t max_position = 0;
    bool checked = false;  // the rows were validated by the caller (analyze_head's moments pass)
    simd::isa level = simd::isa::generic;  // of the widening

    /// Row i of the input widened to double (contiguous f32 rows: the
    /// dispatched widening of moment_kernels.hpp, exact at every level).
    void read_row(index_t i, double* out) const {
        if constexpr (std::is_same_v<Reader, matrix_view<float>>) {
            if (reader.col_stride() == 1)
                return detail::mom::widen_f32(level, reader.data() + i * reader.row_stride(), out, reader.cols());
        }
        reader.read_row(i, out);
    }

    /// Rows fetched ahead of their reading: the sorted order jumps through
    /// the input, past what the hardware prefetchers follow.
    static constexpr index_t prefetch_ahead = 6;
    /// Asks for the cache lines of input row i (contiguous f32 / f64 views).
    void prefetch_row(index_t i) const noexcept {
        if constexpr (std::is_same_v<Reader, matrix_view<float>> || std::is_same_v<Reader, matrix_view<double>>) {
            if (reader.col_stride() != 1) return;
            detail::prefetch_bytes(reader.data() + i * reader.row_stride(),
                                   std::size_t(reader.cols()) * sizeof(*reader.data()));
        } else {
            (void)i;
        }
    }

    /// out.topRows(n) = the sorted rows r0 .. r0 + n − 1 in permuted columns
    /// (`out` grows, never shrinks: one allocation for the largest bucket).
    void gather(index_t r0, index_t n, rmat& out) const {
        if (out.rows() < n || out.cols() != g->d) out.resize(n, g->d);
        std::vector<double> buf(g->identity ? 0 : std::size_t(g->d));
        index_t const* perm = g->perm.data();
        for (index_t r = 0; r < n; ++r) {
            index_t const i = order[std::size_t(r0 + r)];
            if (r + prefetch_ahead < n) prefetch_row(order[std::size_t(r0 + r + prefetch_ahead)]);
            double* o = out.row(r).data();
            double const* v = o;  // the row in the input's column order
            if (g->identity) {
                read_row(i, o);
            } else {
                read_row(i, buf.data());
                for (index_t j = 0; j < g->d; ++j) o[j] = buf[std::size_t(perm[j])];
                v = buf.data();
            }
            if (checked) continue;
            int bad = 0;  // NaN fails the comparison
            for (index_t j = 0; j < g->d; ++j) bad |= !(std::abs(v[j]) < input_limit);
            if (!bad) continue;
            for (index_t j = 0; j < g->d; ++j)
                if (!(std::abs(v[j]) < input_limit))
                    fail_arg(fn, std::string(kind_name) + ": a row holds NaN, Inf or a value >= 2^128 at row " +
                                     std::to_string(i) + ", column " + std::to_string(j) + "; value",
                             v[j]);
        }
    }
};

/// The rows of `rows` in the order (bucket, example id, row): a stable
/// counting sort by bucket (buckets below 4·n + 1024, the usual case; else a
/// comparison sort), then each bucket's run sorted by example id unless the
/// rows already come in example order (captures write them so).
template <class M>
std::vector<index_t> bucket_example_order(token_rows<M> const& rows, index_t n) {
    bool const ex = !rows.example_id.empty();
    auto const bucket = [&](index_t i) { return rows.bucket[i]; };
    auto const example = [&](index_t i) { return ex ? rows.example_id[i] : std::int64_t(i); };
    std::vector<index_t> order(static_cast<std::size_t>(n));
    std::int64_t top = 0;
    for (index_t i = 0; i < n; ++i) top = std::max(top, bucket(i));
    if (top < 4 * std::int64_t(n) + 1024) {
        std::vector<index_t> start(static_cast<std::size_t>(top) + 2, 0);
        for (index_t i = 0; i < n; ++i) ++start[static_cast<std::size_t>(bucket(i)) + 1];
        std::partial_sum(start.begin(), start.end(), start.begin());
        for (index_t i = 0; i < n; ++i) order[static_cast<std::size_t>(start[static_cast<std::size_t>(bucket(i))]++)] = i;
    } else {
        std::iota(order.begin(), order.end(), index_t(0));
        std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return bucket(a) < bucket(b); });
    }
    auto const before = [&](index_t a, index_t b) { return example(a) != example(b) ? example(a) < example(b) : a < b; };
    for (std::size_t s = 0; s < order.size();) {  // each bucket's run: by example id, then row
        std::size_t e = s + 1;
        bool sorted = true;
        for (; e < order.size() && bucket(order[e]) == bucket(order[s]); ++e) sorted = sorted && before(order[e - 1], order[e]);
        if (!sorted) std::sort(order.begin() + std::ptrdiff_t(s), order.begin() + std::ptrdiff_t(e), before);
        s = e;
    }
    return order;
}

template <class M>
auto read_sorted(std::string_view fn, std::string_view kind_name, token_rows<M> const& rows, geometry const& g,
                 bool checked) {
    using reader_t = std::remove_cv_t<decltype(as_matrix(rows.vectors))>;
    sorted_rows<reader_t> s{as_matrix(rows.vectors), fn, kind_name, &g, {}, {}, {}, {}, {}, 0, checked, simd::active()};
    index_t const n = s.reader.rows();
    bool const ex = !rows.example_id.empty();
    s.order = bucket_example_order(rows, n);
    s.position.reserve(std::size_t(n)), s.bucket.reserve(std::size_t(n)), s.example.reserve(std::size_t(n));
    for (index_t r = 0; r < n; ++r) {
        index_t const i = s.order[std::size_t(r)];
        s.position.push_back(rows.position[i]);
        s.bucket.push_back(rows.bucket[i]);
        s.example.push_back(ex ? rows.example_id[i] : std::int64_t(i));
        s.max_position = std::max(s.max_position, rows.position[i]);
        if (r == 0 || s.bucket[std::size_t(r)] != s.bucket[std::size_t(r - 1)]) s.segment.push_back({r, 0});
        ++s.segment.back().second;
    }
    return s;
}

/// Per pair sums of one frame: for the current bucket, Σ x (2 per pair) and
/// Σ ‖x‖²; at the end of the bucket folded into the statistics of §1 of
/// docs/beyond-rope.md (Den, Num, noise²).
struct pair_energy {
    std::vector<double> cs, cq;           // current bucket: Σ x and Σ x² per permuted rotary column
    std::vector<double> den, m1, m2, var_sum, noise2, ss_all;  // over buckets
    std::vector<double> r1, r2;  // Σ R(t)x over all rows (mirror frame; filled by unrotate_row)
    explicit pair_energy(geometry const& g)
        : cs(std::size_t(g.r)), cq(cs), den(std::size_t(g.half)), m1(den), m2(den), var_sum(den), noise2(den),
          ss_all(den), r1(den), r2(den) {}
    /// Folds a bucket of n rows (weight w = n/N added later through 1/N).
    template <class = void>  // instantiated on use
    void close(geometry const& g, double n) {
        for_pair_blocks(g, [&](index_t p0, index_t np, index_t c0) {
            for (index_t j = 0; j < np; ++j) {
                auto const i = std::size_t(p0 + j), c1 = std::size_t(c0 + j), c2 = std::size_t(c0 + np + j);
                double const s1 = cs[c1], s2 = cs[c2], ss = cq[c1] + cq[c2];
                double const a = s1 / n, b = s2 / n, e = a * a + b * b;
                double const v = std::max(0.0, (ss - n * e) / (n - 1));  // trace of the 2 × 2 covariance
                den[i] += n * (e - v / n);
                m1[i] += s1, m2[i] += s2;
                var_sum[i] += n * v;  // Σ n_b s_b²
                noise2[i] += n * n * (v / n) * (v / n);
                ss_all[i] += ss;
            }
        });
        std::fill(cs.begin(), cs.end(), 0.0);
        std::fill(cq.begin(), cq.end(), 0.0);
    }
};

/// The loop of `unrotate_row` over np pairs (separate restrict arrays: the
/// compiler vectorises it): x = (x1, x2) the row's pairs, (c, sv) their
/// cos, sin; u = R(t)ᵀ x; ra/rq += x, x²; oa/oq += u, u²; n += R(t) x.
template <class = void>  // instantiated on use
void unrotate_pairs(index_t np, double const* __restrict x1, double const* __restrict x2,
                           double const* __restrict c, double const* __restrict sv, double* __restrict u1,
                           double* __restrict u2, double* __restrict ra1, double* __restrict ra2,
                           double* __restrict rq1, double* __restrict rq2, double* __restrict oa1,
                           double* __restrict oa2, double* __restrict oq1, double* __restrict oq2,
                           double* __restrict n1, double* __restrict n2) {
    for (index_t j = 0; j < np; ++j) {
        double const a = x1[j], b = x2[j];
        ra1[j] += a, rq1[j] += a * a, ra2[j] += b, rq2[j] += b * b;
        n1[j] += c[j] * a - sv[j] * b;
        n2[j] += sv[j] * a + c[j] * b;
        double const ua = c[j] * a + sv[j] * b, ub = c[j] * b - sv[j] * a;
        u1[j] = ua, u2[j] = ub;
        oa1[j] += ua, oq1[j] += ua * ua, oa2[j] += ub, oq2[j] += ub * ub;
    }
}

/// One row of a bucket in one pass over its rotary pairs: the raw frame's
/// sums (`raw`), the unrotated pair x' = R(t)ᵀ x written to `ur` and summed
/// (`rot`), and R(t)·x (the opposite sense: the mirror check) summed into
/// rot.r1, rot.r2; `cs`, `sn` the pairs' cos, sin of t·θ_i.
template <class = void>  // instantiated on use
void unrotate_row(geometry const& g, double const* row, double* ur, double const* cs, double const* sn,
                         pair_energy& raw, pair_energy& rot) {
    index_t const h = g.half;
    if (h == 0) return;
    unrotate_pairs(h, row, row + h, cs, sn, ur, ur + h, raw.cs.data(), raw.cs.data() + h, raw.cq.data(),
                   raw.cq.data() + h, rot.cs.data(), rot.cs.data() + h, rot.cq.data(), rot.cq.data() + h,
                   rot.r1.data(), rot.r2.data());
}

/// `unrotate_row` over the n rows of a bucket (positions `t`) at `level`
/// (avx2 or avx512; table angles): the register-blocked kernel of
/// simd/rope_kernels.hpp, the same sums bit for bit. `u`: n × r (row-major)
/// receives the unrotated pairs when not null; `o12` is work space.
template <class = void>  // instantiated on use
void unrotate_bucket(simd::isa level, geometry const& g, trig_table const& tt, rmat const& blk,
                            std::int64_t const* t, index_t n, double* u, pair_energy& raw, pair_energy& rot,
                            std::vector<index_t>& o12) {
    index_t const h = g.half;
    if (h == 0) return;
    o12.resize(std::size_t(2 * n));
    for (index_t r = 0; r < n; ++r)
        o12[std::size_t(r)] = index_t(t[r] % tt.K) * h, o12[std::size_t(n + r)] = index_t(t[r] / tt.K) * h;
    detail::ropek::unrotate_args a;
    a.x = blk.data(), a.ldx = blk.cols(), a.n = n, a.h = h;
    a.o1 = o12.data(), a.o2 = o12.data() + n;
    a.lc = tt.lc.data(), a.ls = tt.ls.data(), a.hc = tt.hc.data(), a.hs = tt.hs.data();
    a.u = u, a.ldu = g.r;
    a.ra = raw.cs.data(), a.rq = raw.cq.data(), a.oa = rot.cs.data(), a.oq = rot.cq.data();
    a.m1 = rot.r1.data(), a.m2 = rot.r2.data();
    detail::ropek::unrotate_block(level, a);
}

/// Per pair coherence, energy z and power of one frame; Num and Den summed
/// over the powered pairs into `num`, `den`.
template <class = void>  // instantiated on use
void finish_frame(pair_energy const& e, double N, std::vector<double> const& span, double min_span,
                         double min_z, std::vector<rope_pair_check>& out, bool query, bool raw, double& num,
                         double& den, index_t& powered, double& c_min,
                         double& mirror_max) {
    for (std::size_t i = 0; i < e.den.size(); ++i) {
        double const D = e.den[i] / N;
        double const a = e.m1[i] / N, b = e.m2[i] / N;
        double const U = a * a + b * b - e.var_sum[i] / (N * N);
        double const noise = std::sqrt(e.noise2[i]) / N;
        double const z = noise > 0 ? D / noise : (D > 0 ? std::numeric_limits<double>::infinity() : nan);
        bool const p = span[i] >= min_span && z >= min_z;
        rope_pair_kind& k = query ? out[i].query : out[i].key;
        (raw ? k.coherence_raw : k.coherence) = D > 0 ? U / D : nan;
        (raw ? k.energy_z_raw : k.energy_z) = z;
        (raw ? k.powered_raw : k.powered) = p;
        if (!raw && D > 0) {  // mirror: debiased ‖mean of R(t)·y‖² over all rows, over D
            double const c = e.r1[i] / N, d = e.r2[i] / N;
            double const s2 = std::max(0.0, (e.ss_all[i] - N * (c * c + d * d)) / (N - 1));
            k.mirror_ratio = (c * c + d * d - s2 / N) / D;
        }
        k.angle_span = span[i];
        if (!p) continue;
        num += U, den += D, ++powered;
        c_min = std::isnan(c_min) ? U / D : std::min(c_min, U / D);
        if (!raw) mirror_max = std::isnan(mirror_max) ? k.mirror_ratio : std::max(mirror_max, k.mirror_ratio);
    }
}

/// out.rows(o .. o + m) = scale · (x.rows(r .. r + m) − their mean) (two
/// passes over the rows; `mean` is work space of x.cols() entries).
template <class = void>  // instantiated on use
void center_rows(rmat const& x, index_t r, index_t m, rmat& out, index_t o, double scale,
                        std::vector<double>& mean) {
    index_t const d = x.cols();
    mean.assign(std::size_t(d), 0.0);
    for (index_t i = r; i < r + m; ++i) {
        double const* xi = x.row(i).data();
        for (index_t j = 0; j < d; ++j) mean[std::size_t(j)] += xi[j];
    }
    for (index_t j = 0; j < d; ++j) mean[std::size_t(j)] /= double(m);
    for (index_t i = 0; i < m; ++i) {
        double const* xi = x.row(r + i).data();
        double* oi = out.row(o + i).data();
        for (index_t j = 0; j < d; ++j) oi[j] = (xi[j] - mean[std::size_t(j)]) * scale;
    }
}

/// C (w × w, lower triangle, column-major) += Xᵀ X for the n × w block X of
/// row-major doubles at `x` (row stride `ldx`): at simd::active() = avx2 or
/// avx512 the register-blocked rank-k update of simd/moment_kernels.hpp on a
/// packed copy of X (panels of W columns, zero padded), else Eigen's
/// rankUpdate. The levels agree to rounding.
struct gram_update {
    std::vector<double> buf;  // the packed block (grows only)
    template <class = void>  // instantiated on use
    void add(double const* x, index_t ldx, index_t n, std::vector<index_t> const& cols, dmat& C) {
        index_t const w = index_t(cols.size());
        if (n == 0 || w == 0) return;
        simd::isa const level = simd::active();
        index_t const W = level == simd::isa::generic ? 1 : detail::mom::panel_width(level), np = (w + W - 1) / W;
        if (buf.size() < std::size_t(np * W * n + 8)) buf.resize(std::size_t(np * W * n + 8));
        double* const pk = detail::mom::align64(buf.data());
        index_t const* cl = cols.data();
        for (index_t k = 0; k < n; ++k) {  // panel p holds columns cols[pW .. pW + W) row after row
            double const* xk = x + k * ldx;
            for (index_t p = 0; p < np; ++p) {
                double* o = pk + (p * n + k) * W;
                index_t const m = std::min(W, w - p * W);
                for (index_t l = 0; l < m; ++l) o[l] = xk[cl[p * W + l]];
                for (index_t l = m; l < W; ++l) o[l] = 0.0;
            }
        }
        update(level, pk, n, w, C);
    }
    /// C (w × w, lower triangle) += the Gram matrix of the packed n × w block
    /// at pk (panels of W = panel_width(level) columns; generic: W = 1, that
    /// is column-major).
    template <class = void>  // instantiated on use
    static void update(simd::isa level, double const* pk, index_t n, index_t w, dmat& C) {
        if (level != simd::isa::generic) return detail::mom::syrk_packed(level, pk, n, w, C.data(), w);
        Eigen::Map<dmat const> X(pk, n, w);  // W = 1: column-major n × w
        C.selfadjointView<Eigen::Lower>().rankUpdate(X.transpose());
    }
    /// The panels of every band side by side: per band ⌈w_b / W⌉ panels of W
    /// lanes, each lane the source column of `add`'s packing (−1: zero pad);
    /// `first[b]`: band b's first panel.
    template <class = void>  // instantiated on use
    static std::vector<index_t> pack_plan(std::vector<std::vector<index_t>> const& band_cols, index_t W,
                                          std::vector<index_t>& first) {
        std::vector<index_t> plan;
        first.clear();
        for (auto const& cols : band_cols) {
            first.push_back(index_t(plan.size()) / W);
            index_t const w = index_t(cols.size()), np = (w + W - 1) / W;
            for (index_t l = 0; l < np * W; ++l) plan.push_back(l < w ? cols[std::size_t(l)] : index_t(-1));
        }
        return plan;
    }
    /// Rows s0 .. s0 + m − 1 of x as (x − mean)·scale into packed rows kk ..
    /// kk + m − 1 of the panels of `plan` (nz rows per panel).
    template <index_t W>
    static void pack_rows(rmat const& x, index_t s0, index_t m, double const* mean, double scale,
                          std::vector<index_t> const& plan, index_t nz, index_t kk, double* pk) {
        constexpr index_t Q = W < 4 ? W : 4;  // lanes per run: runs of Q contiguous source columns are copied as one
        index_t const P = index_t(plan.size()) / W;
        for (index_t p = 0; p < P; ++p) {
            for (index_t q = 0; q < W; q += Q) {
                index_t const* src = plan.data() + p * W + q;
                bool contiguous = src[0] >= 0;
                for (index_t l = 1; l < Q; ++l) contiguous = contiguous && src[l] == src[0] + l;
                double* o = pk + (p * nz + kk) * W + q;
                for (index_t i = 0; i < m; ++i, o += W) {
                    double const* xi = x.row(s0 + i).data();
                    if (contiguous) {
                        double const* xs = xi + src[0];
                        double const* ms = mean + src[0];
                        for (index_t l = 0; l < Q; ++l) o[l] = (xs[l] - ms[l]) * scale;
                    } else {
                        for (index_t l = 0; l < Q; ++l) o[l] = src[l] < 0 ? 0.0 : (xi[src[l]] - mean[src[l]]) * scale;
                    }
                }
            }
        }
    }
};

/// Σ_ij A_ij B_ij of two symmetric matrices given by their lower triangles.
template <class = void>  // instantiated on use
double sym_dot(dmat const& A, dmat const& B) {
    double diag = 0, off = 0;
    for (index_t j = 0; j < A.cols(); ++j) {
        diag += A(j, j) * B(j, j);
        for (index_t i = j + 1; i < A.rows(); ++i) off += A(i, j) * B(i, j);
    }
    return diag + 2 * off;
}

/// Per key cell (key bucket): the band blocks of D_c = Σ_pairs Δ Δᵀ over the
/// pairs of one example's keys in the cell (Σ_{i<j} (x_i − x_j)(x_i − x_j)ᵀ =
/// m Σ_i (x_i − x̄)(x_i − x̄)ᵀ per group of m keys), prefix-summed over the
/// cells in ascending order: pref[c + 1] − pref[lo] sums cells lo..c.
struct key_prefix {
    std::vector<std::int64_t> cell;             // key bucket of each cell, ascending
    std::vector<std::vector<dmat>> pref;        // [cells + 1][band]
    std::vector<std::int64_t> pairs;            // prefix pair counts
    std::vector<double> mean;                   // work: one group's mean

    template <class = void>  // instantiated on use
    explicit key_prefix(geometry const& g) : pref(1), pairs(1, 0) {
        for (auto const& c : g.band_cols) pref.back().push_back(dmat::Zero(index_t(c.size()), index_t(c.size())));
    }
    /// Adds key cell r0 .. r0 + n − 1 of `k` (one key bucket, sorted by
    /// example; its rows in `blk`): each group of m ≥ 2 keys of one example
    /// centred, scaled by √m and written straight into the packed panels of
    /// every band (`gram_update::pack_plan`), then one rank-k update per band.
    template <class S>
    void add_cell(S const& k, index_t r0, index_t n, rmat const& blk, geometry const& g) {
        simd::isa const level = simd::active();
        index_t const W = level == simd::isa::generic ? 1 : detail::mom::panel_width(level);
        if (plan_w != W) make_plan(g, W);
        groups.clear();
        index_t nz = 0;
        std::int64_t np = 0;
        for (index_t r = r0; r < r0 + n;) {
            index_t e = r;
            while (e < r0 + n && k.example[std::size_t(e)] == k.example[std::size_t(r)]) ++e;
            if (e - r >= 2) groups.push_back({r - r0, e - r}), nz += e - r, np += std::int64_t(e - r) * (e - r - 1) / 2;
            r = e;
        }
        cell.push_back(k.bucket[std::size_t(r0)]);
        pairs.push_back(pairs.back() + np);
        pref.push_back(pref.back());
        if (nz == 0) return;
        index_t const P = index_t(plan.size()) / W;
        if (buf.size() < std::size_t(P * W * nz + 8)) buf.resize(std::size_t(P * W * nz + 8));
        double* const pk = detail::mom::align64(buf.data());
        if (level != simd::isa::generic && quads_ok) {  // the dispatched kernel: the same values
            quad_dst.resize(quad_src.size());
            for (std::size_t q = 0; q < quad_src.size(); ++q)  // panel ⌊4q / W⌋, lane 4q mod W, row 0
                quad_dst[q] = index_t(q) * 4 / W * nz * W + index_t(q) * 4 % W;
            mean.resize(std::size_t(g.d));
            index_t kk = 0;
            for (auto const& [s0, m] : groups) {
                detail::ropek::centre_group(level, blk.row(s0).data(), blk.cols(), m, g.d, mean.data(),
                                            std::sqrt(double(m)), quad_src.data(), quad_dst.data(),
                                            index_t(quad_src.size()), pk + kk * W, W);
                kk += m;
            }
        } else {
            pack_groups(blk, g, nz, W, pk);
        }
        for (std::size_t b = 0; b < g.bands.size(); ++b)  // lower triangles only
            gram_update::update(level, pk + first[b] * nz * W, nz, index_t(g.band_cols[b].size()), pref.back()[b]);
    }

private:
    /// The groups into the panels by the scalar loops (generic level, or a
    /// panel lane run that is not 4 contiguous columns).
    template <class = void>  // instantiated on use
    void pack_groups(rmat const& blk, geometry const& g, index_t nz, index_t W, double* pk) {
        index_t kk = 0;
        for (auto const& [s0, m] : groups) {
            mean.assign(std::size_t(g.d), 0.0);  // the group mean as center_rows forms it
            double* __restrict mu = mean.data();
            for (index_t i = s0; i < s0 + m; ++i) {
                double const* __restrict xi = blk.row(i).data();
                for (index_t j = 0; j < g.d; ++j) mu[j] += xi[j];
            }
            for (index_t j = 0; j < g.d; ++j) mu[j] /= double(m);
            double const scale = std::sqrt(double(m));
            if (W == 8) gram_update::pack_rows<8>(blk, s0, m, mean.data(), scale, plan, nz, kk, pk);
            else if (W == 4) gram_update::pack_rows<4>(blk, s0, m, mean.data(), scale, plan, nz, kk, pk);
            else gram_update::pack_rows<1>(blk, s0, m, mean.data(), scale, plan, nz, kk, pk);
            kk += m;
        }
    }
    /// The packing plan at width W; quad_src: the first source column of each
    /// run of 4 lanes, quads_ok: every run is 4 contiguous columns (W ≥ 4).
    template <class = void>  // instantiated on use
    void make_plan(geometry const& g, index_t W) {
        plan_w = W, plan = gram_update::pack_plan(g.band_cols, W, first);
        quad_src.clear();
        quads_ok = W >= 4;
        for (std::size_t q = 0; quads_ok && q < plan.size(); q += 4) {
            for (std::size_t l = 0; l < 4; ++l) quads_ok = quads_ok && plan[q] >= 0 && plan[q + l] == plan[q] + index_t(l);
            quad_src.push_back(plan[q]);
        }
    }
    std::vector<index_t> quad_src, quad_dst;  // per run of 4 lanes: source column, packed offset of the group's row 0
    bool quads_ok = false;
    std::vector<std::pair<index_t, index_t>> groups;  // work: (first row in blk, rows) of the groups of ≥ 2 keys
    std::vector<index_t> plan, first;                 // the packing plan at panel width plan_w
    index_t plan_w = 0;
    std::vector<double> buf;                          // work: the packed groups (grows only)
};

/// The queries' within-bucket residual energy of the unrotated rows, per
/// band and per cluster (example id when the queries carry them, else row).
struct content_acc {
    std::vector<std::int64_t> cluster_of;  // per sorted row: dense cluster id
    index_t n_clusters = 0, n_bands = 0;
    std::vector<double> a;                 // [cluster * n_bands + band]
    std::vector<double> col;               // work: one run's Σ (u − μ)² per column
    template <class = void>  // instantiated on use
    content_acc(std::vector<std::int64_t> const& example, index_t bands) : n_bands(bands) {
        auto const [lo, hi] = std::minmax_element(example.begin(), example.end());
        if (lo != example.end() && std::uint64_t(*hi) - std::uint64_t(*lo) < 4 * example.size() + 1024) {
            std::vector<std::int64_t> rank(std::size_t(*hi - *lo) + 1, 0);  // ids in a small range: rank by counting
            for (auto e : example) rank[std::size_t(e - *lo)] = 1;
            for (auto& v : rank) v = (n_clusters += v) - 1;  // the dense id of each present id, ascending
            for (auto e : example) cluster_of.push_back(rank[std::size_t(e - *lo)]);
        } else {
            std::vector<std::int64_t> ids = example;
            std::sort(ids.begin(), ids.end());
            ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
            n_clusters = index_t(ids.size());
            for (auto e : example)
                cluster_of.push_back(std::lower_bound(ids.begin(), ids.end(), e) - ids.begin());
        }
        a.assign(std::size_t(n_clusters * n_bands), 0.0);
    }
    /// Adds the residuals of the unrotated rows r0 .. r0 + n − 1 of `s`
    /// (permuted columns) from their mean `usum`/n; `buf` has ≥ r entries.
    /// `u` holds the bucket's unrotated rotary columns (n × r, row-major).
    /// At avx2 / avx512 per run of rows of one cluster: Σ over the run per
    /// column (simd/rope_kernels.hpp), then per band (sums of squares in
    /// another order: equal to rounding).
    template <class = void>  // instantiated on use
    void add_bucket(simd::isa level, rmat const& blk, index_t r0, index_t n, geometry const& g,
                    std::vector<double> const& u, std::vector<double> const& usum) {
        std::vector<double> mean(usum.size()), sq(usum.size());
        for (std::size_t j = 0; j < usum.size(); ++j) mean[j] = usum[j] / double(n);
        double const* __restrict mu = mean.data();
        if (level != simd::isa::generic) return add_runs(level, blk, r0, n, g, u, mean);
        double* __restrict e = sq.data();
        for (index_t r = 0; r < n; ++r) {
            double const* __restrict row = blk.row(r).data();
            double const* __restrict ur = u.data() + r * g.r;
            for (index_t j = 0; j < g.r; ++j) e[j] = (ur[j] - mu[j]) * (ur[j] - mu[j]);  // vectorised
            for (index_t j = g.r; j < g.d; ++j) e[j] = (row[j] - mu[j]) * (row[j] - mu[j]);
            add_bands(g, e, a.data() + cluster_of[std::size_t(r0 + r)] * n_bands);
        }
    }
    template <class = void>  // instantiated on use
    void add_runs(simd::isa level, rmat const& blk, index_t r0, index_t n, geometry const& g,
                  std::vector<double> const& u, std::vector<double> const& mean) {
        col.resize(std::size_t(g.d));
        for (index_t r = 0; r < n;) {
            std::int64_t const c = cluster_of[std::size_t(r0 + r)];
            index_t e = r + 1;
            while (e < n && cluster_of[std::size_t(r0 + e)] == c) ++e;
            detail::ropek::sq_residual(level, u.data() + r * g.r, g.r, e - r, mean.data(), g.r, col.data());
            detail::ropek::sq_residual(level, blk.row(r).data() + g.r, blk.cols(), e - r, mean.data() + g.r, g.d - g.r,
                                       col.data() + g.r);
            add_bands_paired(g, col.data(), a.data() + c * n_bands);
            r = e;
        }
    }
    /// acc[k] += Σ of e over band k's columns (rotary bands: per pair, the
    /// pair's two columns first; the sums of squares in another order than
    /// the generic level's: equal to rounding).
    template <class = void>  // instantiated on use
    void add_bands_paired(geometry const& g, double const* e, double* acc) {
        pair_sum.resize(std::size_t(g.half));
        double* __restrict f = pair_sum.data();
        for (index_t i = 0; i < g.half; ++i) f[i] = e[i] + e[g.half + i];
        for (index_t k = 0; k < n_bands; ++k) {
            auto const& b = g.bands[std::size_t(k)];
            acc[k] += b.rotary ? sum4(f + b.first_pair, b.n_pairs) : sum4(e + g.r, b.n_coords);
        }
    }
    std::vector<double> pair_sum;  // work: per pair, the run's sum over its two columns
    /// acc[k] += Σ of e over band k's columns.
    template <class = void>  // instantiated on use
    void add_bands(geometry const& g, double const* e, double* acc) const {
        for (index_t k = 0; k < n_bands; ++k) {  // rotary: two runs of np columns; unrotated: one run
            auto const& c = g.band_cols[std::size_t(k)];
            index_t const m = index_t(c.size()), np = g.bands[std::size_t(k)].n_pairs;
            acc[k] += np > 0 ? sum4(e + c[0], np) + sum4(e + c[std::size_t(np)], np) : sum4(e + c[0], m);
        }
    }
    /// Σ p[0 .. m) in four interleaved partial sums (independent chains; the
    /// terms are squares, so the order changes the sum by rounding only).
    template <class = void>  // instantiated on use
    static double sum4(double const* p, index_t m) {
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        index_t j = 0;
        for (; j + 4 <= m; j += 4) s0 += p[j], s1 += p[j + 1], s2 += p[j + 2], s3 += p[j + 3];
        for (; j < m; ++j) s0 += p[j];
        return (s0 + s1) + (s2 + s3);
    }
    /// Shares and their linearised cluster standard errors:
    /// S_B = A_B / T, se² = G/(G−1) Σ_e (A_eB − S_B T_e)² / T².
    template <class = void>  // instantiated on use
    void finish(std::vector<rope_band>& bands) const {
        std::vector<double> A(std::size_t(n_bands), 0.0), Te(std::size_t(n_clusters), 0.0);
        for (index_t e = 0; e < n_clusters; ++e)
            for (index_t k = 0; k < n_bands; ++k) {
                A[std::size_t(k)] += a[std::size_t(e * n_bands + k)];
                Te[std::size_t(e)] += a[std::size_t(e * n_bands + k)];
            }
        double const T = std::accumulate(A.begin(), A.end(), 0.0);
        if (!(T > 0)) return;  // zero content variance: the shares stay NaN
        for (index_t k = 0; k < n_bands; ++k) {
            double const S = A[std::size_t(k)] / T;
            bands[std::size_t(k)].content_var_share = S;
            if (n_clusters < 2) continue;
            double q = 0;
            for (index_t e = 0; e < n_clusters; ++e) {
                double const r = a[std::size_t(e * n_bands + k)] - S * Te[std::size_t(e)];
                q += r * r;
            }
            double const G = double(n_clusters);
            bands[std::size_t(k)].content_var_share_se = std::sqrt(G / (G - 1) * q) / T;
        }
    }
};

/// Mean position of each segment and the used segments (≥ min rows).
template <class S>
std::vector<double> segment_tau(S const& s) {
    std::vector<double> tau;
    for (auto const& [r0, n] : s.segment) {
        double t = 0;
        for (index_t r = r0; r < r0 + n; ++r) t += double(s.position[std::size_t(r)]);
        tau.push_back(t / double(n));
    }
    return tau;
}

/// The coherence check of one kind (and, for queries, the content residuals).
template <class S>
void kind_pass(S const& s, geometry const& g, trig_table const& tt, rope_band_options const& opt,
               std::vector<rope_pair_check>& pairs, bool query, rope_kind_check& out, double& num, double& den,
               double& num_raw, double& den_raw, content_acc* content, key_prefix* keys) {
    std::vector<double> const tau = segment_tau(s);
    double lo = std::numeric_limits<double>::infinity(), hi = -lo, N = 0;
    for (std::size_t b = 0; b < s.segment.size(); ++b)
        if (s.segment[b].second >= opt.min_bucket_rows) {
            lo = std::min(lo, tau[b]), hi = std::max(hi, tau[b]);
            N += double(s.segment[b].second);
            ++out.buckets;
        }
    bool const check = out.buckets >= 2;  // else no check: undetermined, NaN
    std::vector<double> span;
    for (double f : g.freq) span.push_back(f * (hi - lo));
    pair_energy rot(g), raw(g);
    std::vector<double> u, usum(std::size_t(g.d));  // the bucket's unrotated rotary columns, their sums
    std::vector<double> cs(std::size_t(g.half)), sn(cs);  // one row's cos, sin of t·θ_i
    std::vector<index_t> o12;  // the bucket's angle table offsets (unrotate_bucket)
    simd::isa const level = simd::active();
    rmat blk;
    for (auto const& [r0, n] : s.segment) {
        s.gather(r0, n, blk);  // every row is validated, used or not
        if (keys) keys->add_cell(s, r0, n, blk, g);
        if (!check || n < opt.min_bucket_rows) continue;
        std::fill(usum.begin(), usum.end(), 0.0);
        if (u.size() < std::size_t(n * g.r)) u.resize(std::size_t(n * g.r));  // grows only
        if (level != simd::isa::generic && tt.freq.empty()) {  // register-blocked, angles in registers
            unrotate_bucket(level, g, tt, blk, s.position.data() + r0, n, content ? u.data() : nullptr, raw, rot, o12);
            if (content && n > 0)
                detail::ropek::col_sums(level, blk.row(0).data() + g.r, blk.cols(), n, g.d - g.r, usum.data() + g.r);
        } else {
            for (index_t r = 0; r < n; ++r) {
                double const* row = blk.row(r).data();
                tt.angles(s.position[std::size_t(r0 + r)], cs.data(), sn.data());
                unrotate_row(g, row, u.data() + r * g.r, cs.data(), sn.data(), raw, rot);
                if (!content) continue;
                for (index_t j = g.r; j < g.d; ++j) usum[std::size_t(j)] += row[j];
            }
        }
        std::copy(rot.cs.begin(), rot.cs.end(), usum.begin());  // Σ of the unrotated columns, the same sums
        rot.close(g, double(n));
        raw.close(g, double(n));
        if (content) content->add_bucket(level, blk, r0, n, g, u, usum);
    }
    if (!check) return;
    double nu = 0, de = 0, nr = 0, dr = 0, unused = nan;
    finish_frame(rot, N, span, opt.min_angle_span, opt.min_energy_z, pairs, query, false, nu, de, out.powered_pairs,
                 out.coherence_min, out.mirror_max);
    finish_frame(raw, N, span, opt.min_angle_span, opt.min_energy_z, pairs, query, true, nr, dr,
                 out.powered_pairs_raw, out.coherence_min_raw, unused);
    if (out.powered_pairs > 0) out.coherence = nu / de;
    if (out.powered_pairs_raw > 0) out.coherence_raw = nr / dr;
    num += nu, den += de, num_raw += nr, den_raw += dr;
    if (out.powered_pairs == 0) return;
    // One powered pair whose mean moves is evidence (a wrong pairing can leave
    // one pair half demodulated: coordinate 0 is in pair 0 under both pairings).
    bool const bad = out.coherence_min < opt.inconsistent_below || out.mirror_max >= opt.max_mirror_ratio;
    out.status = bad                                     ? rope_status::inconsistent
                 : out.coherence >= opt.consistent_above ? rope_status::consistent
                                                         : rope_status::undetermined;
}

/// ⌊5 τ_b / L⌋ clamped to [0, 4] (method §9.12).
template <class = void>  // instantiated on use
int quintile_of(double tau, std::int64_t L) {
    auto const q = static_cast<std::int64_t>(std::floor(5.0 * tau / double(L)));
    return int(std::clamp<std::int64_t>(q, 0, 4));
}

/// Per query bucket with ≥ min rows: V_bB = tr(Σ_b,BB D_b,BB), the v shares,
/// and the head summary per band (quintiles 0 and 4, query-count weighted).
/// The lower triangle of band b's block of the query scatter Σ (x − x̄)(x − x̄)ᵀ
/// of one bucket: from `m` (the caller's moments of the same rows) when
/// given, else from the rows (gathered into `blk`, centred into `xc`).
template <class S>
void bucket_scatter(S const& q, index_t r0, index_t n, geometry const& g, moments const* m, index_t b, dmat& C,
                    rmat& blk, rmat& xc, gram_update& gram, bool fresh) {
    auto const& cols = g.band_cols[std::size_t(b)];
    index_t const w = index_t(cols.size());
    C = dmat::Zero(w, w);
    if (m) {
        for (index_t j = 0; j < w; ++j)
            for (index_t i = j; i < w; ++i) {
                index_t const a = g.perm[std::size_t(cols[std::size_t(i)])], e = g.perm[std::size_t(cols[std::size_t(j)])];
                C(i, j) = m->c_xx(std::max(a, e), std::min(a, e));  // moments keep the lower triangle
            }
        return;
    }
    if (fresh) {
        q.gather(r0, n, blk);
        if (xc.rows() < n) xc.resize(n, g.d);  // grows only
        std::vector<double> mean;
        center_rows(blk, 0, n, xc, 0, 1.0, mean);
    }
    gram.add(xc.data(), xc.cols(), n, cols, C);
}

/// The moments of query bucket `bucket` in `qm` (null when qm is null);
/// throws when they do not hold the same number of rows as the queries.
template <class = void>  // instantiated on use
moments const* bucket_moments(std::string_view fn, bucketed_moments const* qm, std::int64_t bucket,
                                     index_t n) {
    if (!qm) return nullptr;
    auto const it = qm->buckets.find(bucket);
    std::int64_t const have = it == qm->buckets.end() ? 0 : it->second.n;
    if (have != n || (it != qm->buckets.end() && it->second.c_xx.rows() != qm->d))
        fail_arg(fn, "query_moments: bucket " + std::to_string(bucket) + " holds " + std::to_string(have) +
                         " rows, the queries " + std::to_string(n) + " (not the moments of these rows); rows",
                 have);
    return &it->second;
}

template <class S>
void v_shares(S const& q, key_prefix const& kp, geometry const& g, capture_facts const& facts,
              rope_band_options const& opt, bucketed_moments const* qm, rope_band_result& res) {
    index_t const nb = index_t(g.bands.size());
    std::vector<double> const tau = segment_tau(q);
    std::vector<double> f0(std::size_t(nb), 0.0), f4(f0), w0(f0), w4(f0);
    rmat xc, blk;
    gram_update gram;
    for (std::size_t s = 0; s < q.segment.size(); ++s) {
        auto const [r0, n] = q.segment[s];
        if (n < opt.min_bucket_rows) continue;
        rope_bucket_bands bb;
        bb.bucket = q.bucket[std::size_t(r0)];
        bb.n_queries = n;
        bb.tau = tau[s];
        bb.quintile = quintile_of(tau[s], res.context_length);
        bb.v_share.assign(std::size_t(nb), nan);
        auto const hi = std::size_t(std::lower_bound(kp.cell.begin(), kp.cell.end(), bb.bucket) - kp.cell.begin());
        auto const lo = std::size_t(std::partition_point(kp.cell.begin(), kp.cell.begin() + std::ptrdiff_t(hi),
                                                         [&](std::int64_t c) { return !in_window(facts, bb.bucket, c); }) -
                                    kp.cell.begin());
        bb.n_pairs = kp.pairs[hi] - kp.pairs[lo];
        moments const* m = bucket_moments(q.fn, qm, bb.bucket, n);
        if (bb.n_pairs > 0) {
            std::vector<double> V(static_cast<std::size_t>(nb));
            dmat C;
            for (index_t b = 0; b < nb; ++b) {
                bucket_scatter(q, r0, n, g, m, b, C, blk, xc, gram, b == 0);
                V[std::size_t(b)] = sym_dot(C, kp.pref[hi][std::size_t(b)]) - sym_dot(C, kp.pref[lo][std::size_t(b)]);
            }
            double const tot = std::accumulate(V.begin(), V.end(), 0.0);
            if (tot > 0)
                for (index_t b = 0; b < nb; ++b) bb.v_share[std::size_t(b)] = V[std::size_t(b)] / tot;
        }
        for (index_t b = 0; b < nb && std::isfinite(bb.v_share[0]); ++b) {
            double const w = double(n), v = bb.v_share[std::size_t(b)];
            if (bb.quintile == 0) f0[std::size_t(b)] += w * v, w0[std::size_t(b)] += w;
            if (bb.quintile == 4) f4[std::size_t(b)] += w * v, w4[std::size_t(b)] += w;
        }
        res.buckets.push_back(std::move(bb));
    }
    for (index_t b = 0; b < nb; ++b) {
        if (w0[std::size_t(b)] > 0) res.bands[std::size_t(b)].v_share_first_20pct = f0[std::size_t(b)] / w0[std::size_t(b)];
        if (w4[std::size_t(b)] > 0) res.bands[std::size_t(b)].v_share_last_20pct = f4[std::size_t(b)] / w4[std::size_t(b)];
    }
}

/// Checks the options; throws std::invalid_argument naming the field.
template <class = void>  // instantiated on use
void check_options(std::string_view fn, rope_band_options const& o) {
    if (o.n_bands < 1) fail_arg(fn, "rope_band_options.n_bands: must be >= 1", o.n_bands);
    if (!(std::isfinite(o.min_angle_span) && o.min_angle_span > 0))
        fail_arg(fn, "rope_band_options.min_angle_span: must be finite and > 0 radians", o.min_angle_span);
    if (!(std::isfinite(o.min_energy_z) && o.min_energy_z > 0))
        fail_arg(fn, "rope_band_options.min_energy_z: must be finite and > 0", o.min_energy_z);
    if (!(o.consistent_above > 0 && o.consistent_above <= 1))
        fail_arg(fn, "rope_band_options.consistent_above: must be in (0, 1]", o.consistent_above);
    if (!(o.inconsistent_below >= 0 && o.inconsistent_below <= o.consistent_above))
        fail_arg(fn, "rope_band_options.inconsistent_below: must be in [0, consistent_above]", o.inconsistent_below);
    if (!(std::isfinite(o.max_mirror_ratio) && o.max_mirror_ratio > 0))
        fail_arg(fn, "rope_band_options.max_mirror_ratio: must be finite and > 0", o.max_mirror_ratio);
    if (o.min_bucket_rows < 2) fail_arg(fn, "rope_band_options.min_bucket_rows: must be >= 2", o.min_bucket_rows);
}

/// Checks the RoPE settings against the head dimension d; returns the
/// position divisor (1 for "none", the factor for "linear", 0 for another
/// scaling: unsupported).
template <class = void>  // instantiated on use
double check_spec(std::string_view fn, rope_spec const& s, index_t d) {
    if (s.rotary_dim < 0 || s.rotary_dim % 2 != 0 || s.rotary_dim > d)
        fail_arg(fn, "facts.rope.rotary_dim: must be even and in [0, d = " + std::to_string(d) + "]", s.rotary_dim);
    if (s.rotary_dim == 0 && d % 2 != 0)
        fail_arg(fn, "facts.rope.rotary_dim: 0 (the whole head) needs an even head dimension; d", d);
    if (!(std::isfinite(s.theta) && s.theta > 0)) fail_arg(fn, "facts.rope.theta: must be finite and > 0", s.theta);
    if (s.scaling == "none") {
        if (s.scaling_factor != 1.0)
            fail_arg(fn, "facts.rope.scaling_factor: must be 1 when scaling is \"none\"", s.scaling_factor);
        return 1.0;
    }
    if (s.scaling != "linear") return 0.0;
    if (!(std::isfinite(s.scaling_factor) && s.scaling_factor > 0))
        fail_arg(fn, "facts.rope.scaling_factor: must be finite and > 0 for \"linear\"", s.scaling_factor);
    return s.scaling_factor;
}

}  // namespace rope
}  // namespace detail

namespace detail {
/// `rope_bands`; `rows_checked`: the rows were validated by the caller
/// (analyze_head's moments pass), so the row reads skip the value scan.
template <RowMatrix QM, RowMatrix KM>
rope_band_result rope_bands_of(head_capture<QM, KM> const& head, rope_band_options const& opt,
                               bucketed_moments const* query_moments, bool rows_checked) {
    constexpr std::string_view fn = "qkgeom::rope_bands";
    namespace rd = detail::rope;
    rd::check_options(fn, opt);
    index_t const d = as_matrix(head.queries.vectors).cols(), dk = as_matrix(head.keys.vectors).cols();
    if (d != dk)
        detail::fail_arg(fn, "queries and keys differ in head dimension: queries have " + std::to_string(d) +
                                 " columns, keys have",
                         dk);
    if (query_moments && query_moments->d != d)
        detail::fail_arg(fn, "query_moments: head dimension differs from the rows' " + std::to_string(d) + "; d",
                         query_moments->d);
    detail::check_facts(fn, head.facts);
    detail::check_annotations(fn, "queries", as_matrix(head.queries.vectors).rows(), head.queries.position,
                              head.queries.bucket, head.queries.example_id, false, head.facts);
    detail::check_annotations(fn, "keys", as_matrix(head.keys.vectors).rows(), head.keys.position, head.keys.bucket,
                              head.keys.example_id, true, head.facts);
    rope_band_result res;
    if (!head.facts.rope) return res;
    double const scale = rd::check_spec(fn, *head.facts.rope, d);
    if (scale == 0.0) {
        res.status = rope_status::unsupported_scaling;
        return res;
    }
    rd::geometry const g = rd::make_geometry(*head.facts.rope, d, opt.n_bands, scale);
    res.bands = g.bands;
    for (index_t i = 0; i < g.half; ++i)
        res.pairs.push_back({i, g.freq[std::size_t(i)], 2 * std::numbers::pi / g.freq[std::size_t(i)], {}, {}});
    auto const q = rd::read_sorted(fn, "queries", head.queries, g, rows_checked);
    auto const k = rd::read_sorted(fn, "keys", head.keys, g, rows_checked);
    res.context_length = head.facts.context_length > 0 ? head.facts.context_length
                                                       : std::max(q.max_position, k.max_position) + 1;
    res.clusters_are_examples = !head.queries.example_id.empty();
    index_t used = 0;
    for (auto const& sg : q.segment) used += sg.second >= opt.min_bucket_rows ? 1 : 0;
    if (used < 2) {
        rd::rmat blk;
        for (auto const& [r0, n] : q.segment) q.gather(r0, n, blk);  // validates the rows
        for (auto const& [r0, n] : k.segment) k.gather(r0, n, blk);
        res.status = rope_status::too_few_rows;
        return res;
    }
    rd::trig_table const tt(g.freq, std::max(q.max_position, k.max_position));
    rd::content_acc content(q.example, index_t(g.bands.size()));
    double num = 0, den = 0, num_raw = 0, den_raw = 0;
    rd::key_prefix kp(g);
    rd::kind_pass(q, g, tt, opt, res.pairs, true, res.queries, num, den, num_raw, den_raw, &content, nullptr);
    rd::kind_pass(k, g, tt, opt, res.pairs, false, res.keys, num, den, num_raw, den_raw, nullptr, &kp);
    content.finish(res.bands);
    if (res.queries.powered_pairs + res.keys.powered_pairs > 0) res.coherence = num / den;
    if (res.queries.powered_pairs_raw + res.keys.powered_pairs_raw > 0) res.coherence_raw = num_raw / den_raw;
    rd::v_shares(q, kp, g, head.facts, opt, query_moments, res);
    auto const any = [&](rope_status s) { return res.queries.status == s || res.keys.status == s; };
    res.status = any(rope_status::inconsistent) ? rope_status::inconsistent
                 : any(rope_status::consistent) ? rope_status::consistent
                                                : rope_status::undetermined;
    return res;
}
}  // namespace detail

/// \brief RoPE bands of one head (docs/beyond-rope.md): undoes the rotation
/// of every query and key row by its position under `head.facts.rope`,
/// checks per rotary pair that the unrotated means are stable across buckets
/// (status consistent / inconsistent / undetermined), and per frequency band
/// measures the queries' content-variance share (± cluster SE) and, per query
/// bucket, the band's share of the score-difference variance v.
/// \tparam QM, KM any RowMatrix.
/// \param[in] head the head (positions, buckets, key example ids; query
///            example ids, when present, are the SE clusters).
/// \param[in] opt  the options (bands, power and decision thresholds).
/// \param[in] query_moments optional: the per-bucket moments of exactly these
///            query rows as captured (`head_moments::q`, as analyze_head
///            computes them); their centred scatters replace the v shares'
///            pass over the query rows (same result to rounding).
/// \returns the result; status not_applicable (facts.rope empty),
///          unsupported_scaling (a scaling other than "none" / "linear") or
///          too_few_rows (fewer than 2 query buckets with min_bucket_rows rows)
///          leave every number NaN.
/// \throws std::invalid_argument naming the field and value for a bad option,
///         invalid RoPE settings (rotary_dim odd, negative or > d, theta not
///         finite and > 0, a scaling factor ≠ 1 with "none" or ≤ 0 with
///         "linear"), queries and keys of different widths, bad annotations
///         (as analyze_head), a row holding NaN, Inf or a value >= 2^128, or
///         `query_moments` whose bucket row counts differ from the queries'.
/// \throws std::bad_alloc if the index arrays or the per-bucket buffers cannot be allocated.
template <RowMatrix QM, RowMatrix KM>
rope_band_result rope_bands(head_capture<QM, KM> const& head, rope_band_options const& opt = {},
                            bucketed_moments const* query_moments = nullptr) {
    return detail::rope_bands_of(head, opt, query_moments, false);
}

}  // namespace qkgeom
