// qkgeom — "any tensor type": the row-matrix and index-vector concepts.
//
// Every algorithm of qkgeom reads its inputs through two customisation point
// objects (CPOs):
//
//   qkgeom::as_matrix(x)   -> a MatrixReader: rows = tokens, cols = head dimension
//   qkgeom::as_indices(v)  -> an IndexReader: positions, buckets, example ids
//
// and is constrained by the concepts `RowMatrix` / `IndexVector`, which hold
// exactly when the CPO accepts the type. A reader widens every element to
// double on read (method §1: accumulate in double); 16-bit floats are widened
// exactly. See docs/tensor-concept.md for how to adapt a new tensor type.
//
// Resolution order of `as_matrix(x)` (first that applies wins):
//   1. `x` already is a MatrixReader (matrix_view, dense_rows, ...);
//   2. member   `x.qkgeom_as_matrix()`;
//   3. ADL      `qkgeom_as_matrix(x)`;
//   4. traits   `qkgeom::tensor_traits<T>::as_matrix(x)`  (how adapters plug in);
//   5. built-in: Eigen dense objects (here: Eigen is a core dependency) and random-access or
//      forward ranges of fixed-size rows (`std::array<T, N>`, `T[N]`,
//      `std::span<T, N>`, fixed-size Eigen vectors), range-v3 views included.
// `as_indices(v)` resolves the same way with `qkgeom_as_indices` /
// `tensor_traits<T>::as_indices`, and built-in integral ranges and Eigen vectors.
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/float16.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>
#include <iterator>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkgeom {

// ---------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------

/// \brief Customisation point for element types: `name` (the dtype string used
/// in messages and files) and an exact widening `to_double`. The primary
/// template is undefined on purpose: only listed types are elements.
/// Each specialisation below (double, float, qkgeom's bfloat16 / float16,
/// Eigen::half, Eigen::bfloat16) has `static double to_double(T v) noexcept`,
/// returning `v` exactly widened.
template <class T>
struct element_traits;

template <>
struct element_traits<double> {
    static constexpr std::string_view name = "f64";
    static constexpr double to_double(double v) noexcept { return v; }
};
template <>
struct element_traits<float> {
    static constexpr std::string_view name = "f32";
    static constexpr double to_double(float v) noexcept { return static_cast<double>(v); }
};
template <>
struct element_traits<bfloat16> {
    static constexpr std::string_view name = "bf16";
    static constexpr double to_double(bfloat16 v) noexcept { return static_cast<double>(v.to_float()); }
};
template <>
struct element_traits<float16> {
    static constexpr std::string_view name = "f16";
    static constexpr double to_double(float16 v) noexcept { return static_cast<double>(v.to_float()); }
};
template <>
struct element_traits<Eigen::half> {
    static constexpr std::string_view name = "f16";
    static double to_double(Eigen::half v) noexcept { return static_cast<double>(static_cast<float>(v)); }
};
template <>
struct element_traits<Eigen::bfloat16> {
    static constexpr std::string_view name = "bf16";
    static double to_double(Eigen::bfloat16 v) noexcept {
        return static_cast<double>(static_cast<float>(v));
    }
};

/// \brief A floating-point element type qkgeom can read: f64, f32, bf16, f16.
template <class T>
concept Element = requires(T const& v) {
    { element_traits<std::remove_cv_t<T>>::to_double(v) } -> std::same_as<double>;
    { element_traits<std::remove_cv_t<T>>::name } -> std::convertible_to<std::string_view>;
};

// ---------------------------------------------------------------------------
// Readers: what the CPOs return
// ---------------------------------------------------------------------------

/// \brief What algorithms consume: a rows × cols matrix whose rows can be read,
/// widened to double, into a caller-provided buffer.
template <class R>
concept MatrixReader = requires(R const& r, index_t i, double* out) {
    { r.rows() } -> std::same_as<index_t>;
    { r.cols() } -> std::same_as<index_t>;
    { r.dtype() } -> std::convertible_to<std::string_view>;
    r.read_row(i, out);
};

/// \brief What algorithms consume for positions, buckets and example ids.
/// (Exact result types, so that containers such as std::vector are not
/// mistaken for readers and copied.)
template <class R>
concept IndexReader = requires(R const& r, index_t i) {
    { r.size() } -> std::same_as<index_t>;
    { r[i] } -> std::same_as<std::int64_t>;
};

/// \brief Non-owning strided view of a rows × cols matrix of element type T:
/// element (i, j) lives at `data()[i * row_stride() + j * col_stride()]`
/// (strides in elements, any sign). The canonical form every adapter may
/// produce (like stdBLAS's mdspan).
template <Element T>
class matrix_view {
public:
    using element_type = T;

    /// \brief An empty 0 × 0 view.
    constexpr matrix_view() noexcept = default;
    /// \brief Views `data` as a rows × cols matrix. Nothing is checked; use
    /// make_matrix_view() for a bounds-checked view over a span.
    /// \param[in] data address of element (0, 0); may be null when the view is empty.
    /// \param[in] rows number of rows (tokens), ≥ 0.
    /// \param[in] cols number of columns (head dimension), ≥ 0.
    /// \param[in] row_stride distance in elements between (i, j) and (i + 1, j); any sign.
    /// \param[in] col_stride distance in elements between (i, j) and (i, j + 1); any sign.
    /// \pre every element (i, j) with 0 ≤ i < rows, 0 ≤ j < cols is readable
    ///      for the lifetime of the view.
    constexpr matrix_view(T const* data, index_t rows, index_t cols, index_t row_stride,
                          index_t col_stride = 1) noexcept
        : data_(data), rows_(rows), cols_(cols), row_stride_(row_stride), col_stride_(col_stride) {}

    /// \returns the address of element (0, 0).
    [[nodiscard]] constexpr T const* data() const noexcept { return data_; }
    /// \returns the number of rows.
    [[nodiscard]] constexpr index_t rows() const noexcept { return rows_; }
    /// \returns the number of columns.
    [[nodiscard]] constexpr index_t cols() const noexcept { return cols_; }
    /// \returns the row stride, in elements.
    [[nodiscard]] constexpr index_t row_stride() const noexcept { return row_stride_; }
    /// \returns the column stride, in elements.
    [[nodiscard]] constexpr index_t col_stride() const noexcept { return col_stride_; }
    /// \returns the element type's name (`element_traits<T>::name`, e.g. `"f32"`).
    [[nodiscard]] static constexpr std::string_view dtype() noexcept { return element_traits<T>::name; }

    /// \brief Element (i, j) widened to double.
    /// \pre 0 ≤ i < rows(), 0 ≤ j < cols() (not checked).
    /// \returns the element, exactly widened.
    [[nodiscard]] double operator()(index_t i, index_t j) const noexcept {
        return element_traits<T>::to_double(data_[i * row_stride_ + j * col_stride_]);
    }

    /// \brief Widen row i into out[0 .. cols).
    /// \param[in] i the row, 0 ≤ i < rows() (not checked).
    /// \param[out] out buffer of at least cols() doubles.
    void read_row(index_t i, double* out) const noexcept {
        T const* p = data_ + i * row_stride_;
        if (col_stride_ == 1) {  // contiguous: a plain loop the compiler vectorises (cvtps2pd for f32)
            if constexpr (std::is_same_v<T, double>) {
                std::memcpy(out, p, static_cast<std::size_t>(cols_) * sizeof(double));
            } else {
                for (index_t j = 0; j < cols_; ++j) out[j] = element_traits<T>::to_double(p[j]);
            }
            return;
        }
        for (index_t j = 0; j < cols_; ++j) out[j] = element_traits<T>::to_double(p[j * col_stride_]);
    }

private:
    T const* data_ = nullptr;
    index_t rows_ = 0, cols_ = 0, row_stride_ = 0, col_stride_ = 1;
};

/// \brief Owning row-major matrix of doubles: what non-viewable inputs
/// (expression templates, forward-only ranges) are materialised into.
class dense_rows {
public:
    /// \brief An empty 0 × 0 matrix of dtype `"f64"`.
    dense_rows() = default;
    /// \brief A zero-filled rows × cols matrix.
    /// \param[in] rows number of rows, ≥ 0.
    /// \param[in] cols number of columns, ≥ 0.
    /// \param[in] dtype the dtype of the source the values came from (reported
    ///            by dtype(); the values themselves are always double).
    /// \pre `dtype` refers to a string with static storage (e.g.
    ///      `element_traits<T>::name`): only the view is kept.
    /// \throws std::invalid_argument when rows or cols is negative or rows ×
    ///         cols overflows (checked before allocating).
    /// \throws std::bad_alloc (or std::length_error) when rows × cols doubles
    ///         cannot be allocated.
    dense_rows(index_t rows, index_t cols, std::string_view dtype)
        : values_(checked_size(rows, cols)), rows_(rows), cols_(cols), dtype_(dtype) {}

    /// \returns the number of rows.
    [[nodiscard]] index_t rows() const noexcept { return rows_; }
    /// \returns the number of columns.
    [[nodiscard]] index_t cols() const noexcept { return cols_; }
    /// \returns the dtype given at construction (`"f64"` by default).
    [[nodiscard]] std::string_view dtype() const noexcept { return dtype_; }
    /// \returns the row-major storage, rows() × cols() doubles.
    [[nodiscard]] double* data() noexcept { return values_.data(); }
    /// \returns the row-major storage, rows() × cols() doubles.
    [[nodiscard]] double const* data() const noexcept { return values_.data(); }
    /// \brief Copies row i into out[0 .. cols).
    /// \param[in] i the row, 0 ≤ i < rows() (not checked).
    /// \param[out] out buffer of at least cols() doubles.
    void read_row(index_t i, double* out) const noexcept {
        if (cols_ > 0)
            std::memcpy(out, values_.data() + i * cols_, static_cast<std::size_t>(cols_) * sizeof(double));
    }

private:
    static std::size_t checked_size(index_t rows, index_t cols) {
        constexpr std::string_view fn = "qkgeom::dense_rows";
        if (rows < 0) detail::fail_arg(fn, "rows must be >= 0", rows);
        if (cols < 0) detail::fail_arg(fn, "cols must be >= 0", cols);
        if (cols != 0 && rows > std::numeric_limits<index_t>::max() / cols)
            detail::fail_arg(fn, "rows x cols overflows; rows", rows);
        return static_cast<std::size_t>(rows * cols);
    }

    std::vector<double> values_;
    index_t rows_ = 0, cols_ = 0;
    std::string_view dtype_ = "f64";  // always a static string (element_traits<>::name)
};

/// \brief Non-owning view of a random-access sequence of integers.
template <class T>
    requires std::integral<T>
class index_view {
public:
    /// \brief An empty view.
    constexpr index_view() noexcept = default;
    /// \brief Views `size` integers starting at `data`, `stride` elements apart.
    /// \param[in] data address of element 0; may be null when size = 0.
    /// \param[in] size number of elements, ≥ 0.
    /// \param[in] stride distance in elements between consecutive entries.
    /// \pre the viewed elements stay readable for the lifetime of the view (not checked).
    constexpr index_view(T const* data, index_t size, index_t stride = 1) noexcept
        : data_(data), size_(size), stride_(stride) {}
    /// \returns the number of elements.
    [[nodiscard]] constexpr index_t size() const noexcept { return size_; }
    /// \brief Element i converted to int64 (values of unsigned 64-bit types
    /// above INT64_MAX wrap).
    /// \pre 0 ≤ i < size() (not checked).
    /// \returns the element as `std::int64_t`.
    [[nodiscard]] constexpr std::int64_t operator[](index_t i) const noexcept {
        return static_cast<std::int64_t>(data_[i * stride_]);
    }

private:
    T const* data_ = nullptr;
    index_t size_ = 0, stride_ = 1;
};

/// \brief Owning vector of int64 (materialised index input).
class dense_indices {
public:
    /// \brief An empty vector.
    dense_indices() = default;
    /// \brief Takes ownership of `v`.
    /// \param[in] v the values.
    explicit dense_indices(std::vector<std::int64_t> v) noexcept : values_(std::move(v)) {}
    /// \returns the number of elements.
    [[nodiscard]] index_t size() const noexcept { return static_cast<index_t>(values_.size()); }
    /// \pre 0 ≤ i < size() (not checked).
    /// \returns element i.
    [[nodiscard]] std::int64_t operator[](index_t i) const noexcept {
        return values_[static_cast<std::size_t>(i)];
    }
    /// \returns the underlying vector, for in-place modification.
    [[nodiscard]] std::vector<std::int64_t>& values() noexcept { return values_; }

private:
    std::vector<std::int64_t> values_;
};

/// \brief A strided row-matrix view over a `std::span`, bounds-checked against
/// the span: element (i, j) is `s[i * row_stride + j * col_stride]`.
/// \tparam T the element type (const or not); the view reads `std::remove_const_t<T>`.
/// \param[in] s the storage; it must outlive the view.
/// \param[in] rows number of rows, ≥ 0.
/// \param[in] cols number of columns, ≥ 0.
/// \param[in] row_stride distance in elements between consecutive rows, ≥ 0.
/// \param[in] col_stride distance in elements between consecutive columns, ≥ 0.
/// \returns a matrix_view over `s.data()`.
/// \throws std::invalid_argument when an extent or stride is negative, the
///         last element's index (rows − 1)·row_stride + (cols − 1)·col_stride
///         overflows index_t (checked before computing it), or it lies
///         outside the span. (Unlike the matrix_view
///         constructor, negative strides are refused here.)
template <Element T, std::size_t Extent>
[[nodiscard]] matrix_view<std::remove_const_t<T>> make_matrix_view(std::span<T, Extent> s, index_t rows,
                                                                   index_t cols, index_t row_stride,
                                                                   index_t col_stride) {
    constexpr std::string_view fn = "qkgeom::make_matrix_view";
    if (rows < 0) detail::fail_arg(fn, "rows must be >= 0", rows);
    if (cols < 0) detail::fail_arg(fn, "cols must be >= 0", cols);
    if (row_stride < 0) detail::fail_arg(fn, "row_stride must be >= 0", row_stride);
    if (col_stride < 0) detail::fail_arg(fn, "col_stride must be >= 0", col_stride);
    if (rows > 0 && cols > 0) {
        constexpr index_t big = std::numeric_limits<index_t>::max();
        // (rows − 1)·row_stride + (cols − 1)·col_stride, refused before it could overflow
        bool const overflow = (row_stride != 0 && rows - 1 > big / row_stride) ||
                              (col_stride != 0 && cols - 1 > big / col_stride) ||
                              (rows - 1) * row_stride > big - (cols - 1) * col_stride;
        if (overflow)
            detail::fail_arg(fn, "the view's extent overflows the index type; rows", rows);
        index_t const last = (rows - 1) * row_stride + (cols - 1) * col_stride;
        if (last >= static_cast<index_t>(s.size()))
            detail::fail_arg(fn,
                             "the view reaches past the end of the span of " + std::to_string(s.size()) +
                                 " elements; last element index",
                             last);
    }
    return {s.data(), rows, cols, row_stride, col_stride};
}

/// \brief Contiguous row-major rows × cols view over a `std::span`
/// (row stride cols, column stride 1).
/// \param[in] s the storage; it must outlive the view.
/// \param[in] rows number of rows, ≥ 0.
/// \param[in] cols number of columns, ≥ 0.
/// \returns a matrix_view over `s.data()`.
/// \throws std::invalid_argument when rows or cols is negative or rows × cols
///         exceeds `s.size()`.
template <Element T, std::size_t Extent>
[[nodiscard]] matrix_view<std::remove_const_t<T>> make_matrix_view(std::span<T, Extent> s, index_t rows,
                                                                   index_t cols) {
    return make_matrix_view(s, rows, cols, cols, 1);
}

// ---------------------------------------------------------------------------
// Adapter hook
// ---------------------------------------------------------------------------

/// \brief Specialise for a tensor type you do not own, with a static
/// `as_matrix(T const&)` returning a MatrixReader and/or a static
/// `as_indices(T const&)` returning an IndexReader. Undefined primary:
/// no guessing (see docs/tensor-concept.md). Constrained partial
/// specialisations (`template <class T> requires C<T> struct tensor_traits<T>`)
/// are the way to adapt a whole family of types.
template <class T>
struct tensor_traits;

// ---------------------------------------------------------------------------
// Fixed-size rows (for ranges of rows)
// ---------------------------------------------------------------------------

namespace detail {

template <class T>
inline constexpr std::size_t fixed_extent_v = 0;  // 0 = not a fixed-size row
template <class T, std::size_t N>
inline constexpr std::size_t fixed_extent_v<std::array<T, N>> = N;
template <class T, std::size_t N>
inline constexpr std::size_t fixed_extent_v<T[N]> = N;
template <class T, std::size_t N>
    requires(N != std::dynamic_extent)
inline constexpr std::size_t fixed_extent_v<std::span<T, N>> = N;
template <class S, int R, int C, int O, int MR, int MC>
    requires(R > 0 && C > 0 && (R == 1 || C == 1))
inline constexpr std::size_t fixed_extent_v<Eigen::Matrix<S, R, C, O, MR, MC>> =
    static_cast<std::size_t>(R * C);

template <class Row>
concept fixed_row = fixed_extent_v<std::remove_cvref_t<Row>> > 0 && requires(Row const& r) {
    { std::data(r) };
    requires Element<std::remove_cvref_t<decltype(*std::data(r))>>;
};

template <class Row>
using row_element_t = std::remove_cvref_t<decltype(*std::data(std::declval<Row const&>()))>;

template <class R>
concept range_of_fixed_rows =
    std::ranges::forward_range<R const> && fixed_row<std::ranges::range_reference_t<R const>>;

/// Reader over a random-access range of fixed-size rows (no copy of the range).
template <class R>
class row_range_reader {
    using ref = std::ranges::range_reference_t<R const>;
    using elem = row_element_t<ref>;
    static constexpr index_t N = static_cast<index_t>(fixed_extent_v<std::remove_cvref_t<ref>>);
    // Views are cheap to copy and may be temporaries: keep a copy; anything
    // else is referenced (it outlives the call that reads it).
    using holder = std::conditional_t<std::ranges::view<R>, R, R const*>;

public:
    explicit row_range_reader(R const& r) : r_(hold(r)), rows_(static_cast<index_t>(std::ranges::distance(get()))) {}
    [[nodiscard]] index_t rows() const noexcept { return rows_; }
    [[nodiscard]] static constexpr index_t cols() noexcept { return N; }
    [[nodiscard]] static constexpr std::string_view dtype() noexcept { return element_traits<elem>::name; }
    void read_row(index_t i, double* out) const {
        auto it = std::ranges::begin(get());
        std::ranges::advance(it, i);
        decltype(auto) row = *it;
        auto const* p = std::data(row);
        for (index_t j = 0; j < N; ++j) out[j] = element_traits<elem>::to_double(p[j]);
    }

private:
    static holder hold(R const& r) {
        if constexpr (std::ranges::view<R>) return r;
        else return &r;
    }
    R const& get() const noexcept {
        if constexpr (std::ranges::view<R>) return r_;
        else return *r_;
    }
    holder r_;
    index_t rows_;
};

}  // namespace detail

// ---------------------------------------------------------------------------
// The CPOs
// ---------------------------------------------------------------------------

namespace detail {
namespace as_matrix_impl {

void qkgeom_as_matrix() = delete;  // poison pill: only ADL finds user overloads

template <class T>
concept has_member = requires(T const& t) {
    { t.qkgeom_as_matrix() } -> MatrixReader;
};
template <class T>
concept has_adl = requires(T const& t) {
    { qkgeom_as_matrix(t) } -> MatrixReader;
};
template <class T>
concept has_traits = requires(T const& t) {
    { tensor_traits<T>::as_matrix(t) } -> MatrixReader;
};
template <class T>
concept eigen_dense = std::derived_from<T, Eigen::DenseBase<T>> && Element<typename T::Scalar>;
template <class T>
concept eigen_direct = eigen_dense<T> && ((T::Flags & Eigen::DirectAccessBit) != 0);

template <class V>
concept packed_fixed_row = fixed_row<V> && std::is_standard_layout_v<V> &&
                           (sizeof(V) == fixed_extent_v<V> * sizeof(row_element_t<V>));

/// A contiguous range of packed rows (e.g. std::vector<std::array<float, 128>>):
/// viewed in place with row stride N.
template <class T>
concept contiguous_array_rows = std::ranges::contiguous_range<T const> && std::ranges::sized_range<T const> &&
                                packed_fixed_row<std::ranges::range_value_t<T const>>;

template <class T>
concept builtin = MatrixReader<T> || eigen_dense<T> || range_of_fixed_rows<T>;

template <class T>
concept adaptable = has_member<T> || has_adl<T> || has_traits<T> || builtin<T>;

}  // namespace as_matrix_impl
}  // namespace detail

/// \brief A type every qkgeom algorithm accepts as rows × head-dimension data:
/// `qkgeom::as_matrix(x)` turns it into a MatrixReader (see the resolution
/// order at the top of this header).
template <class T>
concept RowMatrix = detail::as_matrix_impl::adaptable<std::remove_cvref_t<T>>;

namespace detail {
namespace as_matrix_impl {

struct fn {
    template <RowMatrix T>
    [[nodiscard]] constexpr auto operator()(T const& t) const {
        if constexpr (MatrixReader<T>) {
            return t;
        } else if constexpr (has_member<T>) {
            return t.qkgeom_as_matrix();
        } else if constexpr (has_adl<T>) {
            return qkgeom_as_matrix(t);
        } else if constexpr (has_traits<T>) {
            return tensor_traits<T>::as_matrix(t);
        } else if constexpr (eigen_direct<T>) {
            // Any storage order, Map/Ref/Block strides included.
            using S = typename T::Scalar;
            index_t const rs = T::IsRowMajor ? t.outerStride() : t.innerStride();
            index_t const cs = T::IsRowMajor ? t.innerStride() : t.outerStride();
            return matrix_view<S>(t.data(), t.rows(), t.cols(), rs, cs);
        } else if constexpr (eigen_dense<T>) {
            // Expression templates: evaluate once, widened to double.
            dense_rows out(t.rows(), t.cols(), element_traits<typename T::Scalar>::name);
            for (index_t i = 0; i < t.rows(); ++i)
                for (index_t j = 0; j < t.cols(); ++j)
                    out.data()[i * t.cols() + j] = element_traits<typename T::Scalar>::to_double(t.coeff(i, j));
            return out;
        } else if constexpr (contiguous_array_rows<T>) {
            using V = std::ranges::range_value_t<T const>;
            constexpr auto n = static_cast<index_t>(fixed_extent_v<V>);
            auto const rows = static_cast<index_t>(std::ranges::size(t));
            row_element_t<V> const* p = rows > 0 ? std::data(*std::ranges::data(t)) : nullptr;
            return matrix_view<row_element_t<V>>(p, rows, n, n, 1);
        } else if constexpr (std::ranges::random_access_range<T const> && std::ranges::sized_range<T const>) {
            return row_range_reader<T>(t);
        } else {
            // forward-only range of rows: one pass into an owning buffer
            using ref = std::ranges::range_reference_t<T const>;
            using E = row_element_t<ref>;
            constexpr auto n = static_cast<index_t>(fixed_extent_v<std::remove_cvref_t<ref>>);
            std::vector<double> tmp;
            for (auto&& row : t) {
                auto const* p = std::data(row);
                for (index_t j = 0; j < n; ++j) tmp.push_back(element_traits<E>::to_double(p[j]));
            }
            dense_rows out(static_cast<index_t>(tmp.size()) / n, n, element_traits<E>::name);
            if (!tmp.empty()) std::memcpy(out.data(), tmp.data(), tmp.size() * sizeof(double));
            return out;
        }
    }
};

}  // namespace as_matrix_impl
}  // namespace detail

namespace detail {
namespace as_indices_impl {

void qkgeom_as_indices() = delete;  // poison pill

template <class T>
concept has_member = requires(T const& t) {
    { t.qkgeom_as_indices() } -> IndexReader;
};
template <class T>
concept has_adl = requires(T const& t) {
    { qkgeom_as_indices(t) } -> IndexReader;
};
template <class T>
concept has_traits = requires(T const& t) {
    { tensor_traits<T>::as_indices(t) } -> IndexReader;
};
template <class T>
concept integer = std::integral<T> && !std::same_as<std::remove_cv_t<T>, bool>;
template <class T>
concept eigen_integer_vector = std::derived_from<T, Eigen::DenseBase<T>> && integer<typename T::Scalar> &&
                               (T::RowsAtCompileTime == 1 || T::ColsAtCompileTime == 1);
template <class T>
concept integer_range =
    std::ranges::forward_range<T const> && integer<std::remove_cvref_t<std::ranges::range_reference_t<T const>>>;

template <class T>
concept adaptable =
    has_member<T> || has_adl<T> || has_traits<T> || IndexReader<T> || eigen_integer_vector<T> || integer_range<T>;

}  // namespace as_indices_impl
}  // namespace detail

/// \brief A type every qkgeom algorithm accepts as positions, buckets or
/// example ids: `qkgeom::as_indices(v)` turns it into an IndexReader.
/// Elements must be integers (method §9.2), bool excluded.
template <class T>
concept IndexVector = detail::as_indices_impl::adaptable<std::remove_cvref_t<T>>;

namespace detail {
namespace as_indices_impl {

struct fn {
    template <IndexVector T>
    [[nodiscard]] constexpr auto operator()(T const& t) const {
        if constexpr (IndexReader<T>) {
            return t;
        } else if constexpr (has_member<T>) {
            return t.qkgeom_as_indices();
        } else if constexpr (has_adl<T>) {
            return qkgeom_as_indices(t);
        } else if constexpr (has_traits<T>) {
            return tensor_traits<T>::as_indices(t);
        } else if constexpr (eigen_integer_vector<T>) {
            std::vector<std::int64_t> v(static_cast<std::size_t>(t.size()));
            for (index_t i = 0; i < t.size(); ++i) v[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(t(i));
            return dense_indices(std::move(v));
        } else if constexpr (std::ranges::contiguous_range<T const> && std::ranges::sized_range<T const>) {
            using V = std::remove_cv_t<std::ranges::range_value_t<T const>>;
            return index_view<V>(std::ranges::data(t), static_cast<index_t>(std::ranges::size(t)));
        } else {
            std::vector<std::int64_t> v;
            if constexpr (std::ranges::sized_range<T const>) v.reserve(std::ranges::size(t));
            for (auto&& x : t) v.push_back(static_cast<std::int64_t>(x));
            return dense_indices(std::move(v));
        }
    }
};

}  // namespace as_indices_impl
}  // namespace detail

inline namespace cpo {
/// \brief `qkgeom::as_matrix(x)`: the MatrixReader of a row matrix (rows = tokens).
///
/// Called as `as_matrix(x)` with `x` a RowMatrix. Returns `x` itself (a copy)
/// when it already is a MatrixReader, otherwise what the first applicable
/// hook in the resolution order returns: a matrix_view reading `x` in place
/// (Eigen objects with direct access, contiguous ranges of packed rows), a
/// reader referencing a random-access range (views are copied), or an owning
/// dense_rows (Eigen expressions, forward-only ranges, evaluated once).
/// \pre `x` outlives the returned reader unless the reader owns its data.
/// \throws std::bad_alloc when an owning copy cannot be allocated; whatever
///         a user hook or adapter throws (e.g. std::invalid_argument for a
///         wrong rank from the xtensor and torch adapters).
inline constexpr detail::as_matrix_impl::fn as_matrix{};
/// \brief `qkgeom::as_indices(v)`: the IndexReader of an integer vector.
///
/// Called as `as_indices(v)` with `v` an IndexVector. Returns `v` itself when
/// it already is an IndexReader, a user hook's result, an index_view over a
/// contiguous sized range (in place), or an owning dense_indices (Eigen
/// vectors, other ranges; elements converted to int64).
/// \pre `v` outlives the returned reader unless the reader owns its data.
/// \throws std::bad_alloc when an owning copy cannot be allocated; whatever
///         a user hook or adapter throws.
inline constexpr detail::as_indices_impl::fn as_indices{};
}  // namespace cpo

}  // namespace qkgeom
