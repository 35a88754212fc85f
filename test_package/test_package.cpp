#include "head_check.hpp"

#include <qkgeom/plasticity.hpp>
#include <cstdlib>
#include <iostream>
#include <vector>

int main() {  // 4 query rows (d = 2) in two buckets; pooled covariance vs a direct one
    Eigen::MatrixXd x(4, 2);
    x << 1, 2, 3, 5, 4, 1, 0, 7;
    qkgeom::head_moments hm(2);
    hm.add(qkgeom::kind::query, x, std::vector<int>{0, 1, 2, 3}, std::vector<int>{0, 0, 1, 1});
    Eigen::MatrixXd const c = x.rowwise() - x.colwise().mean();
    double const err = (hm.pooled().cov_x() - c.transpose() * c / 3.0).cwiseAbs().maxCoeff();
    std::cout << "qkgeom test_package: n = " << hm.pooled().n << ", max |cov_x error| = " << err << '\n';
    head_numbers h;
    bool const head_ok = print_head_check(h);  // the last line: compare_modes.cmake reads it
    return hm.pooled().n == 4 && err < 1e-12 && head_ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
