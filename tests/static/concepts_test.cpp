// Static conformance suite (built, never run): every adapted type satisfies
// the concepts, and near-misses do not. A failure here is a compile error.
#include <qkgeom/plasticity.hpp>

#ifdef QKGEOM_TEST_XTENSOR
#include <qkgeom/adapters/xtensor.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>
#endif
#ifdef QKGEOM_TEST_RANGE_V3
#include <range/v3/view/filter.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#endif

#include <array>
#include <list>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace {

using qkgeom::IndexVector;
using qkgeom::RowMatrix;

template <class S>
using RM = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using CM = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

// --- Eigen: matrices, maps, refs, blocks; any storage order; 4 element types
template <class S>
constexpr bool eigen_family_ok() {
    return RowMatrix<RM<S>> && RowMatrix<CM<S>> && RowMatrix<Eigen::Map<RM<S>>> &&
           RowMatrix<Eigen::Map<CM<S> const>> && RowMatrix<Eigen::Map<RM<S>, 0, Eigen::OuterStride<>>> &&
           RowMatrix<Eigen::Map<CM<S>, 0, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>> &&
           RowMatrix<Eigen::Ref<RM<S> const>> && RowMatrix<Eigen::Ref<CM<S>>> &&
           RowMatrix<Eigen::Block<RM<S>>> && RowMatrix<Eigen::Block<CM<S> const>> &&
           RowMatrix<Eigen::Matrix<S, 16, 4>> && RowMatrix<Eigen::Transpose<CM<S>>>;
}
static_assert(eigen_family_ok<double>());
static_assert(eigen_family_ok<float>());
static_assert(eigen_family_ok<Eigen::half>());
static_assert(eigen_family_ok<Eigen::bfloat16>());
static_assert(RowMatrix<decltype(std::declval<Eigen::MatrixXd>() * 2.0)>);  // expression: evaluated
static_assert(std::same_as<decltype(qkgeom::as_matrix(std::declval<Eigen::MatrixXf const&>())),
                           qkgeom::matrix_view<float>>);  // viewed in place, not copied

// --- canonical views and span factories
static_assert(RowMatrix<qkgeom::matrix_view<double>> && RowMatrix<qkgeom::matrix_view<float>>);
static_assert(RowMatrix<qkgeom::matrix_view<qkgeom::bfloat16>> && RowMatrix<qkgeom::matrix_view<qkgeom::float16>>);
static_assert(RowMatrix<qkgeom::dense_rows>);
static_assert(std::same_as<decltype(qkgeom::make_matrix_view(std::span<float const>{}, 1, 1)),
                           qkgeom::matrix_view<float>>);
static_assert(std::same_as<decltype(qkgeom::make_matrix_view(std::span<qkgeom::float16>{}, 1, 1, 2, 1)),
                           qkgeom::matrix_view<qkgeom::float16>>);

// --- ranges of fixed-size rows
static_assert(RowMatrix<std::vector<std::array<float, 128>>>);
static_assert(RowMatrix<std::vector<std::array<qkgeom::bfloat16, 64>>>);
static_assert(RowMatrix<std::span<std::array<double, 4> const>>);
static_assert(RowMatrix<std::list<std::array<float, 8>>>);
static_assert(RowMatrix<std::vector<Eigen::Vector4f>>);
static_assert(RowMatrix<double[3][4]>);
static_assert(std::same_as<decltype(qkgeom::as_matrix(std::declval<std::vector<std::array<float, 8>> const&>())),
                           qkgeom::matrix_view<float>>);  // contiguous rows: viewed in place

// --- index vectors
static_assert(IndexVector<std::vector<int>> && IndexVector<std::vector<std::int64_t>>);
static_assert(IndexVector<std::span<std::uint32_t const>> && IndexVector<std::list<long>>);
static_assert(IndexVector<Eigen::VectorXi> && IndexVector<Eigen::Matrix<std::int64_t, 1, Eigen::Dynamic>>);
static_assert(std::same_as<decltype(qkgeom::as_indices(std::declval<std::vector<int> const&>())),
                           qkgeom::index_view<int>>);  // viewed, not copied

// --- near-misses are rejected
static_assert(!RowMatrix<int>);
static_assert(!RowMatrix<std::string>);
static_assert(!RowMatrix<std::vector<double>>);               // flat: no row structure
static_assert(!RowMatrix<std::vector<std::vector<double>>>);  // ragged rows
static_assert(!RowMatrix<std::vector<std::array<int, 4>>>);   // integer elements
static_assert(!RowMatrix<Eigen::MatrixXi>);
static_assert(!RowMatrix<std::map<int, std::array<float, 2>>>);
static_assert(!IndexVector<std::vector<double>>);  // positions are integers (method §9.2)
static_assert(!IndexVector<std::vector<bool>>);
static_assert(!IndexVector<Eigen::MatrixXi>);  // not a vector
static_assert(!IndexVector<Eigen::VectorXd>);

// --- user adaptation paths: member, ADL, traits (see docs/tensor-concept.md)
struct with_member {
    std::vector<float> v = std::vector<float>(8);
    [[nodiscard]] qkgeom::matrix_view<float> qkgeom_as_matrix() const { return {v.data(), 2, 4, 4, 1}; }
};
static_assert(RowMatrix<with_member>);

}  // namespace

// (named namespaces: the ADL function must be visible, not internal)
namespace qkgeom_static_test_user {
struct adl_tensor {
    std::vector<double> v;
};
inline qkgeom::matrix_view<double> qkgeom_as_matrix(adl_tensor const& t) {
    return {t.v.data(), static_cast<qkgeom::index_t>(t.v.size()), 1, 1, 1};
}
}  // namespace qkgeom_static_test_user
static_assert(qkgeom::RowMatrix<qkgeom_static_test_user::adl_tensor>);

struct traits_tensor {
    qkgeom::float16 const* p;
};

template <>
struct qkgeom::tensor_traits<traits_tensor> {
    static qkgeom::matrix_view<qkgeom::float16> as_matrix(traits_tensor const& t) { return {t.p, 1, 1, 1, 1}; }
};
static_assert(qkgeom::RowMatrix<traits_tensor>);

#ifdef QKGEOM_TEST_XTENSOR
static_assert(qkgeom::RowMatrix<xt::xtensor<double, 2>> && qkgeom::RowMatrix<xt::xtensor<float, 2>>);
static_assert(qkgeom::RowMatrix<xt::xtensor<double, 2, xt::layout_type::column_major>>);
static_assert(qkgeom::RowMatrix<xt::xarray<float>>);
using xview_t = decltype(xt::view(std::declval<xt::xtensor<float, 2>&>(), xt::range(0, 2), xt::all()));
static_assert(qkgeom::RowMatrix<xview_t>);
using xstrided_t = decltype(xt::strided_view(std::declval<xt::xtensor<double, 2>&>(), {xt::all(), xt::all()}));
static_assert(qkgeom::RowMatrix<xstrided_t>);
static_assert(qkgeom::IndexVector<xt::xtensor<int, 1>> && qkgeom::IndexVector<xt::xarray<std::int64_t>>);
static_assert(!qkgeom::RowMatrix<xt::xtensor<int, 2>>);
static_assert(!qkgeom::IndexVector<xt::xtensor<double, 1>>);
#endif

#ifdef QKGEOM_TEST_RANGE_V3
inline auto rv3_rows() {
    return ranges::views::iota(0, 4) | ranges::views::transform([](int) { return std::array<float, 4>{}; });
}
static_assert(qkgeom::RowMatrix<decltype(rv3_rows())>);
static_assert(qkgeom::IndexVector<decltype(ranges::views::iota(0, 4))>);
#endif
