// Runtime tests of the streaming moment accumulator (method §1) and its shard
// serialisation: merge-order invariance, accuracy against a long-double
// two-pass reference, round trips, and clear errors on bad input.
#include <qkgeom/io/moments_io.hpp>
#include <qkgeom/plasticity.hpp>

#ifdef QKGEOM_TEST_XTENSOR
#include <qkgeom/adapters/xtensor.hpp>
#include <xtensor/xtensor.hpp>
#endif

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_moments_test {

using qkgeom::index_t;
using qkgeom_test::make_batch;
using qkgeom_test::rel_diff;

namespace {

using LMat = Eigen::Matrix<long double, Eigen::Dynamic, Eigen::Dynamic>;
using LVec = Eigen::Matrix<long double, Eigen::Dynamic, 1>;

/// Two-pass reference in long double: means, then centred sums.
struct reference {
    long double mean_t = 0, m2_t = 0;
    LVec mean_x, c_xt;
    LMat c_xx;
};

reference two_pass(Eigen::MatrixXd const& x, std::vector<std::int64_t> const& t) {
    index_t const n = x.rows(), d = x.cols();
    reference r;
    LMat const X = x.cast<long double>();
    r.mean_x = X.colwise().sum().transpose() / static_cast<long double>(n);
    for (auto v : t) r.mean_t += static_cast<long double>(v);
    r.mean_t /= static_cast<long double>(n);
    r.c_xt = LVec::Zero(d);
    r.c_xx = LMat::Zero(d, d);
    for (index_t i = 0; i < n; ++i) {
        LVec const dx = X.row(i).transpose() - r.mean_x;
        long double const dt = static_cast<long double>(t[static_cast<std::size_t>(i)]) - r.mean_t;
        r.m2_t += dt * dt;
        r.c_xt += dx * dt;
        r.c_xx += dx * dx.transpose();
    }
    return r;
}

double rel_ld(LMat const& ref, Eigen::MatrixXd const& got) {
    Eigen::MatrixXd const R = ref.cast<double>();
    return rel_diff(got, R);
}

/// Same statistics, compared field by field, relative to each field's scale.
double moments_diff(qkgeom::moments const& a, qkgeom::moments const& b) {
    if (a.n != b.n) return INFINITY;
    double e = 0;
    e = std::max(e, rel_diff(a.mean_t, b.mean_t));
    e = std::max(e, rel_diff(a.m2_t, b.m2_t));
    if (a.t_min != b.t_min || a.t_max != b.t_max) return INFINITY;  // exact, any merge order
    e = std::max(e, rel_diff(a.mean_x, b.mean_x));
    e = std::max(e, rel_diff(a.c_xt, b.c_xt));
    e = std::max(e, rel_diff(a.c_xx, b.c_xx));
    return e;
}

double head_diff(qkgeom::head_moments const& a, qkgeom::head_moments const& b) {
    double e = 0;
    for (qkgeom::kind w : {qkgeom::kind::query, qkgeom::kind::key}) {
        if (a[w].buckets.size() != b[w].buckets.size()) return INFINITY;
        for (auto const& [bucket, m] : a[w].buckets) {
            auto it = b[w].buckets.find(bucket);
            if (it == b[w].buckets.end()) return INFINITY;
            e = std::max(e, moments_diff(m, it->second));
        }
    }
    return e;
}

/// Rows [lo, hi) of a batch as a new head_moments shard.
qkgeom::head_moments shard(qkgeom_test::batch const& b, qkgeom::kind w, index_t lo, index_t hi,
                           qkgeom::head_moments hm) {
    auto const span_t = std::span<std::int64_t const>(b.t).subspan(static_cast<std::size_t>(lo),
                                                                    static_cast<std::size_t>(hi - lo));
    auto const span_b = std::span<std::int64_t const>(b.bucket).subspan(static_cast<std::size_t>(lo),
                                                                         static_cast<std::size_t>(hi - lo));
    hm.add(w, b.x.middleRows(lo, hi - lo), span_t, span_b);
    return hm;
}

}  // namespace

TEST_CASE("single-group moments match a long-double two-pass reference", "[moments]") {
    // n spans several blocks and is not a multiple of the block size.
    auto const b = make_batch(1, 3 * qkgeom::moments::block_rows + 17, 12);
    qkgeom::moments m(12);
    qkgeom::add_rows(m, b.x, b.t);
    auto const ref = two_pass(b.x, b.t);
    CHECK(m.n == b.x.rows());
    CHECK(m.t_min == static_cast<double>(*std::min_element(b.t.begin(), b.t.end())));
    CHECK(m.t_max == static_cast<double>(*std::max_element(b.t.begin(), b.t.end())));
    CHECK(rel_diff(m.mean_t, static_cast<double>(ref.mean_t)) < 1e-14);
    CHECK(rel_diff(m.m2_t, static_cast<double>(ref.m2_t)) < 1e-13);
    CHECK(rel_ld(ref.mean_x, m.mean_x) < 1e-13);
    CHECK(rel_ld(ref.c_xt, m.c_xt) < 1e-12);
    CHECK(rel_ld(ref.c_xx, m.c_xx) < 1e-13);
    CHECK(m.c_xx == m.c_xx.transpose());  // both triangles stored
    // raw sums reconstruct
    CHECK(rel_diff(m.sum_t(), static_cast<double>(std::accumulate(b.t.begin(), b.t.end(), std::int64_t{0}))) <
          1e-14);
    Eigen::MatrixXd const sxx = b.x.transpose() * b.x;
    CHECK(rel_diff(m.sum_xx(), sxx) < 1e-12);
}

TEST_CASE("ill-conditioned data (offset 1e4, spread 1e-2) keeps full accuracy", "[moments]") {
    auto const b = make_batch(2, 2000, 8, 1e4, 1e-2);
    qkgeom::moments m(8);
    qkgeom::add_rows(m, b.x, b.t);
    auto const ref = two_pass(b.x, b.t);
    // The naive one-pass formula Σxxᵀ - n x̄x̄ᵀ loses ~12 digits here; the
    // centred blocked update must not.
    CHECK(rel_ld(ref.c_xx, m.c_xx) < 1e-9);
    CHECK(rel_ld(ref.c_xt, m.c_xt) < 1e-9);
    CHECK(rel_ld(ref.mean_x, m.mean_x) < 1e-15);
    // ... and so must merging shards of it.
    qkgeom::moments a(8), c(8);
    qkgeom::add_rows(a, b.x.topRows(700), std::span(b.t).first(700));
    qkgeom::add_rows(c, b.x.bottomRows(1300), std::span(b.t).last(1300));
    a += c;
    CHECK(rel_ld(ref.c_xx, a.c_xx) < 1e-9);
    // Sanity check that the test data is really ill-conditioned.
    Eigen::MatrixXd const naive =
        b.x.transpose() * b.x - static_cast<double>(b.x.rows()) * m.mean_x * m.mean_x.transpose();
    CHECK(rel_ld(ref.c_xx, naive) > 1e-6);
}

TEST_CASE("merging any partition in any order equals the single pass", "[moments][merge]") {
    auto const qb = make_batch(3, 1500, 16);
    auto const kb = make_batch(4, 1300, 16);
    qkgeom::head_id const id{3, 5, 1};
    qkgeom::head_moments single(16, id);
    single.add(qkgeom::kind::query, qb.x, qb.t, qb.bucket);
    single.add(qkgeom::kind::key, kb.x, kb.t, kb.bucket);

    std::mt19937_64 gen(99);
    for (int trial = 0; trial < 12; ++trial) {
        // random cut points -> shards, each kind split independently
        std::vector<qkgeom::head_moments> shards;
        for (auto [w, b] : {std::pair{qkgeom::kind::query, &qb}, std::pair{qkgeom::kind::key, &kb}}) {
            index_t const n = b->x.rows();
            std::uniform_int_distribution<index_t> cut(1, n - 1);
            std::vector<index_t> cuts{0, n};
            int const pieces = 1 + trial % 7;
            for (int p = 0; p < pieces; ++p) cuts.push_back(cut(gen));
            std::sort(cuts.begin(), cuts.end());
            cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
            for (std::size_t c = 0; c + 1 < cuts.size(); ++c)
                shards.push_back(shard(*b, w, cuts[c], cuts[c + 1], qkgeom::head_moments(16, id)));
        }
        std::shuffle(shards.begin(), shards.end(), gen);
        qkgeom::head_moments merged;  // default-constructed adopts the first shard
        if (trial % 2 == 0) {
            for (auto const& s : shards) merged += s;
        } else {  // pairwise tree reduction, other argument order
            while (shards.size() > 1) {
                std::vector<qkgeom::head_moments> next;
                for (std::size_t i = 0; i + 1 < shards.size(); i += 2) {
                    auto t = shards[i + 1];
                    t += shards[i];
                    next.push_back(std::move(t));
                }
                if (shards.size() % 2) next.push_back(shards.back());
                shards = std::move(next);
            }
            merged = shards.front();
        }
        CHECK(head_diff(merged, single) < 1e-12);
        CHECK(rel_diff(merged.pooled().c_xx, single.pooled().c_xx) < 1e-12);
    }
}

TEST_CASE("buckets partition the rows and pooled equals all rows in one group", "[moments]") {
    auto const b = make_batch(5, 900, 6, 0.0, 1.0, 100);
    qkgeom::bucketed_moments bm(6);
    bm.add(b.x, b.t, b.bucket);
    CHECK(bm.count() == 900);
    for (auto const& [bucket, m] : bm.buckets) {
        // rebuild the bucket's rows by hand
        std::vector<index_t> rows;
        std::vector<std::int64_t> ts;
        for (index_t i = 0; i < b.x.rows(); ++i)
            if (b.bucket[static_cast<std::size_t>(i)] == bucket) {
                rows.push_back(i);
                ts.push_back(b.t[static_cast<std::size_t>(i)]);
            }
        Eigen::MatrixXd const xb = b.x(rows, Eigen::all);
        auto const ref = two_pass(xb, ts);
        CHECK(m.n == static_cast<std::int64_t>(rows.size()));
        CHECK(rel_ld(ref.c_xx, m.c_xx) < 1e-12);
    }
    qkgeom::moments all(6);
    qkgeom::add_rows(all, b.x, b.t);
    CHECK(moments_diff(bm.pooled(), all) < 1e-12);
}

TEST_CASE("every input type gives bit-identical moments", "[moments][adapters]") {
    auto const b = make_batch(6, 300, 5);
    Eigen::MatrixXf const xf = b.x.cast<float>();
    auto reference_hm = [&] {
        qkgeom::head_moments hm(5);
        hm.add(qkgeom::kind::key, xf, b.t, b.bucket);
        return hm;
    }();
    auto same = [&](auto const& rows, auto const& pos, auto const& bkt) {
        qkgeom::head_moments hm(5);
        hm.add(qkgeom::kind::key, rows, pos, bkt);
        return head_diff(hm, reference_hm) == 0.0;
    };
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> const xr = xf;
    CHECK(same(xr, b.t, b.bucket));
    std::vector<std::array<float, 5>> arr(300);
    for (index_t i = 0; i < 300; ++i)
        for (index_t j = 0; j < 5; ++j) arr[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = xf(i, j);
    CHECK(same(arr, b.t, b.bucket));
    CHECK(same(qkgeom::make_matrix_view(std::span<float const>(xr.data(), 1500), 300, 5), b.t, b.bucket));
    Eigen::VectorXi const ti = Eigen::Map<Eigen::Matrix<std::int64_t, -1, 1> const>(b.t.data(), 300).cast<int>();
    std::vector<short> bs(b.bucket.begin(), b.bucket.end());
    CHECK(same(xf, ti, bs));
#ifdef QKGEOM_TEST_XTENSOR
    xt::xtensor<float, 2> xt_rows = xt::zeros<float>({300, 5});
    for (std::size_t i = 0; i < 300; ++i)
        for (std::size_t j = 0; j < 5; ++j) xt_rows(i, j) = xf(static_cast<int>(i), static_cast<int>(j));
    CHECK(same(xt_rows, b.t, b.bucket));
#endif
    // bf16 input equals f64 input of the exactly widened values
    std::vector<qkgeom::bfloat16> h(1500);
    Eigen::MatrixXd widened(300, 5);
    for (index_t i = 0; i < 300; ++i)
        for (index_t j = 0; j < 5; ++j) {
            h[static_cast<std::size_t>(i * 5 + j)] = qkgeom::bfloat16::from_float(xf(i, j));
            widened(i, j) = h[static_cast<std::size_t>(i * 5 + j)].to_float();
        }
    qkgeom::head_moments h16(5), h64(5);
    h16.add(qkgeom::kind::query, qkgeom::make_matrix_view(std::span<qkgeom::bfloat16 const>(h), 300, 5), b.t,
            b.bucket);
    h64.add(qkgeom::kind::query, widened, b.t, b.bucket);
    CHECK(head_diff(h16, h64) == 0.0);
}

TEST_CASE("shard serialisation round-trips bit for bit", "[moments][io]") {
    auto const b = make_batch(7, 700, 9);
    qkgeom::head_moments hm(9, {12, 7, 1});
    hm.add(qkgeom::kind::query, b.x, b.t, b.bucket);
    hm.add(qkgeom::kind::key, b.x.topRows(100), std::span(b.t).first(100), std::span(b.bucket).first(100));
    std::stringstream ss;
    qkgeom::write_moments(ss, hm);
    std::string const bytes = ss.str();
    std::istringstream in(bytes);
    auto const back = qkgeom::read_moments(in);
    CHECK(back.id == hm.id);
    CHECK(back.d == 9);
    CHECK(head_diff(back, hm) == 0.0);
    // size: header + per bucket (4 + 2d + d(d+1)/2) doubles/ints + checksum
    std::size_t nb = hm.q.buckets.size() + hm.k.buckets.size();
    CHECK(bytes.size() == 8 + 4 + 4 + 3 * 8 + 8 + 2 * 8 + nb * 8 * (6 + 2 * 9 + 45) + 8);
    // and through a file
    auto const path = std::filesystem::temp_directory_path() / "qkgeom_moments_test.qkm";
    qkgeom::save_moments(path, hm);
    CHECK(head_diff(qkgeom::load_moments(path), hm) == 0.0);
    std::filesystem::remove(path);
}

TEST_CASE("corrupt or truncated shards are rejected naming the field", "[moments][io]") {
    auto const b = make_batch(8, 64, 3);
    qkgeom::head_moments hm(3, {0, 0, 0});
    hm.add(qkgeom::kind::query, b.x, b.t, b.bucket);
    std::stringstream ss;
    qkgeom::write_moments(ss, hm);
    std::string const bytes = ss.str();
    // Every truncation fails with input_error, never a partial result.
    for (std::size_t len = 0; len < bytes.size(); ++len) {
        std::istringstream in(bytes.substr(0, len));
        REQUIRE_THROWS_AS(qkgeom::read_moments(in, "shard.qkm"), qkgeom::input_error);
    }
    {
        std::istringstream in(bytes.substr(0, 40));
        CHECK_THROWS_WITH(qkgeom::read_moments(in, "shard.qkm"),
                          Catch::Contains("shard.qkm") && Catch::Contains("d") && Catch::Contains("truncated"));
    }
    // Every single-byte corruption is detected (validation or checksum).
    for (std::size_t pos = 0; pos < bytes.size(); ++pos) {
        std::string bad = bytes;
        bad[pos] = static_cast<char>(bad[pos] ^ 0x10);
        std::istringstream in(bad);
        REQUIRE_THROWS_AS(qkgeom::read_moments(in, "shard.qkm"), qkgeom::input_error);
    }
    std::string bad = bytes;
    bad[0] = 'X';
    std::istringstream in(bad);
    try {
        (void)qkgeom::read_moments(in, "shard.qkm");
        FAIL("bad magic accepted");
    } catch (qkgeom::input_error const& e) {
        CHECK(e.source() == "shard.qkm");
        CHECK(e.field() == "magic");
        CHECK(std::string(e.what()).find("not a qkgeom moments shard") != std::string::npos);
    }
}

TEST_CASE("bad input gets a clear error and leaves the accumulator unchanged", "[moments][errors]") {
    auto b = make_batch(9, 50, 4);
    qkgeom::head_moments hm(4, {1, 2, 0});
    hm.add(qkgeom::kind::query, b.x, b.t, b.bucket);
    auto const before = hm;

    auto x_nan = b.x;
    x_nan(17, 2) = std::numeric_limits<double>::quiet_NaN();
    CHECK_THROWS_WITH(hm.add(qkgeom::kind::query, x_nan, b.t, b.bucket),
                      Catch::Contains("non-finite") && Catch::Contains("row 17") && Catch::Contains("column 2") &&
                          Catch::Contains("nan"));
    auto x_inf = b.x;
    x_inf(3, 0) = -std::numeric_limits<double>::infinity();
    CHECK_THROWS_WITH(hm.add(qkgeom::kind::key, x_inf, b.t, b.bucket),
                      Catch::Contains("row 3") && Catch::Contains("inf"));
    CHECK_THROWS_WITH(hm.add(qkgeom::kind::query, b.x, std::span(b.t).first(49), b.bucket),
                      Catch::Contains("positions") && Catch::Contains("49"));
    CHECK_THROWS_WITH(hm.add(qkgeom::kind::query, b.x, b.t, std::span(b.bucket).first(10)),
                      Catch::Contains("buckets") && Catch::Contains("10"));
    CHECK_THROWS_WITH(hm.add(qkgeom::kind::query, b.x.topRows(0), std::span(b.t).first(0),
                             std::span(b.bucket).first(0)),
                      Catch::Contains("at least one row"));
    CHECK_THROWS_WITH(hm.add(qkgeom::kind::query, b.x.leftCols(3), b.t, b.bucket),
                      Catch::Contains("expected 4 columns") && Catch::Contains("3"));
    auto t_neg = b.t;
    t_neg[5] = -2;
    CHECK_THROWS_WITH(hm.add(qkgeom::kind::query, b.x, t_neg, b.bucket),
                      Catch::Contains("negative position at row 5") && Catch::Contains("-2"));
    auto b_neg = b.bucket;
    b_neg[6] = -1;
    CHECK_THROWS_WITH(hm.add(qkgeom::kind::query, b.x, b.t, b_neg), Catch::Contains("negative bucket at row 6"));
    CHECK(head_diff(hm, before) == 0.0);  // strong guarantee

    // merging shards of different heads or dimensions names the field
    qkgeom::head_moments other(4, {1, 3, 0});
    CHECK_THROWS_WITH(hm += other, Catch::Contains("q_head"));
    qkgeom::head_moments wider(5, {1, 2, 0});
    CHECK_THROWS_WITH(hm += wider, Catch::Contains("d mismatch"));
    CHECK_THROWS_AS(qkgeom::head_moments(0), std::invalid_argument);
}

TEST_CASE("degenerate groups: n < 2 gives NaN sample statistics", "[moments]") {
    qkgeom::moments m(3);
    CHECK(std::isnan(m.var_t()));
    Eigen::MatrixXd one = Eigen::MatrixXd::Ones(1, 3);
    qkgeom::add_rows(m, one, std::vector<int>{4});
    CHECK(m.n == 1);
    CHECK(std::isnan(m.var_t()));
    CHECK(m.cov_x().array().isNaN().all());
    CHECK(m.mean_x == Eigen::VectorXd::Ones(3));
    CHECK(m.c_xx.isZero(0));
}

}  // namespace qkgeom_tests_moments_test
