// qkgeom — results as bytes and back, for processes that share the work of
// one run (the program under mpirun, docs/scale.md): a value of any result
// type (head_analysis and everything in it) written field by field into a
// byte string and read back bit for bit.
//
//   std::string b = qkgeom::to_bytes(head);              // head_analysis
//   auto back = qkgeom::from_bytes<qkgeom::head_analysis>(b);
//
// What it covers: numbers and enumerations (their bytes as they are: NaN
// payloads and signed zeros survive), std::string, std::vector, std::array,
// Eigen matrices and vectors, and aggregates (plain structs with public
// fields: every result type of the library), field by field in declaration
// order. Fields are found by the language, not by a list kept by hand, so a
// field added to a result type travels without a change here; a type with
// more than 32 fields or anything else fails to compile, never to copy.
//
// The bytes are for processes of one run on machines of one architecture
// (the byte order and the sizes of the number types are the sender's): not a
// file format. Reading checks every length against the bytes that are left
// and throws qkgeom::input_error naming the field's byte offset, so short or
// foreign bytes never turn into a plausible value.
#pragma once

#include <qkgeom/core/errors.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkgeom {

namespace detail::bytes {

/// Converts to any field type (unevaluated only): counts an aggregate's fields.
struct any_field {
    template <class U>
    operator U() const;  // NOLINT(google-explicit-constructor): the point
};

template <class T, std::size_t... I>
constexpr bool brace_initialisable(std::index_sequence<I...>) {
    return requires { T{(static_cast<void>(I), any_field{})...}; };
}

/// The number of fields of an aggregate T: the most initialisers T{...} takes.
template <class T, std::size_t N = 0>
constexpr std::size_t field_count() {
    if constexpr (N < 33 && brace_initialisable<T>(std::make_index_sequence<N + 1>{}))
        return field_count<T, N + 1>();
    else
        return N;
}

template <class F, class... A>
void each(F& fn, A&... a) {
    (fn(a), ...);
}

/// Calls fn on every field of the aggregate x, in declaration order. A wrong
/// count cannot slip through: a structured binding must name every field.
template <class T, class F>
void for_each_field(T& x, F& fn) {
    constexpr std::size_t N = field_count<std::remove_const_t<T>>();
    static_assert(N >= 1 && N <= 32, "qkgeom::to_bytes: aggregate with 0 or more than 32 fields");
    // clang-format off
    if constexpr (N == 1) { auto& [a0] = x; each(fn, a0); }
    else if constexpr (N == 2) { auto& [a0, a1] = x; each(fn, a0, a1); }
    else if constexpr (N == 3) { auto& [a0, a1, a2] = x; each(fn, a0, a1, a2); }
    else if constexpr (N == 4) { auto& [a0, a1, a2, a3] = x; each(fn, a0, a1, a2, a3); }
    else if constexpr (N == 5) { auto& [a0, a1, a2, a3, a4] = x; each(fn, a0, a1, a2, a3, a4); }
    else if constexpr (N == 6) { auto& [a0, a1, a2, a3, a4, a5] = x; each(fn, a0, a1, a2, a3, a4, a5); }
    else if constexpr (N == 7) { auto& [a0, a1, a2, a3, a4, a5, a6] = x; each(fn, a0, a1, a2, a3, a4, a5, a6); }
    else if constexpr (N == 8) { auto& [a0, a1, a2, a3, a4, a5, a6, a7] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7); }
    else if constexpr (N == 9) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8); }
    else if constexpr (N == 10) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9); }
    else if constexpr (N == 11) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0); }
    else if constexpr (N == 12) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1); }
    else if constexpr (N == 13) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2); }
    else if constexpr (N == 14) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3); }
    else if constexpr (N == 15) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4); }
    else if constexpr (N == 16) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5); }
    else if constexpr (N == 17) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6); }
    else if constexpr (N == 18) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7); }
    else if constexpr (N == 19) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8); }
    else if constexpr (N == 20) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9); }
    else if constexpr (N == 21) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0); }
    else if constexpr (N == 22) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1); }
    else if constexpr (N == 23) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2); }
    else if constexpr (N == 24) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3); }
    else if constexpr (N == 25) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4); }
    else if constexpr (N == 26) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5); }
    else if constexpr (N == 27) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6); }
    else if constexpr (N == 28) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7); }
    else if constexpr (N == 29) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7, c8] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7, c8); }
    else if constexpr (N == 30) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9); }
    else if constexpr (N == 31) { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, d0] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, d0); }
    else { auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, d0, d1] = x; each(fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, d0, d1); }
    // clang-format on
}

template <class T>
struct is_std_vector : std::false_type {};
template <class T, class A>
struct is_std_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_std_array : std::false_type {};
template <class T, std::size_t N>
struct is_std_array<std::array<T, N>> : std::true_type {};
template <class T>
struct is_eigen_matrix : std::false_type {};
template <class S, int R, int C, int O, int MR, int MC>
struct is_eigen_matrix<Eigen::Matrix<S, R, C, O, MR, MC>> : std::true_type {};

template <class T>
inline constexpr bool is_number = std::is_arithmetic_v<T> || std::is_enum_v<T>;

/// Appends values to a byte string.
struct writer {
    std::string out;

    void raw(void const* p, std::size_t n) { out.append(static_cast<char const*>(p), n); }
    void size(std::size_t n) {
        auto const v = static_cast<std::uint64_t>(n);
        raw(&v, sizeof v);
    }

    template <class T>
    void operator()(T const& x) {
        if constexpr (is_number<T>) {
            raw(&x, sizeof x);
        } else if constexpr (std::is_same_v<T, std::string>) {
            size(x.size());
            raw(x.data(), x.size());
        } else if constexpr (is_std_vector<T>::value) {
            static_assert(!std::is_same_v<typename T::value_type, bool>, "qkgeom::to_bytes: std::vector<bool>");
            size(x.size());
            if constexpr (is_number<typename T::value_type>)
                raw(x.data(), x.size() * sizeof(typename T::value_type));
            else
                for (auto const& e : x) (*this)(e);
        } else if constexpr (is_std_array<T>::value) {
            for (auto const& e : x) (*this)(e);
        } else if constexpr (is_eigen_matrix<T>::value) {
            static_assert(is_number<typename T::Scalar>, "qkgeom::to_bytes: Eigen matrix of non-numbers");
            size(static_cast<std::size_t>(x.rows()));
            size(static_cast<std::size_t>(x.cols()));
            raw(x.data(), static_cast<std::size_t>(x.size()) * sizeof(typename T::Scalar));
        } else {
            static_assert(std::is_aggregate_v<T>, "qkgeom::to_bytes: a type that is neither a number, string, "
                                                  "vector, array, Eigen matrix nor an aggregate");
            for_each_field(x, *this);
        }
    }
};

/// Reads values back from a byte string, checking every length.
struct reader {
    std::string_view in;
    std::size_t at = 0;

    [[noreturn]] void short_of(std::size_t need) const {
        throw input_error("bytes", "offset", std::to_string(at),
                          "qkgeom::from_bytes: " + std::to_string(need) + " byte(s) needed at offset " +
                              std::to_string(at) + " of " + std::to_string(in.size()) +
                              " (truncated or not written by to_bytes of this type)");
    }
    void raw(void* p, std::size_t n) {
        if (n > in.size() - at) short_of(n);
        if (n > 0) std::memcpy(p, in.data() + at, n);
        at += n;
    }
    /// A count of elements of `elem` bytes each (each element at least one
    /// byte on the wire), checked against the bytes left before anything is
    /// allocated.
    std::size_t count(std::size_t elem) {
        std::uint64_t v = 0;
        raw(&v, sizeof v);
        std::size_t const left = in.size() - at;
        if (v > left / std::max<std::size_t>(elem, 1)) short_of(static_cast<std::size_t>(v));
        return static_cast<std::size_t>(v);
    }

    template <class T>
    void operator()(T& x) {
        if constexpr (is_number<T>) {
            raw(&x, sizeof x);
        } else if constexpr (std::is_same_v<T, std::string>) {
            x.resize(count(1));
            raw(x.data(), x.size());
        } else if constexpr (is_std_vector<T>::value) {
            using E = typename T::value_type;
            if constexpr (is_number<E>) {
                x.resize(count(sizeof(E)));
                raw(x.data(), x.size() * sizeof(E));
            } else {
                x.resize(count(1));
                for (auto& e : x) (*this)(e);
            }
        } else if constexpr (is_std_array<T>::value) {
            for (auto& e : x) (*this)(e);
        } else if constexpr (is_eigen_matrix<T>::value) {
            using S = typename T::Scalar;
            std::size_t const r = count(0), c = count(0);
            if (c != 0 && r > (in.size() - at) / sizeof(S) / c) short_of(r * sizeof(S));
            bool const fits = (T::RowsAtCompileTime == Eigen::Dynamic || std::size_t(T::RowsAtCompileTime) == r) &&
                              (T::ColsAtCompileTime == Eigen::Dynamic || std::size_t(T::ColsAtCompileTime) == c);
            if (!fits)
                throw input_error("bytes", "offset", std::to_string(at),
                                  "qkgeom::from_bytes: a " + std::to_string(r) + " x " + std::to_string(c) +
                                      " matrix where the type has a fixed shape");
            x.resize(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c));
            raw(x.data(), r * c * sizeof(S));
        } else {
            for_each_field(x, *this);
        }
    }
};

}  // namespace detail::bytes

/// \brief The bytes of a result value (docs/scale.md#results-as-bytes):
/// every field, in declaration order, for `from_bytes` of the same type in a
/// process of the same build and architecture.
/// \tparam T a number, std::string, std::vector, std::array, Eigen matrix, or
///           an aggregate of those (every result type, e.g. head_analysis).
/// \param[in] x the value.
/// \returns the bytes.
/// \throws std::bad_alloc if the string cannot be allocated.
template <class T>
[[nodiscard]] std::string to_bytes(T const& x) {
    detail::bytes::writer w;
    w(x);
    return std::move(w.out);
}

/// \brief A value back from `to_bytes`, bit for bit.
/// \param[in] b the bytes (all of them: bytes left over are an error).
/// \returns the value.
/// \throws qkgeom::input_error (source "bytes", field "offset") when the
///         bytes end early, declare a length beyond their end, or have bytes
///         left over.
template <class T>
[[nodiscard]] T from_bytes(std::string_view b) {
    detail::bytes::reader r{b, 0};
    T x{};
    r(x);
    if (r.at != b.size())
        throw input_error("bytes", "offset", std::to_string(r.at),
                          "qkgeom::from_bytes: " + std::to_string(b.size() - r.at) +
                              " byte(s) left over after the value (bytes of another type?)");
    return x;
}

}  // namespace qkgeom
