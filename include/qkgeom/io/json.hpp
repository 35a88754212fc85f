// qkgeom — a small, strict JSON (RFC 8259) parser and writer.
//
// Used for safetensors headers and the dataset manifest.json. Strict means:
// exactly one value with optional surrounding whitespace; no comments, no
// trailing commas, no leading zeros, no NaN/Infinity; strings must be valid
// UTF-8 without raw control characters; \uXXXX escapes (surrogate pairs
// combined, lone surrogates rejected); duplicate object keys rejected;
// nesting depth limited (default 64). Numbers without fraction/exponent that
// fit in int64 are integers, every other number is a double.
//
// Every parse error is a qkgeom::input_error with field "json" and the byte
// offset as value: "<source>: json: <problem> (value byte 17)".
#pragma once

#include <qkgeom/core/errors.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

namespace qkgeom::json {

class value;
/// JSON array.
using array = std::vector<value>;
/// JSON object: members in document order. parse() guarantees unique keys;
/// an object built in code is checked by dump(), which refuses duplicates.
using object = std::vector<std::pair<std::string, value>>;

/// \brief A JSON value: null, bool, int64, double, string, array or object.
class value {
public:
    using storage = std::variant<std::nullptr_t, bool, std::int64_t, double, std::string, array, object>;

    /// \name Construction
    /// Implicit from each alternative: null, bool, int / int64 (integer),
    /// double (number), string (C strings are copied: may throw
    /// std::bad_alloc), array, object. The default is null.
    ///@{
    value() noexcept : v_(nullptr) {}
    value(std::nullptr_t) noexcept : v_(nullptr) {}
    value(bool b) noexcept : v_(b) {}
    value(int i) noexcept : v_(static_cast<std::int64_t>(i)) {}
    value(std::int64_t i) noexcept : v_(i) {}
    value(double d) noexcept : v_(d) {}
    value(char const* s) : v_(std::string(s)) {}
    value(std::string s) noexcept : v_(std::move(s)) {}
    value(array a) noexcept : v_(std::move(a)) {}
    value(object o) noexcept : v_(std::move(o)) {}
    ///@}

    /// \name Type tests
    /// \returns true when the value holds that alternative (is_number: int or double).
    ///@{
    [[nodiscard]] bool is_null() const noexcept { return std::holds_alternative<std::nullptr_t>(v_); }
    [[nodiscard]] bool is_bool() const noexcept { return std::holds_alternative<bool>(v_); }
    [[nodiscard]] bool is_int() const noexcept { return std::holds_alternative<std::int64_t>(v_); }
    [[nodiscard]] bool is_double() const noexcept { return std::holds_alternative<double>(v_); }
    [[nodiscard]] bool is_number() const noexcept { return is_int() || is_double(); }
    [[nodiscard]] bool is_string() const noexcept { return std::holds_alternative<std::string>(v_); }
    [[nodiscard]] bool is_array() const noexcept { return std::holds_alternative<array>(v_); }
    [[nodiscard]] bool is_object() const noexcept { return std::holds_alternative<object>(v_); }
    ///@}

    /// \name Typed access
    /// \pre the value holds that alternative (test with is_*() first).
    /// \returns the held value (a reference for string, array and object).
    /// \throws std::bad_variant_access when the type differs.
    ///@{
    [[nodiscard]] bool as_bool() const { return std::get<bool>(v_); }
    [[nodiscard]] std::int64_t as_int() const { return std::get<std::int64_t>(v_); }
    /// \brief A number as double (an int is converted, rounding beyond 2^53).
    /// \throws std::bad_variant_access when the value is not a number.
    [[nodiscard]] double as_double() const {
        return is_int() ? static_cast<double>(std::get<std::int64_t>(v_)) : std::get<double>(v_);
    }
    [[nodiscard]] std::string const& as_string() const { return std::get<std::string>(v_); }
    [[nodiscard]] array const& as_array() const { return std::get<array>(v_); }
    [[nodiscard]] object const& as_object() const { return std::get<object>(v_); }
    [[nodiscard]] array& as_array() { return std::get<array>(v_); }
    [[nodiscard]] object& as_object() { return std::get<object>(v_); }
    ///@}

    /// \brief Member of an object by key (linear search).
    /// \param[in] key the key.
    /// \returns the first member with that key, or nullptr (also when this is
    ///          not an object).
    [[nodiscard]] value const* find(std::string_view key) const noexcept {
        if (auto const* o = std::get_if<object>(&v_))
            for (auto const& [k, v] : *o)
                if (k == key) return &v;
        return nullptr;
    }

    /// \brief Short name of the type, for messages.
    /// \returns "null", "bool", "integer", "number" (double), "string", "array" or "object".
    [[nodiscard]] std::string_view type_name() const noexcept {
        static constexpr std::string_view names[] = {"null", "bool", "integer", "number", "string", "array", "object"};
        return names[v_.index()];
    }

    /// \returns the underlying variant (for std::visit).
    [[nodiscard]] storage const& get() const noexcept { return v_; }

private:
    storage v_;
};

namespace detail {

class parser {
public:
    parser(std::string_view text, std::string_view source, int max_depth)
        : s_(text), src_(source), max_depth_(max_depth) {}

    value run() {
        if (s_.starts_with("\xEF\xBB\xBF"))
            fail_at(0, "starts with a UTF-8 byte-order mark (BOM), which JSON does not allow; save the file without BOM");
        skip_ws();
        value v = parse_value(0);
        skip_ws();
        if (pos_ != s_.size()) fail("unexpected content after the JSON value");
        return v;
    }

private:
    [[noreturn]] void fail(std::string_view problem) const { fail_at(pos_, problem); }
    [[noreturn]] void fail_at(std::size_t at, std::string_view problem) const {
        qkgeom::detail::fail_input(src_, "json", "byte " + std::to_string(at), problem);
    }

    void skip_ws() noexcept {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
            ++pos_;
    }

    bool consume(std::string_view lit) noexcept {
        if (s_.substr(pos_, lit.size()) == lit) {
            pos_ += lit.size();
            return true;
        }
        return false;
    }

    value parse_value(int depth) {
        if (pos_ >= s_.size()) fail("unexpected end of input, expected a value");
        char const c = s_[pos_];
        switch (c) {
            case '{': return parse_object(depth + 1);
            case '[': return parse_array(depth + 1);
            case '"': return value(parse_string());
            case 't':
                if (consume("true")) return value(true);
                break;
            case 'f':
                if (consume("false")) return value(false);
                break;
            case 'n':
                if (consume("null")) return value(nullptr);
                break;
            default:
                if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        }
        fail("invalid value");
    }

    void check_depth(int depth) const {
        if (depth > max_depth_) fail("nesting deeper than the limit of " + std::to_string(max_depth_));
    }

    /// Duplicate keys of the object just parsed (its key offsets are
    /// key_at_[first..]): sorted once, O(n log n) (a linear search per key was
    /// quadratic: a 300,000-key manifest took minutes). Reports the later
    /// occurrence in document order, then drops the object's offsets.
    void check_unique_keys(object const& o, std::size_t first) {
        std::vector<std::size_t> idx(o.size());
        for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return o[a].first < o[b].first; });
        std::size_t dup = o.size();
        for (std::size_t i = 1; i < idx.size(); ++i)
            if (o[idx[i]].first == o[idx[i - 1]].first) dup = std::min(dup, idx[i]);
        if (dup < o.size()) fail_at(key_at_[first + dup], "duplicate object key \"" + o[dup].first + "\"");
        key_at_.resize(first);
    }

    value parse_object(int depth) {
        check_depth(depth);
        ++pos_;  // '{'
        object o;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '}') {
            ++pos_;
            return value(std::move(o));
        }
        std::size_t const first_key = key_at_.size();  // this object's keys start here (nested ones follow)
        for (;;) {
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key in object");
            std::size_t const key_at = pos_;
            std::string key = parse_string();
            key_at_.push_back(key_at);
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != ':') fail("expected ':' after object key");
            ++pos_;
            skip_ws();
            value v = parse_value(depth);
            o.emplace_back(std::move(key), std::move(v));
            skip_ws();
            if (pos_ >= s_.size()) fail("unexpected end of input in object");
            if (s_[pos_] == ',') {
                ++pos_;
                continue;
            }
            if (s_[pos_] == '}') {
                ++pos_;
                check_unique_keys(o, first_key);
                return value(std::move(o));
            }
            fail("expected ',' or '}' in object");
        }
    }

    value parse_array(int depth) {
        check_depth(depth);
        ++pos_;  // '['
        array a;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ']') {
            ++pos_;
            return value(std::move(a));
        }
        for (;;) {
            skip_ws();
            a.push_back(parse_value(depth));
            skip_ws();
            if (pos_ >= s_.size()) fail("unexpected end of input in array");
            if (s_[pos_] == ',') {
                ++pos_;
                continue;
            }
            if (s_[pos_] == ']') {
                ++pos_;
                return value(std::move(a));
            }
            fail("expected ',' or ']' in array");
        }
    }

    unsigned hex4() {
        if (s_.size() - pos_ < 4) fail("truncated \\u escape");
        unsigned v = 0;
        for (int i = 0; i < 4; ++i) {
            char const c = s_[pos_++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
            else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
            else fail("invalid hex digit in \\u escape");
        }
        return v;
    }

    static void put_utf8(std::string& out, std::uint32_t cp) {
        if (cp < 0x80) {
            out.push_back(static_cast<char>(cp));
        } else if (cp < 0x800) {
            out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else if (cp < 0x10000) {
            out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else {
            out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
    }

    /// Copies one raw UTF-8 sequence starting at pos_ (validated: no overlongs,
    /// no surrogates, <= U+10FFFF).
    void copy_utf8(std::string& out) {
        auto const b0 = static_cast<unsigned char>(s_[pos_]);
        int n = 0;
        std::uint32_t cp = 0, min = 0;
        if (b0 >= 0xC2 && b0 <= 0xDF) n = 1, cp = b0 & 0x1Fu, min = 0x80;
        else if (b0 >= 0xE0 && b0 <= 0xEF) n = 2, cp = b0 & 0x0Fu, min = 0x800;
        else if (b0 >= 0xF0 && b0 <= 0xF4) n = 3, cp = b0 & 0x07u, min = 0x10000;
        else fail("invalid UTF-8 byte in string");
        if (s_.size() - pos_ <= static_cast<std::size_t>(n)) fail("truncated UTF-8 sequence in string");
        for (int i = 1; i <= n; ++i) {
            auto const b = static_cast<unsigned char>(s_[pos_ + static_cast<std::size_t>(i)]);
            if ((b & 0xC0u) != 0x80u) fail("invalid UTF-8 continuation byte in string");
            cp = (cp << 6) | (b & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("invalid UTF-8 sequence in string");
        out.append(s_.substr(pos_, static_cast<std::size_t>(n) + 1));
        pos_ += static_cast<std::size_t>(n) + 1;
    }

    std::string parse_string() {
        ++pos_;  // opening quote
        std::string out;
        for (;;) {
            if (pos_ >= s_.size()) fail("unterminated string");
            auto const c = static_cast<unsigned char>(s_[pos_]);
            if (c == '"') {
                ++pos_;
                return out;
            }
            if (c < 0x20) fail("raw control character in string");
            if (c >= 0x80) {
                copy_utf8(out);
                continue;
            }
            if (c != '\\') {
                out.push_back(static_cast<char>(c));
                ++pos_;
                continue;
            }
            ++pos_;
            if (pos_ >= s_.size()) fail("unterminated escape in string");
            char const e = s_[pos_++];
            switch (e) {
                case '"': out.push_back('"'); break;
                case '\\': out.push_back('\\'); break;
                case '/': out.push_back('/'); break;
                case 'b': out.push_back('\b'); break;
                case 'f': out.push_back('\f'); break;
                case 'n': out.push_back('\n'); break;
                case 'r': out.push_back('\r'); break;
                case 't': out.push_back('\t'); break;
                case 'u': {
                    std::uint32_t cp = hex4();
                    if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in \\u escape");
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (!consume("\\u")) fail("high surrogate not followed by a \\u low surrogate");
                        std::uint32_t const lo = hex4();
                        if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate not followed by a low surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    put_utf8(out, cp);
                    break;
                }
                default: --pos_; fail("invalid escape character in string");
            }
        }
    }

    value parse_number() {
        std::size_t const start = pos_;
        auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
        if (s_[pos_] == '-') ++pos_;
        if (!digit()) fail("expected a digit in number");
        if (s_[pos_] == '0') {
            ++pos_;
            if (digit()) fail_at(start, "leading zero in number");
        } else {
            while (digit()) ++pos_;
        }
        bool integral = true;
        if (pos_ < s_.size() && s_[pos_] == '.') {
            integral = false;
            ++pos_;
            if (!digit()) fail("expected a digit after the decimal point");
            while (digit()) ++pos_;
        }
        if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
            integral = false;
            ++pos_;
            if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
            if (!digit()) fail("expected a digit in the exponent");
            while (digit()) ++pos_;
        }
        char const* first = s_.data() + start;
        char const* last = s_.data() + pos_;
        if (integral) {
            std::int64_t i = 0;
            auto const r = std::from_chars(first, last, i);
            if (r.ec == std::errc() && r.ptr == last) return value(i);
            // out of int64 range: fall through to double
        }
        double d = 0;
        auto const r = std::from_chars(first, last, d);
        if (r.ec == std::errc::result_out_of_range) {
            // underflow to zero is harmless; overflow is not representable
            bool const neg = s_[start] == '-';
            std::size_t const e = std::string_view(first, static_cast<std::size_t>(last - first)).find_first_of("eE");
            bool const neg_exp = e != std::string_view::npos && first[e + 1] == '-';
            if (neg_exp) return value(neg ? -0.0 : 0.0);
            fail_at(start, "number out of the range of a double");
        }
        if (r.ec != std::errc() || r.ptr != last) fail_at(start, "invalid number");
        return value(d);
    }

    std::string_view s_;
    std::string_view src_;
    int max_depth_;
    std::vector<std::size_t> key_at_;  // byte offsets of the keys of the objects being parsed (innermost last)
    std::size_t pos_ = 0;
};

/// Whether s is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
inline bool valid_utf8(std::string_view s) noexcept {
    for (std::size_t i = 0; i < s.size();) {
        auto const b0 = static_cast<unsigned char>(s[i]);
        std::size_t n = 0;
        std::uint32_t cp = 0, min = 0;
        if (b0 < 0x80) {
            ++i;
            continue;
        }
        if (b0 >= 0xC2 && b0 <= 0xDF) n = 1, cp = b0 & 0x1Fu, min = 0x80;
        else if (b0 >= 0xE0 && b0 <= 0xEF) n = 2, cp = b0 & 0x0Fu, min = 0x800;
        else if (b0 >= 0xF0 && b0 <= 0xF4) n = 3, cp = b0 & 0x07u, min = 0x10000;
        else return false;
        if (s.size() - i <= n) return false;
        for (std::size_t k = 1; k <= n; ++k) {
            auto const b = static_cast<unsigned char>(s[i + k]);
            if ((b & 0xC0u) != 0x80u) return false;
            cp = (cp << 6) | (b & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += n + 1;
    }
    return true;
}

inline void escape_into(std::string& out, std::string_view s) {
    if (!valid_utf8(s))
        qkgeom::detail::fail_arg("qkgeom::json::dump", "string is not valid UTF-8 (the parser would reject it)",
                                 qkgeom::escape_text(s));
    out.push_back('"');
    for (char ch : s) {
        auto const c = static_cast<unsigned char>(ch);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    static constexpr char hex[] = "0123456789abcdef";
                    out += "\\u00";
                    out.push_back(hex[c >> 4]);
                    out.push_back(hex[c & 0xF]);
                } else {
                    out.push_back(ch);
                }
        }
    }
    out.push_back('"');
}

inline void dump_into(std::string& out, value const& v, int indent, int level) {
    auto newline = [&](int lvl) {
        if (indent < 0) return;
        out.push_back('\n');
        out.append(static_cast<std::size_t>(indent * lvl), ' ');
    };
    std::visit(
        [&](auto const& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::nullptr_t>) {
                out += "null";
            } else if constexpr (std::is_same_v<T, bool>) {
                out += x ? "true" : "false";
            } else if constexpr (std::is_same_v<T, std::int64_t>) {
                out += std::to_string(x);
            } else if constexpr (std::is_same_v<T, double>) {
                if (!std::isfinite(x)) qkgeom::detail::fail_arg("qkgeom::json::dump", "non-finite number", x);
                char buf[64];
                auto const r = std::to_chars(buf, buf + sizeof buf, x);
                std::string_view s(buf, static_cast<std::size_t>(r.ptr - buf));
                out += s;
                // keep it a double on re-read
                if (s.find_first_of(".eE") == std::string_view::npos) out += ".0";
            } else if constexpr (std::is_same_v<T, std::string>) {
                escape_into(out, x);
            } else if constexpr (std::is_same_v<T, array>) {
                out.push_back('[');
                bool first = true;
                for (auto const& e : x) {
                    if (!first) out.push_back(',');
                    first = false;
                    newline(level + 1);
                    dump_into(out, e, indent, level + 1);
                }
                if (!x.empty()) newline(level);
                out.push_back(']');
            } else {
                if (x.size() > 1) {  // the parser rejects duplicate keys: refuse to write them
                    std::vector<std::string_view> keys;
                    keys.reserve(x.size());
                    for (auto const& m : x) keys.emplace_back(m.first);
                    std::sort(keys.begin(), keys.end());
                    auto const dup = std::adjacent_find(keys.begin(), keys.end());
                    if (dup != keys.end())
                        qkgeom::detail::fail_arg("qkgeom::json::dump", "duplicate object key (the parser would reject it)",
                                                 qkgeom::escape_text(*dup));
                }
                out.push_back('{');
                bool first = true;
                for (auto const& [k, e] : x) {
                    if (!first) out.push_back(',');
                    first = false;
                    newline(level + 1);
                    escape_into(out, k);
                    out += indent < 0 ? ":" : ": ";
                    dump_into(out, e, indent, level + 1);
                }
                if (!x.empty()) newline(level);
                out.push_back('}');
            }
        },
        v.get());
}

}  // namespace detail

/// \brief Parses one JSON document (strict RFC 8259).
/// \param[in] text the document, UTF-8.
/// \param[in] source  label used in error messages (file name).
/// \param[in] max_depth  maximum nesting of arrays/objects (default 64).
/// \returns the value; numbers without fraction or exponent that fit int64 are
///          integers (is_int()), every other number a double.
/// \throws qkgeom::input_error naming the source, field "json" and the byte
///         offset: a leading UTF-8 byte-order mark (named as such), any
///         syntax error, trailing content, invalid UTF-8 or
///         escape, lone surrogate, raw control character, duplicate key,
///         leading zero, a number beyond the double range, nesting deeper
///         than max_depth.
/// \throws std::bad_alloc if the value cannot be held in memory.
[[nodiscard]] inline value parse(std::string_view text, std::string_view source = "<json>", int max_depth = 64) {
    return detail::parser(text, source, max_depth).run();
}

/// \brief Serialises a value. `indent < 0`: compact; otherwise pretty-printed
/// with that many spaces per level. Doubles are written in shortest
/// round-trip form (always with '.' or an exponent, so they re-read as doubles).
/// Strings are escaped. What parse() would reject is refused: a string or
/// key that is not valid UTF-8, an object with a duplicate key.
/// \param[in] v the value.
/// \param[in] indent spaces per nesting level, or < 0 for compact output.
/// \returns the JSON text.
/// \throws std::invalid_argument for a non-finite double, invalid UTF-8 or a
///         duplicate object key (naming the value).
[[nodiscard]] inline std::string dump(value const& v, int indent = -1) {
    std::string out;
    detail::dump_into(out, v, indent, 0);
    return out;
}

}  // namespace qkgeom::json
