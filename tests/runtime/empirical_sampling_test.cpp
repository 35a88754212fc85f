// The sampled empirical cross-check (method §9.14, `empirical_policy::sampled`,
// docs/plasticity.md "Sampled or exact: `empirical_check`"): a cell with more
// than max(`empirical_max_exact`, `empirical_budget`) (query, pair)
// evaluations counts `empirical_pairs` of its pairs against every query (the
// difference estimator, the cases at the end) or, in a bucket too large for
// that, makes `empirical_budget` evaluations, drawn as (pair, two queries),
// instead of counting every query for every pair. The heads here are small
// (cells of ≈ 6000 evaluations, counted under the default 16,384), so the
// tests set `empirical_max_exact = 0` to sample them, and the draws' cases
// set `empirical_pairs = 0` to draw. The draws' tests: with a budget
// that covers every evaluation it is the counted check bit for bit; the closed
// form and every number but the empirical ones never change; the draws are
// unbiased and their 95 % intervals (cell, bucket and gaussian_gap) cover the
// counted values at the nominal rate over 200 seeds on a planted bimodal head;
// the draws depend on the seed only (not on the speed options); bad options
// are a clear error.
#include <qkgeom/capture/synthetic.hpp>
#include <qkgeom/plasticity.hpp>
#include <qkgeom/simd/dispatch.hpp>

#include <catch2/catch.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_empirical_sampling_test {

namespace {

namespace syn = qkgeom::synthetic;
using qkgeom::empirical_policy;
using qkgeom::index_t;
using qkgeom::pair_policy;
using qkgeom::plasticity_options;
using qkgeom::plasticity_result;

/// A synthetic head of one query and one kv head (as plasticity_test.cpp's):
/// d = 12, the drift on axis 4, 16 examples × 2048 tokens, uniform buckets of
/// 128 at rate 4: 16 query buckets of ≈ 64 queries, cells of ≈ 96 pairs.
syn::head_capture make_head() {
    syn::layer_spec L;
    L.d = 12;
    L.rotary_dims = 4;
    L.mix = false;
    L.n_q_heads = 1;
    L.n_kv_heads = 1;
    auto qh = syn::default_q_head();
    qh.query.slope = 2e-3;
    qh.query.intercept = 2.0;
    qh.query.bucket_mean_scale = 0.5;
    auto kh = syn::default_kv_head();
    kh.key.slope = 2e-3;
    kh.key.bucket_mean_scale = 0.5;
    L.q_heads = {qh};
    L.kv_heads = {kh};
    syn::capture_spec cap;
    cap.n_examples = 16;
    cap.context_length = 2048;
    cap.buckets = {qkgeom::bucket_scheme::uniform, 128, 4.0};
    cap.seed = 1;
    return syn::generate_head(L, cap, 0);
}

/// The head with its semantic query coordinates replaced by a ±1.5 two-point
/// mixture (one sign per query): q·δ is two-valued, so the real preferences
/// are far from the Gaussian model's and |AP_b − AP_b,empirical| ≈ 0.1 in
/// every bucket (plasticity_test.cpp, "gaussian_gap is … large on a bimodal one").
syn::head_capture bimodal(syn::head_capture h) {
    syn::normal_stream rng(77);
    for (index_t i = 0; i < h.queries.vectors.rows(); ++i) {
        double const sign = rng() > 0 ? 1.0 : -1.0;
        for (index_t j = 0; j < h.queries.vectors.cols(); ++j)
            if (j != 4) h.queries.vectors(i, j) = 1.5 * sign * ((j % 3 == 0) ? -1.0 : 1.0);
    }
    return h;
}

qkgeom::householder_result model_of(syn::head_capture const& h) {
    return qkgeom::householder(h.queries.vectors, h.queries.position, h.queries.bucket);
}

bool same_bits(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

/// Everything but the empirical values is the same, bit for bit.
void check_closed_form_unchanged(plasticity_result const& a, plasticity_result const& b) {
    REQUIRE(a.cells.size() == b.cells.size());
    for (std::size_t i = 0; i < a.cells.size(); ++i) {
        INFO("cell " << i);
        CHECK(a.cells[i].q_bucket == b.cells[i].q_bucket);
        CHECK(a.cells[i].k_bucket == b.cells[i].k_bucket);
        CHECK(a.cells[i].n_pairs == b.cells[i].n_pairs);
        CHECK(same_bits(a.cells[i].plasticity, b.cells[i].plasticity));
        CHECK(same_bits(a.cells[i].std_error, b.cells[i].std_error));
    }
    REQUIRE(a.profile.size() == b.profile.size());
    for (std::size_t i = 0; i < a.profile.size(); ++i) {
        CHECK(same_bits(a.profile[i].ap, b.profile[i].ap));
        CHECK(same_bits(a.profile[i].std_error, b.profile[i].std_error));
        CHECK(a.profile[i].n_pairs == b.profile[i].n_pairs);
    }
    for (double plasticity_result::*f : {&plasticity_result::ap_overall, &plasticity_result::ap_first_20pct,
                                         &plasticity_result::ap_last_20pct, &plasticity_result::ap_drop})
        CHECK(same_bits(a.*f, b.*f));
    for (std::size_t q = 0; q < 5; ++q) CHECK(same_bits(a.ap_quintile[q], b.ap_quintile[q]));
    for (std::size_t q = 0; q < 10; ++q) CHECK(same_bits(a.ap_decile[q], b.ap_decile[q]));
    CHECK(a.heatmap.sum == b.heatmap.sum);
    CHECK(a.heatmap.count == b.heatmap.count);
    CHECK(a.heatmap.n_outside == b.heatmap.n_outside);
    CHECK(a.n_pairs == b.n_pairs);
    CHECK(a.n_pairs_skipped == b.n_pairs_skipped);
    CHECK(a.sampled == b.sampled);
    for (double qkgeom::profile_split::*f :
         {&qkgeom::profile_split::ap_drop_bias, &qkgeom::profile_split::ap_drop_content,
          &qkgeom::profile_split::ap_drop_neither, &qkgeom::profile_split::ap_drop_no_drift,
          &qkgeom::profile_split::ap_drop_frozen_content})
        CHECK(same_bits(a.split.*f, b.split.*f));
}

/// The largest n_b · (planned pairs) of a cell: the budget that covers every
/// evaluation (no identical keys here, so the planned pairs are the evaluated
/// ones; sampled enumeration plans `samples_per_cell` per cell).
std::int64_t covering_budget(plasticity_result const& r, plasticity_options const& o) {
    std::int64_t most = 0;
    for (auto const& c : r.cells) {
        if (c.n_pairs == 0) continue;
        auto const pb = std::find_if(r.profile.begin(), r.profile.end(),
                                     [&](auto const& b) { return b.q_bucket == c.q_bucket; });
        REQUIRE(pb != r.profile.end());
        most = std::max(most, pb->n_queries * (r.sampled ? o.samples_per_cell : c.n_pairs));
    }
    return most;
}

/// The coverage tallies of repeated seeds against the counted values: cells,
/// buckets (with each bucket's sum of standardised errors) and gaussian_gap.
struct coverage {
    int seeds = 0, gap_cover = 0;
    std::int64_t cells = 0, cells_cover = 0, buckets = 0, buckets_cover = 0;
    std::vector<double> zsum;

    void cell(qkgeom::plasticity_cell const& c, qkgeom::plasticity_cell const& counted) {
        ++cells;
        cells_cover += std::abs(c.empirical - counted.empirical) <= 1.96 * c.empirical_se ? 1 : 0;
    }
    void bucket(std::size_t i, qkgeom::plasticity_bucket const& pb, qkgeom::plasticity_bucket const& counted) {
        zsum.resize(std::max(zsum.size(), i + 1), 0.0);
        double const z = (pb.ap_empirical - counted.ap_empirical) / pb.ap_empirical_se;
        zsum[i] += z;
        ++buckets;
        buckets_cover += std::abs(z) <= 1.96 ? 1 : 0;
    }
    void gap(plasticity_result const& r, plasticity_result const& counted) {
        ++seeds;
        gap_cover += std::abs(r.gaussian_gap - counted.gaussian_gap) <= 1.96 * r.gaussian_gap_se ? 1 : 0;
    }
    [[nodiscard]] double gap_rate() const { return gap_cover / double(seeds); }
    [[nodiscard]] double cell_rate() const { return double(cells_cover) / double(cells); }
    [[nodiscard]] double bucket_rate() const { return double(buckets_cover) / double(buckets); }
    /// Unbiased per bucket: the mean standardised error over the seeds is
    /// N(0, 1/seeds) (cells independent), so |·| < 4/√seeds.
    void check_unbiased(plasticity_result const& counted) const {
        for (std::size_t i = 0; i < zsum.size(); ++i)
            if (zsum[i] != 0.0) {
                INFO("bucket " << counted.profile[i].q_bucket << ": mean standardised error " << zsum[i] / seeds);
                CHECK(std::abs(zsum[i] / seeds) < 4.0 / std::sqrt(double(seeds)));
            }
    }
};

}  // namespace

// ---------------------------------------------------------------------------
// A budget that covers every (query, pair) evaluation of every cell gives the
// counted check bit for bit (every cell is counted, standard errors 0); one
// evaluation less draws in the largest cell(s). So does `empirical_max_exact`
// (the default counts this head). Either way the closed form, AP, the heatmap
// and the split are those of `empirical_policy::exact`, bit for bit:
// same_bucket and prefix, exact and sampled enumeration, the direct and the
// Gram path (dense_min_keys 3).
// ---------------------------------------------------------------------------
TEST_CASE("sampled empirical check: a covering budget is the counted check, the closed form never changes",
          "[plasticity][empirical][empirical_sampling]") {
    auto const h = make_head();
    auto const model = model_of(h);
    for (auto const pairs : {pair_policy::same_bucket, pair_policy::prefix})
        for (bool const sampled_enumeration : {false, true})
            for (index_t const dense : {index_t{48}, index_t{3}}) {
                INFO("prefix " << (pairs == pair_policy::prefix) << ", sampled enumeration " << sampled_enumeration
                               << ", dense_min_keys " << dense);
                plasticity_options o;
                o.pairs = pairs;
                o.dense_min_keys = dense;
                o.seed = 5;
                if (sampled_enumeration) {
                    o.enumeration = qkgeom::enumeration_policy::sampled;
                    o.samples_per_cell = 300;
                }
                o.empirical_pairs = 0;  // the draws (the pair sample has its own cases below)
                o.empirical_check = empirical_policy::exact;
                auto const exact = qkgeom::attention_plasticity(model, h, o);
                REQUIRE(std::isfinite(exact.gaussian_gap));
                CHECK(exact.gaussian_gap_se == 0.0);
                for (auto const& c : exact.cells)
                    if (std::isfinite(c.empirical)) CHECK(c.empirical_se == 0.0);

                // the defaults count every cell of ≤ 16,384 evaluations: all of
                // same_bucket's (≈ 6000), not sampled enumeration's (64 × 300) nor
                // the largest prefix cells (up to 1.7 M)
                o.empirical_check = empirical_policy::sampled;
                auto const defaults = qkgeom::attention_plasticity(model, h, o);
                check_closed_form_unchanged(defaults, exact);
                std::int64_t const covering = covering_budget(exact, o);
                REQUIRE(covering > 4096);  // the default budget alone samples this head
                if (covering <= o.empirical_max_exact) {
                    CHECK(defaults.gaussian_gap == exact.gaussian_gap);
                    CHECK(defaults.gaussian_gap_se == 0.0);
                } else {
                    CHECK(defaults.gaussian_gap_se > 0);
                }
                o.empirical_max_exact = 0;
                o.empirical_budget = covering;
                auto const all = qkgeom::attention_plasticity(model, h, o);
                check_closed_form_unchanged(all, exact);
                for (std::size_t i = 0; i < all.cells.size(); ++i) {
                    CHECK(same_bits(all.cells[i].empirical, exact.cells[i].empirical));
                    CHECK(same_bits(all.cells[i].empirical_se, exact.cells[i].empirical_se));
                }
                for (std::size_t i = 0; i < all.profile.size(); ++i) {
                    CHECK(same_bits(all.profile[i].ap_empirical, exact.profile[i].ap_empirical));
                    CHECK(same_bits(all.profile[i].ap_empirical_se, exact.profile[i].ap_empirical_se));
                }
                CHECK(all.gaussian_gap == exact.gaussian_gap);
                CHECK(all.gaussian_gap_se == 0.0);

                // one evaluation short: the largest cells draw, nothing else moves
                --o.empirical_budget;
                auto const short1 = qkgeom::attention_plasticity(model, h, o);
                check_closed_form_unchanged(short1, exact);
                std::int64_t drawn = 0;
                for (auto const& c : short1.cells) drawn += c.empirical_se > 0 ? 1 : 0;
                CHECK(drawn >= 1);
                CHECK(short1.gaussian_gap_se > 0);
                CHECK(short1.gaussian_gap != exact.gaussian_gap);
                // empirical_max_exact alike: counted up to it, above it the budget's draws
                o.empirical_budget = 4096;
                o.empirical_max_exact = covering;
                auto const upto = qkgeom::attention_plasticity(model, h, o);
                CHECK(upto.gaussian_gap == exact.gaussian_gap);
                CHECK(upto.gaussian_gap_se == 0.0);
                --o.empirical_max_exact;
                auto const above = qkgeom::attention_plasticity(model, h, o);
                check_closed_form_unchanged(above, exact);
                CHECK(above.gaussian_gap_se > 0);
                // every cell sampled: every number but the empirical ones is the same
                o.empirical_max_exact = 0;
                check_closed_form_unchanged(qkgeom::attention_plasticity(model, h, o), exact);
            }
}

// ---------------------------------------------------------------------------
// Coverage. On the bimodal head every bucket's gap |AP_b − AP_b,emp| is at
// least 4 of its standard errors (checked), so |·| keeps its sign under the
// sampling error and the delta-method interval gaussian_gap ± 1.96 se is a
// 95 % interval for the counted gap. 200 seeds (fixed: the test is
// deterministic). Bands: at a true rate of 0.95, 200 intervals cover
// Bin(200, 0.95) times, sd 3.1 (1.5 %): [0.88, 0.99] is −4.5 to +2.6 sd
// (P ≈ 4e-4 to fall outside by chance). The pooled cell and bucket intervals
// are 14,000 and 2800 (the 14 sampled buckets × 200; sd ≤ 0.42 %):
// [0.93, 0.97], ≥ 4.7 sd either side. Unbiasedness:
// per bucket the mean over seeds of (estimate − counted)/se is N(0, 1/200)
// (cells independent): |·| < 4/√200. Convergence: a 4× budget halves the
// standard error (512 → 2048: every cell stays sampled).
// ---------------------------------------------------------------------------
TEST_CASE("sampled empirical check: unbiased, its intervals cover the counted values at the nominal rate",
          "[plasticity][empirical][empirical_sampling]") {
    auto const h = bimodal(make_head());
    auto const model = model_of(h);
    plasticity_options o;
    o.empirical_check = empirical_policy::exact;
    auto const exact = qkgeom::attention_plasticity(model, h, o);
    REQUIRE(exact.gaussian_gap > 0.06);
    // Bucket 1's one cell (65 queries × 107 pairs) has the smallest gap, 0.046:
    // the default budget's se there (0.022) would leave it 2 se from 0, so
    // the budget counts that cell (6955 evaluations) and samples every cell
    // above 7000 (most of them; bucket 6's 49 queries keep some counted).
    o.empirical_check = empirical_policy::sampled;
    o.empirical_budget = 7000;
    o.empirical_max_exact = 0;
    o.empirical_pairs = 0;  // the draws

    int const n_seeds = 200;
    coverage cov;
    for (int seed = 0; seed < n_seeds; ++seed) {
        o.seed = static_cast<std::uint64_t>(seed);
        auto const r = qkgeom::attention_plasticity(model, h, o);
        REQUIRE(r.cells.size() == exact.cells.size());
        REQUIRE(r.gaussian_gap_se > 0);
        for (std::size_t i = 0; i < r.cells.size(); ++i)
            if (r.cells[i].empirical_se > 0) cov.cell(r.cells[i], exact.cells[i]);  // else counted (none here) or empty
        for (std::size_t i = 0; i < r.profile.size(); ++i) {
            auto const& pb = r.profile[i];
            if (!std::isfinite(pb.ap_empirical)) continue;
            if (pb.ap_empirical_se == 0.0) {  // every cell counted: the counted value
                CHECK(pb.ap_empirical == exact.profile[i].ap_empirical);
                continue;
            }
            if (seed == 0) {  // the gap keeps its sign: |d_b| ≥ 4 se_b
                INFO("bucket " << pb.q_bucket << ": gap " << std::abs(pb.ap - exact.profile[i].ap_empirical)
                               << ", se " << pb.ap_empirical_se);
                REQUIRE(std::abs(pb.ap - exact.profile[i].ap_empirical) >= 4 * pb.ap_empirical_se);
            }
            cov.bucket(i, pb, exact.profile[i]);
        }
        cov.gap(r, exact);
    }
    INFO("coverage of the 95 % intervals over " << n_seeds << " seeds: gaussian_gap " << cov.gap_rate() << ", "
                                                << cov.cells << " cells " << cov.cell_rate() << ", " << cov.buckets
                                                << " buckets " << cov.bucket_rate());
    CHECK(cov.gap_rate() >= 0.88);
    CHECK(cov.gap_rate() <= 0.99);
    CHECK(cov.cells >= 10000);
    CHECK(cov.cell_rate() >= 0.93);
    CHECK(cov.cell_rate() <= 0.97);
    CHECK(cov.buckets >= 2800);
    CHECK(cov.bucket_rate() >= 0.93);
    CHECK(cov.bucket_rate() <= 0.97);
    cov.check_unbiased(exact);

    // convergence: 4× the budget, half the standard error (every cell has
    // more than 2048 evaluations, so both budgets sample every cell)
    o.seed = 3;
    o.empirical_budget = 512;
    auto const small = qkgeom::attention_plasticity(model, h, o);
    o.empirical_budget = 2048;
    auto const big = qkgeom::attention_plasticity(model, h, o);
    for (auto const& c : big.cells) CHECK((c.n_pairs == 0 || c.empirical_se > 0));
    double const ratio = big.gaussian_gap_se / small.gaussian_gap_se;
    INFO("gaussian_gap_se " << small.gaussian_gap_se << " (budget 512), " << big.gaussian_gap_se << " (2048)");
    CHECK(ratio > 0.45);
    CHECK(ratio < 0.55);
}

// ---------------------------------------------------------------------------
// The draws depend on (seed, head, b, c) only: the same seed gives the same
// values, another seed others, and the speed options (dense_min_keys,
// tile_keys, the counted check's product form) change nothing, bit for bit.
// ---------------------------------------------------------------------------
TEST_CASE("sampled empirical check: seeded, independent of the speed options",
          "[plasticity][empirical][empirical_sampling]") {
    auto const h = make_head();
    auto const model = model_of(h);
    plasticity_options o;
    o.empirical_budget = 1000;  // some cells counted, most drawn
    o.empirical_max_exact = 0;
    o.empirical_pairs = 0;
    o.seed = 11;
    auto const a = qkgeom::attention_plasticity(model, h, o);
    std::int64_t counted = 0, drawn = 0;
    for (auto const& c : a.cells) {
        counted += c.empirical_se == 0.0 ? 1 : 0;
        drawn += c.empirical_se > 0 ? 1 : 0;
    }
    CHECK(drawn > 0);
    auto same_empirical = [&](plasticity_result const& b) {
        REQUIRE(b.cells.size() == a.cells.size());
        for (std::size_t i = 0; i < a.cells.size(); ++i) {
            CHECK(same_bits(b.cells[i].empirical, a.cells[i].empirical));
            CHECK(same_bits(b.cells[i].empirical_se, a.cells[i].empirical_se));
        }
        for (std::size_t i = 0; i < a.profile.size(); ++i) {
            CHECK(same_bits(b.profile[i].ap_empirical, a.profile[i].ap_empirical));
            CHECK(same_bits(b.profile[i].ap_empirical_se, a.profile[i].ap_empirical_se));
        }
        // AP_b of the Gram path differs from the direct path's by rounding (plasticity_test.cpp)
        CHECK(std::abs(b.gaussian_gap - a.gaussian_gap) <= 1e-12);
        CHECK(same_bits(b.gaussian_gap_se, a.gaussian_gap_se));
    };
    same_empirical(qkgeom::attention_plasticity(model, h, o));
    auto speed = o;
    speed.dense_min_keys = 2;
    speed.tile_keys = 3;
    same_empirical(qkgeom::attention_plasticity(model, h, speed));
    for (auto const form : {qkgeom::empirical_columns::keys, qkgeom::empirical_columns::pairs}) {
        speed = o;
        speed.empirical = form;
        same_empirical(qkgeom::attention_plasticity(model, h, speed));
    }
    auto other = o;
    other.seed = 12;
    CHECK(qkgeom::attention_plasticity(model, h, other).gaussian_gap != a.gaussian_gap);
    // the budget applies per cell: a cell of n_b · pairs ≤ 1000 is counted
    INFO(counted << " cells counted, " << drawn << " drawn");
    // without query rows there is nothing to estimate
    auto const none = qkgeom::attention_plasticity(model, h.keys, h.facts, h.id, o);
    CHECK(std::isnan(none.gaussian_gap));
    CHECK(std::isnan(none.gaussian_gap_se));
    for (auto const& c : none.cells) CHECK(std::isnan(c.empirical_se));
}

TEST_CASE("sampled empirical check: a budget below 4 or a negative exact limit is a clear error",
          "[plasticity][empirical][errors]") {
    auto const h = make_head();
    auto const model = model_of(h);
    using Catch::Contains;
    for (std::int64_t const bad : {std::int64_t{3}, std::int64_t{0}, std::int64_t{-1}}) {
        plasticity_options o;
        o.empirical_budget = bad;
        CHECK_THROWS_AS(qkgeom::attention_plasticity(model, h, o), std::invalid_argument);
        CHECK_THROWS_WITH(qkgeom::attention_plasticity(model, h, o),
                          Contains("qkgeom::attention_plasticity") && Contains("empirical_budget must be >= 4") &&
                              Contains("value " + std::to_string(bad)));
        o.empirical_check = empirical_policy::exact;  // checked whatever the policy, as samples_per_cell
        CHECK_THROWS_WITH(qkgeom::attention_plasticity(model, h, o), Contains("empirical_budget"));
    }
    plasticity_options o;
    o.empirical_max_exact = -1;
    CHECK_THROWS_WITH(qkgeom::attention_plasticity(model, h, o),
                      Contains("empirical_max_exact must be >= 0") && Contains("value -1"));
    o.empirical_max_exact = 0;
    o.empirical_budget = 4;
    CHECK_NOTHROW(qkgeom::attention_plasticity(model, h, o));
}

// ---------------------------------------------------------------------------
// The pair sample (the difference estimator): a cell of more than
// 4 × `empirical_pairs` pairs counts m = `empirical_pairs` of them, drawn
// without replacement, against every query; its empirical value is the
// closed form's mean plus the mean of PP̂ − PP over the sample. Over 200
// seeds on the planted bimodal head: unbiased per bucket (mean
// standardised error within 4/√200), the 95 % intervals of the cells (m = 20
// pairs: the t distribution with 19 degrees of freedom covers 93.5 % at
// ±1.96 for normal errors; band [0.90, 0.965], pooled over ≥ 10,000 cells,
// sd ≤ 0.3 %) and of the buckets (means of ≈ 8 cells: ≈ 95 %, band
// [0.93, 0.97]) cover the counted values. On this head PP̂ − PP varies
// widely from pair to pair (the model does not fit), so the first buckets,
// of 1 to 3 cells, have |d_b| < 4 se_b: there |·| folds the error and the
// interval of gaussian_gap is conservative; it must cover at least at the
// nominal rate (≥ 0.90 of 200, sd 1.5 %). A cell of ≤ 4m pairs is counted
// whole (se 0, the counted value bit for bit); the closed form never
// changes; m = 5 against m = 20 gives about twice the standard error
// (√4 · √((1 − 5/N)/(1 − 20/N)) ≈ 2.2 at N ≈ 100 pairs).
// ---------------------------------------------------------------------------
TEST_CASE("pair-sampled empirical check: unbiased, its intervals cover the counted values",
          "[plasticity][empirical][empirical_sampling]") {
    auto const h = bimodal(make_head());
    auto const model = model_of(h);
    plasticity_options o;
    o.empirical_check = empirical_policy::exact;
    auto const exact = qkgeom::attention_plasticity(model, h, o);
    REQUIRE(exact.gaussian_gap > 0.06);
    o.empirical_check = empirical_policy::sampled;
    o.empirical_max_exact = 0;  // every cell above 4096 / n_b ≈ 64 pairs is sampled
    o.empirical_pairs = 20;

    int const n_seeds = 200;
    coverage cov;
    std::int64_t whole = 0;
    for (int seed = 0; seed < n_seeds; ++seed) {
        o.seed = static_cast<std::uint64_t>(seed);
        auto const r = qkgeom::attention_plasticity(model, h, o);
        if (seed == 0) check_closed_form_unchanged(r, exact);
        REQUIRE(r.cells.size() == exact.cells.size());
        for (std::size_t i = 0; i < r.cells.size(); ++i) {
            auto const& c = r.cells[i];
            if (c.n_pairs == 0 || !std::isfinite(c.empirical)) continue;
            if (c.n_pairs <= 4 * o.empirical_pairs) {  // counted whole
                ++whole;
                CHECK(c.empirical_se == 0.0);
                CHECK(c.empirical == exact.cells[i].empirical);
                continue;
            }
            REQUIRE(c.empirical_se > 0);
            cov.cell(c, exact.cells[i]);
        }
        for (std::size_t i = 0; i < r.profile.size(); ++i) {
            auto const& pb = r.profile[i];
            if (std::isfinite(pb.ap_empirical) && pb.ap_empirical_se != 0.0) cov.bucket(i, pb, exact.profile[i]);
        }
        cov.gap(r, exact);
    }
    INFO("coverage of the 95 % intervals over " << n_seeds << " seeds: gaussian_gap " << cov.gap_rate() << ", "
                                                << cov.cells << " cells " << cov.cell_rate() << ", " << cov.buckets
                                                << " buckets " << cov.bucket_rate() << "; " << whole
                                                << " cells counted whole");
    CHECK(cov.gap_rate() >= 0.90);  // at least nominal (see above)
    CHECK(cov.cells >= 10000);
    CHECK(cov.cell_rate() >= 0.90);
    CHECK(cov.cell_rate() <= 0.965);
    CHECK(cov.buckets >= 2000);
    CHECK(cov.bucket_rate() >= 0.93);
    CHECK(cov.bucket_rate() <= 0.97);
    cov.check_unbiased(exact);

    // convergence: 4× the pairs, about half the standard error
    o.seed = 3;
    o.empirical_pairs = 5;
    auto const small = qkgeom::attention_plasticity(model, h, o);
    o.empirical_pairs = 20;
    auto const big = qkgeom::attention_plasticity(model, h, o);
    double const ratio = small.gaussian_gap_se / big.gaussian_gap_se;
    INFO("gaussian_gap_se " << small.gaussian_gap_se << " (5 pairs), " << big.gaussian_gap_se << " (20 pairs)");
    CHECK(ratio > 1.6);
    CHECK(ratio < 2.9);
}

// ---------------------------------------------------------------------------
// The pair sample depends on (seed, head, b, c) only: bit for bit the same
// under the speed options and at the generic level (the sampled pairs'
// counts in double there, by the certified single-precision kernels at the
// dispatched levels: the same counts), another seed gives other values. It
// serves `prefix` (one large cell per bucket) and sampled enumeration. Where
// n_b · m exceeds 32 · `empirical_budget` the cell draws instead (the
// draws' standard error √(ȳ(2 − ȳ)/(k − 1)) identifies them).
// ---------------------------------------------------------------------------
TEST_CASE("pair-sampled empirical check: seeded, independent of the speed options and the instruction set",
          "[plasticity][empirical][empirical_sampling]") {
    auto const h = make_head();
    auto const model = model_of(h);
    plasticity_options o;
    o.empirical_max_exact = 0;
    o.empirical_pairs = 20;
    o.seed = 11;
    auto const a = qkgeom::attention_plasticity(model, h, o);
    std::int64_t paired = 0;
    for (auto const& c : a.cells) paired += c.empirical_se > 0 ? 1 : 0;
    CHECK(paired > 50);
    auto same_empirical = [&](plasticity_result const& b, double tol) {
        REQUIRE(b.cells.size() == a.cells.size());
        for (std::size_t i = 0; i < a.cells.size(); ++i) {
            CHECK(std::abs(b.cells[i].empirical - a.cells[i].empirical) <= tol);
            CHECK(std::abs(b.cells[i].empirical_se - a.cells[i].empirical_se) <= tol);
        }
        CHECK(std::abs(b.gaussian_gap - a.gaussian_gap) <= 1e-12);
        CHECK(std::abs(b.gaussian_gap_se - a.gaussian_gap_se) <= 1e-12);
    };
    same_empirical(qkgeom::attention_plasticity(model, h, o), 0.0);
    auto speed = o;
    speed.dense_min_keys = 2;  // the Gram path: AP differs by rounding, so does the empirical value
    speed.tile_keys = 3;
    same_empirical(qkgeom::attention_plasticity(model, h, speed), 1e-12);
    for (auto const form : {qkgeom::empirical_columns::keys, qkgeom::empirical_columns::pairs}) {
        speed = o;
        speed.empirical = form;
        same_empirical(qkgeom::attention_plasticity(model, h, speed), 0.0);
    }
    {
        qkgeom::simd::scoped_limit const cap(qkgeom::simd::isa::generic);
        same_empirical(qkgeom::attention_plasticity(model, h, o), 1e-12);
    }
    auto other = o;
    other.seed = 12;
    CHECK(qkgeom::attention_plasticity(model, h, other).gaussian_gap != a.gaussian_gap);

    // prefix and sampled enumeration: every sampled cell within 5 se of the counted value
    for (bool const prefix : {true, false}) {
        auto p = o;
        auto ex = o;
        ex.empirical_check = empirical_policy::exact;
        if (prefix) {
            p.pairs = ex.pairs = pair_policy::prefix;
        } else {
            p.enumeration = ex.enumeration = qkgeom::enumeration_policy::sampled;
            p.samples_per_cell = ex.samples_per_cell = 300;
        }
        auto const rp = qkgeom::attention_plasticity(model, h, p);
        auto const re = qkgeom::attention_plasticity(model, h, ex);
        check_closed_form_unchanged(rp, re);
        std::int64_t sampled_cells = 0;
        for (std::size_t i = 0; i < rp.cells.size(); ++i) {
            if (!(rp.cells[i].empirical_se > 0)) continue;
            ++sampled_cells;
            INFO("prefix " << prefix << ", cell " << i);
            CHECK(std::abs(rp.cells[i].empirical - re.cells[i].empirical) <= 5 * rp.cells[i].empirical_se);
        }
        CHECK(sampled_cells >= 10);
    }

    // n_b · m > 32 · budget: the cells draw (⌊budget/2⌋ = 8 draws each)
    auto d = o;
    d.empirical_budget = 16;  // 32 · 16 = 512 < 20 pairs × n_b (≥ 49 queries)
    auto const drawn = qkgeom::attention_plasticity(model, h, d);
    std::int64_t n_drawn = 0;
    for (auto const& c : drawn.cells) {
        if (!(c.empirical_se > 0)) continue;
        ++n_drawn;
        CHECK(std::abs(c.empirical_se - std::sqrt(c.empirical * (2.0 - c.empirical) / 7.0)) <= 1e-12);
    }
    CHECK(n_drawn > 50);
    CHECK_THROWS_WITH(qkgeom::attention_plasticity(model, h, [] {
                          plasticity_options bad;
                          bad.empirical_pairs = -1;
                          return bad;
                      }()),
                      Catch::Contains("empirical_pairs must be >= 0") && Catch::Contains("value -1"));
}

}  // namespace qkgeom_tests_empirical_sampling_test
