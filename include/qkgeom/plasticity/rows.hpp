// qkgeom — the rows attention plasticity works on (internal): the head's keys
// widened to double, in the original basis and rotated (k̃ = H k, method §4),
// and its queries grouped by bucket for the empirical cross-check, with the
// value ranges that decide whether single-precision scores can be certified
// (method §9.14).
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/simd/sse2.hpp>

#include <Eigen/Core>

#include <cstdint>
#include <limits>
#include <map>
#include <vector>

namespace qkgeom::detail {

/// Row-major double rows (one token per row).
using row_block = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Query rows of one bucket (original basis), for the empirical cross-check.
using query_rows = row_block;

/// Whether single-precision scores of these rows can be certified: every
/// nonzero |x| ≥ 2⁻¹²⁶ (f32 rounding is then relative) and
/// d·max|q|·max|k| ≤ 2¹²⁶ (no partial sum overflows). Otherwise every
/// comparison goes to the double-precision fallback.
struct f32_range {
    double min_nonzero = std::numeric_limits<double>::infinity();
    double max_abs = 0.0;
    /// Folds in n finite values (validated by the caller).
    void add(double const* p, index_t count) noexcept { sse2::abs_range(p, count, min_nonzero, max_abs); }
};
inline bool f32_certifiable(f32_range const& q, f32_range const& k, index_t d) {
    return q.min_nonzero >= 0x1p-126 && k.min_nonzero >= 0x1p-126 &&
           double(d) * q.max_abs * k.max_abs <= 0x1p126;
}

/// The keys of one head, rotated (k̃ = H k) and in the original basis, with
/// their integer annotations.
struct key_store {
    index_t d = 0;
    row_block rot, orig;
    std::vector<std::int64_t> position, bucket, example;
    f32_range range;  ///< of `orig`, folded into the read when the empirical check will run
};

/// The query rows of a head by bucket, and their range.
struct query_store {
    std::map<std::int64_t, query_rows> by_bucket;
    f32_range range;
    std::int64_t max_position = -1;
};

}  // namespace qkgeom::detail
