// qkgeom — pairwise preference and pairwise plasticity of the Gaussian
// closed form (SPEC §5; thesis eqs. 4.13–4.14), accurate in the tails.
//
//   p(z)  = Φ(z)
//   PP(z) = 4 p (1 − p) = 4 Φ(−|z|) (1 − Φ(−|z|)),  Φ(−|z|) = erfc(|z|/√2) / 2
//
// Φ(−|z|) ≤ 1/2 is computed directly by erfc, so nothing cancels: PP keeps
// full relative accuracy (≈ 1e-15) wherever Φ(−|z|) is a normal double,
// i.e. for |z| up to ≈ 37.5, and then underflows gracefully through the
// subnormals to exactly 0 (|z| ≳ 38.6).
#pragma once

#include <cmath>
#include <span>

#include <qkgeom/errors.hpp>

namespace qkgeom {

namespace detail {
inline constexpr double inv_sqrt2 = 0.70710678118654752440084436210484903928;  // 1/√2
}  // namespace detail

/// \brief Upper-tail Φ(−|z|) = erfc(|z|/√2)/2, without cancellation.
[[nodiscard]] inline double normal_tail(double z) noexcept {
    return 0.5 * std::erfc(std::abs(z) * detail::inv_sqrt2);
}

/// \brief p(z) = Φ(z): probability that key i beats key j (SPEC §5).
/// Accurate relative to p for every z (small p are not lost to 1 − tail).
[[nodiscard]] inline double preference_probability(double z) noexcept {
    return 0.5 * std::erfc(-z * detail::inv_sqrt2);
}

/// \brief PP(z) = 4 p (1 − p) computed as 4 Φ(−|z|)(1 − Φ(−|z|)) (SPEC §5).
/// NaN in, NaN out; PP(0) = 1; PP(±∞) = 0.
[[nodiscard]] inline double pairwise_plasticity(double z) noexcept {
    double const t = normal_tail(z);
    return 4.0 * t * (1.0 - t);
}

/// \brief Element-wise PP over arrays (a loop the compiler may vectorise).
/// \throws std::invalid_argument when the spans differ in length.
inline void pairwise_plasticity(std::span<double const> z, std::span<double> out) {
    if (z.size() != out.size())
        detail::fail_arg("qkgeom::pairwise_plasticity", "output length differs from input length; output length",
                         out.size());
    for (std::size_t i = 0; i < z.size(); ++i) out[i] = pairwise_plasticity(z[i]);
}

}  // namespace qkgeom
