// Runtime tests of the dispatched moment kernels (simd/moment_kernels.hpp):
// at every instruction-set level this CPU has, the moments of random rows
// (f64, f32, a large common offset) equal a brute-force long-double two-pass
// reference, the levels equal each other, the rank-k update touches only the
// lower triangle, and merging is symmetric. Tolerances: docs/moments.md,
// "The kernels".
#include <qkgeom/simd/moment_kernels.hpp>
#include <qkgeom/stats/moments.hpp>

#include "test_util.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_moments_kernel_test {

using qkgeom::index_t;
namespace simd = qkgeom::simd;

namespace {

using LMat = Eigen::Matrix<long double, Eigen::Dynamic, Eigen::Dynamic>;
using LVec = Eigen::Matrix<long double, Eigen::Dynamic, 1>;
using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Documented tolerances (docs/moments.md): relative to the largest entry of
/// the field. `tol_unit`: rows of unit scale; `tol_offset`: a common offset
/// 1e6 with unit spread (the block means carry rounding of 1e6·2⁻⁵³).
constexpr double tol_unit = 1e-13;
constexpr double tol_offset = 1e-9;

/// The levels this CPU, build and QKGEOM_ISA allow; each one left out is
/// reported once (test_util.hpp).
std::vector<simd::isa> const& levels_here() {
    static std::vector<simd::isa> const levels = qkgeom_test::isa_levels_to_run("moment kernels");
    return levels;
}

double rel(Eigen::MatrixXd const& got, LMat const& ref) {
    Eigen::MatrixXd const r = ref.cast<double>();
    double const den = std::max(r.cwiseAbs().maxCoeff(), 1e-300);
    return (got - r).cwiseAbs().maxCoeff() / den;
}

/// The worst relative error of mean_x, c_xt, c_xx and m2_t against a
/// long-double two-pass reference over the same (widened) values.
double error_vs_reference(qkgeom::moments const& m, RowMat const& x, std::vector<std::int64_t> const& t) {
    index_t const n = x.rows(), d = x.cols();
    LMat const X = x.cast<long double>();
    LVec const mean = X.colwise().sum().transpose() / static_cast<long double>(n);
    long double mt = 0;
    for (auto v : t) mt += static_cast<long double>(v);
    mt /= static_cast<long double>(n);
    LVec cxt = LVec::Zero(d);
    LMat cxx = LMat::Zero(d, d);
    long double m2 = 0;
    for (index_t i = 0; i < n; ++i) {
        LVec const dx = X.row(i).transpose() - mean;
        long double const dt = static_cast<long double>(t[static_cast<std::size_t>(i)]) - mt;
        m2 += dt * dt;
        cxt += dx * dt;
        cxx += dx * dx.transpose();
    }
    double e = rel(m.c_xx, cxx);
    e = std::max(e, rel(m.c_xt, cxt));
    e = std::max(e, rel(m.mean_x, mean));
    if (n > 1) e = std::max(e, static_cast<double>(std::abs(static_cast<long double>(m.m2_t) - m2) / m2));
    return e;
}

double moments_diff(qkgeom::moments const& a, qkgeom::moments const& b) {
    auto r = [](auto const& g, auto const& h) {
        double const den = std::max(h.cwiseAbs().maxCoeff(), 1e-300);
        return (g - h).cwiseAbs().maxCoeff() / den;
    };
    if (a.n != b.n) return INFINITY;
    return std::max({r(a.c_xx, b.c_xx), r(a.c_xt, b.c_xt), r(a.mean_x, b.mean_x),
                     std::abs(a.m2_t - b.m2_t) / std::max(b.m2_t, 1e-300)});
}

struct rows {
    RowMat x;                       // the values as the moments see them (widened)
    RowMatF xf;                     // f32 rows (kind f32 only)
    std::vector<std::int64_t> t;
};

enum class kind_of_rows { f64, f32, offset };

rows make_rows(std::uint64_t seed, index_t n, index_t d, kind_of_rows k) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::uniform_int_distribution<std::int64_t> pos(0, 4095);
    rows r;
    r.x.resize(n, d);
    r.t.resize(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
        r.t[static_cast<std::size_t>(i)] = pos(gen);
        for (index_t j = 0; j < d; ++j) r.x(i, j) = (k == kind_of_rows::offset ? 1e6 : 0.3 * j) + nd(gen);
    }
    if (k == kind_of_rows::f32) {
        r.xf = r.x.cast<float>();
        r.x = r.xf.cast<double>();
    }
    return r;
}

qkgeom::moments moments_of(rows const& r, kind_of_rows k) {
    qkgeom::moments m(r.x.cols());
    if (k == kind_of_rows::f32) qkgeom::add_rows(m, r.xf, r.t);
    else qkgeom::add_rows(m, r.x, r.t);
    return m;
}

}  // namespace

TEST_CASE("moment kernels: every level equals a long-double reference and the generic level", "[moments][simd]") {
    std::vector<index_t> const dims = {1, 3, 17, 63, 64, 65, 127, 128, 130, 256};
    std::vector<index_t> const counts = {1, 2, 13, 256, 611};  // 611 = 2·256 + 99: three blocks
    double worst_unit = 0, worst_offset = 0, worst_levels = 0;
    std::uint64_t seed = 7;
    for (index_t d : dims) {
        for (index_t n : counts) {
            if (d >= 127 && n == 13) continue;  // keep the long-double reference cheap
            for (auto k : {kind_of_rows::f64, kind_of_rows::f32, kind_of_rows::offset}) {
                rows const r = make_rows(++seed, n, d, k);
                double const tol = k == kind_of_rows::offset ? tol_offset : tol_unit;
                qkgeom::moments generic;
                for (simd::isa level : levels_here()) {
                    simd::scoped_limit const cap(level);
                    REQUIRE(simd::active() == level);
                    qkgeom::moments const m = moments_of(r, k);
                    INFO("level " << simd::isa_name(level) << ", d = " << d << ", n = " << n << ", kind "
                                  << static_cast<int>(k));
                    CHECK(m.n == n);
                    CHECK((m.c_xx - m.c_xx.transpose()).cwiseAbs().maxCoeff() == 0.0);  // symmetrised exactly
                    double const e = error_vs_reference(m, r.x, r.t);
                    CHECK(e <= tol);
                    (k == kind_of_rows::offset ? worst_offset : worst_unit) =
                        std::max(k == kind_of_rows::offset ? worst_offset : worst_unit, e);
                    if (level == simd::isa::generic) {
                        generic = m;
                    } else {
                        double const dl = moments_diff(m, generic);
                        CHECK(dl <= tol);
                        if (k != kind_of_rows::offset) worst_levels = std::max(worst_levels, dl);
                    }
                }
            }
        }
    }
    WARN("worst relative error: unit rows " << worst_unit << ", offset 1e6 " << worst_offset
                                            << "; levels vs generic (unit rows) " << worst_levels);
}

TEST_CASE("moment kernels: the rank-k update adds to the lower triangle only", "[moments][simd]") {
    for (simd::isa level : levels_here()) {
        if (level == simd::isa::generic) continue;
        for (index_t d : {1, 3, 8, 17, 64, 65, 130}) {
            for (index_t nb : {1, 5, 256}) {
                INFO("level " << simd::isa_name(level) << ", d = " << d << ", nb = " << nb);
                index_t const ldc = d + 3;
                rows const r = make_rows(static_cast<std::uint64_t>(d * 1000 + nb), nb, d, kind_of_rows::f64);
                std::vector<double> tau(static_cast<std::size_t>(nb), 0.5);
                std::vector<double> work(static_cast<std::size_t>(qkgeom::detail::mom::work_size(level, d, nb)));
                double* pk = qkgeom::detail::mom::align64(work.data());
                index_t const w = qkgeom::detail::mom::panel_width(level), dp = (d + w - 1) / w * w;
                double* mb = pk + dp * nb;
                qkgeom::detail::mom::centre_pack(level, r.x.data(), d, nullptr, tau.data(), nb, d, pk, mb, mb + dp,
                                                 mb + 2 * dp);
                // C starts as a sentinel pattern: the strict upper triangle and
                // the rows past d must come back untouched.
                Eigen::MatrixXd c(ldc, d);
                for (index_t j = 0; j < d; ++j)
                    for (index_t i = 0; i < ldc; ++i) c(i, j) = 1000.0 + static_cast<double>(i * d + j);
                Eigen::MatrixXd const before = c;
                qkgeom::detail::mom::syrk_packed(level, pk, nb, d, c.data(), ldc);
                // Brute force: rows R about the first-pass mean x̃ = mean − ε (what
                // the panels hold; the caller subtracts nb ε εᵀ) in long double.
                LMat const R = (r.x.cast<long double>().rowwise() -
                                (Eigen::Map<Eigen::VectorXd const>(mb, d).cast<long double>() -
                                 Eigen::Map<Eigen::VectorXd const>(mb + 2 * dp, d).cast<long double>())
                                    .transpose());
                LMat const rr = R.transpose() * R;
                double worst = 0;
                bool untouched = true;
                for (index_t j = 0; j < d; ++j)
                    for (index_t i = 0; i < ldc; ++i) {
                        if (i >= j && i < d) {
                            long double const want = static_cast<long double>(before(i, j)) + rr(i, j);
                            worst = std::max(worst, static_cast<double>(std::abs(c(i, j) - want) / std::abs(want)));
                        } else if (c(i, j) != before(i, j)) {
                            untouched = false;
                        }
                    }
                CHECK(untouched);
                CHECK(worst <= 1e-12);
            }
        }
    }
}

TEST_CASE("moment kernels: merging is symmetric and equals one pass at every level", "[moments][simd]") {
    for (simd::isa level : levels_here()) {
        simd::scoped_limit const cap(level);
        for (index_t d : {5, 64, 130}) {
            rows const r = make_rows(static_cast<std::uint64_t>(d), 900, d, kind_of_rows::f64);
            index_t const cut = 333;  // not a multiple of the block or of a tile
            qkgeom::moments a(d), b(d), all(d);
            qkgeom::add_rows(a, r.x.topRows(cut), std::span(r.t).first(static_cast<std::size_t>(cut)));
            qkgeom::add_rows(b, r.x.bottomRows(900 - cut), std::span(r.t).last(static_cast<std::size_t>(900 - cut)));
            qkgeom::add_rows(all, r.x, r.t);
            qkgeom::moments const ab = a + b, ba = b + a;
            INFO("level " << simd::isa_name(level) << ", d = " << d);
            CHECK(moments_diff(ab, ba) <= 1e-14);
            CHECK(moments_diff(ab, all) <= tol_unit);
            CHECK(ab.t_min == all.t_min);
            CHECK(ab.t_max == all.t_max);
        }
    }
}

TEST_CASE("fma_peak_probe: counts its flops at every level", "[simd]") {
    for (simd::isa level : levels_here()) {
        simd::scoped_limit const cap(level);
        auto const r = simd::fma_peak_probe(1000);
        double const generic_lanes = QKGEOM_SIMD_X86 ? 12 * 2 : 16;
        double const lanes = level == simd::isa::avx512 ? 24 * 8 : level == simd::isa::avx2 ? 12 * 4 : generic_lanes;
        CHECK(r.flops == 1000 * lanes * 2);
        // x ← 0.999999·x + 1e-6 from x₀ ∈ [0, 0.023]: the chains stay in (0, 1).
        CHECK(r.checksum > 0);
        CHECK(r.checksum < lanes);
        CHECK(simd::fma_peak_probe(0).flops == 0);
    }
}

TEST_CASE("moment kernels: buckets in any order give each bucket the moments of its own rows",
          "[moments][simd]") {
    // bucketed_moments::add groups the rows by bucket (already in order, by
    // counting for a small range, by a stable sort for a wide one) and reads
    // f32 rows in place through the row index. Each bucket must hold, bit for
    // bit, what add_rows gives for that bucket's rows alone in input order, at
    // every level, and match the long-double reference.
    index_t const n = 700, d = 65;
    rows const r = make_rows(77, n, d, kind_of_rows::f32);
    std::mt19937_64 gen(5);
    for (int regime = 0; regime < 3; ++regime) {
        std::vector<std::int64_t> b(static_cast<std::size_t>(n));
        for (index_t i = 0; i < n; ++i) {
            std::int64_t const g = std::uniform_int_distribution<std::int64_t>(0, 4)(gen);
            b[static_cast<std::size_t>(i)] = regime == 0 ? i * 5 / n : regime == 1 ? 3 + g : g * 1'000'000'007LL;
        }
        for (simd::isa level : levels_here()) {
            INFO("level " << simd::isa_name(level) << ", regime " << regime);
            simd::scoped_limit const cap(level);
            qkgeom::bucketed_moments bm(d);
            bm.add(r.xf, r.t, b);
            std::size_t seen = 0;
            for (auto const& [bucket, m] : bm.buckets) {
                std::vector<index_t> mine;
                for (index_t i = 0; i < n; ++i)
                    if (b[static_cast<std::size_t>(i)] == bucket) mine.push_back(i);
                RowMatF xs(static_cast<index_t>(mine.size()), d);
                RowMat xd(static_cast<index_t>(mine.size()), d);
                std::vector<std::int64_t> ts;
                for (std::size_t k = 0; k < mine.size(); ++k) {
                    xs.row(static_cast<index_t>(k)) = r.xf.row(mine[k]);
                    xd.row(static_cast<index_t>(k)) = r.x.row(mine[k]);
                    ts.push_back(r.t[static_cast<std::size_t>(mine[k])]);
                }
                qkgeom::moments alone(d);
                qkgeom::add_rows(alone, xs, ts);
                CHECK(m.n == alone.n);
                CHECK(moments_diff(m, alone) == 0.0);
                CHECK(error_vs_reference(m, xd, ts) <= tol_unit);
                seen += mine.size();
            }
            CHECK(seen == static_cast<std::size_t>(n));
        }
    }
}

TEST_CASE("moment kernels: add_block_rows reads rows in place as add_block reads their copy", "[moments][simd]") {
    // Rows gathered through an index (reversed, every other one, stride ld > d),
    // as f32 and as f64, at every level: the same bits as add_block on a
    // contiguous double copy of the same rows (the same values in the same
    // order through the same level).
    index_t const n = 300, d = 19, ld = 23;
    rows const r = make_rows(91, n, ld, kind_of_rows::f32);
    std::vector<index_t> idx;
    for (index_t i = n - 1; i >= 0; i -= 2) idx.push_back(i);
    auto const nb = static_cast<index_t>(idx.size());
    RowMat copy(nb, d);
    std::vector<double> t(static_cast<std::size_t>(nb));
    for (index_t k = 0; k < nb; ++k) {
        copy.row(k) = r.x.row(idx[static_cast<std::size_t>(k)]).head(d);
        t[static_cast<std::size_t>(k)] = static_cast<double>(r.t[static_cast<std::size_t>(idx[static_cast<std::size_t>(k)])]);
    }
    for (simd::isa level : levels_here()) {
        INFO("level " << simd::isa_name(level));
        simd::scoped_limit const cap(level);
        Eigen::MatrixXd scratch;
        qkgeom::moments want(d), from_f32(d), from_f64(d);
        want.add_block(copy.data(), t.data(), nb, scratch);
        from_f32.add_block_rows(r.xf.data(), ld, idx.data(), t.data(), nb, scratch);
        from_f64.add_block_rows(r.x.data(), ld, idx.data(), t.data(), nb, scratch);
        for (auto* m : {&want, &from_f32, &from_f64}) m->symmetrize();
        CHECK(moments_diff(from_f32, want) == 0.0);
        CHECK(moments_diff(from_f64, want) == 0.0);
        CHECK(error_vs_reference(want, copy, std::vector<std::int64_t>(t.begin(), t.end())) <= tol_unit);
    }
}

}  // namespace qkgeom_tests_moments_kernel_test
