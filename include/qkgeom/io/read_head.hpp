// qkgeom — reading a dataset: one head entry (any storage form, detected), or
// one head as one value (its query and key entries and capture facts), rows
// widened to double or kept in the stored single precision. docs/dataset.md.
#pragma once

#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/io/head_entry.hpp>
#include <qkgeom/io/manifest.hpp>
#include <qkgeom/io/npy.hpp>
#include <qkgeom/io/npz.hpp>
#include <qkgeom/io/safetensors.hpp>
#include <qkgeom/simd/moment_kernels.hpp>

#include <Eigen/Core>

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace qkgeom::io {

namespace detail {

inline std::vector<std::int64_t> int_vector(npy_array const& a, std::string const& src, std::string const& field) {
    if (a.shape.size() != 1)
        qkgeom::detail::fail_input(src, field + ".shape", shape_text(a.shape), "expected a rank-1 array");
    return npy_to_int64(a, src, field);
}

inline std::int64_t int_scalar(npy_array const& a, std::string const& src, std::string const& field) {
    if (!(a.shape.empty() || (a.shape.size() == 1 && a.shape[0] == 1)))
        qkgeom::detail::fail_input(src, field + ".shape", shape_text(a.shape), "expected a scalar (shape () or (1,))");
    return npy_to_int64(a, src, field)[0];
}

inline void check_vector_dtype(npy_array const& a, std::string const& src, head_entry& e) {
    dtype const t = npy_dtype(a, src);
    if (!dtype_is_float(t))
        qkgeom::detail::fail_input(src, "vectors.dtype", a.descr, "vectors must be f32, f64, f16 or bf16");
    if (a.shape.size() != 2)
        qkgeom::detail::fail_input(src, "vectors.shape", shape_text(a.shape), "vectors must be a rank-2 array (n, d)");
    e.dtype = std::string(dtype_name(t));
}

}  // namespace detail

/// \brief Row-major single-precision matrix: the rows of an f32, f16 or bf16
/// entry as read_capture_rows keeps them (every such value is a float, so
/// the rows are exactly the stored values; the analyses widen them to double
/// as they read them).
using row_matrix_f32 = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace detail {

/// An entry as read: its rows in e.vectors (double) or, when `single`, in
/// v32 (stored dtype f32, f16 or bf16); `nonfinite`: the scan made while the
/// rows were copied into v32 found NaN or ±inf (reported by validate_read,
/// in its turn among the checks).
struct entry_read {
    head_entry e;
    row_matrix_f32 v32;
    bool single = false;
    bool nonfinite = false;
};

inline bool widens_to_f32(dtype t) noexcept { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

/// Values per step of the copy-and-scan: the scan reads what the copy has
/// just written, while it is in cache.
inline constexpr std::size_t scan_chunk_values = 16384;

/// Scans v32's values [from, to) (the dispatched f32 finiteness scan: for
/// these dtypes finite is exactly |x| < 2^128).
inline void scan_f32(entry_read& r, simd::isa level, std::size_t from, std::size_t to) noexcept {
    r.nonfinite = qkgeom::detail::mom::any_nonfinite_f32(level, r.v32.data() + from, static_cast<index_t>(to - from)) ||
                  r.nonfinite;
}

/// The vectors of an array in memory (dtype and rank checked): into v32
/// with the scan when `single` and the dtype widens to f32, else into
/// e.vectors (npy_to_matrix).
inline void vectors_from(npy_array const& a, std::string const& src, bool single, entry_read& r) {
    dtype const t = npy_dtype(a, src);
    if (!single || !widens_to_f32(t)) {
        r.e.vectors = npy_to_matrix(a, src);
        return;
    }
    check_data_size(a, t, src);
    auto const rows = static_cast<index_t>(a.shape[0]), cols = static_cast<index_t>(a.shape[1]);
    r.v32.resize(rows, cols);
    r.single = true;
    std::size_t const n = static_cast<std::size_t>(rows * cols), w = dtype_size(t);
    simd::isa const level = simd::active();
    if (!a.fortran_order) {
        for (std::size_t s = 0; s < n; s += scan_chunk_values) {
            std::size_t const e = std::min(n, s + scan_chunk_values);
            load_floats(t, a.data.data() + s * w, e - s, r.v32.data() + s);
            scan_f32(r, level, s, e);
        }
        return;
    }
    for (index_t i = 0; i < rows; ++i)  // element (i, j) of Fortran order at i + j * rows
        for (index_t j = 0; j < cols; ++j)
            r.v32(i, j) = static_cast<float>(load_double(t, a.data.data(), static_cast<std::size_t>(i + j * rows)));
    scan_f32(r, level, 0, n);
}

/// The vectors of an entry in NumPy form: f32 rows in C order go from the
/// file straight into v32, scanned step by step as they arrive; other arrays
/// are read whole and converted (vectors_from).
inline void read_npy_vectors(std::filesystem::path const& path, std::string const& src, bool single, entry_read& r) {
    npy_reader in(path);
    check_vector_dtype(in.header(), src, r.e);
    npy_array const& h = in.header();
    if (!single || in.type() != dtype::f32 || h.fortran_order || std::endian::native != std::endian::little) {
        vectors_from(in.take(), src, single, r);
        return;
    }
    auto const rows = static_cast<index_t>(h.shape[0]), cols = static_cast<index_t>(h.shape[1]);
    r.v32.resize(rows, cols);
    r.single = true;
    std::size_t const n = static_cast<std::size_t>(rows * cols);
    simd::isa const level = simd::active();
    for (std::size_t s = 0; s < n; s += scan_chunk_values) {
        std::size_t const e = std::min(n, s + scan_chunk_values);
        in.read_data(reinterpret_cast<unsigned char*>(r.v32.data() + s), (e - s) * sizeof(float));
        scan_f32(r, level, s, e);
    }
    in.finish();
}

/// validate_head for an entry as read (rows in e.vectors or v32).
template <class Src>
void validate_read(entry_read const& r, manifest const& m, Src const& src) {
    if (!r.single) {
        validate_head(r.e, m, src);
        return;
    }
    validate_entry(r.e, r.v32.rows(), r.v32.cols(), m, src, [&] {
        if (!r.nonfinite) return;
        for (index_t i = 0; i < r.v32.rows(); ++i)
            for (index_t j = 0; j < r.v32.cols(); ++j)
                if (!std::isfinite(r.v32(i, j))) fail_vector_value(src, i, j, static_cast<double>(r.v32(i, j)));
    });
}

inline void read_npz_entry(std::filesystem::path const& nz, manifest const& m, bool single, entry_read& r) {
    auto& e = r.e;
    std::string const s = nz.string();
    auto const f = read_npz(nz);
    auto msrc = [&](std::string_view member) { return s + "[" + std::string(member) + ".npy]"; };
    auto const& v = f.at("vectors", s);
    check_vector_dtype(v, msrc("vectors"), e);
    vectors_from(v, msrc("vectors"), single, r);
    e.position = token_positions(int_vector(f.at("position", s), msrc("position"), "position"));
    e.bucket = token_buckets(int_vector(f.at("bucket", s), msrc("bucket"), "bucket"));
    e.example_id = example_ids(int_vector(f.at("example_id", s), msrc("example_id"), "example_id"));
    if (auto const* w = f.find("sliding_window"))
        e.sliding_window = int_scalar(*w, msrc("sliding_window"), "sliding_window");
    validate_read(r, m, msrc);
}

inline void read_npy_entry(std::filesystem::path const& sub, std::string const& name, manifest const& m, bool single,
                           entry_read& r) {
    namespace fs = std::filesystem;
    auto& e = r.e;
    {
        std::error_code ec;
        auto const t = fs::status(sub, ec).type();
        if (t != fs::file_type::directory)
            qkgeom::detail::fail_input(sub.string(), "entry", name,
                                       ec ? "cannot access the entry: " + ec.message()
                                          : std::string("is not a directory (an entry in NumPy form is a directory "
                                                        "of .npy files; the other forms end in .safetensors or .npz)"));
    }
    auto src = [&](std::string_view f) { return (sub / (std::string(f) + ".npy")).string(); };
    read_npy_vectors(sub / "vectors.npy", src("vectors"), single, r);
    e.position = token_positions(int_vector(read_npy(sub / "position.npy"), src("position"), "position"));
    e.bucket = token_buckets(int_vector(read_npy(sub / "bucket.npy"), src("bucket"), "bucket"));
    e.example_id = example_ids(int_vector(read_npy(sub / "example_id.npy"), src("example_id"), "example_id"));
    std::error_code ec;
    auto const wt = fs::symlink_status(sub / "sliding_window.npy", ec).type();
    if (wt != fs::file_type::not_found && wt != fs::file_type::none)
        e.sliding_window = int_scalar(read_npy(sub / "sliding_window.npy"), src("sliding_window"), "sliding_window");
    validate_read(r, m, src);
}

inline void read_st_entry(std::filesystem::path const& st, manifest const& m, bool single, entry_read& r) {
    auto& e = r.e;
    std::string const s = st.string();
    auto const f = read_safetensors(st, head_entry_max_header);
    auto get = [&](std::string const& t) -> npy_array {
        auto it = f.tensors.find(t);
        if (it == f.tensors.end()) qkgeom::detail::fail_input(s, t, "<missing>", "required tensor is missing");
        return to_npy_array(it->second);
    };
    auto const v = get("vectors");
    check_vector_dtype(v, s, e);
    vectors_from(v, s, single, r);
    e.position = token_positions(int_vector(get("position"), s, "position"));
    e.bucket = token_buckets(int_vector(get("bucket"), s, "bucket"));
    e.example_id = example_ids(int_vector(get("example_id"), s, "example_id"));
    if (f.tensors.count("sliding_window")) e.sliding_window = int_scalar(get("sliding_window"), s, "sliding_window");
    validate_read(r, m, [&](std::string_view) { return s; });
}

/// The bytes of an entry on disk (a file, or the files of an entry folder);
/// 0 where a size cannot be read.
inline std::uintmax_t entry_bytes_on_disk(std::filesystem::path const& p) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
        auto const n = fs::file_size(p, ec);
        return ec ? 0 : n;
    }
    std::uintmax_t total = 0;
    for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code fec;
        auto const n = fs::file_size(it->path(), fec);
        if (!fec) total += n;
    }
    return total;
}

/// read_head, the rows kept in single precision (entry_read::v32) when
/// `single` and the stored dtype is f32, f16 or bf16.
inline entry_read read_entry(std::filesystem::path const& dir, manifest const& m, std::int64_t layer, std::int64_t head,
                             kind k, bool single) {
    using qkgeom::detail::fail_input;
    namespace fs = std::filesystem;
    std::string const name = head_entry_name(layer, head, k);
    if (m.n_q_heads.size() != static_cast<std::size_t>(std::max<std::int64_t>(m.n_layers, 0)) ||
        m.n_kv_heads.size() != m.n_q_heads.size())
        qkgeom::detail::fail_arg("qkgeom::io::read_head",
                                 "inconsistent manifest: n_q_heads / n_kv_heads lengths differ from n_layers; n_layers",
                                 m.n_layers);
    if (layer < 0 || layer >= m.n_layers)
        fail_input((dir / name).string(), "layer", layer, "layer outside [0, n_layers = " + std::to_string(m.n_layers) + ")");
    std::int64_t const nh = k == kind::query ? m.n_q_heads[static_cast<std::size_t>(layer)]
                                             : m.n_kv_heads[static_cast<std::size_t>(layer)];
    if (head < 0 || head >= nh)
        fail_input((dir / name).string(), "head", head,
                   std::string("head outside [0, ") + (k == kind::query ? "n_q_heads" : "n_kv_heads") + " = " +
                       std::to_string(nh) + ")");
    entry_read r;
    r.e.layer = layer;
    r.e.head = head;
    r.e.k = k;
    auto const sub = dir / name;
    auto const st = dir / (name + ".safetensors");
    auto const nz = dir / (name + ".npz");
    // Anything at an entry's path counts as that form (a directory named
    // lLLhHHq.safetensors too): the reader then says what is wrong with it.
    auto present = [](fs::path const& p) {
        std::error_code ec;
        auto const t = fs::symlink_status(p, ec).type();
        return t != fs::file_type::not_found && t != fs::file_type::none;
    };
    bool const is_npy = present(sub);
    bool const is_st = present(st);
    bool const is_npz = present(nz);
    if (int{is_npy} + int{is_st} + int{is_npz} > 1) {
        std::string forms;
        if (is_npy) forms += " " + name + "/";
        if (is_st) forms += " " + name + ".safetensors";
        if (is_npz) forms += " " + name + ".npz";
        fail_input(sub.string(), "entry", name, "the entry exists in more than one storage form:" + forms);
    }
    if (!is_npy && !is_st && !is_npz)
        fail_input(sub.string(), "entry", name, "head entry not found (no directory, no .safetensors, no .npz)");
    fs::path const at = is_npz ? nz : is_npy ? sub : st;
    try {
        if (is_npz) read_npz_entry(nz, m, single, r);
        else if (is_npy) read_npy_entry(sub, name, m, single, r);
        else read_st_entry(st, m, single, r);
    } catch (std::bad_alloc const&) {  // a bare bad_alloc names nothing: say which entry, how big
        r = entry_read{};
        fail_input(at.string(), "entry", name,
                   "does not fit in memory (" + std::to_string(entry_bytes_on_disk(at)) +
                       " bytes on disk; rows are held as float, f64 rows as double)");
    }
    return r;
}

}  // namespace detail

/// \brief Reads and validates one head entry, detecting the storage form
/// (directory lLLhHHq/ of .npy files, lLLhHHq.safetensors or lLLhHHq.npz;
/// exactly one of them must exist).
/// \param[in] dir   the dataset directory.
/// \param[in] m     its manifest (`read_manifest(dir)`).
/// \param[in] layer the layer, in [0, n_layers).
/// \param[in] head  the head, in [0, n_q_heads[layer]) for queries or
///                  [0, n_kv_heads[layer]) for keys.
/// \param[in] k     query or key.
/// \returns the entry, vectors widened to double and `dtype` the stored type.
/// \throws qkgeom::input_error naming the file, field and value: layer or head
///         out of range, no entry or an entry in more than one form, an
///         entry path that is not what its form needs (a directory named
///         lLLhHHq.safetensors: "is a directory, not a regular file"; a file
///         named lLLhHHq), an unreadable or malformed file (npy / npz /
///         safetensors, with the operating system's reason), an entry with
///         no rows, a missing
///         array, vectors not a float rank-2 array, an integer array of the
///         wrong rank or type, or an entry that fails the checks write_head
///         makes (head_dim, lengths, finiteness, positions, buckets, sliding
///         window).
/// \throws std::invalid_argument if the manifest's bucket spec is invalid or
///         its per-layer head counts do not have n_layers entries.
/// \throws std::bad_alloc if the arrays do not fit in memory.
[[nodiscard]] inline head_entry read_head(std::filesystem::path const& dir, manifest const& m, std::int64_t layer,
                                          std::int64_t head, kind k) {
    return std::move(detail::read_entry(dir, m, layer, head, k, false).e);
}

/// \brief As above, reading DIR/manifest.json first.
/// \param[in] dir   the dataset directory.
/// \param[in] layer the layer.
/// \param[in] head  the head (a q head for queries, a kv head for keys).
/// \param[in] k     query or key.
/// \returns the entry.
/// \throws qkgeom::input_error as read_manifest and as the overload above.
/// \throws std::invalid_argument, std::filesystem::filesystem_error,
///         std::bad_alloc as the overload above.
[[nodiscard]] inline head_entry read_head(std::filesystem::path const& dir, std::int64_t layer, std::int64_t head,
                                          kind k) {
    return read_head(dir, read_manifest(dir), layer, head, k);
}

namespace detail {

/// The query and key entries of a head (read_capture's checks and messages),
/// rows kept in single precision where read_entry keeps them.
inline std::pair<entry_read, entry_read> read_entries(std::filesystem::path const& dir, manifest const& m,
                                                      head_id const& id, bool single) {
    if (id.layer >= 0 && id.layer < m.n_layers) {
        auto const L = static_cast<std::size_t>(id.layer);
        if (key_head_of(id.q_head, m.n_q_heads[L], m.n_kv_heads[L]) != id.k_head)
            qkgeom::detail::fail_arg("qkgeom::io::read_capture",
                                     "k_head does not follow the GQA mapping of layer " + std::to_string(id.layer) +
                                         " q_head " + std::to_string(id.q_head) + "; k_head",
                                     id.k_head);
    }
    entry_read q = read_entry(dir, m, id.layer, id.q_head, kind::query, single);
    entry_read k = [&] {
        try {
            return read_entry(dir, m, id.layer, id.k_head, kind::key, single);
        } catch (input_error const& e) {  // say that the key entry is at fault, and which query head read it
            throw input_error(e.source(), e.field(), e.value(),
                              "key entry " + head_entry_name(id.layer, id.k_head, kind::key) + " (read by query head " +
                                  std::to_string(id.q_head) + "): " + e.what());
        }
    }();
    if (q.e.sliding_window != k.e.sliding_window)
        qkgeom::detail::fail_input((dir / head_entry_name(id.layer, id.k_head, kind::key)).string(), "sliding_window",
                                   k.e.sliding_window ? std::to_string(*k.e.sliding_window) : std::string("none"),
                                   "differs from the query entry's sliding window");
    return {std::move(q), std::move(k)};
}

/// A head of rows of type M from its two entries' rows.
template <class M>
head_capture<M> make_capture(manifest const& m, head_id const& id, token_rows<M> q, token_rows<M> k,
                             std::optional<std::int64_t> window) {
    head_capture<M> out;
    out.id = id;
    out.facts = facts_of(m, id.layer);
    out.facts.sliding_window = window.value_or(0);
    out.queries = std::move(q);
    out.keys = std::move(k);
    return out;
}

/// The rows of an entry as token_rows of single or double precision (the
/// single ones widened exactly when double is asked for).
inline token_rows<row_matrix_f32> rows_f32(entry_read& r) {
    return {std::move(r.v32), std::move(r.e.position), std::move(r.e.bucket), std::move(r.e.example_id)};
}
inline token_rows<row_matrix> rows_f64(entry_read& r) {
    if (r.single) r.e.vectors = r.v32.cast<double>();
    return std::move(static_cast<token_rows<row_matrix>&>(r.e));
}

}  // namespace detail

/// \brief Reads one head as one value (method §0): the query entry of
/// (layer, q_head), the key entry of (layer, k_head), and the capture facts
/// (the manifest's bucket scheme and context length, the entries' sliding
/// window).
/// \param[in] dir  the dataset directory
/// \param[in] m    its manifest (`read_manifest(dir)`)
/// \param[in] id   the head: layer, q_head and the k_head it reads
/// \returns the head, rows widened to double
/// \throws qkgeom::input_error naming the file, field and value for a
///         missing or invalid entry (for the key entry the message starts
///         "key entry lLLhHHk (read by query head Q): ", as several query
///         heads read one key entry), or when the two entries' sliding windows
///         differ; std::invalid_argument when k_head is not the key head of
///         q_head under the manifest's GQA layout, or q_head is outside
///         [0, n_q_heads) (as key_head_of, before any file is read)
/// \throws std::filesystem::filesystem_error, std::bad_alloc as read_head
/// \pre m is consistent, as parse_manifest guarantees
[[nodiscard]] inline head_capture<row_matrix> read_capture(std::filesystem::path const& dir, manifest const& m,
                                                           head_id const& id) {
    auto [q, k] = detail::read_entries(dir, m, id, false);
    auto const window = q.e.sliding_window;
    return detail::make_capture(m, id, detail::rows_f64(q), detail::rows_f64(k), window);
}

/// \brief A head as read_capture_rows returns it: rows in single precision
/// (both entries stored as f32, f16 or bf16; the values exactly those
/// stored) or in double (an entry stored as f64).
using stored_capture = std::variant<head_capture<row_matrix_f32>, head_capture<row_matrix>>;

/// \brief read_capture keeping the stored precision: when both entries are
/// stored as f32, f16 or bf16 their rows stay floats (half the memory and the
/// memory traffic of double; 16-bit values are widened to float exactly),
/// else both are widened to double. The analyses widen each value to double
/// as they read it, so a head analysed from either form gives bit-identical
/// results. The rows are copied once from the file (f32 .npy: straight into
/// the matrix) and scanned for NaN / ±inf as they are copied.
/// \param[in] dir  the dataset directory
/// \param[in] m    its manifest (`read_manifest(dir)`)
/// \param[in] id   the head: layer, q_head and the k_head it reads
/// \returns the head, single precision (index 0) or double (index 1)
/// \throws as read_capture, with the same messages (file, field, value)
/// \pre m is consistent, as parse_manifest guarantees
[[nodiscard]] inline stored_capture read_capture_rows(std::filesystem::path const& dir, manifest const& m,
                                                      head_id const& id) {
    auto [q, k] = detail::read_entries(dir, m, id, true);
    auto const window = q.e.sliding_window;
    if (q.single && k.single) return detail::make_capture(m, id, detail::rows_f32(q), detail::rows_f32(k), window);
    return detail::make_capture(m, id, detail::rows_f64(q), detail::rows_f64(k), window);
}

}  // namespace qkgeom::io
