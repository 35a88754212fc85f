// Shared helpers for the runtime tests.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace qkgeom_test {

/// max |a - b| / max(max |b|, tiny): relative difference of two arrays.
template <class A, class B>
double rel_diff(A const& a, B const& b) {
    double const num = (a - b).cwiseAbs().maxCoeff();
    double const den = std::max(b.cwiseAbs().maxCoeff(), 1e-300);
    return num / den;
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
