// qkgeom — the empirical cross-check of attention plasticity (method §6,
// §9.14): for an evaluated pair (i, j) and query bucket b, p̂ = the fraction of
// the bucket's real queries with q·k_i > q·k_j (original basis, strict), and
// the unbiased 4p̂(1−p̂)·n/(n−1).
//
// Counts are those of double-precision scores. They are computed in single
// precision at the widest instruction set available (simd/score_kernels.hpp)
// and certified: a query whose f32 score difference does not exceed the
// rigorous rounding bound is recounted in double from the original rows. Two
// forms give the same counts (`empirical_columns`): the key form scores every
// key that takes part in a pair and compares pairs of scores; the
// pair-difference form scores one column kᵢ − kⱼ per pair and decides the sign
// in registers (docs/plasticity.md, "How the counts are computed").
//
// Under `empirical_policy::sampled` a cell with more than `empirical_budget`
// (query, pair) evaluations is not counted: it draws (pair, two queries)
// after its closed-form pass (`disagreement`, evaluate.hpp), an unbiased
// estimate of the same mean with a standard error.
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/plasticity/options.hpp>
#include <qkgeom/plasticity/pair_plan.hpp>
#include <qkgeom/plasticity/rows.hpp>
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/simd/score_kernels.hpp>

#include <Eigen/Core>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace qkgeom::detail {

/// Certified error factor of a single-precision dot product of length d whose
/// operands were rounded from double: each operand carries a relative
/// rounding u = 2⁻²⁴, the products and the sum (any order, FMA or not) at
/// most γ_d; so |fl32(q·k) − q·k| <= γ_{d+3} Σ|q_l k_l| <= γ_{d+3} ‖q‖‖k‖,
/// γ_n = n u/(1 − n u), plus the absolute term `f32_dot_abs_error` when a
/// product or partial sum is subnormal. Valid while every operand is zero or
/// a normal float and nothing overflows (`f32_certifiable`). The factor
/// 1 + 2⁻³⁰ covers the double rounding of the norms and of the bound itself
/// (relative ≈ d·2⁻⁵³).
template <class = void>  // instantiated on use
double f32_dot_error_factor(index_t d) {
    double const u = 0x1p-24, nu = double(d + 3) * u;
    return nu / (1.0 - nu) * (1.0 + 0x1p-30);
}

/// Absolute part of the bound: each of the d multiply–adds may round a
/// subnormal result by at most 2⁻¹⁵⁰ (half the smallest subnormal).
template <class = void>  // instantiated on use
double f32_dot_abs_error(index_t d) { return double(d + 3) * 0x1p-149; }

/// Error factor of a double-precision dot product of length d (any order,
/// FMA or not): |fl64(q·k) − q·k| <= γ_{d+3}‖q‖‖k‖ with u = 2⁻⁵³. The
/// pair-difference form adds it so that a decided query is also decided the
/// same way by the double-precision scores of the fallback.
template <class = void>  // instantiated on use
double f64_dot_error_factor(index_t d) {
    double const nu = double(d + 3) * 0x1p-53;
    return nu / (1.0 - nu) * (1.0 + 0x1p-30);
}

/// Absolute term of the pair-difference form's threshold: (d + 3)·2⁻¹²⁵, a
/// normal float that covers a subnormal product or partial sum even when
/// the FPU flushes them to zero (FTZ/DAZ, e.g. -ffast-math).
template <class = void>  // instantiated on use
float f32_pair_abs_error(index_t d) { return static_cast<float>(double(d + 3) * 0x1p-125); }

/// The smallest float ≥ x, at least the smallest normal float (so the value
/// is never flushed by DAZ); +inf for NaN and x beyond the float range.
template <class = void>  // instantiated on use
float float_up(double x) {
    if (!(x <= double(std::numeric_limits<float>::max()))) return std::numeric_limits<float>::infinity();
    auto f = static_cast<float>(x);
    if (double(f) < x) f = std::nextafter(f, std::numeric_limits<float>::infinity());
    return std::max(f, std::numeric_limits<float>::min());
}

/// The key form's f32 threshold factor of one pair: kk = score_err·(‖kᵢ‖ +
/// ‖kⱼ‖) with 2⁻²¹ of slack after rounding to nearest (kk·(1 + 2⁻²⁰) rounded
/// is ≥ kk·(1 + 2⁻²¹); NaN and beyond the float range: +∞, nothing decided).
/// With `key_form_ka` a query decided by the f32 counts is decided by
/// `scores::decided` (score_kernels.hpp, count_body), so its f32 comparison
/// is that of the exact scores.
template <class = void>  // instantiated on use
float key_form_kk(double score_err, double kn_i, double kn_j) {
    double const kks = score_err * (kn_i + kn_j) * (1.0 + 0x1p-20);
    return kks <= double(std::numeric_limits<float>::max()) ? static_cast<float>(kks)
                                                            : std::numeric_limits<float>::infinity();
}

/// The key form's absolute term: 2·score_abs with 2⁻²¹ of slack, rounded up
/// to float, plus 2⁻¹²⁴ for a product or a score flushed to zero (FTZ/DAZ).
template <class = void>  // instantiated on use
float key_form_ka(double score_abs) { return float_up(2.0 * score_abs * (1.0 + 0x1p-21) + 0x1p-124); }

/// The double-precision wins, q·kᵢ > q·kⱼ from the original rows, of the
/// queries of `q` set in bit mask `m` (bit t = row base + t): the fallback of
/// both forms for the queries the f32 kernels left undecided.
template <class Row>
std::int32_t masked_wins(query_rows const& q, index_t base, std::uint32_t m, Row const& ki, Row const& kj) {
    std::int32_t w = 0;
    for (; m != 0; m &= m - 1u) {
        auto const qrow = q.row(base + std::countr_zero(m));
        w += qrow.dot(ki) > qrow.dot(kj) ? 1 : 0;
    }
    return w;
}

/// The seed of the sampled check's draws in cell (b, c) of the head whose
/// stream is `head_seed` (`head_stream_seed`): a stream of its own, so the
/// draws depend on (seed, head id, b, c) only and never on the closed form's
/// pair sampling (method §6):
///     mt19937_64(splitmix64(splitmix64(splitmix64(head_seed ^ "empcheck") ^ b) ^ c))
constexpr std::uint64_t empirical_stream(std::uint64_t head_seed, std::int64_t b, std::int64_t c) noexcept {
    return hash_step(hash_step(splitmix64(head_seed ^ 0x656D70636865636BULL), static_cast<std::uint64_t>(b)),
                     static_cast<std::uint64_t>(c));
}

/// A uniform integer in [0, n), n ≥ 1, exactly (words below 2⁶⁴ mod n are
/// rejected) and the same on every platform (unlike
/// std::uniform_int_distribution).
template <class Gen>
std::uint64_t uniform_below(Gen& gen, std::uint64_t n) {
    std::uint64_t const reject = (0 - n) % n;  // 2⁶⁴ mod n
    for (;;)
        if (std::uint64_t const x = gen(); x >= reject) return x % n;
}

/// One draw of the sampled check (method §9.14): 2 when exactly one of the
/// queries r ≠ s has q·k_i > q·k_j (the double-precision comparison that the
/// counts equal), else 0. Over the n(n − 1) ordered (r, s) its mean is
/// 2·2W(n − W)/(n(n − 1)) = 4p̂(1 − p̂)·n/(n − 1), W the pair's wins: the
/// pair's unbiased PP̂ exactly.
template <class Row>
int disagreement(query_rows const& q, index_t r, index_t s, Row const& ki, Row const& kj) {
    auto const qr = q.row(r), qs = q.row(s);
    bool const wr = qr.dot(ki) > qr.dot(kj);
    bool const ws = qs.dot(ki) > qs.dot(kj);
    return wr != ws ? 2 : 0;
}

/// The empirical side of one query bucket: its queries and, per form, the
/// single-precision scores (key form) or the counted wins per pair
/// (pair-difference form).
struct empirical_bucket {
    query_rows const* queries = nullptr;  ///< original-basis queries of the bucket (≥ 2 rows) or null
    double emp_scale = 1.0;               ///< n/(n−1)
    /// Key form: scores q·k of the bucket's queries (rows 0 … nq−1; more rows
    /// may be padding) against every key that takes part in a pair (columns);
    /// `column[i]` is key i's column (−1: not scored).
    Eigen::MatrixXf scores;
    index_t nq = 0;                        ///< the bucket's query count
    simd::isa level = simd::isa::generic;  ///< kernels' instruction set
    std::vector<float> q_norm_up;          ///< ‖q_r‖ rounded up to float (the f32 counts)
    /// 2·score_abs with 2⁻²¹ of slack, rounded up to float, plus 2⁻¹²⁴ for a
    /// product or a score flushed to zero (FTZ/DAZ): the f32 counts' ka.
    float ka_up = 0.0f;
    Eigen::VectorXd k_norm;                ///< ‖k‖ per score column
    double score_err = 0.0;  ///< certified bound: |fl32(q·k) − q·k| <= score_err·‖q‖‖k‖ + score_abs
    double score_abs = 0.0;  ///< absolute part of the bound (underflow), see f32_dot_abs_error
    /// Original-basis key rows (double): score column c is row (*scored)[c] (exact fallback).
    row_block const* k_orig = nullptr;
    std::vector<index_t> const* scored = nullptr;
    std::vector<index_t> const* column = nullptr;
    /// Pair-difference form: the bucket's pairs in evaluation order (padding
    /// {−1, −1}) and their counted wins.
    std::vector<std::array<index_t, 2>> const* pair_keys = nullptr;
    std::vector<std::int32_t> const* pair_wins = nullptr;

    [[nodiscard]] bool active() const noexcept { return queries != nullptr; }
};

/// Key form, method §9.14: the number of the bucket's queries r with
/// q_r·k_i > q_r·k_j for score columns ci, cj. The single-precision scores
/// decide every query whose score difference exceeds the certified error
/// bound of both scores; the (rare) undecided ones, which the count reports
/// as a bit mask, are recomputed in double from the original rows, so the
/// count is that of double-precision scores (ties within double rounding
/// aside). `und` is scratch for the mask.
template <class = void>  // instantiated on use
std::int64_t empirical_wins(empirical_bucket const& e, index_t ci, index_t cj, std::vector<std::uint32_t>& und) {
    index_t const nq = e.nq;
    float const* si = e.scores.col(ci).data();
    float const* sj = e.scores.col(cj).data();
    float const kkf = key_form_kk(e.score_err, e.k_norm(ci), e.k_norm(cj));  // with ka_up (prepare)
    und.resize(static_cast<std::size_t>(scores::mask_words(nq)));
    auto const [wins0, undecided] =
        scores::count_wins(e.level, si, sj, e.q_norm_up.data(), kkf, e.ka_up, nq, und.data());
    if (undecided == 0) return wins0;
    // Each query is in wins0 or in the mask, never both (one computation).
    auto const& sc = *e.scored;
    auto const ki = e.k_orig->row(sc[static_cast<std::size_t>(ci)]), kj = e.k_orig->row(sc[static_cast<std::size_t>(cj)]);
    std::int64_t wins = wins0;
    for (std::size_t w = 0; w < und.size(); ++w)
        if (und[w] != 0) wins += masked_wins(*e.queries, static_cast<index_t>(w * 32), und[w], ki, kj);
    return wins;
}

/// The per-head state of the cross-check: key segments packed once per key
/// bucket and reused by every later query bucket, and the buffers of the
/// current query bucket. `prepare` fills an `empirical_bucket`; `wins` reads
/// the count of one evaluated pair. (A class template, instantiated on use.)
template <class Dep = void>
class empirical_check_t {
    using VecX = detail::dep_t<Eigen::VectorXd, Dep>;
    using KeyStore = detail::dep_t<key_store, Dep>;
    using PPlan = detail::dep_t<pair_plan, Dep>;
    using QRows = detail::dep_t<query_rows, Dep>;
    using QueryStore = detail::dep_t<query_store, Dep>;
public:
    empirical_check_t(KeyStore const& ks, QueryStore const& qs, PPlan const& plan,
                      plasticity_options const& opt)
        : ks_(ks), qs_(qs), plan_(plan), opt_(opt), level_(simd::active()), blk_(scores::blocking_of(level_)),
          column_(static_cast<std::size_t>(ks.orig.rows()), -1) {
        if (qs.by_bucket.empty()) return;
        certifiable_ = f32_certifiable(qs.range, ks.range, ks.d);
        q_max_abs_ = qs.range.max_abs;
        k_norm_all_ = ks.orig.rowwise().norm();
    }

    /// The query rows of bucket `b` (0 when it has none).
    [[nodiscard]] index_t query_count(std::int64_t b) const {
        auto const qit = qs_.by_bucket.find(b);
        return qit == qs_.by_bucket.end() ? 0 : qit->second.rows();
    }

    /// Sets `e` up for query bucket `b` with admissible key buckets `cells`
    /// (nothing when the bucket has fewer than 2 query rows): the cells whose
    /// pairs are counted (those of a sampled check draw after the pass and
    /// need the queries only). `prefix`: under pair_policy::prefix the
    /// bucket's groups (pair_plan::prefix_groups, as the evaluator walks
    /// them), else null.
    void prepare(std::int64_t b, std::vector<std::int64_t> const& cells, std::vector<key_group> const* prefix,
                 bool sampled, empirical_bucket& e) {
        auto const qit = qs_.by_bucket.find(b);
        if (qit == qs_.by_bucket.end() || qit->second.rows() < 2) return;
        auto const& q = qit->second;
        e.queries = &q;
        e.emp_scale = double(q.rows()) / double(q.rows() - 1);
        e.nq = q.rows();
        e.level = level_;
        cursor_ = 0;
        packed_for_ = nullptr;
        if (cells.empty()) return;  // no counted cell
        if (use_pair_form(cells, sampled)) prepare_pairs(q, cells, e);
        else if (auto groups = panel_groups(cells, prefix, sampled); !groups.empty())
            prepare_panels(q, cells, groups, e);
        else prepare_keys(q, cells, e);
    }

    /// The counted wins of evaluated pair (i, j) (row indices of the keys).
    /// In the pair-difference form pairs are recorded in the order they were
    /// listed (pairs of identical keys are listed but never recorded, so they
    /// are passed over).
    std::int64_t wins(empirical_bucket const& e, index_t i, index_t j) {
        if (e.pair_wins == nullptr)
            return empirical_wins(e, column_[static_cast<std::size_t>(i)], column_[static_cast<std::size_t>(j)],
                                  und_bits_);
        auto const& keys = *e.pair_keys;
        while (cursor_ < keys.size() && !(keys[cursor_][0] == i && keys[cursor_][1] == j)) ++cursor_;
        if (cursor_ == keys.size())
            throw std::logic_error("qkgeom::attention_plasticity: internal error: pair " + std::to_string(i) + ", " +
                                   std::to_string(j) + " is not in the empirical check's pair list");
        return (*e.pair_wins)[cursor_++];
    }

    /// The wins of the listed pairs (row indices of the keys, i < j as
    /// recorded) against every query of bucket `e` (set up by `prepare`),
    /// counted as the counted check counts them: the pair-sampled check
    /// (evaluate.hpp, `pair_sample_empirical`).
    void count_listed(empirical_bucket const& e, std::vector<std::array<index_t, 2>> const& pairs,
                      std::vector<std::int64_t>& wins) {
        wins.assign(pairs.size(), 0);
        auto const& q = *e.queries;
        if (level_ == simd::isa::generic) {  // double scores, as the fallback of the dispatched forms
            for (std::size_t k = 0; k < pairs.size(); ++k) {
                auto const ki = ks_.orig.row(pairs[k][0]), kj = ks_.orig.row(pairs[k][1]);
                for (index_t r = 0; r < e.nq; ++r) wins[k] += q.row(r).dot(ki) > q.row(r).dot(kj) ? 1 : 0;
            }
            return;
        }
        if (packed_for_ != &q) pack_queries(q, e.nq);
        list_keys_.assign(pairs.begin(), pairs.end());
        index_t const n = pack_pair_columns(list_keys_, list_packed_, list_kk_);
        list_wins_.assign(list_keys_.size(), 0);
        count_pair_columns(q, e.nq, list_keys_, list_packed_, list_kk_, n, list_wins_.data());
        for (std::size_t k = 0; k < pairs.size(); ++k) wins[k] = list_wins_[k];
    }

private:
    /// The scored keys of one key bucket c (those of examples with ≥ 2 keys in
    /// c for same_bucket, all for prefix), padded with −1 to whole key
    /// blocks, and packed once (dispatched levels).
    struct key_segment {
        std::vector<index_t> keys;
        std::vector<float> packed;
    };
    /// Pair-difference form, per key bucket c: its pairs in evaluation order
    /// (groups ascending by example, (a, b) with a < b, as the exact path
    /// records them), the packed f32 columns kᵢ − kⱼ (difference in double,
    /// rounded once) and per column the bound factor
    /// kk = (γ32‖kᵢ − kⱼ‖ + γ64(‖kᵢ‖ + ‖kⱼ‖))(1 + 2⁻²⁰) rounded up to float:
    /// with the query's ‖q‖ rounded up and one FMA, the threshold qn·kk + ka
    /// is ≥ the certified error of the f32 score q·(kᵢ − kⱼ) plus the rounding
    /// of the double scores (scores::pair_counts). Columns with a
    /// subnormal-range component or beyond the float range get kk = +inf
    /// (all their queries go to the double fallback).
    struct pair_segment {
        std::vector<std::array<index_t, 2>> keys;  // padded with {−1, −1} to whole blocks
        index_t n = 0;                             // pairs (unpadded)
        std::vector<float> packed, kk;
    };

    /// The pair-difference form applies to same_bucket, exact enumeration,
    /// groups below dense_min_keys and a dispatched level; `automatic` takes
    /// it when the bucket has no more pairs than scored keys.
    [[nodiscard]] bool use_pair_form(std::vector<std::int64_t> const& cells, bool sampled) const {
        if (level_ == simd::isa::generic || opt_.pairs != pair_policy::same_bucket || sampled ||
            opt_.empirical == empirical_columns::keys)
            return false;
        cell_size const total = plan_.total_size(cells);
        return static_cast<index_t>(total.largest) < opt_.dense_min_keys &&
               (opt_.empirical == empirical_columns::pairs || total.pairs <= total.keys);
    }

    /// The query-blocked key form (`prepare_panels`) applies at a dispatched
    /// level to exact enumeration when every group is below dense_min_keys
    /// (so the pairs are evaluated group by group, (a, b) with a < b, in the
    /// order listed here). Returns the groups in evaluation order (those of
    /// `evaluate_query_bucket`), or none where the form does not apply.
    [[nodiscard]] std::vector<std::vector<index_t> const*> panel_groups(std::vector<std::int64_t> const& cells,
                                                                        std::vector<key_group> const* prefix,
                                                                        bool sampled) const {
        std::vector<std::vector<index_t> const*> out;
        if (level_ == simd::isa::generic || sampled) return out;
        auto const add = [&](std::vector<key_group> const& groups) {
            for (auto const& g : groups) {
                if (static_cast<index_t>(g.keys.size()) >= opt_.dense_min_keys) return false;
                out.push_back(&g.keys);
            }
            return true;
        };
        if (prefix != nullptr) return add(*prefix) ? out : decltype(out){};
        for (auto c : cells)
            if (!add(plan_.groups_of(c))) return {};
        return out;
    }

    /// The score columns of the key form: every key of segment_of(c) for the
    /// admissible buckets `cells` (padding −1 included) in `scored_`, each
    /// key's column in `column_` and its ‖k‖ in `kn`. Returns the column count.
    index_t score_columns(std::vector<std::int64_t> const& cells, VecX& kn) {
        scored_.clear();
        for (auto c : cells) {
            auto const& seg = segment_of(c);
            scored_.insert(scored_.end(), seg.keys.begin(), seg.keys.end());
        }
        auto const nks = static_cast<index_t>(scored_.size());
        kn.resize(nks);
        for (index_t a = 0; a < nks; ++a) {
            auto const key = scored_[static_cast<std::size_t>(a)];
            if (key < 0) {  // padding: never a pair's column
                kn(a) = 0.0;
                continue;
            }
            column_[static_cast<std::size_t>(key)] = a;
            kn(a) = k_norm_all_(key);
        }
        return nks;
    }

    /// The bucket's queries packed in f32 panels (`qpack_`) and their norms
    /// rounded up to float, one per padded row (`q_norm_up_`, padding 0): the
    /// query side of the pair-difference and panel forms.
    void pack_queries(QRows const& q, index_t nq) {
        index_t const nq_pad = scores::round_up(nq, blk_.panel);
        scores::pack_rows_transposed(q.data(), q.outerStride(), nq, ks_.d, blk_.panel, qpack_);
        q_norm_up_.assign(static_cast<std::size_t>(nq_pad), 0.0f);
        for (index_t r = 0; r < nq; ++r) q_norm_up_[static_cast<std::size_t>(r)] = float_up(q.row(r).norm());
        packed_for_ = &q;
    }

    /// The key form's certified relative error of an f32 score (+inf when the
    /// rows are not certifiable: every comparison in double).
    [[nodiscard]] double key_score_err() const {
        return certifiable_ ? f32_dot_error_factor(ks_.d) : std::numeric_limits<double>::infinity();
    }

    key_segment const& segment_of(std::int64_t c) {
        auto [it, fresh] = segments_.try_emplace(c);
        if (!fresh) return it->second;
        auto& seg = it->second;
        for (auto const& g : plan_.groups_of(c))
            if (opt_.pairs == pair_policy::prefix || g.keys.size() >= 2)
                seg.keys.insert(seg.keys.end(), g.keys.begin(), g.keys.end());
        auto const n = static_cast<index_t>(seg.keys.size());
        if (level_ != simd::isa::generic)
            scores::pack_transposed([&](index_t a, index_t l) { return ks_.orig(seg.keys[static_cast<std::size_t>(a)], l); },
                                    n, ks_.d, blk_.block, seg.packed);
        seg.keys.resize(static_cast<std::size_t>(scores::round_up(n, blk_.block)), -1);
        return seg;
    }

    pair_segment const& pair_segment_of(std::int64_t c) {
        auto [it, fresh] = pair_segments_.try_emplace(c);
        if (!fresh) return it->second;
        auto& seg = it->second;
        for (auto const& g : plan_.groups_of(c))
            for (std::size_t a = 0; a < g.keys.size(); ++a)
                for (std::size_t b = a + 1; b < g.keys.size(); ++b) seg.keys.push_back({g.keys[a], g.keys[b]});
        seg.n = pack_pair_columns(seg.keys, seg.packed, seg.kk);
        return seg;
    }

    /// The packed f32 columns kᵢ − kⱼ of the pairs `keys` and their bound
    /// factors kk (see pair_segment); pads `keys` with {−1, −1} to whole
    /// blocks. Returns the pair count (unpadded).
    index_t pack_pair_columns(std::vector<std::array<index_t, 2>>& keys, std::vector<float>& packed,
                              std::vector<float>& kk) const {
        index_t const d = ks_.d, W = blk_.block;
        auto const n = static_cast<index_t>(keys.size());
        auto const padded = scores::round_up(n, W);
        double const gamma32 = f32_dot_error_factor(d), gamma64 = f64_dot_error_factor(d);
        packed.assign(static_cast<std::size_t>(padded * d), 0.0f);  // scores::pack_transposed's layout
        kk.assign(static_cast<std::size_t>(padded), 0.0f);
        auto const row_bytes = static_cast<std::size_t>(d) * sizeof(double);
        for (index_t a = 0; a < std::min<index_t>(n, 3); ++a)
            for (index_t k : keys[static_cast<std::size_t>(a)]) prefetch_bytes(ks_.orig.row(k).data(), row_bytes);
        for (index_t a = 0; a < n; ++a) {  // one pass per pair: its column and its bound
            auto const [i, j] = keys[static_cast<std::size_t>(a)];
            if (a + 3 < n) {  // rows three pairs ahead: random rows, not followed by the hardware prefetchers
                auto const [ni, nj] = keys[static_cast<std::size_t>(a + 3)];
                prefetch_bytes(ks_.orig.row(ni).data(), row_bytes);
                prefetch_bytes(ks_.orig.row(nj).data(), row_bytes);
            }
            double const* ki = ks_.orig.row(i).data();
            double const* kj = ks_.orig.row(j).data();
            float* dst = packed.data() + (a / W) * d * W + a % W;
            double norm2 = 0.0, big = 0.0;
            bool tiny = false;
            for (index_t l = 0; l < d; ++l) {
                double const x = ki[l] - kj[l];  // the difference in double, rounded once
                dst[l * W] = static_cast<float>(x);
                norm2 += x * x;
                big = std::max(big, std::abs(x));
                tiny = tiny || (x != 0.0 && std::abs(x) < 0x1p-126);
            }
            bool const ok = certifiable_ && !tiny && big <= 0x1p126 && double(d) * q_max_abs_ * big <= 0x1p126;
            kk[static_cast<std::size_t>(a)] =
                ok ? float_up((gamma32 * std::sqrt(norm2) + gamma64 * (k_norm_all_(i) + k_norm_all_(j))) * (1.0 + 0x1p-20))
                   : std::numeric_limits<float>::infinity();
        }
        keys.resize(static_cast<std::size_t>(padded), {-1, -1});
        return n;
    }

    /// Certified counts of the packed pair columns `packed`/`kk` of `keys`
    /// (`pack_pair_columns`, padded) against the packed queries of the
    /// current bucket: `wins` (one entry per padded column) gets each pair's
    /// wins, the f32 decisions plus the undecided queries recounted in double.
    void count_pair_columns(QRows const& q, index_t nq, std::vector<std::array<index_t, 2>> const& keys,
                            std::vector<float> const& packed, std::vector<float> const& kk, index_t n,
                            std::int32_t* wins) {
        auto const nc = static_cast<index_t>(keys.size());
        index_t const nq_pad = scores::round_up(nq, blk_.panel), np = nq_pad / blk_.panel;
        undecided_.assign(static_cast<std::size_t>(np * nc), 0u);
        scores::pair_counts(level_, qpack_, q_norm_up_.data(), nq, nq_pad, packed.data(), kk.data(),
                            f32_pair_abs_error(ks_.d), n, ks_.d, wins, undecided_.data(), nc);
        // The undecided queries (≈ 1 in 10⁴ on real heads; all of a column
        // with kk = +inf), in double from the original rows.
        for (index_t p = 0; p < np; ++p)
            for (index_t c = 0; c < n; ++c) {
                std::uint32_t const m = undecided_[static_cast<std::size_t>(p * nc + c)];
                if (m == 0) continue;
                auto const [i, j] = keys[static_cast<std::size_t>(c)];
                wins[c] += masked_wins(q, p * blk_.panel, m, ks_.orig.row(i), ks_.orig.row(j));
            }
    }

    /// method §9.14, pair-difference form (see pair_segment).
    void prepare_pairs(QRows const& q, std::vector<std::int64_t> const& cells, empirical_bucket& e) {
        pair_keys_.clear();
        for (auto c : cells) {
            auto const& seg = pair_segment_of(c);
            pair_keys_.insert(pair_keys_.end(), seg.keys.begin(), seg.keys.end());
        }
        pack_queries(q, e.nq);
        pair_wins_.assign(pair_keys_.size(), 0);
        std::size_t offset = 0;
        for (auto c : cells) {
            auto const& seg = pair_segment_of(c);
            count_pair_columns(q, e.nq, seg.keys, seg.packed, seg.kk, seg.n, pair_wins_.data() + offset);
            offset += seg.keys.size();
        }
        e.pair_keys = &pair_keys_;
        e.pair_wins = &pair_wins_;
    }

    /// method §9.14, key form: one product of the bucket's queries against
    /// every key of the admissible buckets that belongs to an example with at
    /// least two such keys, in single precision (twice the double rate, and
    /// AVX2/AVX-512 kernels where the CPU has them), certified by
    /// empirical_wins.
    void prepare_keys(QRows const& q, std::vector<std::int64_t> const& cells, empirical_bucket& e) {
        index_t const d = ks_.d;
        index_t const nks = score_columns(cells, e.k_norm);
        if (level_ == simd::isa::generic) {  // blocks of one key: no padding
            Eigen::MatrixXf kf(nks, d);
            for (index_t a = 0; a < nks; ++a)
                kf.row(a) = ks_.orig.row(scored_[static_cast<std::size_t>(a)]).template cast<float>();
            e.scores.noalias() = q.template cast<float>() * kf.transpose();
        } else {
            index_t const nq_pad = scores::round_up(e.nq, blk_.panel);
            scores::pack_rows_transposed(q.data(), q.outerStride(), e.nq, d, blk_.panel, qpack_);
            e.scores.resize(nq_pad, nks);
            index_t offset = 0;
            for (auto c : cells) {
                auto const& seg = segment_of(c);
                auto const n = static_cast<index_t>(seg.keys.size());
                scores::score_product(level_, qpack_.data(), nq_pad, seg.packed, n, d,
                                      e.scores.data() + offset * nq_pad);
                offset += n;
            }
        }
        e.q_norm_up.resize(static_cast<std::size_t>(e.nq));
        for (index_t r = 0; r < e.nq; ++r) e.q_norm_up[static_cast<std::size_t>(r)] = float_up(q.row(r).norm());
        // not certifiable (subnormal or huge values): every comparison in double
        e.score_err = key_score_err();
        e.score_abs = f32_dot_abs_error(d);
        e.ka_up = key_form_ka(e.score_abs);
        e.k_orig = &ks_.orig;
        e.scored = &scored_;
        e.column = &column_;
    }

    /// method §9.14, the key form blocked by query panels: for each panel of
    /// P queries, its scores against every scored key (P·nks floats, in L2
    /// where the whole bucket's matrix would not be), then every pair of
    /// `groups` counted against them (`scores::panel_counts`, the test of
    /// `empirical_wins` query by query) and the undecided queries recounted
    /// in double. The counts are those of `prepare_keys` + `empirical_wins`;
    /// `wins` reads them in evaluation order, as in the pair-difference form.
    void prepare_panels(QRows const& q, std::vector<std::int64_t> const& cells,
                        std::vector<std::vector<index_t> const*> const& groups, empirical_bucket& e) {
        index_t const d = ks_.d, P = blk_.panel;
        index_t const nks = score_columns(cells, kn_);
        double const score_err = key_score_err();
        float const ka = key_form_ka(f32_dot_abs_error(d));
        pair_keys_.clear();
        pair_cols_.clear();
        for (auto const* g : groups)
            for (std::size_t a = 0; a < g->size(); ++a)
                for (std::size_t b = a + 1; b < g->size(); ++b) {
                    index_t const i = (*g)[a], j = (*g)[b];
                    auto const ci = column_[static_cast<std::size_t>(i)], cj = column_[static_cast<std::size_t>(j)];
                    pair_keys_.push_back({i, j});
                    pair_cols_.push_back({static_cast<std::int32_t>(ci), static_cast<std::int32_t>(cj),
                                          key_form_kk(score_err, kn_(ci), kn_(cj))});
                }
        auto const npairs = static_cast<index_t>(pair_keys_.size());
        e.pair_keys = &pair_keys_;
        e.pair_wins = &pair_wins_;
        pair_wins_.assign(static_cast<std::size_t>(npairs), 0);
        if (npairs == 0) return;
        index_t const nq_pad = scores::round_up(e.nq, P);
        pack_queries(q, e.nq);
        panel_scores_.resize(static_cast<std::size_t>(nks * P));
        for (index_t p = 0; p < nq_pad / P; ++p) {
            index_t offset = 0;
            for (auto c : cells) {
                auto const& seg = segment_of(c);
                auto const n = static_cast<index_t>(seg.keys.size());
                scores::score_product(level_, qpack_.data() + p * d * P, P, seg.packed, n, d,
                                      panel_scores_.data() + offset * P);
                offset += n;
            }
            index_t const rows = std::min(P, e.nq - p * P);
            std::uint32_t const valid = rows >= 32 ? ~std::uint32_t(0) : (std::uint32_t(1) << rows) - 1u;
            panel_und_.clear();
            scores::panel_counts(level_, panel_scores_.data(), q_norm_up_.data() + p * P, valid, pair_cols_.data(), ka,
                                 npairs, pair_wins_.data(), panel_und_);
            for (auto const& u : panel_und_) {  // the rare undecided queries, in double
                auto const [i, j] = pair_keys_[static_cast<std::size_t>(u.pair)];
                pair_wins_[static_cast<std::size_t>(u.pair)] +=
                    masked_wins(q, p * P, u.mask, ks_.orig.row(i), ks_.orig.row(j));
            }
        }
    }

    KeyStore const& ks_;
    QueryStore const& qs_;
    PPlan const& plan_;
    plasticity_options const& opt_;
    simd::isa level_;
    scores::blocking blk_;
    bool certifiable_ = false;
    double q_max_abs_ = 0.0;
    VecX k_norm_all_;  ///< ‖k‖ of every key (original basis)
    std::vector<index_t> column_;  ///< key → score column (per query bucket)
    std::vector<index_t> scored_;  ///< the scored keys of the current query bucket, one per score column
    std::vector<float> qpack_;     ///< the query bucket's packed f32 panels
    std::map<std::int64_t, key_segment> segments_;
    std::map<std::int64_t, pair_segment> pair_segments_;
    std::vector<std::array<index_t, 2>> pair_keys_;  ///< the current query bucket's pairs (pair form)
    std::vector<std::int32_t> pair_wins_;
    std::vector<std::uint32_t> undecided_;  ///< per (query panel, pair column): undecided queries
    std::vector<std::uint32_t> und_bits_;   ///< key form: one pair's undecided queries (empirical_wins)
    std::vector<float> q_norm_up_;          ///< ‖q‖ rounded up to float, per padded query row
    std::vector<scores::pair_columns> pair_cols_;        ///< panel form: per pair its columns and kk
    std::vector<scores::undecided_panel> panel_und_;     ///< panel form: one panel's undecided pairs
    std::vector<float> panel_scores_;                    ///< panel form: one panel's scores, key-major
    VecX kn_;                                            ///< panel form: ‖k‖ per score column
    std::size_t cursor_ = 0;                ///< pair form: next listed pair
    QRows const* packed_for_ = nullptr;     ///< the rows `qpack_` and `q_norm_up_` hold (pack_queries)
    std::vector<std::array<index_t, 2>> list_keys_;  ///< count_listed: the pairs, padded
    std::vector<float> list_packed_, list_kk_;       ///< count_listed: their columns and bound factors
    std::vector<std::int32_t> list_wins_;            ///< count_listed: their wins
};

using empirical_check = empirical_check_t<>;

}  // namespace qkgeom::detail
