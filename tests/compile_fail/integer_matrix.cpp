// Must not compile: integer elements are not token vectors (f64/f32/bf16/f16
// only). The diagnostic names `RowMatrix`.
#include <qkgeom/stats/moments.hpp>

#include <vector>

int main() {
    qkgeom::moments m(4);
    std::vector<int> t{0, 1};
#ifdef QKGEOM_CF_CONTROL
    Eigen::MatrixXf x = Eigen::MatrixXf::Zero(2, 4);
#else
    Eigen::MatrixXi x = Eigen::MatrixXi::Zero(2, 4);
#endif
    qkgeom::add_rows(m, x, t);
}
