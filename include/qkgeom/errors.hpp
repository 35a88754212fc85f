// qkgeom — error types and the checked-precondition helpers (STYLE: errors, three tiers).
#pragma once

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace qkgeom {

/// \brief Bad input data: a file, stream or array whose content violates the
/// contract. Carries the source (file name or stream label), the field and the
/// offending value so that callers can report them separately.
class input_error : public std::invalid_argument {
public:
    /// \brief Builds the error from its parts.
    /// \param[in] source the file name or stream label the bad data came from.
    /// \param[in] field the offending field (header key, array name, …).
    /// \param[in] value the offending value, as text.
    /// \param[in] what the complete message returned by `what()`.
    /// \throws std::bad_alloc if copying a string fails.
    input_error(std::string source, std::string field, std::string value, std::string const& what)
        : std::invalid_argument(what), source_(std::move(source)), field_(std::move(field)),
          value_(std::move(value)) {}
    /// \returns the file name or stream label the bad data came from.
    [[nodiscard]] std::string const& source() const noexcept { return source_; }
    /// \returns the name of the offending field.
    [[nodiscard]] std::string const& field() const noexcept { return field_; }
    /// \returns the offending value, as text.
    [[nodiscard]] std::string const& value() const noexcept { return value_; }

private:
    std::string source_, field_, value_;
};

namespace detail {

template <class T>
std::string to_text(T const& v) {
    std::ostringstream os;
    os.precision(17);
    os << v;
    return os.str();
}

/// Throws `input_error` with a message of the form
/// "<where>: <field>: <problem> (value <value>)".
template <class V>
[[noreturn]] void fail_input(std::string_view where, std::string_view field, V const& value,
                             std::string_view problem) {
    std::string v = to_text(value);
    std::string msg;
    msg.append(where).append(": ").append(field).append(": ").append(problem);
    msg.append(" (value ").append(v).append(")");
    throw input_error(std::string(where), std::string(field), std::move(v), msg);
}

/// Throws `std::invalid_argument` naming the function and the value (Boost style).
template <class V>
[[noreturn]] void fail_arg(std::string_view function, std::string_view what, V const& value) {
    std::string msg;
    msg.append(function).append(": ").append(what).append(" (value ").append(to_text(value)).append(")");
    throw std::invalid_argument(msg);
}

}  // namespace detail
}  // namespace qkgeom
