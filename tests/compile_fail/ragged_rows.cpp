// Must not compile: rows of run-time length (possibly ragged) are not a row
// matrix; use fixed-size rows or a strided view. The diagnostic names `RowMatrix`.
#include <qkgeom/core/tensor.hpp>

#include <array>
#include <vector>

int main() {
#ifdef QKGEOM_CF_CONTROL
    std::vector<std::array<double, 2>> rows{{1, 2}, {3, 4}};
#else
    std::vector<std::vector<double>> rows{{1, 2}, {3, 4}};
#endif
    auto r = qkgeom::as_matrix(rows);
    return static_cast<int>(r.rows());
}
