// qkgeom — writing one head entry of a dataset in any storage form
// (lLLhHHq/ of .npy files, lLLhHHq.safetensors, lLLhHHq.npz). docs/dataset.md.
#pragma once

#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/float16.hpp>
#include <qkgeom/io/head_entry.hpp>
#include <qkgeom/io/manifest.hpp>
#include <qkgeom/io/npy.hpp>
#include <qkgeom/io/npz.hpp>
#include <qkgeom/io/safetensors.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
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

inline dtype vector_dtype_from_name(std::string_view s) {
    if (s == "f32") return dtype::f32;
    if (s == "f64") return dtype::f64;
    if (s == "f16") return dtype::f16;
    if (s == "bf16") return dtype::bf16;
    qkgeom::detail::fail_arg("qkgeom::io::write_head", "vector dtype must be f32, f64, f16 or bf16", s);
}

inline std::vector<unsigned char> encode_vectors(row_matrix const& v, dtype t) {
    std::size_t const n = static_cast<std::size_t>(v.size()), w = dtype_size(t);
    std::vector<unsigned char> out(n * w);
    double const* p = v.data();
    for (std::size_t i = 0; i < n; ++i) {
        unsigned char* q = out.data() + i * w;
        switch (t) {
            case dtype::f64: store_value(q, p[i]); break;
            case dtype::f32: store_value(q, static_cast<float>(p[i])); break;
            case dtype::f16: store_value(q, float16::from_float(static_cast<float>(p[i]))); break;
            case dtype::bf16: store_value(q, bfloat16::from_float(static_cast<float>(p[i]))); break;
            default: break;
        }
    }
    return out;
}

inline npy_array int_array(std::vector<std::int64_t> const& v) {
    return make_npy(std::span<std::int64_t const>(v), {static_cast<std::int64_t>(v.size())});
}

}  // namespace detail

namespace detail {

/// Throws std::invalid_argument (naming `fn`) when e.layer / e.head are
/// outside the manifest's counts or the manifest is inconsistent.
inline void check_entry_range(manifest const& m, head_entry const& e, std::string_view fn) {
    if (m.n_q_heads.size() != static_cast<std::size_t>(std::max<std::int64_t>(m.n_layers, 0)) ||
        m.n_kv_heads.size() != m.n_q_heads.size())
        qkgeom::detail::fail_arg(fn, "inconsistent manifest: n_q_heads / n_kv_heads lengths differ from n_layers; n_layers",
                                 m.n_layers);
    if (e.layer < 0 || e.layer >= m.n_layers)
        qkgeom::detail::fail_arg(fn, "layer outside [0, n_layers = " + std::to_string(m.n_layers) + "); layer", e.layer);
    auto const L = static_cast<std::size_t>(e.layer);
    std::int64_t const nh = e.k == kind::query ? m.n_q_heads[L] : m.n_kv_heads[L];
    if (e.head < 0 || e.head >= nh)
        qkgeom::detail::fail_arg(fn,
                                 std::string("head outside [0, ") + (e.k == kind::query ? "n_q_heads" : "n_kv_heads") +
                                     " = " + std::to_string(nh) + "); head",
                                 e.head);
}

/// The files an entry in NumPy form holds.
inline constexpr std::string_view npy_entry_files[] = {"vectors.npy", "position.npy", "bucket.npy", "example_id.npy",
                                                       "sliding_window.npy"};

/// Removes an entry directory in NumPy form (its known files, then the
/// directory); nothing when absent. Throws io_error when `sub` is not such a
/// directory (another file type, or other files inside: never removed).
inline void remove_npy_entry(std::filesystem::path const& sub) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto const t = fs::symlink_status(sub, ec).type();
    if (t == fs::file_type::not_found) return;
    if (t != fs::file_type::directory)
        throw io_error(sub.string(), "qkgeom::io::write_head: cannot replace '" + escape_text(sub.string()) +
                                         "': not a directory of .npy files; remove it by hand");
    for (auto const& de : fs::directory_iterator(sub, ec)) {
        auto const fname = de.path().filename().string();
        if (std::find(std::begin(npy_entry_files), std::end(npy_entry_files), fname) == std::end(npy_entry_files))
            throw io_error(sub.string(), "qkgeom::io::write_head: cannot replace '" + escape_text(sub.string()) +
                                             "': it holds a file that is not part of an entry ('" +
                                             escape_text(fname) + "'); remove it by hand");
    }
    for (auto f : npy_entry_files) fs::remove(sub / std::string(f), ec);
    if (!fs::remove(sub, ec) || ec)
        throw io_error(sub.string(), "qkgeom::io::write_head: cannot remove '" + escape_text(sub.string()) +
                                         "': " + (ec ? ec.message() : std::string("not removed")));
}

/// Removes an entry file (.npz / .safetensors form); nothing when absent.
inline void remove_entry_file(std::filesystem::path const& p) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto const t = fs::symlink_status(p, ec).type();
    if (t == fs::file_type::not_found) return;
    if (t == fs::file_type::directory)
        throw io_error(p.string(), "qkgeom::io::write_head: cannot replace '" + escape_text(p.string()) +
                                       "': is a directory; remove it by hand");
    fs::remove(p, ec);
    if (ec)
        throw io_error(p.string(), "qkgeom::io::write_head: cannot remove '" + escape_text(p.string()) + "': " +
                                       ec.message());
}

/// Writes an entry in NumPy form: into a temporary directory next to `sub`,
/// which then replaces `sub` (no partial entry is left on failure).
inline void write_npy_entry(std::filesystem::path const& sub, head_entry const& e, npy_array v) {
    namespace fs = std::filesystem;
    static std::atomic<unsigned> counter{0};
    fs::path tmp = sub;
    tmp += ".tmp-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007) + "-" +
           std::to_string(counter++);
    std::error_code ec;
    if (!fs::create_directory(tmp, ec) || ec)
        throw io_error(tmp.string(), "qkgeom::io::write_head: cannot create '" + escape_text(tmp.string()) +
                                         "': " + (ec ? ec.message() : std::string("it exists")));
    try {
        write_npy(tmp / "vectors.npy", v);
        write_npy(tmp / "position.npy", int_array(e.position.values()));
        write_npy(tmp / "bucket.npy", int_array(e.bucket.values()));
        write_npy(tmp / "example_id.npy", int_array(e.example_id.values()));
        if (e.sliding_window) {
            std::int64_t const w = *e.sliding_window;
            write_npy(tmp / "sliding_window.npy", make_npy(std::span<std::int64_t const>(&w, 1), {}));
        }
        remove_npy_entry(sub);
        fs::rename(tmp, sub, ec);
        if (ec)
            throw io_error(sub.string(), "qkgeom::io::write_head: cannot rename '" + escape_text(tmp.string()) +
                                             "' to '" + escape_text(sub.string()) + "': " + ec.message());
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
}

}  // namespace detail

/// \brief Writes one head entry under DIR in the given format, vectors stored
/// as `vector_dtype` ("f32", "f64", "f16", "bf16"; narrowing rounds to nearest even).
/// Validates the entry (lengths, finiteness, buckets, sliding window) against
/// the manifest first. `npz_method` is the compression of the npz form
/// (deflate needs zlib: npz_deflate_available()).
///
/// Each file is written to a temporary name in the same directory and
/// renamed into place (the NumPy form: a temporary directory that replaces
/// the entry's directory), so a failure leaves no partial entry. After the
/// write, the entry's other storage forms are removed (so read_head never
/// finds it in two forms); an entry directory holding other files than the
/// entry's .npy files, or a directory in place of a .npz / .safetensors
/// entry, is never removed: io_error then.
/// \param[in] dir          the dataset directory (created if needed).
/// \param[in] m            the dataset's manifest.
/// \param[in] e            the entry: layer, head, kind and rows.
/// \param[in] format       the storage form.
/// \param[in] vector_dtype "f32" (default), "f64", "f16" or "bf16".
/// \param[in] npz_method   compression of the npz members (npz form only).
/// \throws qkgeom::input_error for an invalid entry (naming the file, field
///         and value): a column count other than head_dim, position / bucket
///         / example_id lengths other than the row count, a non-finite value,
///         a position < 0 or ≥ context_length, a bucket inconsistent with its
///         position, a sliding window < 1 or one that differs from the
///         manifest's for the layer.
/// \throws std::invalid_argument for a layer or head outside the manifest's
///         counts, a bad vector_dtype, an invalid bucket spec in the
///         manifest, an unknown format or npz compression unavailable in
///         this build (as write_npz).
/// \throws qkgeom::io_error naming the path when a file cannot be written,
///         renamed or an older form of the entry cannot be removed.
/// \throws std::filesystem::filesystem_error when a directory cannot be created.
/// \throws std::bad_alloc if the encoded arrays cannot be allocated.
/// \sa read_head
inline void write_head(std::filesystem::path const& dir, manifest const& m, head_entry const& e, storage_format format,
                       std::string_view vector_dtype = "f32", npz_compression npz_method = npz_compression::stored) {
    namespace fs = std::filesystem;
    detail::check_entry_range(m, e, "qkgeom::io::write_head");
    std::string const name = head_entry_name(e.layer, e.head, e.k);
    detail::validate_head(e, m, [&](std::string_view) { return (dir / name).string(); });
    dtype const t = detail::vector_dtype_from_name(vector_dtype);
    if (format != storage_format::npy && format != storage_format::npz && format != storage_format::safetensors)
        qkgeom::detail::fail_arg("qkgeom::io::write_head", "unknown storage format", static_cast<int>(format));
    std::vector<std::int64_t> const vshape{e.vectors.rows(), e.vectors.cols()};
    fs::create_directories(dir);
    auto const sub = dir / name, nz = dir / (name + ".npz"), st = dir / (name + ".safetensors");
    npy_array v;
    v.descr = std::string(detail::npy_descr_of(t));
    v.shape = vshape;
    v.data = detail::encode_vectors(e.vectors, t);
    if (format == storage_format::npy) {
        detail::write_npy_entry(sub, e, std::move(v));
    } else if (format == storage_format::npz) {
        npz_file f;
        f.add("vectors", std::move(v));
        f.add("position", detail::int_array(e.position.values()));
        f.add("bucket", detail::int_array(e.bucket.values()));
        f.add("example_id", detail::int_array(e.example_id.values()));
        if (e.sliding_window) {
            std::int64_t const w = *e.sliding_window;
            f.add("sliding_window", make_npy(std::span<std::int64_t const>(&w, 1), {}));
        }
        npz_write_options opt;
        opt.compression = npz_method;
        write_npz(nz, f, opt);
    } else {
        safetensors_file f;
        st_tensor vt;
        vt.type = t;
        vt.shape = vshape;
        vt.data = std::move(v.data);
        f.tensors.emplace("vectors", std::move(vt));
        auto ints = [](std::vector<std::int64_t> const& x) {
            return make_tensor(std::span<std::int64_t const>(x), {static_cast<std::int64_t>(x.size())});
        };
        f.tensors.emplace("position", ints(e.position.values()));
        f.tensors.emplace("bucket", ints(e.bucket.values()));
        f.tensors.emplace("example_id", ints(e.example_id.values()));
        if (e.sliding_window) {
            std::int64_t const w = *e.sliding_window;
            f.tensors.emplace("sliding_window", make_tensor(std::span<std::int64_t const>(&w, 1), {}));
        }
        f.metadata.emplace("format", "qkgeom-dataset");
        write_safetensors(st, f);
    }
    // The entry now exists in `format`; remove its other forms so reads stay unambiguous.
    if (format != storage_format::npy) detail::remove_npy_entry(sub);
    if (format != storage_format::npz) detail::remove_entry_file(nz);
    if (format != storage_format::safetensors) detail::remove_entry_file(st);
}

/// \brief As above, reading the manifest from DIR/manifest.json.
/// \param[in] dir          the dataset directory; DIR/manifest.json must exist.
/// \param[in] e            the entry: layer, head, kind and rows.
/// \param[in] format       the storage form.
/// \param[in] vector_dtype "f32" (default), "f64", "f16" or "bf16".
/// \param[in] npz_method   compression of the npz members (npz form only).
/// \throws qkgeom::input_error as read_manifest and as the overload above.
/// \throws std::invalid_argument, std::filesystem::filesystem_error,
///         std::bad_alloc as the overload above.
inline void write_head(std::filesystem::path const& dir, head_entry const& e, storage_format format,
                       std::string_view vector_dtype = "f32", npz_compression npz_method = npz_compression::stored) {
    write_head(dir, read_manifest(dir), e, format, vector_dtype, npz_method);
}

}  // namespace qkgeom::io
