// qkgeom — error types and the checked-precondition helpers (STYLE: errors, three tiers).
#pragma once

#include <cmath>
#include <cstdint>
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

/// \brief An operating-system failure while writing output (a file or
/// directory cannot be created, written, flushed or renamed into place), or a
/// library failure while producing it (zlib). Reading problems are
/// `input_error`s instead: an input that cannot be read is bad input.
class io_error : public std::runtime_error {
public:
    /// \brief Builds the error.
    /// \param[in] path the file or directory concerned.
    /// \param[in] what the complete message returned by `what()`.
    /// \throws std::bad_alloc if copying a string fails.
    io_error(std::string path, std::string const& what) : std::runtime_error(what), path_(std::move(path)) {}
    /// \returns the file or directory concerned.
    [[nodiscard]] std::string const& path() const noexcept { return path_; }

private:
    std::string path_;
};

/// \brief Text safe to quote in a one-line message: control characters
/// (bytes < 0x20 and 0x7F) become `\r`, `\n`, `\t` or `\xNN`, and bytes that
/// are not part of a valid UTF-8 sequence become `\xNN`; everything else
/// (valid UTF-8 included; backslashes too) is kept as it is. Used wherever a
/// message quotes bytes read from a file.
/// \param[in] s the bytes.
/// \returns the escaped text.
/// \throws std::bad_alloc if the result cannot be allocated.
inline std::string escape_text(std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(s.size());
    auto put_hex = [&](unsigned char c) {
        out += "\\x";
        out.push_back(hex[c >> 4]);
        out.push_back(hex[c & 0xF]);
    };
    for (std::size_t i = 0; i < s.size();) {
        auto const c = static_cast<unsigned char>(s[i]);
        if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7F) put_hex(c);
        else if (c < 0x80) out.push_back(static_cast<char>(c));
        else {
            // length and minimum code point of a UTF-8 sequence starting with c
            std::size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
            bool ok = n != 0 && s.size() - i >= n;
            std::uint32_t cp = n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
            for (std::size_t k = 1; ok && k < n; ++k) {
                auto const b = static_cast<unsigned char>(s[i + k]);
                ok = (b & 0xC0u) == 0x80u;
                cp = (cp << 6) | (b & 0x3Fu);
            }
            std::uint32_t const min = n == 2 ? 0x80u : n == 3 ? 0x800u : 0x10000u;
            if (ok && (cp < min || cp > 0x10FFFFu || (cp >= 0xD800u && cp <= 0xDFFFu))) ok = false;
            if (!ok) {
                put_hex(c);
                ++i;
                continue;
            }
            out.append(s.substr(i, n));
            i += n;
            continue;
        }
        ++i;
    }
    return out;
}

namespace detail {

template <class T>
std::string to_text(T const& v) {
    std::ostringstream os;
    os.precision(17);
    os << v;
    return os.str();
}

/// Throws `input_error` with a message of the form
/// "<where>: <field>: <problem> (value <value>)". Every part is passed
/// through escape_text (file data never reaches a message raw); the
/// accessors return the value unescaped.
template <class V>
[[noreturn]] void fail_input(std::string_view where, std::string_view field, V const& value,
                             std::string_view problem) {
    std::string v = to_text(value);
    std::string msg;
    msg.append(escape_text(where)).append(": ").append(escape_text(field)).append(": ").append(escape_text(problem));
    msg.append(" (value ").append(escape_text(v)).append(")");
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
