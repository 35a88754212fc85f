// Beyond pairs (docs/beyond-ranks.md): top-1 flip and expected Kendall τ_a of
// m keys under a head's Gaussian query model, checked against Monte Carlo
// draws of the query from the same model on the same key sets, the m = 2
// closed form, planted truths (symmetric keys, zero variance, strong drift),
// the key-set draw rules, bad options and reproducibility.
#include <qkgeom/beyond/ranks.hpp>

#include <catch2/catch.hpp>
#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_rank_stability_test {

namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;

/// Monte Carlo of the scores s ~ N(mean, cov): top-1 flip (collision
/// estimator, unbiased) and Kendall τ_a with their standard errors.
struct mc_result {
    double flip = 0, flip_se = 0, kendall = 0, kendall_se = 0;
};

mc_result monte_carlo(VectorXd const& mean, MatrixXd const& cov, std::vector<double> const& t, int n,
                      std::uint64_t seed) {
    auto const m = mean.size();
    Eigen::SelfAdjointEigenSolver<MatrixXd> es(cov);
    MatrixXd const A = es.eigenvectors() * es.eigenvalues().cwiseMax(0.0).cwiseSqrt().asDiagonal();
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> nd;
    VectorXd z(m), s(m), wins = VectorXd::Zero(m);
    double ks = 0, ks2 = 0;
    double const pairs = 0.5 * double(m) * double(m - 1);
    for (int r = 0; r < n; ++r) {
        for (Eigen::Index i = 0; i < m; ++i) z(i) = nd(gen);
        s = mean + A * z;
        Eigen::Index top = 0;
        s.maxCoeff(&top);
        wins(top) += 1;
        double k = 0;
        for (Eigen::Index i = 0; i < m; ++i)
            for (Eigen::Index j = i + 1; j < m; ++j) {
                double const dt = t[std::size_t(i)] - t[std::size_t(j)], ds = s(i) - s(j);
                k += (dt > 0 ? 1 : dt < 0 ? -1 : 0) * (ds > 0 ? 1 : ds < 0 ? -1 : 0);
            }
        k /= pairs;
        ks += k;
        ks2 += k * k;
    }
    mc_result out;
    VectorXd const p = wins / double(n);
    double const sum_p2 = (double(n) * p.squaredNorm() - 1.0) / double(n - 1);  // unbiased Σp²
    out.flip = 1.0 - sum_p2;
    double const p3 = p.array().cube().sum();
    out.flip_se = std::sqrt(std::max(0.0, 4.0 * (p3 - p.squaredNorm() * p.squaredNorm())) / double(n));
    out.kendall = ks / n;
    out.kendall_se = std::sqrt(std::max(0.0, ks2 / n - out.kendall * out.kendall) / double(n - 1));
    return out;
}

/// A random planted case: m keys in d dimensions, a query mean and a diag
/// or full covariance.
struct planted {
    VectorXd mean;
    MatrixXd cov;
    std::vector<double> t;
};

planted random_case(std::mt19937_64& gen, int m, int d, bool full, double mean_scale) {
    std::normal_distribution<double> nd;
    std::uniform_real_distribution<double> ud(0.2, 2.0);
    MatrixXd K(m, d);
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < d; ++j) K(i, j) = nd(gen);
    VectorXd w(d);
    for (int j = 0; j < d; ++j) w(j) = mean_scale * nd(gen);
    MatrixXd V = MatrixXd::Zero(d, d);
    if (full) {
        MatrixXd B(d, d);
        for (int i = 0; i < d; ++i)
            for (int j = 0; j < d; ++j) B(i, j) = nd(gen);
        V = B * B.transpose() / double(d);
    } else {
        for (int j = 0; j < d; ++j) V(j, j) = ud(gen);
    }
    planted c{K * w, K * V * K.transpose(), {}};
    for (int i = 0; i < m; ++i) c.t.push_back(double(std::uniform_int_distribution<int>(0, 20)(gen)));
    return c;
}

void check_against_mc(planted const& c, qkgeom::rank_options const& o, std::uint64_t seed, int n_mc) {
    auto const st = qkgeom::score_rank_stability(c.mean, c.cov, c.t, o, seed);
    auto const mc = monte_carlo(c.mean, c.cov, c.t, n_mc, seed + 1);
    double const m = double(c.mean.size());
    INFO("m = " << m << ", flip " << st.top1_flip << " ± " << st.top1_flip_int_se << ", MC " << mc.flip << " ± "
                << mc.flip_se << "; kendall " << st.kendall << ", MC " << mc.kendall << " ± " << mc.kendall_se);
    CHECK(st.top1_flip >= 0.0);
    CHECK(st.top1_flip <= 1.0 - 1.0 / m + 1e-15);
    CHECK(std::abs(st.kendall) <= 1.0);
    CHECK(std::abs(st.p.sum() - 1.0) < 1e-12);
    double const se = std::hypot(mc.flip_se, st.top1_flip_int_se);
    CHECK(std::abs(st.top1_flip - mc.flip) <= 4.0 * se + 1e-9);
    CHECK(std::abs(st.kendall - mc.kendall) <= 4.0 * mc.kendall_se + 1e-9);
}

}  // namespace

TEST_CASE("top-1 flip and Kendall match Monte Carlo from the same Gaussian model", "[ranks]") {
    std::mt19937_64 gen(20261124);
    int const ms[] = {2, 3, 4, 5, 6, 8, 8, 12};
    int const ds[] = {3, 8, 32};
    double const scales[] = {0.0, 0.3, 1.0};
    qkgeom::rank_options fine;
    fine.lattice_points = 32;
    fine.lattice_shifts = 8;
    qkgeom::rank_options const coarse;  // the defaults: 1 point × 2 shifts
    int cases = 0;
    for (int rep = 0; rep < 30; ++rep) {
        int const m = ms[rep % 8], d = ds[rep % 3];
        bool const full = rep % 2 == 1;
        planted const c = random_case(gen, m, d, full, scales[(rep / 3) % 3]);
        check_against_mc(c, fine, 100 + std::uint64_t(rep), 20000);
        check_against_mc(c, coarse, 200 + std::uint64_t(rep), 20000);
        cases += 2;
    }
    CHECK(cases >= 50);
}

TEST_CASE("m = 2 is the closed form of the pair", "[ranks]") {
    std::mt19937_64 gen(7);
    for (int rep = 0; rep < 20; ++rep) {
        planted const c = random_case(gen, 2, 5, rep % 2 == 0, 0.7);
        auto const st = qkgeom::score_rank_stability(c.mean, c.cov, c.t, {}, 3);
        double const v = c.cov(0, 0) + c.cov(1, 1) - 2 * c.cov(0, 1);
        double const z = (c.mean(0) - c.mean(1)) / std::sqrt(v);
        double const p = qkgeom::preference_probability(z), q = qkgeom::preference_probability(-z);
        CHECK(st.top1_flip == Approx(1.0 - p * p - q * q).margin(1e-12));
        CHECK(st.top1_flip == Approx(2.0 * p * q).margin(1e-12));
        CHECK(st.top1_flip_int_se == Approx(0.0).margin(1e-15));
        double const sgn = c.t[0] > c.t[1] ? 1.0 : (c.t[0] < c.t[1] ? -1.0 : 0.0);
        CHECK(st.kendall == Approx(sgn * (2.0 * p - 1.0)).margin(1e-12));
    }
}

TEST_CASE("planted truths: symmetric keys, zero variance, strong drift", "[ranks]") {
    for (int m : {3, 5, 8}) {
        // orthonormal keys, zero query mean, V = I: exchangeable, p_i = 1/m
        VectorXd const mean = VectorXd::Zero(m);
        MatrixXd const cov = MatrixXd::Identity(m, m);
        std::vector<double> t(std::size_t(m), 0.0);
        qkgeom::rank_options o;
        o.lattice_points = 64;
        o.lattice_shifts = 8;
        auto const st = qkgeom::score_rank_stability(mean, cov, t, o, 11);
        CHECK(st.top1_flip == Approx(1.0 - 1.0 / m).margin(4 * st.top1_flip_int_se + 1e-3));
        CHECK(st.kendall == 0.0);  // tied positions contribute 0
        // zero variance: the winner is fixed
        VectorXd s(m);
        for (int i = 0; i < m; ++i) s(i) = double(i);
        for (int i = 0; i < m; ++i) t[std::size_t(i)] = double(10 * i);
        auto const z = qkgeom::score_rank_stability(s, MatrixXd::Zero(m, m), t, {}, 1);
        CHECK(z.top1_flip == 0.0);
        CHECK(z.kendall == 1.0);
        // strong drift: scores increase with position far beyond the noise
        auto const up = qkgeom::score_rank_stability(50.0 * s, MatrixXd::Identity(m, m), t, {}, 1);
        CHECK(up.kendall > 0.99);
        CHECK(up.top1_flip < 1e-6);
        auto const down = qkgeom::score_rank_stability(-50.0 * s, MatrixXd::Identity(m, m), t, {}, 1);
        CHECK(down.kendall < -0.99);
    }
}

namespace {

/// A planted head: d dims, a reflector from a random direction, per query
/// bucket a Gaussian model (diag or full); keys of `n_examples` examples with
/// `per_bucket` keys per (example, bucket) in uniform buckets of width 16.
struct planted_head {
    qkgeom::householder_result model;
    qkgeom::token_rows<qkgeom::row_matrix> keys;
    qkgeom::capture_facts facts;
};

planted_head make_head(std::uint64_t seed, int d, bool full, int n_buckets, int n_examples, int per_bucket,
                       double drift, double var_scale, double key_drift = 0.05) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> nd;
    planted_head h;
    int const width = 16;
    h.facts.buckets = qkgeom::bucket_spec{qkgeom::bucket_scheme::uniform, width, 1.0};
    h.facts.context_length = n_buckets * width;
    VectorXd dir(d);
    for (int j = 0; j < d; ++j) dir(j) = nd(gen);
    h.model.beta = dir;
    h.model.H = qkgeom::householder_reflector::from_direction(dir);
    h.model.max_position = n_buckets * width - 1;
    for (int b = 0; b < n_buckets; ++b) {
        qkgeom::bucket_semantics s;
        s.bucket = b;
        s.n_queries = 10 + b;
        s.tau = b * width + 7.5;
        s.used = true;
        s.mean = VectorXd(d);
        for (int j = 0; j < d; ++j) s.mean(j) = 0.5 * nd(gen);
        s.mean(0) = drift * s.tau;
        s.var = VectorXd::Constant(d, var_scale);
        if (full) {
            MatrixXd B(d - 1, d - 1);
            for (int i = 0; i < d - 1; ++i)
                for (int j = 0; j < d - 1; ++j) B(i, j) = nd(gen);
            s.cov = var_scale * B * B.transpose() / double(d);
            s.var.tail(d - 1) = s.cov.diagonal();
        }
        h.model.buckets.push_back(s);
    }
    std::vector<std::int64_t> pos, bkt, ex;
    std::vector<VectorXd> rows;
    for (int e = 0; e < n_examples; ++e)
        for (int b = 0; b < n_buckets; ++b)
            for (int k = 0; k < per_bucket; ++k) {
                std::int64_t const t = b * width + std::uniform_int_distribution<int>(0, width - 1)(gen);
                VectorXd r(d);
                for (int j = 0; j < d; ++j) r(j) = nd(gen);
                r += key_drift * double(t) * dir / dir.norm();  // keys drift along β̂
                pos.push_back(t);
                bkt.push_back(b);
                ex.push_back(100 + e);
                rows.push_back(r);
            }
    qkgeom::row_matrix K(Eigen::Index(rows.size()), d);
    for (std::size_t i = 0; i < rows.size(); ++i) K.row(Eigen::Index(i)) = rows[i].transpose();
    h.keys = {K, qkgeom::token_positions(pos), qkgeom::token_buckets(bkt), qkgeom::example_ids(ex)};
    return h;
}

/// The score model of a set built independently: dense H, original keys.
void set_model(planted_head const& h, qkgeom::bucket_semantics const& s, std::vector<qkgeom::index_t> const& rows,
               VectorXd& mean, MatrixXd& cov, std::vector<double>& t) {
    auto const d = h.model.beta.size();
    MatrixXd const H = h.model.H.dense(d);
    MatrixXd V = s.var.asDiagonal();
    if (s.cov.size() != 0) V.bottomRightCorner(d - 1, d - 1) = s.cov;
    MatrixXd K(Eigen::Index(rows.size()), d);
    t.clear();
    for (std::size_t a = 0; a < rows.size(); ++a) {
        K.row(Eigen::Index(a)) = (H * h.keys.vectors.row(rows[a]).transpose()).transpose();
        t.push_back(double(h.keys.position[rows[a]]));
    }
    mean = K * s.mean;
    cov = K * V * K.transpose();
}

}  // namespace

TEST_CASE("rank_stability on planted heads matches Monte Carlo on its own key sets", "[ranks]") {
    // Per set: a fine lattice against Monte Carlo within 4 standard errors.
    // Pooled over the sets: the default (coarse) lattice is unbiased, its
    // differences to Monte Carlo average to zero within 4 standard errors.
    int sets_checked = 0;
    std::vector<double> diff;
    for (int rep = 0; rep < 4; ++rep) {
        bool const full = rep % 2 == 1;
        auto const h = make_head(50 + std::uint64_t(rep), rep < 2 ? 6 : 16, full, 5, 6, 2, 0.02 * rep, 0.5 + rep);
        qkgeom::rank_options o;
        o.keys_per_set = rep < 2 ? 4 : 6;
        o.sets_per_bucket = 6;
        o.keep_sets = true;
        o.keys = rep == 3 ? qkgeom::rank_key_policy::same_bucket : qkgeom::rank_key_policy::prefix;
        if (rep == 3) o.keys_per_set = 2;
        auto const coarse = qkgeom::rank_stability(h.model, h.keys, h.facts, {0, rep, 0}, o);
        o.lattice_points = 32;
        o.lattice_shifts = 8;
        auto const r = qkgeom::rank_stability(h.model, h.keys, h.facts, {0, rep, 0}, o);
        REQUIRE(r.profile.size() == 5);
        REQUIRE(r.sets.size() == coarse.sets.size());
        for (std::size_t i = 0; i < r.sets.size(); ++i) {
            auto const& set = r.sets[i];
            REQUIRE(coarse.sets[i].rows == set.rows);  // the same draws whatever the lattice
            auto const& s = h.model.buckets[std::size_t(set.q_bucket)];
            VectorXd mean;
            MatrixXd cov;
            std::vector<double> t;
            set_model(h, s, set.rows, mean, cov, t);
            auto const mc = monte_carlo(mean, cov, t, 20000, 9000 + std::uint64_t(sets_checked));
            INFO("rep " << rep << " bucket " << set.q_bucket << ": flip " << set.top1_flip << " MC " << mc.flip
                        << " ± " << mc.flip_se << "; kendall " << set.kendall << " MC " << mc.kendall);
            CHECK(std::abs(set.top1_flip - mc.flip) <= 4.0 * std::hypot(mc.flip_se, set.top1_flip_int_se) + 1e-9);
            CHECK(std::abs(set.kendall - mc.kendall) <= 4.0 * mc.kendall_se + 1e-9);
            CHECK(coarse.sets[i].kendall == set.kendall);  // exact, lattice-free
            diff.push_back(coarse.sets[i].top1_flip - mc.flip);
            ++sets_checked;
        }
    }
    CHECK(sets_checked >= 50);
    double mu = 0, ss = 0;
    for (double x : diff) mu += x;
    mu /= double(diff.size());
    for (double x : diff) ss += (x - mu) * (x - mu);
    double const se = std::sqrt(ss / double(diff.size() - 1) / double(diff.size()));
    INFO("default lattice − MC: mean " << mu << " ± " << se << " over " << diff.size() << " sets");
    CHECK(std::abs(mu) <= 4.0 * se);
}

TEST_CASE("key sets are drawn as documented", "[ranks]") {
    auto const h = make_head(5, 4, false, 6, 8, 2, 0.0, 1.0);
    for (auto policy : {qkgeom::rank_key_policy::prefix, qkgeom::rank_key_policy::same_bucket}) {
        qkgeom::rank_options o;
        o.keys_per_set = policy == qkgeom::rank_key_policy::prefix ? 5 : 2;
        o.keep_sets = true;
        o.keys = policy;
        auto facts = h.facts;
        facts.sliding_window = 40;  // span ⌈40/16⌉ = 3 buckets
        auto const r = qkgeom::rank_stability(h.model, h.keys, facts, {1, 2, 3}, o);
        for (auto const& rb : r.profile) {
            // brute force: admissible buckets c < b, c ≥ b − 3; sources with ≥ m keys
            std::int64_t const admissible = std::min<std::int64_t>(rb.q_bucket, 3);
            std::int64_t const expect = policy == qkgeom::rank_key_policy::prefix
                                            ? (2 * admissible >= 5 ? 8 : 0)
                                            : 8 * admissible;
            CHECK(rb.n_sources == expect);
            if (expect == 0) {
                CHECK(rb.status == qkgeom::rank_bucket_status::no_key_set);
                CHECK(std::isnan(rb.top1_flip));
                CHECK(std::isnan(rb.kendall));
            } else {
                CHECK(rb.n_sets == o.sets_per_bucket);
                CHECK(rb.top1_flip >= 0.0);
                CHECK(rb.top1_flip <= 1.0 - 1.0 / double(o.keys_per_set));
            }
        }
        CHECK(r.n_buckets_no_key_set == std::count_if(r.profile.begin(), r.profile.end(), [](auto const& rb) {
                  return rb.status == qkgeom::rank_bucket_status::no_key_set;
              }));
        for (auto const& set : r.sets) {
            std::set<std::int64_t> buckets;
            REQUIRE(set.rows.size() == std::size_t(o.keys_per_set));
            CHECK(std::adjacent_find(set.rows.begin(), set.rows.end()) == set.rows.end());  // distinct
            for (auto row : set.rows) {
                CHECK(h.keys.example_id[row] == set.example);
                std::int64_t const c = h.keys.bucket[row];
                CHECK(c < set.q_bucket);
                CHECK(c >= set.q_bucket - 3);
                buckets.insert(c);
            }
            if (policy == qkgeom::rank_key_policy::same_bucket) CHECK(buckets.size() == 1);
        }
    }
}

TEST_CASE("rank_stability: zero variance, strong drift, no model, head aggregates", "[ranks]") {
    auto h = make_head(8, 5, false, 6, 5, 2, 0.0, 1.0);
    for (auto& s : h.model.buckets) s.var.setZero();
    qkgeom::rank_options o;
    o.keys_per_set = 3;
    auto const r0 = qkgeom::rank_stability(h.model, h.keys, h.facts, {0, 0, 0}, o);
    for (auto const& rb : r0.profile)
        if (rb.status == qkgeom::rank_bucket_status::ok) CHECK(rb.top1_flip == 0.0);
    CHECK(r0.top1_flip == 0.0);
    // strong drift: the query's first coordinate and the keys' both grow along β̂
    auto hd = make_head(9, 5, false, 10, 5, 3, 50.0, 1e-6, 20.0);
    hd.model.buckets[3].used = false;
    auto const r = qkgeom::rank_stability(hd.model, hd.keys, hd.facts, {0, 0, 0}, o);
    CHECK(r.kendall > 0.95);
    CHECK(r.profile[3].status == qkgeom::rank_bucket_status::no_model);
    CHECK(std::isnan(r.profile[3].top1_flip));
    CHECK(r.n_buckets_no_model == 1);
    CHECK(r.profile[0].status == qkgeom::rank_bucket_status::no_key_set);  // bucket 0: no earlier key
    // head aggregates: query-weighted means of the bucket values, quintiles by τ_b
    double w = 0, sum = 0;
    for (auto const& rb : r.profile)
        if (std::isfinite(rb.kendall)) {
            w += double(rb.n_queries);
            sum += double(rb.n_queries) * rb.kendall;
        }
    CHECK(r.kendall == Approx(sum / w).epsilon(1e-14));
    REQUIRE(std::isfinite(r.kendall_first_20pct));
    CHECK(r.kendall_drop == Approx(r.kendall_first_20pct - r.kendall_last_20pct).margin(1e-15));
    CHECK(r.top1_flip_drop == Approx(r.top1_flip_first_20pct - r.top1_flip_last_20pct).margin(1e-15));
    CHECK(r.profile.back().quintile == 4);
}

TEST_CASE("rank_stability: bad options name the field, results are reproducible", "[ranks]") {
    auto const h = make_head(3, 4, true, 5, 6, 2, 0.01, 1.0);
    auto bad = [&](auto edit, char const* field) {
        qkgeom::rank_options o;
        edit(o);
        CHECK_THROWS_WITH(qkgeom::rank_stability(h.model, h.keys, h.facts, {0, 0, 0}, o), Catch::Contains(field));
    };
    bad([](auto& o) { o.keys_per_set = 1; }, "keys_per_set");
    bad([](auto& o) { o.keys_per_set = 65; }, "keys_per_set");
    bad([](auto& o) { o.sets_per_bucket = 0; }, "sets_per_bucket");
    bad([](auto& o) { o.lattice_points = 0; }, "lattice_points");
    bad([](auto& o) { o.lattice_shifts = 1; }, "lattice_shifts");
    bad([](auto& o) { o.keys = static_cast<qkgeom::rank_key_policy>(7); }, "rank_options.keys");
    CHECK_THROWS_AS(qkgeom::score_rank_stability(VectorXd::Zero(3), MatrixXd::Zero(2, 2),
                                                 std::vector<double>(3, 0.0), {}, 0),
                    std::invalid_argument);
    VectorXd nan_mean = VectorXd::Zero(3);
    nan_mean(1) = std::nan("");
    CHECK_THROWS_WITH(qkgeom::score_rank_stability(nan_mean, MatrixXd::Identity(3, 3), std::vector<double>(3, 0.0), {}, 0),
                      Catch::Contains("mean"));
    CHECK_THROWS_WITH(qkgeom::score_rank_stability(VectorXd::Zero(1), MatrixXd::Identity(1, 1), std::vector<double>(1, 0.0), {}, 0),
                      Catch::Contains("mean"));
    auto hb = h;
    hb.keys.bucket = qkgeom::token_buckets(std::vector<std::int64_t>(std::size_t(hb.keys.vectors.rows()), 0));
    CHECK_THROWS_AS(qkgeom::rank_stability(hb.model, hb.keys, hb.facts, {0, 0, 0}), std::invalid_argument);

    qkgeom::rank_options o;
    o.keys_per_set = 3;
    auto const a = qkgeom::rank_stability(h.model, h.keys, h.facts, {0, 1, 0}, o);
    auto const b = qkgeom::rank_stability(h.model, h.keys, h.facts, {0, 1, 0}, o);
    REQUIRE(a.profile.size() == b.profile.size());
    bool differs_seed = false, differs_head = false;
    o.seed = 1;
    auto const c = qkgeom::rank_stability(h.model, h.keys, h.facts, {0, 1, 0}, o);
    o.seed = 0;
    auto const e = qkgeom::rank_stability(h.model, h.keys, h.facts, {0, 2, 0}, o);
    for (std::size_t i = 0; i < a.profile.size(); ++i) {
        if (!std::isfinite(a.profile[i].top1_flip)) continue;
        CHECK(a.profile[i].top1_flip == b.profile[i].top1_flip);
        CHECK(a.profile[i].kendall == b.profile[i].kendall);
        differs_seed = differs_seed || c.profile[i].top1_flip != a.profile[i].top1_flip;
        differs_head = differs_head || e.profile[i].top1_flip != a.profile[i].top1_flip;
    }
    CHECK(differs_seed);
    CHECK(differs_head);
}

TEST_CASE("the orthant integrands' Φ⁻¹ is within 1.2e-9 relative of AS 241", "[ranks]") {
    // rank_quantile (Acklam) against normal_quantile (AS 241, ~1e-16) over the
    // whole range the integrands use: [DBL_MIN, 1 − 2^-53], both tails log-spaced.
    double worst = 0, at = 0;
    auto check = [&](double p) {
        double const a = qkgeom::detail::rank_quantile(p), r = qkgeom::detail::normal_quantile(p);
        double const e = std::abs(a - r) / std::max(std::abs(r), 1e-300);
        if (!(e <= worst)) worst = e, at = p;
    };
    for (double lp = -307.6; lp < 0.0; lp += 0.01) {
        double const p = std::pow(10.0, lp);
        check(p);
        check(std::min(1.0 - p, 1.0 - 0x1p-53));
    }
    for (int i = 1; i < 100000; ++i) check(i / 100000.0);
    check(std::numeric_limits<double>::min());
    INFO("worst relative error " << worst << " at p = " << at);
    CHECK(worst <= 1.2e-9);
    CHECK(worst > 0);  // a different approximation, not AS 241 itself
    // odd about 1/2 to the accuracy of both sides (1 − p exact for these p), and monotone
    for (double p : {0x1p-50, 0x1p-30, 0x1p-10, 0.03125, 0.25, 0.4375}) {
        CHECK(qkgeom::detail::rank_quantile(1.0 - p) == Approx(-qkgeom::detail::rank_quantile(p)).epsilon(2.5e-9));
        CHECK(qkgeom::detail::rank_quantile(p) < qkgeom::detail::rank_quantile(std::min(0.5, 2 * p)) + 1e-12);
    }
}

}  // namespace qkgeom_tests_rank_stability_test
