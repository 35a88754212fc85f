// Worked example of docs/tensor-concept.md: adapting a tensor type that
// qkgeom has never heard of, in the three ways the CPO looks for.
//
// Expected output:
//   traits: 3 rows x 4 cols (bf16), row 2 = 8 9 10 11
//   member: 2 rows x 3 cols (f32)
//   adl:    4 rows x 2 cols (f64), strided
//   moments agree: yes
#include <qkgeom/plasticity.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

// 1. A type you do not own, e.g. from another library: specialise
//    qkgeom::tensor_traits. Here: a column-major bf16 buffer with a shape.
namespace their_lib {
struct tensor {
    std::vector<qkgeom::bfloat16> storage;  // column-major
    std::int64_t shape[2];
};
}  // namespace their_lib

template <>
struct qkgeom::tensor_traits<their_lib::tensor> {
    static qkgeom::matrix_view<qkgeom::bfloat16> as_matrix(their_lib::tensor const& t) {
        // element (i, j) at i * 1 + j * rows: row stride 1, column stride rows
        return {t.storage.data(), t.shape[0], t.shape[1], 1, t.shape[0]};
    }
};

// 2. A type you own: give it a member qkgeom_as_matrix().
struct my_rows {
    std::vector<float> values;  // row-major 2 x 3
    [[nodiscard]] qkgeom::matrix_view<float> qkgeom_as_matrix() const { return {values.data(), 2, 3, 3, 1}; }
};

// 3. Or a free function found by argument-dependent lookup.
namespace lab {
struct interleaved {  // two heads interleaved per token: [h0 h0 h1 h1] -> view head 1
    std::vector<double> buf;
};
inline qkgeom::matrix_view<double> qkgeom_as_matrix(interleaved const& t) {
    return {t.buf.data() + 2, static_cast<qkgeom::index_t>(t.buf.size() / 4), 2, 4, 1};
}
}  // namespace lab

template <class T>
void describe(char const* how, T const& x) {
    auto const r = qkgeom::as_matrix(x);  // the CPO every algorithm uses
    std::printf("%s %lld rows x %lld cols (%.*s)", how, static_cast<long long>(r.rows()),
                static_cast<long long>(r.cols()), static_cast<int>(r.dtype().size()), r.dtype().data());
}

int main() {
    their_lib::tensor t{{}, {3, 4}};
    for (int j = 0; j < 4; ++j)
        for (int i = 0; i < 3; ++i) t.storage.push_back(qkgeom::bfloat16::from_float(static_cast<float>(4 * i + j)));
    static_assert(qkgeom::RowMatrix<their_lib::tensor>);
    describe("traits:", t);
    std::vector<double> row(4);
    qkgeom::as_matrix(t).read_row(2, row.data());
    std::printf(", row 2 = %g %g %g %g\n", row[0], row[1], row[2], row[3]);

    describe("member:", my_rows{{1, 2, 3, 4, 5, 6}});
    std::printf("\n");
    lab::interleaved il{{0, 0, 1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0, 0, 7, 8}};
    describe("adl:   ", il);
    std::printf(", strided\n");

    // Adapted types go straight into any algorithm; results equal those of Eigen input.
    Eigen::MatrixXd e(4, 2);
    e << 1, 2, 3, 4, 5, 6, 7, 8;
    std::vector<int> pos{0, 1, 2, 3};
    qkgeom::moments a(2), b(2);
    qkgeom::add_rows(a, il, pos);
    qkgeom::add_rows(b, e, pos);
    bool const same = a.c_xx == b.c_xx && a.c_xt == b.c_xt && a.mean_x == b.mean_x;
    std::printf("moments agree: %s\n", same ? "yes" : "no");
    return same && row[3] == 11.0 ? 0 : 1;
}
