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
}  // namespace detail

}  // namespace qkgeom
