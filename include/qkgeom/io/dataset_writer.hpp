// qkgeom — a streaming writer of a dataset in NumPy form (docs/dataset.md,
// "Writing a dataset as a stream: dataset_writer").
//
//   io::dataset_writer w(dir, manifest, io::dtype::f32, 64 << 20);
//   for each step, layer, kind, head:  w.append(layer, kind, head, rows, positions, example_ids);
//   w.close();   // final .npy headers, sliding_window.npy, then manifest.json
//
// Rows are buffered per entry and appended to the entry's .npy files when the
// buffered bytes would exceed the budget, so memory stays bounded by the
// budget (plus one batch) however long the capture runs. The files are what
// write_head writes for the concatenation of the appended rows, byte for byte.
#pragma once

#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/io/npy.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace qkgeom::io {

namespace detail {

/// The .npy header serialize_npy writes for an array of `descr` and `shape`
/// (rank 1 or 2), without the data: serialize_npy's bytes for the same array
/// with a zero first extent, the extent respelled inside the padding (the
/// header length is unchanged: 128 bytes for every rank-1 and rank-2 shape).
inline std::vector<unsigned char> npy_header_of(std::string_view descr, std::vector<std::int64_t> shape) {
    std::int64_t const rows = shape.at(0);
    shape[0] = 0;
    npy_array a;
    a.descr = std::string(descr);
    a.shape = std::move(shape);
    std::vector<unsigned char> h = serialize_npy(a);  // no data: prod(shape) = 0
    std::string const from = "'shape': (0", to = "'shape': (" + std::to_string(rows);
    auto const at = std::search(h.begin(), h.end(), from.begin(), from.end());
    std::size_t const grow = to.size() - from.size();
    if (at == h.end() || h.size() < grow + 2 ||
        !std::all_of(h.end() - 1 - static_cast<std::ptrdiff_t>(grow), h.end() - 1, [](unsigned char c) { return c == ' '; }))
        throw std::logic_error("qkgeom::io::dataset_writer: no room for the row count in the .npy header");
    h.erase(h.end() - 1 - static_cast<std::ptrdiff_t>(grow), h.end() - 1);  // padding spaces before '\n'
    std::size_t const pos = static_cast<std::size_t>(at - h.begin());
    h.erase(h.begin() + static_cast<std::ptrdiff_t>(pos), h.begin() + static_cast<std::ptrdiff_t>(pos + from.size()));
    h.insert(h.begin() + static_cast<std::ptrdiff_t>(pos), to.begin(), to.end());
    return h;
}

/// Writes `bytes` at `offset` of `path` ("ab": appended; "wb": a new file;
/// "r+b": over the start), naming the path and the OS's reason on failure.
inline void write_at(std::filesystem::path const& path, char const* mode, std::span<unsigned char const> bytes) {
    errno = 0;
    std::FILE* f = std::fopen(path.string().c_str(), mode);
    if (!f)
        throw io_error(path.string(), "qkgeom::io::dataset_writer: cannot open '" + escape_text(path.string()) +
                                          "' for writing: " + errno_text(errno));
    bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    int err = ok ? 0 : errno;
    if (std::fclose(f) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok)
        throw io_error(path.string(), "qkgeom::io::dataset_writer: writing '" + escape_text(path.string()) +
                                          "' failed: " + errno_text(err));
}

}  // namespace detail

/// \brief Writes a dataset (docs/dataset.md) in NumPy form as a stream of
/// row batches, memory bounded by a budget.
///
/// `append` adds rows of one entry (layer, kind, head); rows of an entry may
/// come in any number of batches, interleaved with other entries'. Rows are
/// kept per entry, encoded in the storage dtype; when the buffered bytes
/// would exceed `buffer_bytes`, the fullest entries are appended to their
/// .npy files (opened, appended, closed: no file stays open) until at most
/// half the budget stays buffered. `close` writes the rest, the final .npy
/// headers (the true row counts), `sliding_window.npy` where the manifest
/// records a window for the layer, and manifest.json last (atomically, as
/// write_manifest). A writer destroyed without `close` leaves no
/// manifest.json and .npy files whose headers do not match their data, so
/// the folder never reads as a dataset. Entries no append reached are not
/// written (the analysis lists them as missing). Not thread-safe.
class dataset_writer {
public:
    /// \brief The default buffer budget: 64 MiB.
    static constexpr std::size_t default_buffer_bytes = std::size_t{64} << 20;

    /// \brief Starts a dataset in `dir`.
    /// \param[in] dir the dataset directory: absent, or a directory holding
    ///                neither manifest.json nor anything named like an entry
    ///                (created with its parents).
    /// \param[in] m the manifest written by close (validated now, as write_manifest does).
    /// \param[in] vectors the storage dtype of the vectors: f32, f16, bf16 or f64.
    /// \param[in] buffer_bytes the most bytes of encoded rows kept in memory (≥ 1).
    /// \throws std::invalid_argument for a dtype other than the four, buffer_bytes 0,
    ///         or an invalid manifest (as write_manifest: qkgeom::input_error
    ///         with source "qkgeom::io::dataset_writer").
    /// \throws qkgeom::io_error when `dir` is not a directory, holds a
    ///         manifest.json or an entry, or cannot be created or listed.
    dataset_writer(std::filesystem::path dir, manifest m, dtype vectors = dtype::f32,
                   std::size_t buffer_bytes = default_buffer_bytes)
        : dir_(std::move(dir)), m_(std::move(m)), t_(vectors), budget_(buffer_bytes) {
        constexpr std::string_view fn = "qkgeom::io::dataset_writer";
        if (!dtype_is_float(t_)) qkgeom::detail::fail_arg(fn, "vector dtype must be f32, f16, bf16 or f64", dtype_name(t_));
        if (budget_ == 0) qkgeom::detail::fail_arg(fn, "buffer_bytes must be >= 1", budget_);
        if (m_.seed > static_cast<std::uint64_t>(INT64_MAX) ||
            (m_.heads && m_.heads->seed > static_cast<std::uint64_t>(INT64_MAX)))
            qkgeom::detail::fail_arg(fn, "capture seeds must be < 2^63; seed", m_.seed);
        (void)parse_manifest(dump_manifest(m_), std::string(fn));  // what close's write_manifest would refuse
        check_target();
    }
    /// \brief As above, the dtype by name ("f32", "f16", "bf16", "f64").
    dataset_writer(std::filesystem::path dir, manifest m, std::string_view vectors,
                   std::size_t buffer_bytes = default_buffer_bytes)
        : dataset_writer(std::move(dir), std::move(m), detail::vector_dtype_from_name(vectors), buffer_bytes) {}

    dataset_writer(dataset_writer const&) = delete;
    dataset_writer& operator=(dataset_writer const&) = delete;
    dataset_writer(dataset_writer&&) = default;
    dataset_writer& operator=(dataset_writer&&) = delete;
    /// \brief Leaves what was written, without manifest.json (see the class).
    ~dataset_writer() = default;

    /// \brief Appends rows to the entry (layer, k, head).
    ///
    /// Buckets are bucket_of(manifest.buckets, position). Everything is
    /// checked before anything changes; when append throws, the writer is
    /// as before the call (strong guarantee: a failed flush truncates the
    /// files it appended to). A batch of 0 rows does nothing.
    /// \tparam R any RowMatrix (NumPy views, Eigen, matrix_view, ...).
    /// \param[in] layer the layer, in [0, n_layers).
    /// \param[in] k query or key.
    /// \param[in] head a query head in [0, n_q_heads[layer]) or a key head in [0, n_kv_heads[layer]).
    /// \param[in] rows n × head_dim rows.
    /// \param[in] positions n positions, in [0, context_length).
    /// \param[in] example_ids n example ids.
    /// \throws std::logic_error after close().
    /// \throws std::invalid_argument naming the entry and the field: layer or
    ///         head out of range, a width other than head_dim, lengths that
    ///         differ, a position outside [0, context_length) (its index and
    ///         value), a value that is not finite, |x| ≥ 2^128, or overflows
    ///         the storage dtype (row, column and value).
    /// \throws qkgeom::io_error naming the file when a flush cannot write.
    /// \throws std::bad_alloc when the batch cannot be buffered.
    template <RowMatrix R>
    void append(std::int64_t layer, kind k, std::int64_t head, R const& rows, std::span<std::int64_t const> positions,
                std::span<std::int64_t const> example_ids) {
        check_open("append");
        auto const reader = as_matrix(rows);
        std::string const name = check_entry(layer, k, head, reader.rows(), reader.cols(), positions, example_ids);
        if (reader.rows() == 0) return;
        batch b = encode(reader, name);
        b.pos.assign(positions.begin(), positions.end());
        b.ex.assign(example_ids.begin(), example_ids.end());
        b.bucket.reserve(b.pos.size());
        for (auto t : b.pos) b.bucket.push_back(bucket_of(m_.buckets, t));
        add(std::tuple{layer, static_cast<int>(k), head}, name, std::move(b));
    }

    /// \brief Writes everything: the buffered rows, the final .npy headers,
    /// sliding_window.npy (when the manifest records a window for the
    /// layer), then manifest.json. Calling it again does nothing.
    /// \throws qkgeom::io_error naming the file when a file cannot be
    ///         written (no manifest.json is written then).
    /// \throws std::invalid_argument naming the entry, the example id, the
    ///         position and both rows when an entry holds one token (example
    ///         id, position) twice (no manifest.json is written then).
    /// \throws std::logic_error when an earlier failed write could not be undone.
    void close() {
        if (closed_) return;
        check_open("close");
        for (auto& [key, e] : entries_) flush_buffered(e);
        for (auto& [key, e] : entries_) finish(std::get<0>(key), e);
        for (auto const& [key, e] : entries_) check_unique_tokens(e);
        write_manifest(dir_, m_);
        closed_ = true;
    }

    /// \brief Whether close() has completed.
    [[nodiscard]] bool closed() const noexcept { return closed_; }
    /// \brief The bytes buffered now (encoded rows and their positions,
    /// buckets and example ids, 24 bytes a row): at most buffer_bytes (a batch
    /// larger than the budget is written at once, never buffered).
    [[nodiscard]] std::size_t buffered_bytes() const noexcept { return buffered_; }
    /// \brief The manifest close() writes.
    [[nodiscard]] manifest const& manifest_of() const noexcept { return m_; }
    /// \brief The directory.
    [[nodiscard]] std::filesystem::path const& dir() const noexcept { return dir_; }
    /// \brief Rows appended so far to (layer, k, head) (buffered and written).
    [[nodiscard]] std::int64_t rows(std::int64_t layer, kind k, std::int64_t head) const {
        auto const it = entries_.find(std::tuple{layer, static_cast<int>(k), head});
        return it == entries_.end() ? 0 : it->second.on_disk + static_cast<std::int64_t>(it->second.buf.pos.size());
    }

private:
    struct batch {
        std::vector<unsigned char> vec;  // encoded rows, storage dtype
        std::vector<std::int64_t> pos, bucket, ex;
        [[nodiscard]] std::size_t bytes() const noexcept { return vec.size() + 24 * pos.size(); }
    };
    struct entry {
        std::string name;
        batch buf;
        std::int64_t on_disk = 0;  // rows in the files
    };
    using entry_key = std::tuple<std::int64_t, int, std::int64_t>;
    static constexpr std::size_t header_bytes = 128;  // every rank-1 / rank-2 header (npy_header_of)
    static constexpr std::string_view files_[4] = {"vectors.npy", "position.npy", "bucket.npy", "example_id.npy"};

    void check_open(char const* what) const {
        if (closed_) throw std::logic_error(std::string("qkgeom::io::dataset_writer::") + what + ": the writer is closed");
        if (broken_)
            throw std::logic_error(std::string("qkgeom::io::dataset_writer::") + what +
                                   ": an earlier write failed and could not be undone; the dataset in '" +
                                   escape_text(dir_.string()) + "' is lost");
    }

    void check_target() const {
        namespace fs = std::filesystem;
        std::error_code ec;
        auto const t = fs::status(dir_, ec).type();
        std::string const d = escape_text(dir_.string());
        if (t != fs::file_type::not_found && t != fs::file_type::directory)
            throw io_error(dir_.string(), "qkgeom::io::dataset_writer: '" + d + "' is not a directory");
        if (t == fs::file_type::directory) {
            if (fs::symlink_status(dir_ / "manifest.json", ec).type() != fs::file_type::not_found)
                throw io_error(dir_.string(), "qkgeom::io::dataset_writer: '" + d +
                                                  "' already holds a manifest.json; write a dataset into a new or empty folder");
            for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
                std::string name = it->path().filename().string();
                for (std::string_view ext : {".npz", ".safetensors"})
                    if (name.size() > ext.size() && name.ends_with(ext)) name.resize(name.size() - ext.size());
                entry_id id;
                if (detail::parse_entry_name(name, id))
                    throw io_error(dir_.string(), "qkgeom::io::dataset_writer: '" + d + "' already holds an entry ('" +
                                                      escape_text(it->path().filename().string()) +
                                                      "'); write a dataset into a new or empty folder");
            }
            if (ec) throw io_error(dir_.string(), "qkgeom::io::dataset_writer: cannot list '" + d + "': " + ec.message());
        }
        fs::create_directories(dir_, ec);
        if (ec) throw io_error(dir_.string(), "qkgeom::io::dataset_writer: cannot create '" + d + "': " + ec.message());
    }

    /// Checks the batch's shape and annotations; returns the entry name.
    std::string check_entry(std::int64_t layer, kind k, std::int64_t head, index_t n, index_t d,
                            std::span<std::int64_t const> positions, std::span<std::int64_t const> example_ids) const {
        constexpr std::string_view fn = "qkgeom::io::dataset_writer::append";
        if (layer < 0 || layer >= m_.n_layers)
            qkgeom::detail::fail_arg(fn, "layer outside [0, n_layers = " + std::to_string(m_.n_layers) + "); layer", layer);
        auto const L = static_cast<std::size_t>(layer);
        std::int64_t const nh = k == kind::query ? m_.n_q_heads[L] : m_.n_kv_heads[L];
        if (head < 0 || head >= nh)
            qkgeom::detail::fail_arg(fn,
                                     std::string("head outside [0, ") + (k == kind::query ? "n_q_heads" : "n_kv_heads") +
                                         "[" + std::to_string(layer) + "] = " + std::to_string(nh) + "); head",
                                     head);
        std::string const name = head_entry_name(layer, head, k);
        std::string const at = std::string(fn) + " (" + name + ")";
        if (d != m_.head_dim)
            qkgeom::detail::fail_arg(at, "rows: width differs from the manifest's head_dim = " + std::to_string(m_.head_dim) + "; width", d);
        if (static_cast<std::size_t>(n) != positions.size())
            qkgeom::detail::fail_arg(at, "positions: length differs from the " + std::to_string(n) + " rows; length", positions.size());
        if (static_cast<std::size_t>(n) != example_ids.size())
            qkgeom::detail::fail_arg(at, "example_ids: length differs from the " + std::to_string(n) + " rows; length", example_ids.size());
        for (std::size_t i = 0; i < positions.size(); ++i)
            if (positions[i] < 0 || positions[i] >= m_.context_length)
                qkgeom::detail::fail_arg(at, "positions[" + std::to_string(i) + "]: position outside [0, context_length = " +
                                                 std::to_string(m_.context_length) + ")",
                                         positions[i]);
        return name;
    }

    /// The rows encoded in the storage dtype, checked value by value: finite,
    /// inside the input limit and inside the storage dtype's range.
    template <class Reader>
    batch encode(Reader const& r, std::string const& name) const {
        index_t const n = r.rows(), d = r.cols();
        std::size_t const w = dtype_size(t_);
        batch b;
        b.vec.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(d) * w);
        index_t const chunk = std::max<index_t>(1, (index_t{1} << 17) / std::max<index_t>(d, 1));  // ~1 MiB of doubles
        row_matrix tmp;
        for (index_t r0 = 0; r0 < n; r0 += chunk) {
            index_t const m = std::min(chunk, n - r0);
            tmp.resize(m, d);
            for (index_t i = 0; i < m; ++i) r.read_row(r0 + i, tmp.data() + i * d);
            auto const bytes = detail::encode_vectors(tmp, t_);
            for (index_t i = 0; i < m; ++i)
                for (index_t j = 0; j < d; ++j) {
                    double const x = tmp(i, j);
                    bool const in_limit = std::abs(x) < input_limit;
                    if (!in_limit || !std::isfinite(detail::load_double(t_, bytes.data(), static_cast<std::size_t>(i * d + j))))
                        qkgeom::detail::fail_arg(
                            "qkgeom::io::dataset_writer::append (" + name + ")",
                            "rows[row " + std::to_string(r0 + i) + ", col " + std::to_string(j) + "]: " +
                                (!std::isfinite(x) ? std::string("non-finite value")
                                 : !in_limit       ? std::string("value outside the input limit |x| < 2^128 (method §9.18)")
                                                   : "value overflows the storage dtype " + std::string(dtype_name(t_))),
                            x);
                }
            std::copy(bytes.begin(), bytes.end(), b.vec.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r0 * d) * w));
        }
        return b;
    }

    /// Buffers a checked batch (or writes it at once when it alone exceeds
    /// the budget), flushing the fullest entries first to make room.
    void add(entry_key const& key, std::string const& name, batch b) {
        std::size_t const need = b.bytes();
        if (buffered_ + need > budget_) make_room(need);
        auto it = entries_.find(key);
        bool const fresh = it == entries_.end();
        if (fresh) it = entries_.emplace(key, entry{name, {}, 0}).first;
        try {
            if (need > budget_) {  // alone over the budget: straight to the files
                entry direct{name, std::move(b), it->second.on_disk};
                flush(direct);
                it->second.on_disk = direct.on_disk;
                return;
            }
            auto& buf = it->second.buf;
            buf.vec.reserve(buf.vec.size() + b.vec.size());
            buf.pos.reserve(buf.pos.size() + b.pos.size());
            buf.bucket.reserve(buf.bucket.size() + b.bucket.size());
            buf.ex.reserve(buf.ex.size() + b.ex.size());
        } catch (...) {
            if (fresh) entries_.erase(it);
            throw;
        }
        auto& buf = it->second.buf;  // nothing below allocates: no throw
        buf.vec.insert(buf.vec.end(), b.vec.begin(), b.vec.end());
        buf.pos.insert(buf.pos.end(), b.pos.begin(), b.pos.end());
        buf.bucket.insert(buf.bucket.end(), b.bucket.begin(), b.bucket.end());
        buf.ex.insert(buf.ex.end(), b.ex.begin(), b.ex.end());
        buffered_ += need;
    }

    /// Flushes the fullest entries until `need` more bytes fit in half the budget.
    void make_room(std::size_t need) {
        std::vector<entry*> order;
        for (auto& [key, e] : entries_)
            if (!e.buf.pos.empty()) order.push_back(&e);
        std::sort(order.begin(), order.end(), [](entry const* a, entry const* b) { return a->buf.bytes() > b->buf.bytes(); });
        for (entry* e : order) {
            if (buffered_ + need <= budget_ / 2) break;
            flush_buffered(*e);
        }
    }

    std::filesystem::path file(entry const& e, std::string_view f) const { return dir_ / e.name / std::string(f); }

    /// Appends an entry's buffered rows to its files (creating them with a
    /// placeholder header on the first flush). On failure, truncates the
    /// files back to the rows written before and rethrows; the rows stay buffered.
    void flush(entry& e) {
        if (e.buf.pos.empty()) return;
        auto const n = static_cast<std::int64_t>(e.buf.pos.size());
        auto ints = [n](std::vector<std::int64_t> const& v) { return make_npy(std::span<std::int64_t const>(v), {n}).data; };
        std::size_t const widths[4] = {dtype_size(t_) * static_cast<std::size_t>(m_.head_dim), 8, 8, 8};
        try {
            if (e.on_disk == 0) {
                std::error_code ec;
                std::filesystem::create_directory(dir_ / e.name, ec);
                if (ec)
                    throw io_error((dir_ / e.name).string(), "qkgeom::io::dataset_writer: cannot create '" +
                                                                 escape_text((dir_ / e.name).string()) + "': " + ec.message());
                for (std::size_t f = 0; f < 4; ++f)
                    detail::write_at(file(e, files_[f]), "wb", std::vector<unsigned char>(header_bytes, ' '));
            }
            detail::write_at(file(e, files_[0]), "ab", e.buf.vec);
            detail::write_at(file(e, files_[1]), "ab", ints(e.buf.pos));
            detail::write_at(file(e, files_[2]), "ab", ints(e.buf.bucket));
            detail::write_at(file(e, files_[3]), "ab", ints(e.buf.ex));
        } catch (...) {
            for (std::size_t f = 0; f < 4; ++f) {
                std::error_code ec;
                auto const p = file(e, files_[f]);
                if (!std::filesystem::is_regular_file(p, ec)) continue;  // not created (or not a file: nothing appended)
                std::filesystem::resize_file(p, header_bytes + static_cast<std::uintmax_t>(e.on_disk) * widths[f], ec);
                if (ec) broken_ = true;
            }
            throw;
        }
        e.on_disk += n;
        e.buf = batch{};
    }

    /// flush() of a buffered entry, keeping the count of buffered bytes.
    void flush_buffered(entry& e) {
        std::size_t const bytes = e.buf.bytes();
        flush(e);
        buffered_ -= std::min(buffered_, bytes);
    }

    /// The final headers of an entry's files and its sliding_window.npy.
    void finish(std::int64_t layer, entry const& e) const {
        if (e.on_disk == 0) return;
        std::int64_t const n = e.on_disk;
        detail::write_at(file(e, files_[0]), "r+b", detail::npy_header_of(detail::npy_descr_of(t_), {n, m_.head_dim}));
        for (std::size_t f = 1; f < 4; ++f)
            detail::write_at(file(e, files_[f]), "r+b", detail::npy_header_of(detail::npy_descr_of(dtype::i64), {n}));
        auto const L = static_cast<std::size_t>(layer);
        if (L < m_.sliding_window.size() && m_.sliding_window[L]) {
            std::int64_t const w = *m_.sliding_window[L];
            write_npy(file(e, "sliding_window.npy"), make_npy(std::span<std::int64_t const>(&w, 1), {}));
        }
    }

    /// Refuses an entry holding one token twice (the same example id and
    /// position appended in two rows: a capture that ran a batch twice or
    /// hooked a layer twice), read back from its files so memory stays that of
    /// the largest entry (16 bytes a row), not of every row ever appended.
    void check_unique_tokens(entry const& e) const {
        if (e.on_disk < 2) return;
        auto const pos = npy_to_int64(read_npy(file(e, files_[1])), file(e, files_[1]).string());
        auto const ex = npy_to_int64(read_npy(file(e, files_[3])), file(e, files_[3]).string());
        if (auto const r = detail::first_repeated_token(pos, ex))
            qkgeom::detail::fail_arg("qkgeom::io::dataset_writer::close (" + e.name + ")",
                                     "example " + std::to_string(r->example) + ", position " +
                                         std::to_string(r->position) + " appended twice (rows " +
                                         std::to_string(r->first_row) + " and " + std::to_string(r->second_row) +
                                         "): one token is one row; no manifest.json written; rows",
                                     e.on_disk);
    }

    std::filesystem::path dir_;
    manifest m_;
    dtype t_;
    std::size_t budget_;
    std::size_t buffered_ = 0;
    std::map<entry_key, entry> entries_;
    bool closed_ = false, broken_ = false;
};

}  // namespace qkgeom::io
