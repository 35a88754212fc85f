// qkgeom — the status of a numerical step in a result (STYLE: status in
// results, not aborts; modelled on Eigen's ComputationInfo).
#pragma once

#include <cstdint>

namespace qkgeom {

/// \brief Outcome of a decomposition inside an analysis. Results that rely
/// on one carry it; anything but `success` leaves the dependent fields NaN.
enum class decomposition_status : std::uint8_t {
    success = 0,        ///< computed (or nothing needed computing)
    no_convergence = 1, ///< the eigensolver did not converge (Eigen::NoConvergence)
    invalid_input = 2,  ///< the matrix holds NaN/Inf (Eigen::InvalidInput)
};

/// \brief Name of a status, as written in reports: "success", "no_convergence", "invalid_input".
/// \param[in] s the status
/// \returns a static string
constexpr const char* decomposition_status_name(decomposition_status s) noexcept {
    switch (s) {
        case decomposition_status::success: return "success";
        case decomposition_status::no_convergence: return "no_convergence";
        case decomposition_status::invalid_input: return "invalid_input";
    }
    return "unknown";
}

namespace detail {
/// Maps Eigen's ComputationInfo (0 Success, 2 NoConvergence, 3 InvalidInput).
template <class Info>
constexpr decomposition_status status_of(Info info) noexcept {
    switch (static_cast<int>(info)) {
        case 0: return decomposition_status::success;
        case 2: return decomposition_status::no_convergence;
        default: return decomposition_status::invalid_input;
    }
}
}  // namespace detail

}  // namespace qkgeom
