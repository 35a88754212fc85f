// Must not compile: positions are integers (method §9.2), so a vector of
// doubles is not an IndexVector. The diagnostic names `IndexVector`.
#include <qkgeom/stats/moments.hpp>

#include <vector>

int main() {
    qkgeom::moments m(2);
    Eigen::MatrixXd x = Eigen::MatrixXd::Zero(2, 2);
#ifdef QKGEOM_CF_CONTROL
    std::vector<long> t{0, 1};
#else
    std::vector<double> t{0.0, 1.0};
#endif
    qkgeom::add_rows(m, x, t);
}
