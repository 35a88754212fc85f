// qkgeom — NumPy .npy reader and writer (format versions 1.0, 2.0, 3.0).
//
// Format (numpy/lib/format.py, "NEP 1"):
//   magic "\x93NUMPY", major, minor (1.0 | 2.0 | 3.0),
//   header length HLEN: little-endian u16 (1.0) or u32 (2.0, 3.0),
//   HLEN bytes of header: a Python dict literal with exactly the keys
//   'descr' (str), 'fortran_order' (True/False) and 'shape' (tuple of ints),
//   padded with spaces and terminated by '\n' (latin-1; utf-8 for 3.0),
//   then prod(shape) * itemsize bytes of data (C or Fortran order).
//
// Supported descr: '<f8' '<f4' '<f2' (IEEE half = qkgeom::float16),
// '<V2' / '|V2' read as bfloat16 (numpy has no bf16 dtype; this is the
// descr ml_dtypes' bfloat16 arrays are saved with — a qkgeom convention),
// '<i8' '<i4' '<i2' '|i1' '<u8' '<u4' '<u2' '|u1'. ('|' and '<' are both
// accepted for 1-byte types.) Big-endian ('>') and native ('=') byte orders
// are rejected with a message saying so.
//
// Every problem is a qkgeom::input_error naming the source, the field and the
// offending value, e.g. "x.npy: data: file truncated: expected 48 data bytes,
// found 40 (value 40)".
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/float16.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace qkgeom::io {

/// \brief Element types the readers know (shared by .npy and safetensors).
enum class dtype : std::uint8_t { f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8 };

/// \brief Bytes per element.
/// \param[in] t the element type.
/// \returns 8, 4, 2 or 1 (0 for a value outside the enumeration).
constexpr std::size_t dtype_size(dtype t) noexcept {
    switch (t) {
        case dtype::f64: case dtype::i64: case dtype::u64: return 8;
        case dtype::f32: case dtype::i32: case dtype::u32: return 4;
        case dtype::f16: case dtype::bf16: case dtype::i16: case dtype::u16: return 2;
        case dtype::i8: case dtype::u8: return 1;
    }
    return 0;
}
/// \brief Short name, as in qkgeom::element_traits: "f64", "f32", "f16", "bf16", "i64", ...
/// \param[in] t the element type.
/// \returns the name (a static string); "?" for a value outside the enumeration.
constexpr std::string_view dtype_name(dtype t) noexcept {
    switch (t) {
        case dtype::f64: return "f64";
        case dtype::f32: return "f32";
        case dtype::f16: return "f16";
        case dtype::bf16: return "bf16";
        case dtype::i64: return "i64";
        case dtype::i32: return "i32";
        case dtype::i16: return "i16";
        case dtype::i8: return "i8";
        case dtype::u64: return "u64";
        case dtype::u32: return "u32";
        case dtype::u16: return "u16";
        case dtype::u8: return "u8";
    }
    return "?";
}
/// \brief Whether `t` is a floating-point type.
/// \param[in] t the element type.
/// \returns true for f64, f32, f16 and bf16.
constexpr bool dtype_is_float(dtype t) noexcept {
    return t == dtype::f64 || t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
}

/// \brief The dtype of a C++ element type (float, double, float16, bfloat16,
/// fixed-width integers): `dtype_of<T>::value`. Undefined for other types.
template <class T>
struct dtype_of;
template <> struct dtype_of<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<float16> { static constexpr dtype value = dtype::f16; };
template <> struct dtype_of<bfloat16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of<std::int16_t> { static constexpr dtype value = dtype::i16; };
template <> struct dtype_of<std::int8_t> { static constexpr dtype value = dtype::i8; };
template <> struct dtype_of<std::uint64_t> { static constexpr dtype value = dtype::u64; };
template <> struct dtype_of<std::uint32_t> { static constexpr dtype value = dtype::u32; };
template <> struct dtype_of<std::uint16_t> { static constexpr dtype value = dtype::u16; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::u8; };

namespace detail {

inline std::uint64_t load_le(unsigned char const* p, std::size_t n) noexcept {
    std::uint64_t v = 0;
    for (std::size_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
}
inline void store_le(unsigned char* p, std::uint64_t v, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i, v >>= 8) p[i] = static_cast<unsigned char>(v & 0xFFu);
}

/// Element `i` of little-endian storage of type t, widened exactly to double
/// (integers beyond 2^53 round; use load_int for those).
inline double load_double(dtype t, unsigned char const* base, std::size_t i) noexcept {
    unsigned char const* p = base + i * dtype_size(t);
    switch (t) {
        case dtype::f64: return std::bit_cast<double>(load_le(p, 8));
        case dtype::f32: return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(load_le(p, 4))));
        case dtype::f16: return static_cast<double>(float16::from_bits(static_cast<std::uint16_t>(load_le(p, 2))).to_float());
        case dtype::bf16: return static_cast<double>(bfloat16::from_bits(static_cast<std::uint16_t>(load_le(p, 2))).to_float());
        case dtype::i64: return static_cast<double>(static_cast<std::int64_t>(load_le(p, 8)));
        case dtype::i32: return static_cast<double>(static_cast<std::int32_t>(load_le(p, 4)));
        case dtype::i16: return static_cast<double>(static_cast<std::int16_t>(load_le(p, 2)));
        case dtype::i8: return static_cast<double>(static_cast<std::int8_t>(p[0]));
        case dtype::u64: return static_cast<double>(load_le(p, 8));
        case dtype::u32: case dtype::u16: case dtype::u8: return static_cast<double>(load_le(p, dtype_size(t)));
    }
    return 0.0;
}

/// Element `i` of an integer dtype as int64; returns false when a u64 value exceeds INT64_MAX.
inline bool load_int(dtype t, unsigned char const* base, std::size_t i, std::int64_t& out) noexcept {
    unsigned char const* p = base + i * dtype_size(t);
    switch (t) {
        case dtype::i64: out = static_cast<std::int64_t>(load_le(p, 8)); return true;
        case dtype::i32: out = static_cast<std::int32_t>(load_le(p, 4)); return true;
        case dtype::i16: out = static_cast<std::int16_t>(load_le(p, 2)); return true;
        case dtype::i8: out = static_cast<std::int8_t>(p[0]); return true;
        case dtype::u64: {
            std::uint64_t const u = load_le(p, 8);
            if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
            out = static_cast<std::int64_t>(u);
            return true;
        }
        case dtype::u32: case dtype::u16: case dtype::u8: out = static_cast<std::int64_t>(load_le(p, dtype_size(t))); return true;
        default: return false;
    }
}

/// Encode one value of C++ type T as little-endian bytes.
template <class T>
void store_value(unsigned char* p, T v) noexcept {
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) store_le(p, v.bits, 2);
    else if constexpr (std::is_same_v<T, double>) store_le(p, std::bit_cast<std::uint64_t>(v), 8);
    else if constexpr (std::is_same_v<T, float>) store_le(p, std::bit_cast<std::uint32_t>(v), 4);
    else store_le(p, static_cast<std::uint64_t>(v), sizeof(T));
}

/// prod(shape) * itemsize with overflow checks; false on overflow or a negative extent.
inline bool byte_count(std::span<std::int64_t const> shape, std::size_t itemsize, std::uint64_t& out) noexcept {
    std::uint64_t n = itemsize;
    constexpr std::uint64_t limit = std::uint64_t{1} << 62;
    for (std::int64_t d : shape) {
        if (d < 0) return false;
        auto const u = static_cast<std::uint64_t>(d);
        if (u != 0 && n > limit / u) return false;
        n *= u;
    }
    out = n;
    return true;
}

inline std::string shape_text(std::span<std::int64_t const> shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + ")";
}

/// Why a path cannot be opened for reading, as text ("Permission denied"),
/// from errno as the failed open left it (empty when errno is 0).
inline std::string errno_text(int err) {
    return err == 0 ? std::string("unknown reason") : std::generic_category().message(err);
}

/// Reads a whole regular file (regular_file_size checks it first), refusing
/// one larger than `max_bytes` before allocating (field `limit_field`).
inline std::vector<unsigned char> read_file_bytes(std::filesystem::path const& path,
                                                  std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max(),
                                                  std::string_view limit_field = "file size");

}  // namespace detail

/// \brief Checks that `path` names a regular file (symbolic links followed)
/// and returns its size, without opening it: a FIFO is never opened (opening
/// one for reading blocks until a writer appears), a directory is never read.
/// Every reader of qkgeom::io calls this before opening a file.
/// \param[in] path the file.
/// \returns its size in bytes.
/// \throws qkgeom::input_error (source = path, field "file") when the path does
///         not exist ("no such file"), is a directory ("is a directory, not a
///         regular file"), a FIFO, socket or device ("is a FIFO (named pipe),
///         not a regular file", ...), or its status or size cannot be read
///         (the operating system's reason: "Permission denied", "Too many
///         levels of symbolic links", ...).
/// \throws std::bad_alloc if a message cannot be allocated.
inline std::uint64_t regular_file_size(std::filesystem::path const& path) {
    namespace fs = std::filesystem;
    using qkgeom::detail::fail_input;
    std::string const src = path.string();
    std::error_code ec;
    fs::file_status const st = fs::status(path, ec);
    switch (st.type()) {
        case fs::file_type::not_found: fail_input(src, "file", src, "cannot open file: no such file or directory");
        case fs::file_type::regular: break;
        case fs::file_type::directory: fail_input(src, "file", src, "is a directory, not a regular file");
        case fs::file_type::fifo: fail_input(src, "file", src, "is a FIFO (named pipe), not a regular file");
        case fs::file_type::socket: fail_input(src, "file", src, "is a socket, not a regular file");
        case fs::file_type::block: fail_input(src, "file", src, "is a block device, not a regular file");
        case fs::file_type::character: fail_input(src, "file", src, "is a character device, not a regular file");
        default:
            fail_input(src, "file", src,
                       ec ? "cannot access file: " + ec.message() : std::string("not a regular file (unknown type)"));
    }
    std::uintmax_t const size = fs::file_size(path, ec);
    if (ec) fail_input(src, "file", src, "cannot determine the file size: " + ec.message());
    return static_cast<std::uint64_t>(size);
}

namespace detail {

inline std::vector<unsigned char> read_file_bytes(std::filesystem::path const& path, std::uint64_t max_bytes,
                                                  std::string_view limit_field) {
    using qkgeom::detail::fail_input;
    std::string const src = path.string();
    std::uint64_t const size = regular_file_size(path);
    if (size > max_bytes)
        fail_input(src, limit_field, size,
                   "file larger than the limit of " + std::to_string(max_bytes) + " bytes for this kind of file");
    if (size > static_cast<std::uint64_t>(std::numeric_limits<std::streamsize>::max()) ||
        size > static_cast<std::uint64_t>(std::numeric_limits<std::size_t>::max()))
        fail_input(src, "file size", size, "file too large for this platform");
    errno = 0;
    std::ifstream in(path, std::ios::binary);
    if (!in) fail_input(src, "file", src, "cannot open file: " + errno_text(errno));
    std::vector<unsigned char> bytes(static_cast<std::size_t>(size));
    if (!bytes.empty()) in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (static_cast<std::uint64_t>(in.gcount()) != size)
        fail_input(src, "file", in.gcount(),
                   "read error or file shrank while being read: expected " + std::to_string(size) + " bytes, read");
    if (in.peek() != std::char_traits<char>::eof())
        fail_input(src, "file", size, "file grew while being read (expected size)");
    return bytes;
}

/// Writes the bytes to `path` atomically: to a temporary file in the same
/// directory, then renamed over `path` (an existing file is replaced only
/// once the new content is complete; no partial file is left on failure).
inline void write_file_bytes(std::filesystem::path const& path, std::span<unsigned char const> a,
                             std::span<unsigned char const> b = {}) {
    namespace fs = std::filesystem;
    std::string const dst = path.string();
    std::error_code ec;
    if (fs::is_directory(path, ec))
        throw io_error(dst, "qkgeom::io: cannot write '" + escape_text(dst) + "': is a directory");
    static std::atomic<unsigned> counter{0};
    fs::path tmp = path;
    tmp += ".tmp-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007) + "-" +
           std::to_string(counter++);
    {
        errno = 0;
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out)
            throw io_error(dst, "qkgeom::io: cannot open '" + escape_text(tmp.string()) +
                                    "' for writing: " + errno_text(errno));
        out.write(reinterpret_cast<char const*>(a.data()), static_cast<std::streamsize>(a.size()));
        if (!b.empty()) out.write(reinterpret_cast<char const*>(b.data()), static_cast<std::streamsize>(b.size()));
        out.flush();
        out.close();
        if (!out) {
            int const err = errno;
            fs::remove(tmp, ec);
            throw io_error(dst, "qkgeom::io: writing '" + escape_text(dst) + "' failed: " + errno_text(err));
        }
    }
    fs::rename(tmp, path, ec);
    if (ec) {
        std::error_code ignored;
        fs::remove(tmp, ignored);
        throw io_error(dst, "qkgeom::io: cannot rename the temporary file onto '" + escape_text(dst) +
                                "': " + ec.message());
    }
}

}  // namespace detail

// ---------------------------------------------------------------------------
// .npy
// ---------------------------------------------------------------------------

/// \brief Number of elements of a shape, prod(shape) (1 for a 0-d array);
/// shared by the .npy and safetensors containers.
/// \param[in] shape the extents.
/// \returns the product of the extents; -1 when an extent is negative or the
///          product overflows int64 (never true of a shape the parsers accept).
[[nodiscard]] inline std::int64_t element_count(std::vector<std::int64_t> const& shape) noexcept {
    std::int64_t n = 1;
    for (auto d : shape) {
        if (d < 0) return -1;
        if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d) return -1;
        n *= d;
    }
    return n;
}

/// \brief A parsed .npy array: descr as in the file, shape, order and the raw
/// little-endian data bytes (prod(shape) * itemsize of them, validated).
struct npy_array {
    std::string descr;
    std::vector<std::int64_t> shape;
    bool fortran_order = false;
    std::vector<unsigned char> data;

    /// \brief Number of elements, prod(shape) (1 for a 0-d array).
    /// \returns element_count(shape) (-1 for an invalid shape).
    [[nodiscard]] std::int64_t size() const noexcept { return element_count(shape); }
};

namespace detail {

/// The element type of a supported descr in `out`, or false (big-endian and
/// native-order descrs are not supported and give false too).
inline bool npy_descr_type(std::string_view d, dtype& out) noexcept {
    struct entry {
        std::string_view name;
        dtype t;
    };
    static constexpr entry table[] = {
        {"<f8", dtype::f64}, {"<f4", dtype::f32}, {"<f2", dtype::f16}, {"<V2", dtype::bf16}, {"|V2", dtype::bf16},
        {"<i8", dtype::i64}, {"<i4", dtype::i32}, {"<i2", dtype::i16}, {"|i1", dtype::i8},   {"<i1", dtype::i8},
        {"<u8", dtype::u64}, {"<u4", dtype::u32}, {"<u2", dtype::u16}, {"|u1", dtype::u8},   {"<u1", dtype::u8},
    };
    for (auto const& e : table)
        if (e.name == d) {
            out = e.t;
            return true;
        }
    return false;
}

/// The descr numpy writes for a dtype.
constexpr std::string_view npy_descr_of(dtype t) noexcept {
    switch (t) {
        case dtype::f64: return "<f8";
        case dtype::f32: return "<f4";
        case dtype::f16: return "<f2";
        case dtype::bf16: return "<V2";
        case dtype::i64: return "<i8";
        case dtype::i32: return "<i4";
        case dtype::i16: return "<i2";
        case dtype::i8: return "|i1";
        case dtype::u64: return "<u8";
        case dtype::u32: return "<u4";
        case dtype::u16: return "<u2";
        case dtype::u8: return "|u1";
    }
    return "";
}

/// Parser of the Python-literal header dict.
class npy_header_parser {
public:
    npy_header_parser(std::string_view h, std::string const& src) : h_(h), src_(src) {}

    void run(npy_array& a) {
        bool have_descr = false, have_order = false, have_shape = false;
        ws();
        expect('{', "expected '{' at the start of the header dict");
        for (;;) {
            ws();
            if (peek() == '}') {
                ++p_;
                break;
            }
            std::string const key = str("expected a quoted key in the header dict");
            ws();
            expect(':', "expected ':' after a header key");
            ws();
            if (key == "descr") {
                if (have_descr) fail("header", key, "duplicate key in header dict");
                a.descr = str("descr must be a quoted string (structured dtypes are not supported)");
                have_descr = true;
            } else if (key == "fortran_order") {
                if (have_order) fail("header", key, "duplicate key in header dict");
                if (lit("True")) a.fortran_order = true;
                else if (lit("False")) a.fortran_order = false;
                else fail("fortran_order", snippet(), "fortran_order must be True or False");
                have_order = true;
            } else if (key == "shape") {
                if (have_shape) fail("header", key, "duplicate key in header dict");
                parse_shape(a.shape);
                have_shape = true;
            } else {
                fail("header", key, "unexpected key in header dict");
            }
            ws();
            if (peek() == ',') {
                ++p_;
                continue;
            }
            ws();
            expect('}', "expected ',' or '}' in the header dict");
            break;
        }
        ws();
        if (p_ != h_.size()) fail("header", snippet(), "unexpected content after the header dict");
        if (!have_descr) fail("header", "descr", "header dict lacks the key 'descr'");
        if (!have_order) fail("header", "fortran_order", "header dict lacks the key 'fortran_order'");
        if (!have_shape) fail("header", "shape", "header dict lacks the key 'shape'");
    }

private:
    [[noreturn]] void fail(std::string_view field, std::string const& value, std::string_view problem) const {
        qkgeom::detail::fail_input(src_, field, value, problem);
    }
    std::string snippet() const { return "'" + std::string(h_.substr(p_, 20)) + "'"; }
    char peek() const noexcept { return p_ < h_.size() ? h_[p_] : '\0'; }
    void ws() noexcept {
        while (p_ < h_.size() && (h_[p_] == ' ' || h_[p_] == '\t' || h_[p_] == '\n' || h_[p_] == '\r')) ++p_;
    }
    void expect(char c, std::string_view problem) {
        if (peek() != c || p_ >= h_.size()) fail("header", snippet(), problem);
        ++p_;
    }
    bool lit(std::string_view s) noexcept {
        if (h_.substr(p_, s.size()) == s) {
            p_ += s.size();
            return true;
        }
        return false;
    }
    std::string str(std::string_view problem) {
        char const q = peek();
        if (q != '\'' && q != '"') fail("header", snippet(), problem);
        std::size_t const start = ++p_;
        while (p_ < h_.size() && h_[p_] != q) {
            if (h_[p_] == '\\' || h_[p_] == '\n') fail("header", snippet(), "unsupported character in a header string");
            ++p_;
        }
        if (p_ >= h_.size()) fail("header", snippet(), "unterminated string in the header dict");
        return std::string(h_.substr(start, p_++ - start));
    }
    void parse_shape(std::vector<std::int64_t>& shape) {
        expect('(', "shape must be a tuple");
        for (;;) {
            ws();
            if (peek() == ')') {
                ++p_;
                return;
            }
            std::size_t const start = p_;
            std::int64_t v = 0;
            bool any = false;
            while (p_ < h_.size() && h_[p_] >= '0' && h_[p_] <= '9') {
                int const dg = h_[p_] - '0';
                if (v > (std::numeric_limits<std::int64_t>::max() - dg) / 10)
                    fail("shape", std::string(h_.substr(start, p_ - start + 1)), "shape extent too large");
                v = v * 10 + dg;
                ++p_;
                any = true;
            }
            if (peek() == 'L') ++p_;  // Python 2 long suffix
            if (!any) fail("shape", snippet(), "shape entries must be non-negative integers");
            if (shape.size() >= 32) fail("shape", std::to_string(shape.size() + 1), "shape rank above the limit of 32");
            shape.push_back(v);
            ws();
            if (peek() == ',') {
                ++p_;
                continue;
            }
            expect(')', "expected ',' or ')' in shape");
            return;
        }
    }

    std::string_view h_;
    std::string const& src_;
    std::size_t p_ = 0;
};

}  // namespace detail

/// \brief The element type of an array's descr.
/// \param[in] a the array.
/// \param[in] source file name (or label) used in error messages.
/// \returns the dtype of `a.descr`.
/// \throws qkgeom::input_error (field "descr") for an unsupported or big-endian descr.
inline dtype npy_dtype(npy_array const& a, std::string const& source = "<npy>") {
    dtype t{};
    if (detail::npy_descr_type(a.descr, t)) return t;
    if (!a.descr.empty() && a.descr[0] == '>')
        qkgeom::detail::fail_input(source, "descr", a.descr, "big-endian dtype is not supported (store little-endian '<')");
    if (!a.descr.empty() && a.descr[0] == '=')
        qkgeom::detail::fail_input(source, "descr", a.descr, "native-order dtype '=' is not supported (store '<')");
    qkgeom::detail::fail_input(source, "descr", a.descr,
                               "unsupported dtype (supported: <f8 <f4 <f2 <V2(bf16) <i8 <i4 <i2 |i1 <u8 <u4 <u2 |u1)");
}

namespace detail {

/// The checks of parse_npy up to the data, for a file of `file_size` bytes of
/// which `bytes` holds the first ones: at least min(file_size, 12) and, when
/// the header length fits in the file, the whole header. Fills `a` (its data
/// left empty) and returns the offset of the data.
inline std::size_t parse_npy_header(std::span<unsigned char const> bytes, std::uint64_t file_size,
                                    std::string const& source, npy_array& a) {
    using qkgeom::detail::fail_input;
    static constexpr unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    if (file_size < 6 || std::memcmp(bytes.data(), magic, 6) != 0) {
        std::string seen;
        for (std::size_t i = 0; i < std::min<std::uint64_t>(file_size, 6); ++i) {
            static constexpr char hex[] = "0123456789abcdef";
            seen += "\\x";
            seen.push_back(hex[bytes[i] >> 4]);
            seen.push_back(hex[bytes[i] & 0xF]);
        }
        fail_input(source, "magic", seen.empty() ? std::string("<empty>") : seen,
                   file_size < 6 ? "file truncated: too short for the .npy magic \\x93NUMPY"
                                    : "not a .npy file: wrong magic (expected \\x93NUMPY)");
    }
    if (file_size < 8) fail_input(source, "version", file_size, "file truncated inside the version bytes");
    unsigned const major = bytes[6], minor = bytes[7];
    if (!((major == 1 || major == 2 || major == 3) && minor == 0))
        fail_input(source, "version", std::to_string(major) + "." + std::to_string(minor),
                   "unsupported .npy format version (supported: 1.0, 2.0, 3.0)");
    std::size_t const len_bytes = major == 1 ? 2 : 4;
    if (file_size < 8 + len_bytes)
        fail_input(source, "header_len", file_size, "file truncated inside the header length");
    std::uint64_t const hlen = detail::load_le(bytes.data() + 8, len_bytes);
    std::size_t const hstart = 8 + len_bytes;
    if (hlen > file_size - hstart)
        fail_input(source, "header_len", hlen,
                   "file truncated: header length exceeds the " + std::to_string(file_size - hstart) +
                       " bytes left in the file");
    std::string_view const header(reinterpret_cast<char const*>(bytes.data() + hstart), static_cast<std::size_t>(hlen));
    if (major < 3) {
        for (char c : header)
            if (static_cast<unsigned char>(c) >= 0x80)
                fail_input(source, "header", static_cast<int>(static_cast<unsigned char>(c)),
                           "non-ASCII byte in a version 1.0/2.0 header");
    }
    if (header.empty() || header.back() != '\n')
        fail_input(source, "header", hlen, "header does not end with a newline");
    detail::npy_header_parser(header, source).run(a);
    dtype const t = npy_dtype(a, source);
    std::uint64_t need = 0;
    if (!detail::byte_count(a.shape, dtype_size(t), need))
        fail_input(source, "shape", detail::shape_text(a.shape), "shape too large (byte count overflows)");
    std::size_t const dstart = hstart + static_cast<std::size_t>(hlen);
    std::uint64_t const have = file_size - dstart;
    if (have < need)
        fail_input(source, "data", have,
                   "file truncated: shape " + detail::shape_text(a.shape) + " of " + a.descr + " needs " +
                       std::to_string(need) + " data bytes, found");
    if (have > need)
        fail_input(source, "data", have,
                   "trailing bytes: shape " + detail::shape_text(a.shape) + " of " + a.descr + " needs " +
                       std::to_string(need) + " data bytes, found");
    return dstart;
}

}  // namespace detail

/// \brief Parses a complete .npy file held in memory.
/// \param[in] bytes the whole file.
/// \param[in] source  file name (or label) used in error messages.
/// \returns the array; its data is a copy of the data bytes, exactly
///          prod(shape) * itemsize of them.
/// \throws qkgeom::input_error for a bad magic or version, malformed header
///         (including a non-ASCII byte in a 1.0/2.0 header, duplicate or
///         missing keys, rank above 32), unsupported/big-endian descr, bad
///         shape (an extent beyond int64, a byte count beyond 2^62), or a data
///         length that differs from prod(shape) * itemsize (truncated or
///         trailing bytes).
/// \throws std::bad_alloc if the copy cannot be allocated.
[[nodiscard]] inline npy_array parse_npy(std::span<unsigned char const> bytes, std::string const& source = "<npy>") {
    npy_array a;
    std::size_t const dstart = detail::parse_npy_header(bytes, bytes.size(), source, a);
    a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(dstart), bytes.end());
    return a;
}

/// \brief A .npy file opened for reading, its header parsed and checked as
/// parse_npy checks it (the data length included), the stream at the first
/// data byte: the caller reads the data where it wants it (one copy from the
/// operating system, no staging buffer).
class npy_reader {
public:
    /// \brief Opens `path` and parses its header.
    /// \param[in] path the file.
    /// \throws qkgeom::input_error as read_npy, before any data byte is read.
    /// \throws std::bad_alloc if the header does not fit in memory.
    explicit npy_reader(std::filesystem::path const& path) : src_(path.string()) {
        using qkgeom::detail::fail_input;
        size_ = regular_file_size(path);
        if (size_ > static_cast<std::uint64_t>(std::numeric_limits<std::streamsize>::max()) ||
            size_ > static_cast<std::uint64_t>(std::numeric_limits<std::size_t>::max()))
            fail_input(src_, "file size", size_, "file too large for this platform");
        errno = 0;
        in_.open(path, std::ios::binary);
        if (!in_) fail_input(src_, "file", src_, "cannot open file: " + detail::errno_text(errno));
        // The magic, version and header length (12 bytes at most), then the
        // header itself when its length fits in the file.
        std::vector<unsigned char> head(static_cast<std::size_t>(std::min<std::uint64_t>(size_, 12)));
        read(head.data(), head.size());
        if (head.size() >= 10 && head[6] >= 1 && head[6] <= 3) {
            std::size_t const hstart = head[6] == 1 ? 10 : 12;
            std::uint64_t const hlen = head.size() >= hstart ? detail::load_le(head.data() + 8, hstart - 8) : 0;
            if (head.size() >= hstart && hlen <= size_ - hstart && hstart + hlen > head.size()) {
                std::size_t const have = head.size();
                head.resize(hstart + static_cast<std::size_t>(hlen));
                read(head.data() + have, head.size() - have);
            }
        }
        std::size_t const dstart = detail::parse_npy_header(head, size_, src_, a_);
        type_ = npy_dtype(a_, src_);
        data_bytes_ = size_ - dstart;
        // Data bytes already read with the first 12 (a 1.0 header shorter
        // than 2 bytes, which the parse rejects anyway): served first.
        if (head.size() > dstart) {
            a_.data.assign(head.begin() + static_cast<std::ptrdiff_t>(dstart), head.end());
            pending_ = a_.data.size();
        }
    }

    /// \brief The header: descr, shape, order (data empty).
    /// \returns the array header.
    [[nodiscard]] npy_array const& header() const noexcept { return a_; }
    /// \brief The element type of the data.
    /// \returns the dtype of the descr.
    [[nodiscard]] dtype type() const noexcept { return type_; }
    /// \brief The number of data bytes, prod(shape) * itemsize.
    /// \returns the count.
    [[nodiscard]] std::uint64_t data_bytes() const noexcept { return data_bytes_; }

    /// \brief Reads the next `n` data bytes into `out`.
    /// \param[out] out where they go.
    /// \param[in] n how many.
    /// \throws qkgeom::input_error when the file ends first ("read error or
    ///         file shrank while being read").
    void read_data(unsigned char* out, std::size_t n) {
        std::size_t const from_head = std::min(n, pending_);
        if (from_head > 0) {
            std::memcpy(out, a_.data.data() + (a_.data.size() - pending_), from_head);
            pending_ -= from_head;
        }
        read(out + from_head, n - from_head);
    }

    /// \brief Checks that the file ends where its data ends.
    /// \throws qkgeom::input_error when it has grown since it was opened.
    void finish() {
        if (in_.peek() != std::char_traits<char>::eof())
            qkgeom::detail::fail_input(src_, "file", size_, "file grew while being read (expected size)");
    }

    /// \brief Reads all the data into the header's array and returns it (read_npy).
    /// \returns the array, as parse_npy.
    /// \throws qkgeom::input_error as read_data and finish.
    /// \throws std::bad_alloc if the data does not fit in memory.
    [[nodiscard]] npy_array take() {
        std::vector<unsigned char> data(static_cast<std::size_t>(data_bytes_));
        read_data(data.data(), data.size());
        finish();
        a_.data = std::move(data);
        return std::move(a_);
    }

private:
    void read(unsigned char* out, std::size_t n) {
        if (n == 0) return;
        in_.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(n));
        done_ += static_cast<std::uint64_t>(in_.gcount());
        if (static_cast<std::size_t>(in_.gcount()) != n)
            qkgeom::detail::fail_input(src_, "file", done_,
                                       "read error or file shrank while being read: expected " +
                                           std::to_string(size_) + " bytes, read");
    }

    std::string src_;
    std::ifstream in_;
    std::uint64_t size_ = 0, done_ = 0, data_bytes_ = 0;
    std::size_t pending_ = 0;
    npy_array a_;
    dtype type_{};
};

/// \brief Reads and parses a .npy file.
/// \param[in] path the file.
/// \returns the array, as parse_npy.
/// \throws qkgeom::input_error (source = path) when the path is not a regular
///         file (as regular_file_size: a directory, FIFO, ... is never read),
///         the file cannot be opened or read (with the operating system's
///         reason), and for everything parse_npy rejects.
/// \throws std::bad_alloc if the file does not fit in memory.
[[nodiscard]] inline npy_array read_npy(std::filesystem::path const& path) {
    return npy_reader(path).take();
}

/// \brief Serialises an array as .npy (version 1.0 when the header fits in
/// 65535 bytes, else 2.0; header padded so the data starts on a 64-byte boundary).
/// \param[in] a the array; `a.data` holds prod(shape) * itemsize little-endian bytes.
/// \returns the complete file contents.
/// \throws std::invalid_argument for an unsupported descr (big-endian
///         included), a negative extent, or a data size that does not match
///         the shape.
/// \throws std::bad_alloc if the output cannot be allocated.
[[nodiscard]] inline std::vector<unsigned char> serialize_npy(npy_array const& a) {
    constexpr std::string_view fn = "qkgeom::io::serialize_npy";
    dtype t{};
    if (!detail::npy_descr_type(a.descr, t)) qkgeom::detail::fail_arg(fn, "unsupported descr", a.descr);
    std::uint64_t need = 0;
    if (!detail::byte_count(a.shape, dtype_size(t), need) || need != a.data.size())
        qkgeom::detail::fail_arg(fn, "data size does not match shape " + detail::shape_text(a.shape), a.data.size());
    std::string dict = "{'descr': '" + a.descr + "', 'fortran_order': " + (a.fortran_order ? "True" : "False") +
                       ", 'shape': (";
    for (std::size_t i = 0; i < a.shape.size(); ++i) {
        if (i) dict += ", ";
        dict += std::to_string(a.shape[i]);
    }
    if (a.shape.size() == 1) dict += ",";  // "(3,)"
    dict += "), }";
    std::size_t const prefix1 = 10, prefix2 = 12;
    bool const v1 = dict.size() + 1 + prefix1 + 64 <= 65535;
    std::size_t const prefix = v1 ? prefix1 : prefix2;
    std::size_t const total = prefix + dict.size() + 1;
    std::size_t const pad = (64 - total % 64) % 64;
    std::string const header = dict + std::string(pad, ' ') + "\n";
    // Sized once and filled with memcpy (vector::insert here trips a g++ 12
    // -Wstringop-overflow false positive).
    static constexpr unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    std::size_t const len_bytes = v1 ? 2 : 4;
    std::vector<unsigned char> out(prefix + header.size() + a.data.size());
    std::memcpy(out.data(), magic, 6);
    out[6] = static_cast<unsigned char>(v1 ? 1 : 2);
    out[7] = 0;
    detail::store_le(out.data() + 8, header.size(), len_bytes);
    std::memcpy(out.data() + prefix, header.data(), header.size());
    if (!a.data.empty()) std::memcpy(out.data() + prefix + header.size(), a.data.data(), a.data.size());
    return out;
}

/// \brief Writes an npy_array to a file (created or truncated).
/// \param[in] path the file.
/// \param[in] a the array, as serialize_npy.
/// \throws std::invalid_argument for a bad array (as serialize_npy).
/// \throws qkgeom::io_error naming the path when the file cannot be written
///         (written to a temporary file in the same directory, then renamed:
///         an existing file is replaced only by complete content).
inline void write_npy(std::filesystem::path const& path, npy_array const& a) {
    auto const bytes = serialize_npy(a);
    detail::write_file_bytes(path, bytes);
}

/// \brief Builds an npy_array from typed values (C order unless fortran_order).
/// \tparam T double, float, float16, bfloat16, int64/32/16/8, uint64/32/16/8
///           (const allowed).
/// \param[in] values the elements, in the storage order given by `fortran_order`.
/// \param[in] shape the extents, each ≥ 0.
/// \param[in] fortran_order whether `values` are in column-major order.
/// \returns the array, with the descr numpy writes for T (`<V2` for bfloat16).
/// \throws std::invalid_argument when values.size() != prod(shape) or an
///         extent is negative.
template <class T>
[[nodiscard]] npy_array make_npy(std::span<T const> values, std::vector<std::int64_t> shape, bool fortran_order = false) {
    constexpr dtype t = dtype_of<std::remove_cv_t<T>>::value;
    std::uint64_t need = 0;
    if (!detail::byte_count(shape, dtype_size(t), need) || need != values.size() * dtype_size(t))
        qkgeom::detail::fail_arg("qkgeom::io::make_npy", "value count does not match shape " + detail::shape_text(shape),
                                 values.size());
    npy_array a;
    a.descr = std::string(detail::npy_descr_of(t));
    a.shape = std::move(shape);
    a.fortran_order = fortran_order;
    a.data.resize(values.size() * dtype_size(t));
    for (std::size_t i = 0; i < values.size(); ++i) detail::store_value(a.data.data() + i * dtype_size(t), values[i]);
    return a;
}

/// \brief Writes typed values as .npy (see make_npy).
/// \param[in] path the file (created or truncated).
/// \param[in] values the elements.
/// \param[in] shape the extents.
/// \param[in] fortran_order whether `values` are in column-major order.
/// \throws std::invalid_argument as make_npy and write_npy(path, npy_array).
template <class T>
void write_npy(std::filesystem::path const& path, std::span<T const> values, std::vector<std::int64_t> shape,
               bool fortran_order = false) {
    write_npy(path, make_npy(values, std::move(shape), fortran_order));
}
/// \brief Overload of write_npy() for a std::vector of values.
template <class T>
void write_npy(std::filesystem::path const& path, std::vector<T> const& values, std::vector<std::int64_t> shape,
               bool fortran_order = false) {
    write_npy(path, make_npy(std::span<T const>(values), std::move(shape), fortran_order));
}

namespace detail {

/// Throws when `a.data` does not hold exactly prod(shape) * itemsize bytes.
inline void check_data_size(npy_array const& a, dtype t, std::string const& source) {
    std::uint64_t need = 0;
    if (!byte_count(a.shape, dtype_size(t), need))
        qkgeom::detail::fail_input(source, "shape", shape_text(a.shape), "shape too large (byte count overflows)");
    if (need != a.data.size())
        qkgeom::detail::fail_input(source, "data", a.data.size(),
                                   "data size does not match shape " + shape_text(a.shape) + " of " + a.descr +
                                       " (needs " + std::to_string(need) + " bytes)");
}

}  // namespace detail

/// \brief The elements of an integer array as int64, in C (row-major) order.
/// \param[in] a the array.
/// \param[in] source file name (or label) used in error messages.
/// \param[in] field  name used in messages (default "data").
/// \returns the prod(shape) elements, C order (Fortran-order arrays are reordered).
/// \throws qkgeom::input_error for an unsupported descr (as npy_dtype), a float
///         dtype, a data size other than prod(shape) * itemsize (field
///         "data"; checked before allocating), or a u64 value above INT64_MAX.
[[nodiscard]] inline std::vector<std::int64_t> npy_to_int64(npy_array const& a, std::string const& source = "<npy>",
                                                            std::string_view field = "data") {
    dtype const t = npy_dtype(a, source);
    detail::check_data_size(a, t, source);
    if (dtype_is_float(t))
        qkgeom::detail::fail_input(source, "descr", a.descr, std::string(field) + ": expected an integer dtype");
    std::size_t const n = static_cast<std::size_t>(a.size());
    std::vector<std::int64_t> out(n);
    if (t == dtype::i64 && (!a.fortran_order || a.shape.size() <= 1) && std::endian::native == std::endian::little) {
        if (n > 0) std::memcpy(out.data(), a.data.data(), n * sizeof(std::int64_t));  // storage order = C order
        return out;
    }
    // Fortran order: map C index to storage index.
    std::vector<std::int64_t> idx(a.shape.size(), 0);
    for (std::size_t c = 0; c < n; ++c) {
        std::size_t s = c;
        if (a.fortran_order && a.shape.size() > 1) {
            s = 0;
            std::size_t mul = 1;
            for (std::size_t k = 0; k < a.shape.size(); ++k) {
                s += static_cast<std::size_t>(idx[k]) * mul;
                mul *= static_cast<std::size_t>(a.shape[k]);
            }
            for (std::size_t k = a.shape.size(); k-- > 0;) {
                if (++idx[k] < a.shape[k]) break;
                idx[k] = 0;
            }
        }
        if (!detail::load_int(t, a.data.data(), s, out[c]))
            qkgeom::detail::fail_input(source, std::string(field) + "[" + std::to_string(c) + "]",
                                       detail::load_le(a.data.data() + s * 8, 8), "u64 value exceeds the int64 range");
    }
    return out;
}

namespace detail {

/// out[i] = element i of contiguous little-endian storage of f32, f16 or
/// bf16 values, i < n, as float (exact: every such value is a float).
inline void load_floats(dtype t, unsigned char const* p, std::size_t n, float* out) noexcept {
    if (t == dtype::f32 && std::endian::native == std::endian::little) {
        if (n > 0) std::memcpy(out, p, n * sizeof(float));
        return;
    }
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(load_double(t, p, i));
}

}  // namespace detail

/// \brief Row-major double matrix (what readers return for vectors).
using row_matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// \brief A rank-2 array (any supported dtype, C or Fortran order) as a dense
/// row-major double matrix; values are widened exactly (16-bit floats included;
/// 64-bit integers beyond 2^53 round).
/// \param[in] a the array.
/// \param[in] source file name (or label) used in error messages.
/// \returns the shape[0] × shape[1] matrix.
/// \throws qkgeom::input_error for an unsupported descr (as npy_dtype), a data
///         size other than prod(shape) * itemsize (field "data"; checked before
///         allocating) or when the rank is not 2.
/// \throws std::bad_alloc if the matrix cannot be allocated.
[[nodiscard]] inline row_matrix npy_to_matrix(npy_array const& a, std::string const& source = "<npy>") {
    dtype const t = npy_dtype(a, source);
    detail::check_data_size(a, t, source);
    if (a.shape.size() != 2)
        qkgeom::detail::fail_input(source, "shape", detail::shape_text(a.shape), "expected a rank-2 array (rows, cols)");
    auto const r = static_cast<index_t>(a.shape[0]), c = static_cast<index_t>(a.shape[1]);
    row_matrix m(r, c);
    if (!a.fortran_order && (t == dtype::f64 || t == dtype::f32) && std::endian::native == std::endian::little) {
        std::size_t const n = static_cast<std::size_t>(r * c);  // storage order = the matrix's
        unsigned char const* p = a.data.data();
        double* out = m.data();
        if (t == dtype::f64) {
            if (n > 0) std::memcpy(out, p, n * sizeof(double));
        } else {
            for (std::size_t i = 0; i < n; ++i) {
                float f;
                std::memcpy(&f, p + i * sizeof(float), sizeof f);
                out[i] = static_cast<double>(f);
            }
        }
        return m;
    }
    // element (i, j) lives at i*c + j (C) or i + j*r (Fortran)
    index_t const rs = a.fortran_order ? 1 : c, cs = a.fortran_order ? r : 1;
    for (index_t i = 0; i < r; ++i)
        for (index_t j = 0; j < c; ++j)
            m(i, j) = detail::load_double(t, a.data.data(), static_cast<std::size_t>(i * rs + j * cs));
    return m;
}

}  // namespace qkgeom::io
