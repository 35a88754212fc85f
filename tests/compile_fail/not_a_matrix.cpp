// Must not compile: a type that is not a matrix is passed as rows. The
// diagnostic names the concept `RowMatrix`. With QKGEOM_CF_CONTROL the same
// call with a real matrix compiles (so the failure is the intended one).
#include <qkgeom/stats/moments.hpp>

#include <vector>

struct not_a_matrix {
    int rows = 3;
};

int main() {
    qkgeom::head_moments hm(4);
    std::vector<int> t{0, 1, 2}, b{0, 0, 0};
#ifdef QKGEOM_CF_CONTROL
    Eigen::MatrixXd x = Eigen::MatrixXd::Zero(3, 4);
#else
    not_a_matrix x;
#endif
    hm.add(qkgeom::kind::query, x, t, b);
}
