// Shared helpers for the runtime tests.
#pragma once

#include <qkgeom/simd/dispatch.hpp>

#include <catch2/catch.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom_test {

/// The instruction-set levels this CPU, build and QKGEOM_ISA run (generic first), for
/// tests of the dispatched kernels; each level it lacks is reported (WARN),
/// never silently passed.
inline std::vector<qkgeom::simd::isa> isa_levels_to_run(std::string_view what) {
    using qkgeom::simd::isa;
    // Outside any scoped_limit, active() is detected() capped by QKGEOM_ISA.
    isa const reach = qkgeom::simd::active();
    std::vector<isa> run;
    for (isa level : {isa::generic, isa::avx2, isa::avx512}) {
        if (static_cast<int>(level) <= static_cast<int>(reach)) {
            run.push_back(level);
        } else if (static_cast<int>(level) <= static_cast<int>(qkgeom::simd::detected())) {
            WARN(what << ": level " << qkgeom::simd::isa_name(level) << " NOT tested: QKGEOM_ISA caps the kernels at "
                      << qkgeom::simd::isa_name(reach));
        } else {
            WARN(what << ": level " << qkgeom::simd::isa_name(level) << " NOT tested: this CPU/build supports up to "
                      << qkgeom::simd::isa_name(qkgeom::simd::detected()));
        }
    }
    return run;
}

/// max |a - b| / max(max |b|, tiny): relative difference of two arrays.
template <class A, class B>
double rel_diff(A const& a, B const& b) {
    double const num = (a - b).cwiseAbs().maxCoeff();
    double const den = std::max(b.cwiseAbs().maxCoeff(), 1e-300);
    return num / den;
}

/// The message of the std::invalid_argument that f throws, or
/// "<no std::invalid_argument thrown>" when f returns (any other exception
/// propagates and fails the test).
template <class F>
std::string invalid_argument_of(F&& f) {
    try {
        f();
    } catch (std::invalid_argument const& e) {
        return e.what();
    }
    return "<no std::invalid_argument thrown>";
}

inline double rel_diff(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

/// A seeded synthetic batch: n rows of dimension d with a linear drift in
/// position, bucket = position / width.
struct batch {
    Eigen::MatrixXd x;
    std::vector<std::int64_t> t, bucket;
};

inline batch make_batch(std::uint64_t seed, std::ptrdiff_t n, std::ptrdiff_t d, double offset = 0.0,
                        double spread = 1.0, std::int64_t width = 64) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::uniform_int_distribution<std::int64_t> pos(0, 1023);
    batch b;
    b.x.resize(n, d);
    b.t.resize(static_cast<std::size_t>(n));
    b.bucket.resize(static_cast<std::size_t>(n));
    Eigen::VectorXd slope(d);
    for (std::ptrdiff_t j = 0; j < d; ++j) slope(j) = 1e-3 * static_cast<double>(j % 3 - 1);
    for (std::ptrdiff_t i = 0; i < n; ++i) {
        std::int64_t const t = pos(gen);
        b.t[static_cast<std::size_t>(i)] = t;
        b.bucket[static_cast<std::size_t>(i)] = t / width;
        for (std::ptrdiff_t j = 0; j < d; ++j)
            b.x(i, j) = offset + spread * (nd(gen) + slope(j) * static_cast<double>(t));
    }
    return b;
}

}  // namespace qkgeom_test
