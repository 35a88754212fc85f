// qkgeom — xtensor adapter: xt::xtensor<T, 2>, xt::xarray<T> (rank checked at
// run time) and rank-2 views/strided views of them are RowMatrix; rank-1
// integral expressions are IndexVector.
//
// Include this header where you pass xtensor objects to qkgeom. It compiles to
// nothing when xtensor is not installed (the core never requires it).
#pragma once

#include <qkgeom/core/tensor.hpp>

#if __has_include(<xtensor/xexpression.hpp>) && __has_include(<xtensor/xutils.hpp>)
#include <xtensor/xexpression.hpp>
#include <xtensor/xutils.hpp>

#include <type_traits>

#define QKGEOM_HAS_XTENSOR 1

namespace qkgeom {
namespace detail {

template <class E>
concept xtensor_expression = xt::is_xexpression<E>::value;

template <class E>
concept xtensor_strided = xtensor_expression<E> && xt::has_data_interface<E>::value &&
                          xt::has_strides<E>::value && requires(E const& e) { e.data_offset(); };

template <class E>
void check_xtensor_rank(E const& e, std::size_t rank, std::string_view field) {
    if (e.dimension() != rank)
        fail_arg("qkgeom::as_matrix(xtensor)", std::string(field) + " must have rank " + std::to_string(rank) +
                                                   ", but has rank",
                 e.dimension());
}

}  // namespace detail

/// \brief xtensor expressions of rank 2 as row matrices (rows = tokens).
/// Containers and strided views are read in place through their strides (any
/// layout, any stride sign); other expressions are evaluated once into doubles.
template <class E>
    requires detail::xtensor_expression<E> && Element<std::remove_cv_t<typename E::value_type>>
struct tensor_traits<E> {
    using value_type = std::remove_cv_t<typename E::value_type>;

    /// \param[in] e a rank-2 expression, rows × cols = shape()[0] × shape()[1].
    /// \pre for strided `e`: it outlives the returned view.
    /// \returns a matrix_view<value_type> over `e`'s storage when `e` has a data
    ///          interface with strides, otherwise an owning dense_rows.
    /// \throws std::invalid_argument when `e.dimension() != 2`.
    /// \throws std::bad_alloc when the dense copy cannot be allocated.
    static auto as_matrix(E const& e) {
        detail::check_xtensor_rank(e, 2, "row matrix");
        auto const rows = static_cast<index_t>(e.shape()[0]);
        auto const cols = static_cast<index_t>(e.shape()[1]);
        if constexpr (detail::xtensor_strided<E>) {
            auto const& st = e.strides();
            return matrix_view<value_type>(e.data() + e.data_offset(), rows, cols, static_cast<index_t>(st[0]),
                                           static_cast<index_t>(st[1]));
        } else {
            dense_rows out(rows, cols, element_traits<value_type>::name);
            for (index_t i = 0; i < rows; ++i)
                for (index_t j = 0; j < cols; ++j)
                    out.data()[i * cols + j] = element_traits<value_type>::to_double(
                        e(static_cast<std::size_t>(i), static_cast<std::size_t>(j)));
            return out;
        }
    }
};

/// \brief Rank-1 integral xtensor expressions as index vectors (copied to int64).
template <class E>
    requires detail::xtensor_expression<E> && std::integral<std::remove_cv_t<typename E::value_type>> &&
             (!std::same_as<std::remove_cv_t<typename E::value_type>, bool>)
struct tensor_traits<E> {
    /// \param[in] e a rank-1 integral expression.
    /// \returns its elements converted to int64 (an owning copy).
    /// \throws std::invalid_argument when `e.dimension() != 1` (the message
    ///         names `qkgeom::as_matrix(xtensor)` even here).
    /// \throws std::bad_alloc when the copy cannot be allocated.
    static dense_indices as_indices(E const& e) {
        detail::check_xtensor_rank(e, 1, "index vector");
        std::vector<std::int64_t> v(e.shape()[0]);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>(e(i));
        return dense_indices(std::move(v));
    }
};

}  // namespace qkgeom

#endif
