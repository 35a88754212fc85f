// qkgeom — configuration and version.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#define QKGEOM_VERSION_MAJOR 0
#define QKGEOM_VERSION_MINOR 1
#define QKGEOM_VERSION_PATCH 0
#define QKGEOM_VERSION_STRING "0.1.0"

namespace qkgeom {

/// \brief Signed index type used for row/column counts and strides
/// (Eigen's `Index` is also `std::ptrdiff_t`).
using index_t = std::ptrdiff_t;

/// \brief Which side of attention a row belongs to (method §0).
enum class kind : std::uint8_t { query = 0, key = 1 };

/// \brief Short name of a kind, as used in the dataset layout.
/// \param[in] k the kind.
/// \returns `"q"` for kind::query, `"k"` for kind::key (a static string).
constexpr const char* kind_name(kind k) noexcept { return k == kind::query ? "q" : "k"; }

/// \brief The input limit of every analysis (method §9.18): each row value x
/// must satisfy |x| < 2¹²⁸ (≈ 3.4e38, just above the float32 range, so every
/// float32/bf16/f16 capture passes). Larger values are rejected where rows
/// enter an analysis: the plasticity variances are quartic in the values and
/// would overflow double (one value ≥ ~1e154 turned a head's AP into 0).
inline constexpr double input_limit = 0x1p128;

namespace detail {
/// Quiet NaN: the value of an undefined statistic (documented per field).
inline constexpr double nan = std::numeric_limits<double>::quiet_NaN();

/// `T`, named through the template parameter `V` of an "instantiated on use"
/// function (`template <class V = void>`): an expression whose type is
/// `dep_t<T, V>` is dependent, so the compiler instantiates the Eigen and
/// standard-library templates it uses only when the function itself is
/// instantiated, not in every translation unit that includes the header.
/// Compile cost only: the type is `T` (docs/architecture.md, compile cost).
template <class T, class V>
struct dep {
    using type = T;  ///< always T
};
/// `dep<T, V>::type`, i.e. T (see `dep`).
template <class T, class V>
using dep_t = typename dep<T, V>::type;
/// `x` itself, as an expression that depends on `V` (see `dep`): members
/// reached through it are instantiated on use.
/// \param[in] x any object.
/// \returns x.
template <class V, class T>
constexpr T& dep_ref(T& x) noexcept {
    return x;
}

/// Asks the cache for the `bytes` bytes at `p` (every 64-byte line; no
/// effect on results). For rows read in an order the hardware prefetchers
/// do not follow (a key pair's two rows, the next group's keys).
/// \param[in] p     any address (it is never dereferenced).
/// \param[in] bytes the length from p.
inline void prefetch_bytes(void const* p, std::size_t bytes) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    char const* c = static_cast<char const*>(p);
    for (std::size_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b);
#else
    (void)p, (void)bytes;
#endif
}
}  // namespace detail

}  // namespace qkgeom
