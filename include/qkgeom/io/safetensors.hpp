// qkgeom — safetensors reader and writer.
//
// Format (huggingface/safetensors, docs "Format"):
//   8 bytes: N, unsigned little-endian 64-bit header size;
//   N bytes: UTF-8 JSON object {"name": {"dtype": "F32", "shape": [2, 3],
//            "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
//            (may be padded with trailing spaces);
//   rest:    the byte buffer; offsets are relative to its start.
//
// Validation on read (as the reference implementation): N <= file size - 8
// and N <= 100 MB; the header is a strict JSON object; each tensor entry has
// exactly dtype, shape, data_offsets; dtype is known; shape extents >= 0;
// 0 <= begin <= end <= buffer size; end - begin = prod(shape) * itemsize;
// tensors do not overlap and together cover the buffer without holes.
// dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 (BOOL and F8_* are
// rejected as unsupported).
#pragma once

#include <qkgeom/io/json.hpp>
#include <qkgeom/io/npy.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom::io {

/// \brief One tensor: dtype, shape (row-major) and little-endian data bytes.
struct st_tensor {
    dtype type = dtype::f32;             ///< element type
    std::vector<std::int64_t> shape;     ///< extents, row-major
    std::vector<unsigned char> data;     ///< prod(shape) × dtype_size(type) bytes

    /// \returns the number of elements, prod(shape) (1 for a 0-d tensor).
    [[nodiscard]] std::int64_t size() const noexcept { return element_count(shape); }
};

/// \brief A safetensors file: tensors by name (sorted) and the string metadata.
struct safetensors_file {
    std::map<std::string, st_tensor> tensors;        ///< by name; "__metadata__" is reserved
    std::map<std::string, std::string> metadata;     ///< the "__metadata__" object
};

namespace detail {

constexpr std::string_view st_dtype_name(dtype t) noexcept {
    switch (t) {
        case dtype::f64: return "F64";
        case dtype::f32: return "F32";
        case dtype::f16: return "F16";
        case dtype::bf16: return "BF16";
        case dtype::i64: return "I64";
        case dtype::i32: return "I32";
        case dtype::i16: return "I16";
        case dtype::i8: return "I8";
        case dtype::u64: return "U64";
        case dtype::u32: return "U32";
        case dtype::u16: return "U16";
        case dtype::u8: return "U8";
    }
    return "";
}

inline bool st_dtype_from_name(std::string_view s, dtype& out) noexcept {
    for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::i64, dtype::i32, dtype::i16, dtype::i8,
                    dtype::u64, dtype::u32, dtype::u16, dtype::u8})
        if (st_dtype_name(t) == s) {
            out = t;
            return true;
        }
    return false;
}

}  // namespace detail

/// \brief Largest accepted header, in bytes (as the reference implementation).
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;

/// \brief Parses a complete safetensors file held in memory.
/// \param[in] bytes the whole file.
/// \param[in] source file name (or label) used in error messages.
/// \param[in] max_header the largest header size N accepted (default and at
///            most sensible: safetensors_max_header, the format's 100 MB).
///            The parsed JSON header takes up to ~40 bytes of memory per
///            byte of hostile text, so readers of small files pass a lower
///            limit (read_head: head_entry_max_header).
/// \returns the tensors (data copied) and the metadata.
/// \throws qkgeom::input_error naming the source, the field (e.g.
///         "vectors.data_offsets") and the value for every violation listed
///         in the file comment, including any JSON error in the header (as
///         json::parse, duplicate names included).
/// \throws std::bad_alloc if the tensors cannot be held in memory.
[[nodiscard]] inline safetensors_file parse_safetensors(std::span<unsigned char const> bytes,
                                                        std::string const& source = "<safetensors>",
                                                        std::uint64_t max_header = safetensors_max_header) {
    using qkgeom::detail::fail_input;
    if (bytes.size() < 8)
        fail_input(source, "header_size", bytes.size(), "file truncated: shorter than the 8-byte header size");
    std::uint64_t const n = detail::load_le(bytes.data(), 8);
    if (n > max_header)
        fail_input(source, "header_size", n,
                   max_header == safetensors_max_header
                       ? std::string("header size above the 100 MB limit")
                       : "header size above the limit of " + std::to_string(max_header) + " bytes for this file");
    if (n > bytes.size() - 8)
        fail_input(source, "header_size", n,
                   "file truncated: header size exceeds the " + std::to_string(bytes.size() - 8) +
                       " bytes after the size field");
    std::string_view const text(reinterpret_cast<char const*>(bytes.data() + 8), static_cast<std::size_t>(n));
    json::value const root = json::parse(text, source + " (header)");
    if (!root.is_object()) fail_input(source, "header", root.type_name(), "header must be a JSON object");
    std::uint64_t const buffer_size = bytes.size() - 8 - n;
    unsigned char const* buffer = bytes.data() + 8 + n;

    safetensors_file out;
    struct range {
        std::uint64_t begin, end;
        std::string const* name;
    };
    std::vector<range> ranges;
    for (auto const& [name, entry] : root.as_object()) {
        if (name == "__metadata__") {
            if (!entry.is_object()) fail_input(source, "__metadata__", entry.type_name(), "must be an object of strings");
            for (auto const& [k, v] : entry.as_object()) {
                if (!v.is_string()) fail_input(source, "__metadata__." + k, v.type_name(), "metadata values must be strings");
                out.metadata.emplace(k, v.as_string());
            }
            continue;
        }
        if (!entry.is_object()) fail_input(source, name, entry.type_name(), "tensor entry must be an object");
        auto const* dt = entry.find("dtype");
        auto const* sh = entry.find("shape");
        auto const* of = entry.find("data_offsets");
        if (!dt) fail_input(source, name + ".dtype", "<missing>", "tensor entry lacks dtype");
        if (!sh) fail_input(source, name + ".shape", "<missing>", "tensor entry lacks shape");
        if (!of) fail_input(source, name + ".data_offsets", "<missing>", "tensor entry lacks data_offsets");
        if (entry.as_object().size() != 3) {
            for (auto const& m : entry.as_object())
                if (m.first != "dtype" && m.first != "shape" && m.first != "data_offsets")
                    fail_input(source, name, m.first, "unexpected key in tensor entry");
        }
        st_tensor t;
        if (!dt->is_string()) fail_input(source, name + ".dtype", dt->type_name(), "dtype must be a string");
        if (!detail::st_dtype_from_name(dt->as_string(), t.type))
            fail_input(source, name + ".dtype", dt->as_string(),
                       "unknown or unsupported dtype (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8)");
        if (!sh->is_array()) fail_input(source, name + ".shape", sh->type_name(), "shape must be an array");
        if (sh->as_array().size() > 32) fail_input(source, name + ".shape", sh->as_array().size(), "rank above the limit of 32");
        for (auto const& d : sh->as_array()) {
            if (!d.is_int() || d.as_int() < 0)
                fail_input(source, name + ".shape", json::dump(*sh), "shape extents must be non-negative integers");
            t.shape.push_back(d.as_int());
        }
        if (!of->is_array() || of->as_array().size() != 2 || !of->as_array()[0].is_int() ||
            !of->as_array()[1].is_int() || of->as_array()[0].as_int() < 0 || of->as_array()[1].as_int() < 0)
            fail_input(source, name + ".data_offsets", json::dump(*of),
                       "data_offsets must be [begin, end] of non-negative integers");
        auto const b = static_cast<std::uint64_t>(of->as_array()[0].as_int());
        auto const e = static_cast<std::uint64_t>(of->as_array()[1].as_int());
        std::string const offs = "[" + std::to_string(b) + ", " + std::to_string(e) + "]";
        if (b > e) fail_input(source, name + ".data_offsets", offs, "begin offset after end offset");
        if (e > buffer_size)
            fail_input(source, name + ".data_offsets", offs,
                       "offset out of range: the data buffer has " + std::to_string(buffer_size) +
                           " bytes (file truncated?)");
        std::uint64_t need = 0;
        if (!detail::byte_count(t.shape, dtype_size(t.type), need))
            fail_input(source, name + ".shape", json::dump(*sh), "shape too large (byte count overflows)");
        if (e - b != need)
            fail_input(source, name + ".data_offsets", offs,
                       "length " + std::to_string(e - b) + " does not match shape " + detail::shape_text(t.shape) +
                           " x " + std::to_string(dtype_size(t.type)) + " bytes = " + std::to_string(need));
        t.data.assign(buffer + b, buffer + e);
        auto const [it, inserted] = out.tensors.emplace(name, std::move(t));
        ranges.push_back({b, e, &it->first});
    }
    std::sort(ranges.begin(), ranges.end(),
              [](range const& x, range const& y) { return x.begin != y.begin ? x.begin < y.begin : x.end < y.end; });
    std::uint64_t at = 0;
    for (auto const& r : ranges) {
        std::string const offs = "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + "]";
        if (r.begin < at)
            fail_input(source, *r.name + ".data_offsets", offs,
                       "overlapping tensors: begins before the previous tensor ends at " + std::to_string(at));
        if (r.begin > at)
            fail_input(source, *r.name + ".data_offsets", offs,
                       "hole in the data buffer: bytes " + std::to_string(at) + ".." + std::to_string(r.begin) +
                           " belong to no tensor");
        at = r.end;
    }
    if (at != buffer_size)
        fail_input(source, "data", buffer_size - at,
                   "trailing bytes after the last tensor (buffer " + std::to_string(buffer_size) + " bytes, used " +
                       std::to_string(at) + ")");
    return out;
}

/// \brief Reads and parses a safetensors file.
/// \param[in] path the file.
/// \param[in] max_header the largest header size accepted (as parse_safetensors).
/// \returns the file's tensors and metadata, as parse_safetensors.
/// \throws qkgeom::input_error (source = path) when the path is not a regular
///         file (as regular_file_size), cannot be opened or read (with the
///         operating system's reason), and for everything parse_safetensors
///         rejects (a header size above safetensors_max_header or the file
///         size included). Memory: the file is read whole (its real size).
/// \throws std::bad_alloc if the file does not fit in memory.
[[nodiscard]] inline safetensors_file read_safetensors(std::filesystem::path const& path,
                                                       std::uint64_t max_header = safetensors_max_header) {
    auto const bytes = detail::read_file_bytes(path);
    return parse_safetensors(bytes, path.string(), max_header);
}

/// \brief Serialises tensors (in name order, contiguous) and metadata. The
/// header is padded with spaces to a multiple of 8 bytes.
/// \param[in] f the tensors and metadata.
/// \returns the complete file contents.
/// \throws std::invalid_argument when a tensor is named "__metadata__", an
///         extent is negative, or a tensor's data size does not match its shape.
/// \throws std::bad_alloc if the output cannot be allocated.
[[nodiscard]] inline std::vector<unsigned char> serialize_safetensors(safetensors_file const& f) {
    json::object hdr;
    if (!f.metadata.empty()) {
        json::object meta;
        for (auto const& [k, v] : f.metadata) meta.emplace_back(k, json::value(v));
        hdr.emplace_back("__metadata__", json::value(std::move(meta)));
    }
    std::uint64_t at = 0;
    for (auto const& [name, t] : f.tensors) {
        if (name == "__metadata__") qkgeom::detail::fail_arg("qkgeom::io::serialize_safetensors", "reserved tensor name", name);
        std::uint64_t need = 0;
        if (!detail::byte_count(t.shape, dtype_size(t.type), need) || need != t.data.size())
            qkgeom::detail::fail_arg("qkgeom::io::serialize_safetensors",
                                     name + ": data size does not match shape " + detail::shape_text(t.shape),
                                     t.data.size());
        json::array shape;
        for (auto d : t.shape) shape.emplace_back(d);
        json::object e;
        e.emplace_back("dtype", json::value(std::string(detail::st_dtype_name(t.type))));
        e.emplace_back("shape", json::value(std::move(shape)));
        e.emplace_back("data_offsets", json::value(json::array{json::value(static_cast<std::int64_t>(at)),
                                                               json::value(static_cast<std::int64_t>(at + need))}));
        hdr.emplace_back(name, json::value(std::move(e)));
        at += need;
    }
    std::string text = json::dump(json::value(std::move(hdr)));
    text.append((8 - text.size() % 8) % 8, ' ');
    // One allocation, filled with memcpy (vector::insert trips a g++ 12 -O3
    // -Warray-bounds false positive here, as in npy serialize).
    std::vector<unsigned char> out(8 + text.size() + at);
    detail::store_le(out.data(), text.size(), 8);
    if (!text.empty()) std::memcpy(out.data() + 8, text.data(), text.size());
    std::size_t w = 8 + text.size();
    for (auto const& [name, t] : f.tensors) {
        if (!t.data.empty()) std::memcpy(out.data() + w, t.data.data(), t.data.size());
        w += t.data.size();
    }
    return out;
}

/// \brief Writes a safetensors file (created or truncated).
/// \param[in] path the file.
/// \param[in] f the tensors and metadata.
/// \throws std::invalid_argument as serialize_safetensors.
/// \throws qkgeom::io_error naming the path when the file cannot be written
///         (atomic: temporary file in the same directory, then rename).
inline void write_safetensors(std::filesystem::path const& path, safetensors_file const& f) {
    auto const bytes = serialize_safetensors(f);
    detail::write_file_bytes(path, bytes);
}

/// \brief Builds a tensor from typed values (row-major).
/// \tparam T as make_npy.
/// \param[in] values the elements, row-major.
/// \param[in] shape the extents, each ≥ 0.
/// \returns the tensor.
/// \throws std::invalid_argument when values.size() != prod(shape) or an
///         extent is negative (the message names qkgeom::io::make_npy).
template <class T>
[[nodiscard]] st_tensor make_tensor(std::span<T const> values, std::vector<std::int64_t> shape) {
    npy_array a = make_npy(values, std::move(shape));
    st_tensor t;
    t.type = dtype_of<std::remove_cv_t<T>>::value;
    t.shape = std::move(a.shape);
    t.data = std::move(a.data);
    return t;
}

/// \brief The tensor as an npy_array (C order) — to reuse the npy conversions
/// (npy_to_matrix, npy_to_int64).
/// \param[in] t the tensor (copied).
/// \returns the array, descr as npy writes it for t.type, C order.
/// \throws std::bad_alloc if the copy cannot be allocated.
[[nodiscard]] inline npy_array to_npy_array(st_tensor const& t) {
    npy_array a;
    a.descr = std::string(detail::npy_descr_of(t.type));
    a.shape = t.shape;
    a.data = t.data;
    return a;
}

}  // namespace qkgeom::io
