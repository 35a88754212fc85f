// The moments of 4 query rows (d = 2) in two buckets: head_moments' pooled
// covariance against one computed directly. Shared by test_package.cpp and the
// pkg-config consumer (tests/consumer/pkgconfig_consumer.cpp), which needs only
// <qkgeom/stats/moments.hpp>.
#pragma once
#include <qkgeom/stats/moments.hpp>

#include <Eigen/Core>

#include <cstdint>
#include <vector>

struct moments_numbers {
    std::int64_t n = 0;  ///< rows the pooled moments hold (4)
    double err = 0;      ///< max |cov_x − direct covariance|
    bool ok() const { return n == 4 && err < 1e-12; }
};

/// The 4 rows.
inline Eigen::MatrixXd moments_rows() {
    Eigen::MatrixXd x(4, 2);
    x << 1, 2, 3, 5, 4, 1, 0, 7;
    return x;
}

inline moments_numbers moments_check() {
    Eigen::MatrixXd const x = moments_rows();
    qkgeom::head_moments hm(2);
    hm.add(qkgeom::kind::query, x, std::vector<int>{0, 1, 2, 3}, std::vector<int>{0, 0, 1, 1});
    Eigen::MatrixXd const c = x.rowwise() - x.colwise().mean();
    double const err = (hm.pooled().cov_x() - c.transpose() * c / 3.0).cwiseAbs().maxCoeff();
    return {static_cast<std::int64_t>(hm.pooled().n), err};
}
