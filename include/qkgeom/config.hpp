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

namespace detail {
/// Quiet NaN: the value of an undefined statistic (documented per field).
inline constexpr double nan = std::numeric_limits<double>::quiet_NaN();
}  // namespace detail

}  // namespace qkgeom
