// The batched, vectorised PP of the dense Gram path (stats/gaussian.hpp:
// `detail::vpp::pairwise_plasticity`, Cody's erfc with its own exp(−x²)) against the scalar `pairwise_plasticity`
// (std::erfc): relative error ≤ 1e-13 for |z| ≤ 37 on a dense sweep (linear
// and log-spaced over [0, 40], random doubles, every interval boundary ± a few
// ulps), the limits (PP(0) = 1, PP(±∞) = 0, NaN → NaN, exact 0 once the
// result underflows), graceful underflow beyond 37, and results that depend
// on a lane's input only (not on its batch, position or neighbours).
//
// Every instruction-set level of the kernel that this CPU runs (simd/dispatch.hpp:
// generic, AVX2, AVX-512; `detail::vpp::batch_at`) is checked, and the levels
// must agree bit for bit over the whole sweep (no fused multiply–add at any
// level, stats/gaussian.hpp); levels the CPU lacks are reported with WARN.
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/stats/gaussian.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "test_util.hpp"

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_gaussian_vector_test {

namespace {

using qkgeom::simd::isa;

/// The kernel under test, at the level `simd::active()` (the public entry of
/// the dense path).
void vpp(std::span<double const> z, std::span<double> out) { qkgeom::detail::vpp::pairwise_plasticity(z, out); }

/// The kernel under test at one level.
void vpp(isa level, std::span<double const> z, std::span<double> out) {
    if (z.size() != out.size()) FAIL("output length differs from input length");
    qkgeom::detail::vpp::batch_at(level, z.data(), out.data(), z.size());
}

bool same_bits(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

constexpr double k_inf = std::numeric_limits<double>::infinity();
constexpr double k_nan = std::numeric_limits<double>::quiet_NaN();

/// Worst error of the batched PP (one level) against the scalar one: relative
/// for |z| ≤ 37 (where Φ(−|z|) is a normal double), absolute beyond; and the
/// lanes whose bits differ from the generic level's.
struct sweep_error {
    double rel = 0, rel_at = 0, abs_tail = 0, abs_tail_at = 0;
    std::size_t bad_special = 0;  // NaN/limit mismatches
    std::size_t not_identical = 0;
    double not_identical_at = 0;
};

/// The sweep points `z` at every level of `levels` (generic first; errs[k]
/// for levels[k]); the scalar reference is computed once.
void accumulate(std::vector<double> const& z, std::vector<isa> const& levels, std::vector<sweep_error>& errs) {
    std::vector<double> ref(z.size()), generic(z.size()), out(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) ref[i] = qkgeom::pairwise_plasticity(z[i]);
    for (std::size_t k = 0; k < levels.size(); ++k) {
        vpp(levels[k], z, out);
        if (k == 0) generic = out;
        sweep_error& err = errs[k];
        for (std::size_t i = 0; i < z.size(); ++i) {
            if (!same_bits(out[i], generic[i]) && err.not_identical++ == 0) err.not_identical_at = z[i];
            double const got = out[i];
            if (std::isnan(ref[i]) || std::isnan(got)) {
                err.bad_special += std::isnan(ref[i]) != std::isnan(got) ? 1 : 0;
                continue;
            }
            if (std::abs(z[i]) <= 37.0) {
                double const e = std::abs(got - ref[i]) / ref[i];
                if (!(e <= err.rel)) {
                    err.rel = e;
                    err.rel_at = z[i];
                }
            } else {
                double const e = std::abs(got - ref[i]);
                if (!(e <= err.abs_tail)) {
                    err.abs_tail = e;
                    err.abs_tail_at = z[i];
                }
            }
        }
    }
}

/// z whose x = |z|/√2 (as the library rounds it) lies k ulps around x0.
std::vector<double> around_boundary(double x0, int ulps) {
    std::vector<double> zs;
    double const z0 = x0 * std::sqrt(2.0);
    double lo = z0, hi = z0;
    for (int i = 0; i < 4 * ulps; ++i) {
        lo = std::nextafter(lo, 0.0);
        hi = std::nextafter(hi, k_inf);
    }
    for (double z = lo; z <= hi; z = std::nextafter(z, k_inf)) {
        zs.push_back(z);
        zs.push_back(-z);
    }
    return zs;
}

}  // namespace

TEST_CASE("batched PP matches the scalar PP to 1e-13 over a dense sweep at every ISA level", "[gaussian][vector]") {
    std::vector<isa> const levels = qkgeom_test::isa_levels_to_run("batched PP");
    std::vector<sweep_error> errs(levels.size());
    std::vector<double> z;
    // 12M points linearly spaced over [0, 40] (both signs alternately), in batches
    constexpr std::size_t n_lin = 12'000'000, batch = 1'000'000;
    for (std::size_t b0 = 0; b0 < n_lin; b0 += batch) {
        z.clear();
        for (std::size_t i = b0; i < b0 + batch; ++i) {
            double const v = 40.0 * static_cast<double>(i) / static_cast<double>(n_lin - 1);
            z.push_back(i % 2 == 0 ? v : -v);
        }
        accumulate(z, levels, errs);
    }
    // 6M points log-spaced over [1e-300, 40]
    constexpr std::size_t n_log = 6'000'000;
    double const l0 = std::log(1e-300), l1 = std::log(40.0);
    for (std::size_t b0 = 0; b0 < n_log; b0 += batch) {
        z.clear();
        for (std::size_t i = b0; i < b0 + batch; ++i)
            z.push_back(std::exp(l0 + (l1 - l0) * static_cast<double>(i) / static_cast<double>(n_log - 1)));
        accumulate(z, levels, errs);
    }
    // 2M random doubles: uniform over [−40, 40], and random bit patterns (any
    // double: NaN, ±∞, huge, subnormal)
    std::mt19937_64 gen(20240607);
    std::uniform_real_distribution<double> u(-40.0, 40.0);
    z.clear();
    for (int i = 0; i < 1'000'000; ++i) z.push_back(u(gen));
    for (int i = 0; i < 1'000'000; ++i) z.push_back(std::bit_cast<double>(gen()));
    accumulate(z, levels, errs);
    // the interval boundaries in x = |z|/√2 (0.46875, 4, and 28 where the
    // argument is clamped), the points where trunc(16x) steps, ± a few ulps
    z.clear();
    for (double x0 : {0.46875, 4.0, 28.0, 0.5, 1.0, 1.0625, 2.9375, 3.9375, 4.0625, 10.0, 26.0, 26.1875}) {
        auto const zs = around_boundary(x0, 8);
        z.insert(z.end(), zs.begin(), zs.end());
    }
    accumulate(z, levels, errs);

    for (std::size_t k = 0; k < levels.size(); ++k) {
        sweep_error const& err = errs[k];
        INFO("level " << qkgeom::simd::isa_name(levels[k]) << ": worst relative error (|z| <= 37): " << err.rel
                      << " at z = " << err.rel_at << "; worst absolute error beyond: " << err.abs_tail << " at z = "
                      << err.abs_tail_at << "; lanes not bit-identical to generic: " << err.not_identical
                      << " (first at z = " << err.not_identical_at << ")");
        CHECK(err.bad_special == 0);
        CHECK(err.rel <= 1e-13);
        CHECK(err.abs_tail < 1e-300);
        CHECK(err.not_identical == 0);
    }
}

TEST_CASE("batched PP: limits, underflow and NaN at every ISA level", "[gaussian][vector]") {
    std::vector<double> const z{0.0,  -0.0,   k_inf,   -k_inf, k_nan, -k_nan, 38.6, -38.6, 39.0,
                                1e300, -1e300, 5e-324, 1e-300, 37.0,  37.9,   38.0, 50.0,  -1e3};
    // a fine grid past 36
    std::vector<double> zz;
    for (int i = 0; i <= 40000; ++i) zz.push_back(36.0 + i * 1e-4);
    for (isa const level : qkgeom_test::isa_levels_to_run("batched PP")) {
        INFO("level " << qkgeom::simd::isa_name(level));
        std::vector<double> out(z.size());
        vpp(level, z, out);
        CHECK(out[0] == 1.0);
        CHECK(out[1] == 1.0);
        CHECK(out[2] == 0.0);
        CHECK(out[3] == 0.0);
        CHECK(std::isnan(out[4]));
        CHECK(std::isnan(out[5]));
        for (std::size_t i : {6u, 7u, 8u, 9u, 10u, 16u, 17u}) CHECK(out[i] == 0.0);  // underflowed: exactly 0
        CHECK(out[11] == 1.0);
        CHECK(out[12] == 1.0);
        CHECK(out[13] > 1e-300);
        CHECK(out[14] > 0.0);  // a subnormal, not flushed early
        CHECK(out[15] > 0.0);

        // monotone non-increasing in |z| (up to a few subnormal ulps, as libm's
        // erfc) past 36; within 1e-13 relative of the scalar PP up to 37 and
        // 1e-300 absolute beyond
        std::vector<double> pp(zz.size());
        vpp(level, zz, pp);
        double worst_rise = 0, worst_rel = 0, worst_abs = 0;
        bool nonneg = true;
        for (std::size_t i = 0; i < zz.size(); ++i) {
            if (i > 0) worst_rise = std::max(worst_rise, pp[i] - pp[i - 1]);
            double const ref = qkgeom::pairwise_plasticity(zz[i]);
            if (zz[i] <= 37.0) worst_rel = std::max(worst_rel, std::abs(pp[i] - ref) / ref);
            else worst_abs = std::max(worst_abs, std::abs(pp[i] - ref));
            nonneg = nonneg && pp[i] >= 0.0;
        }
        INFO("past 36: worst relative error (to 37) " << worst_rel << ", worst absolute error beyond " << worst_abs
                                                      << ", worst rise " << worst_rise);
        CHECK(nonneg);
        CHECK(worst_rise <= 8 * std::numeric_limits<double>::denorm_min());
        CHECK(worst_rel <= 1e-13);
        CHECK(worst_abs < 1e-300);
        CHECK(pp.back() == 0.0);
    }
}

TEST_CASE("batched PP: a lane's value depends on its input only at every ISA level", "[gaussian][vector]") {
    std::mt19937_64 gen(7);
    std::normal_distribution<double> nd(0.0, 3.0);
    std::vector<double> z(1000);
    for (auto& v : z) v = nd(gen);
    z[3] = 30.0;  // a tail lane among ordinary ones
    z[500] = k_nan;
    std::vector<isa> const levels = qkgeom_test::isa_levels_to_run("batched PP");
    std::vector<double> generic(z.size());
    vpp(isa::generic, z, generic);
    for (isa const level : levels) {
        INFO("level " << qkgeom::simd::isa_name(level));
        std::vector<double> all(z.size());
        vpp(level, z, all);
        bool same_as_generic = true;
        for (std::size_t i = 0; i < z.size(); ++i) same_as_generic = same_as_generic && same_bits(all[i], generic[i]);
        CHECK(same_as_generic);
        // one at a time, and in batches of every awkward size (blocks of 8 or
        // 16 lanes, chunks of 256): bit-identical
        bool same = true;
        for (std::size_t i = 0; i < z.size(); ++i) {
            double one = 0;
            vpp(level, std::span<double const>(&z[i], 1), std::span<double>(&one, 1));
            same = same && same_bits(one, all[i]);
        }
        for (std::size_t n : {1u, 7u, 8u, 9u, 15u, 16u, 17u, 255u, 256u, 257u}) {
            std::vector<double> part(z.size());
            for (std::size_t b0 = 0; b0 < z.size(); b0 += n) {
                std::size_t const m = std::min(n, z.size() - b0);
                vpp(level, std::span<double const>(z.data() + b0, m), std::span<double>(part.data() + b0, m));
            }
            for (std::size_t i = 0; i < z.size(); ++i) same = same && same_bits(part[i], all[i]);
        }
        CHECK(same);
        // symmetric, and in place
        std::vector<double> neg(z.size()), negout(z.size());
        std::transform(z.begin(), z.end(), neg.begin(), [](double v) { return -v; });
        vpp(level, neg, negout);
        bool sym = true;
        for (std::size_t i = 0; i < z.size(); ++i)
            sym = sym && (same_bits(negout[i], all[i]) || (std::isnan(negout[i]) && std::isnan(all[i])));
        CHECK(sym);
        std::vector<double> inplace = z;
        vpp(level, inplace, inplace);
        bool same_inplace = true;
        for (std::size_t i = 0; i < z.size(); ++i) same_inplace = same_inplace && same_bits(inplace[i], all[i]);
        CHECK(same_inplace);
        // the dispatching span overload, capped at this level
        qkgeom::simd::scoped_limit const cap(level);
        CHECK(static_cast<int>(qkgeom::simd::active()) <= static_cast<int>(level));  // QKGEOM_ISA may cap lower
        std::vector<double> dispatched(z.size());
        vpp(z, dispatched);
        bool same_dispatched = true;
        for (std::size_t i = 0; i < z.size(); ++i)
            same_dispatched = same_dispatched && same_bits(dispatched[i], all[i]);
        CHECK(same_dispatched);
    }
    // empty, and mismatched lengths
    std::vector<double> none;
    vpp(none, none);
    for (isa const level : levels) vpp(level, none, none);
    std::vector<double> short_out(3);
    CHECK_THROWS_AS(vpp(z, short_out), std::invalid_argument);
}

}  // namespace qkgeom_tests_gaussian_vector_test
