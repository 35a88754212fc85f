// qkgeom — binary serialisation of head_moments, so that shards reduced on
// different machines can be combined (method §1). The byte layout is documented
// in docs/moments.md ("Shard file format"); it is little-endian on every host.
#pragma once

#include <qkgeom/core/errors.hpp>
#include <qkgeom/io/npy.hpp>
#include <qkgeom/stats/moments.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom {

/// Magic bytes opening every shard file.
inline constexpr std::array<char, 8> moments_magic{'Q', 'K', 'G', 'M', 'O', 'M', '\r', '\n'};
/// Current shard format version.
inline constexpr std::uint32_t moments_format_version = 1;
/// Largest head dimension a shard may declare (guards allocations on bad input).
inline constexpr std::uint64_t moments_max_dim = 4096;

namespace detail {

/// FNV-1a (64 bit) over the bytes written/read so far: detects corruption.
struct fnv1a {
    std::uint64_t h = 0xcbf29ce484222325ull;
    void update(unsigned char const* p, std::size_t n) noexcept {
        for (std::size_t i = 0; i < n; ++i) {
            h ^= p[i];
            h *= 0x100000001b3ull;
        }
    }
};

class le_writer {
public:
    explicit le_writer(std::ostream& os) : os_(os) {}
    void bytes(void const* p, std::size_t n) {
        hash_.update(static_cast<unsigned char const*>(p), n);
        os_.write(static_cast<char const*>(p), static_cast<std::streamsize>(n));
    }
    void u64(std::uint64_t v) {
        unsigned char b[8];
        for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
        bytes(b, 8);
    }
    void u32(std::uint32_t v) {
        unsigned char b[4];
        for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
        bytes(b, 4);
    }
    void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
    void f64(double v) { u64(std::bit_cast<std::uint64_t>(v)); }
    [[nodiscard]] std::uint64_t hash() const noexcept { return hash_.h; }

private:
    std::ostream& os_;
    fnv1a hash_;
};

class le_reader {
public:
    le_reader(std::istream& is, std::string source) : is_(is), source_(std::move(source)) {}
    void bytes(void* p, std::size_t n, std::string_view field) {
        is_.read(static_cast<char*>(p), static_cast<std::streamsize>(n));
        if (static_cast<std::size_t>(is_.gcount()) != n)
            fail_input(source_, field, std::to_string(is_.gcount()) + " of " + std::to_string(n) + " bytes",
                       "truncated shard: end of data while reading this field at byte offset " +
                           std::to_string(offset_));
        hash_.update(static_cast<unsigned char const*>(p), n);
        offset_ += n;
    }
    std::uint64_t u64(std::string_view field) {
        unsigned char b[8];
        bytes(b, 8, field);
        std::uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[i]) << (8 * i);
        return v;
    }
    std::uint32_t u32(std::string_view field) {
        unsigned char b[4];
        bytes(b, 4, field);
        std::uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(b[i]) << (8 * i);
        return v;
    }
    std::int64_t i64(std::string_view field) { return static_cast<std::int64_t>(u64(field)); }
    double f64(std::string const& field) {
        double const v = std::bit_cast<double>(u64(field));
        if (!std::isfinite(v)) fail_input(source_, field, v, "non-finite value in shard");
        return v;
    }
    [[nodiscard]] std::uint64_t hash() const noexcept { return hash_.h; }
    [[nodiscard]] std::string const& source() const noexcept { return source_; }

    /// Reads n bytes into `buf`, growing it in 1 MiB steps as the data
    /// arrives: a count claiming more than the stream holds costs no large
    /// allocation (the read fails at the end of the data first).
    void chunked(std::vector<unsigned char>& buf, std::size_t n, std::string_view field) {
        constexpr std::size_t step = std::size_t{1} << 20;
        buf.clear();
        while (buf.size() < n) {
            std::size_t const at = buf.size(), k = std::min(step, n - at);
            buf.resize(at + k);
            bytes(buf.data() + at, k, field);
        }
    }
    [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }

private:
    std::istream& is_;
    std::string source_;
    fnv1a hash_;
    std::size_t offset_ = 0;
};

/// One problem found by check_shard_bucket: field, value (as text), problem.
struct shard_problem {
    std::string field, value, problem;
};

/// Bytes of one bucket record in the shard format: 8 · (6 + 2d + d(d+1)/2).
constexpr std::uint64_t shard_record_bytes(std::uint64_t d) noexcept { return 8 * (6 + 2 * d + d * (d + 1) / 2); }

/// The consistency rules of one stored bucket (docs/moments.md, "What a
/// shard must satisfy"), shared by write_moments (which refuses) and
/// read_moments (which rejects). `f` is the field prefix ("q.buckets[3]").
template <class = void>
std::optional<shard_problem> check_shard_bucket(std::int64_t bucket, moments const& m, index_t d,
                                                std::string const& f) {
    auto bad = [&](std::string_view field, auto const& v, std::string problem) {
        return std::optional<shard_problem>(shard_problem{f + "." + std::string(field), to_text(v), std::move(problem)});
    };
    if (bucket < 0) return bad("bucket", bucket, "bucket ids must be non-negative and strictly ascending");
    if (m.n < 1) return bad("n", m.n, "a stored bucket must hold at least one row");
    if (m.n > (std::int64_t{1} << 53)) return bad("n", m.n, "row count above 2^53 (not exact in double)");
    if (m.dim() != d || m.c_xt.size() != d || m.c_xx.rows() != d || m.c_xx.cols() != d)
        return bad("d", m.dim(), "bucket dimension differs from the head dimension " + std::to_string(d));
    for (double v : {m.mean_t, m.m2_t, m.t_min, m.t_max})
        if (!std::isfinite(v)) return bad("mean_t", v, "non-finite value in shard");
    if (!m.mean_x.allFinite()) return bad("mean_x", "non-finite", "non-finite value in shard");
    if (!m.c_xt.allFinite()) return bad("c_xt", "non-finite", "non-finite value in shard");
    if (!m.c_xx.allFinite()) return bad("c_xx", "non-finite", "non-finite value in shard");
    if (m.m2_t < 0) return bad("m2_t", m.m2_t, "sum of squares must be >= 0");
    if (!(m.t_min >= 0 && m.t_min <= m.mean_t * (1 + 1e-12) + 1e-9 && m.t_max >= m.mean_t * (1 - 1e-12) - 1e-9))
        return bad("t_min", m.t_min,
                   "positions must satisfy 0 <= t_min <= mean_t <= t_max (t_max " + to_text(m.t_max) + ")");
    constexpr double exact = 9007199254740992.0;  // 2^53: positions are exact integers below it
    if (m.t_min != std::floor(m.t_min) || m.t_max != std::floor(m.t_max) || m.t_max > exact)
        return bad("t_min", m.t_min, "t_min and t_max must be integer positions (t_max " + to_text(m.t_max) + ")");
    auto const n = static_cast<double>(m.n);
    double const range = m.t_max - m.t_min;
    if (m.n == 1 && range != 0)
        return bad("n", m.n, "one row but t_min " + to_text(m.t_min) + " != t_max " + to_text(m.t_max));
    // Σ(t − t̄)² lies between range²/2 (both extremes present) and n·range²/4 (Popoviciu).
    double const tol2 = 1e-9 * n * (1 + m.t_max) * (1 + m.t_max) * 1e-3;
    if (m.m2_t > n * range * range / 4 * (1 + 1e-9) + tol2)
        return bad("m2_t", m.m2_t,
                   "larger than n * (t_max - t_min)^2 / 4 = " + to_text(n * range * range / 4) +
                       ": inconsistent with the row count n = " + std::to_string(m.n));
    if (m.m2_t < range * range / 2 * (1 - 1e-9) - tol2)
        return bad("m2_t", m.m2_t, "smaller than (t_max - t_min)^2 / 2 = " + to_text(range * range / 2));
    // Σt = n·t̄ is a sum of integers: an edited n shows as a fractional sum.
    double const sum_t = n * m.mean_t, tol1 = 1e-10 * n * (1 + m.t_max);
    if (tol1 <= 0.1 && std::abs(sum_t - std::round(sum_t)) > tol1)
        return bad("n", m.n,
                   "n * mean_t = " + to_text(sum_t) +
                       " is not a sum of integer positions: row count inconsistent with mean_t");
    // every position lies in [t_min, t_max] and one equals each extreme: n·(t̄ − t_min) ≥ range
    if (range > 0 && (n * (m.mean_t - m.t_min) < range * (1 - 1e-9) - tol1 || n * (m.t_max - m.mean_t) < range * (1 - 1e-9) - tol1))
        return bad("n", m.n, "too few rows for positions spanning " + to_text(m.t_min) + ".." + to_text(m.t_max) +
                                 " with mean " + to_text(m.mean_t));
    for (index_t i = 0; i < d; ++i)
        if (m.c_xx(i, i) < 0)
            return bad("c_xx", m.c_xx(i, i),
                       "diagonal of the co-moment matrix must be >= 0 (entry " + std::to_string(i) + ")");
    return std::nullopt;
}

/// Checks a whole head_moments for write_moments: d, both kinds' d, every bucket.
template <class = void>
void check_shard_for_writing(head_moments const& hm) {
    constexpr std::string_view fn = "qkgeom::write_moments";
    if (hm.d < 1 || static_cast<std::uint64_t>(hm.d) > moments_max_dim)
        fail_arg(fn, "head dimension must be in [1, " + std::to_string(moments_max_dim) + "]; d", hm.d);
    for (kind w : {kind::query, kind::key}) {
        std::string const kn = kind_name(w);
        auto const& bm = hm[w];
        if (!bm.buckets.empty() && bm.d != hm.d)
            fail_arg(fn, kn + ".d differs from the head dimension " + std::to_string(hm.d) + "; " + kn + ".d", bm.d);
        std::size_t bi = 0;
        for (auto const& [bucket, m] : bm.buckets) {
            auto const p = check_shard_bucket(bucket, m, hm.d, kn + ".buckets[" + std::to_string(bi++) + "]");
            if (p) fail_arg(fn, p->field + ": " + p->problem, p->value);
        }
    }
}

}  // namespace detail

/// \brief Write `hm` in the shard format (docs/moments.md). Only the lower
/// triangle of each co-moment matrix is stored. Everything read_moments
/// rejects is refused here first, before any byte is written, so a written
/// shard always reads back.
/// \param[out] os binary output stream; bytes are appended at its position.
/// \param[in] hm the moments to write.
/// \throws std::invalid_argument naming the field and value for d outside
///         [1, moments_max_dim], a kind whose d differs, or a bucket that
///         breaks a rule of docs/moments.md "What a shard must satisfy"
///         (negative id, n < 1, non-finite value, inconsistent counts and
///         positions, negative co-moment diagonal); nothing is written then.
/// \throws std::runtime_error when the stream is in a failed state after
///         writing; std::ios_base::failure if `os` has exceptions enabled.
/// \sa read_moments, save_moments
template <class = void>
void write_moments(std::ostream& os, head_moments const& hm) {
    detail::check_shard_for_writing(hm);
    detail::le_writer w(os);
    w.bytes(moments_magic.data(), moments_magic.size());
    w.u32(moments_format_version);
    w.u32(0);  // flags, reserved
    w.i64(hm.id.layer);
    w.i64(hm.id.q_head);
    w.i64(hm.id.k_head);
    w.u64(static_cast<std::uint64_t>(hm.d));
    for (bucketed_moments const* bm : {&hm.q, &hm.k}) {
        w.u64(bm->buckets.size());
        for (auto const& [bucket, m] : bm->buckets) {
            w.i64(bucket);
            w.i64(m.n);
            w.f64(m.mean_t);
            w.f64(m.m2_t);
            w.f64(m.t_min);
            w.f64(m.t_max);
            for (index_t i = 0; i < hm.d; ++i) w.f64(m.mean_x(i));
            for (index_t i = 0; i < hm.d; ++i) w.f64(m.c_xt(i));
            for (index_t i = 0; i < hm.d; ++i)
                for (index_t j = 0; j <= i; ++j) w.f64(m.c_xx(i, j));
        }
    }
    std::uint64_t const h = w.hash();
    w.u64(h);
    if (!os) throw std::runtime_error("qkgeom::write_moments: the output stream failed");
}

namespace detail {

/// Bytes left in a seekable stream after its position, or -1 when unknown.
inline std::int64_t stream_bytes_left(std::istream& is) {
    auto const pos = is.tellg();
    if (pos == std::istream::pos_type(-1)) return -1;
    is.seekg(0, std::ios::end);
    auto const end = is.tellg();
    is.clear();
    is.seekg(pos);
    if (end == std::istream::pos_type(-1) || !is || end < pos) {
        is.clear();
        is.seekg(pos);
        return -1;
    }
    return static_cast<std::int64_t>(end - pos);
}

/// Reads one bucket record (after its id) into `m`: the record is read into
/// a buffer first (growing as the data arrives), then decoded.
template <class = void>
moments read_shard_bucket(le_reader& r, index_t di, std::string const& f, std::vector<unsigned char>& buf) {
    auto const d = static_cast<std::uint64_t>(di);
    r.chunked(buf, static_cast<std::size_t>(shard_record_bytes(d) - 8), f);
    std::size_t at = 0;
    auto next = [&] {
        std::uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(buf[at + static_cast<std::size_t>(i)]) << (8 * i);
        at += 8;
        return v;
    };
    auto real = [&](std::string const& field) {
        double const v = std::bit_cast<double>(next());
        if (!std::isfinite(v)) fail_input(r.source(), field, v, "non-finite value in shard");
        return v;
    };
    moments m(di);
    m.n = static_cast<std::int64_t>(next());
    if (m.n < 1) fail_input(r.source(), f + ".n", m.n, "a stored bucket must hold at least one row");
    m.mean_t = real(f + ".mean_t");
    m.m2_t = real(f + ".m2_t");
    m.t_min = real(f + ".t_min");
    m.t_max = real(f + ".t_max");
    for (index_t i = 0; i < di; ++i) m.mean_x(i) = real(f + ".mean_x[" + std::to_string(i) + "]");
    for (index_t i = 0; i < di; ++i) m.c_xt(i) = real(f + ".c_xt[" + std::to_string(i) + "]");
    for (index_t i = 0; i < di; ++i)
        for (index_t j = 0; j <= i; ++j) m.c_xx(i, j) = m.c_xx(j, i) = real(f + ".c_xx");
    return m;
}

}  // namespace detail

/// \brief Read one shard written by `write_moments`, validating everything:
/// magic, version, flags, dimension, bucket order, counts (each bucket count
/// against the bytes the stream has left, before allocating), finiteness,
/// the consistency rules of docs/moments.md "What a shard must satisfy"
/// (row count vs positions and sums) and the checksum.
/// \param[in,out] is binary input stream positioned at the shard; on success
///            it is left just after the checksum.
/// \param[in] source  name used in error messages (file name or stream label)
/// \returns the moments, with both triangles of each co-moment matrix filled.
/// \throws qkgeom::input_error naming the source, the field and the value
///         (bytes from the stream quoted escaped): truncated data, bad magic,
///         unsupported version, non-zero flags, d outside [1,
///         moments_max_dim], a bucket count larger than the bytes left can
///         hold, bucket ids negative or not strictly ascending, a bucket
///         that breaks a consistency rule, a non-finite value, or a
///         checksum mismatch.
/// \throws std::bad_alloc if memory for the buckets cannot be allocated
///         (never more than about twice the bytes the stream really holds).
/// \sa write_moments, load_moments
template <class = void>
head_moments read_moments(std::istream& is, std::string const& source = "<stream>") {
    std::int64_t const left = detail::stream_bytes_left(is);
    detail::le_reader r(is, source);
    std::array<char, 8> magic{};
    r.bytes(magic.data(), magic.size(), "magic");
    if (magic != moments_magic)
        detail::fail_input(source, "magic", std::string(magic.data(), magic.size()),
                           "not a qkgeom moments shard (bad magic bytes)");
    std::uint32_t const version = r.u32("version");
    if (version != moments_format_version)
        detail::fail_input(source, "version", version,
                           "unsupported shard format version (this build reads version " +
                               std::to_string(moments_format_version) + ")");
    std::uint32_t const flags = r.u32("flags");
    if (flags != 0) detail::fail_input(source, "flags", flags, "reserved flags must be 0");
    head_id id;
    id.layer = r.i64("layer");
    id.q_head = r.i64("q_head");
    id.k_head = r.i64("k_head");
    std::uint64_t const d = r.u64("d");
    if (d == 0 || d > moments_max_dim)
        detail::fail_input(source, "d", d,
                           "head dimension must be in [1, " + std::to_string(moments_max_dim) + "]");
    auto const di = static_cast<index_t>(d);
    std::uint64_t const rec = detail::shard_record_bytes(d);
    head_moments hm(di, id);
    std::vector<unsigned char> buf;
    for (kind w : {kind::query, kind::key}) {
        std::string const kn = kind_name(w);
        std::uint64_t const nb = r.u64(kn + ".n_buckets");
        if (left >= 0) {  // what the bytes left can hold: nb records, (k.n_buckets), checksum
            std::uint64_t const after = static_cast<std::uint64_t>(left) - std::min<std::uint64_t>(static_cast<std::uint64_t>(left), r.offset());
            std::uint64_t const fixed = w == kind::query ? 16 : 8;
            std::uint64_t const room = after >= fixed ? (after - fixed) / rec : 0;
            if (nb > room)
                detail::fail_input(source, kn + ".n_buckets", nb,
                                   "more buckets than the " + std::to_string(after) + " bytes left can hold (" +
                                       std::to_string(rec) + " bytes per bucket at d = " + std::to_string(d) + ")");
        }
        std::int64_t prev = -1;
        for (std::uint64_t bi = 0; bi < nb; ++bi) {
            std::string const f = kn + ".buckets[" + std::to_string(bi) + "]";
            std::int64_t const bucket = r.i64(f + ".bucket");
            if (bucket <= prev)
                detail::fail_input(source, f + ".bucket", bucket,
                                   "bucket ids must be non-negative and strictly ascending");
            prev = bucket;
            moments m = detail::read_shard_bucket(r, di, f, buf);
            if (auto const p = detail::check_shard_bucket(bucket, m, di, f))
                detail::fail_input(source, p->field, p->value, p->problem);
            hm[w].buckets.emplace(bucket, std::move(m));
        }
    }
    std::uint64_t const expect = r.hash();
    std::uint64_t const stored = r.u64("checksum");
    if (stored != expect)
        detail::fail_input(source, "checksum", stored, "checksum mismatch: the shard is corrupted");
    return hm;
}

/// \brief Write a shard file (one shard per file). The shard is validated
/// first (as write_moments), written to a temporary file in the same
/// directory and renamed onto `path`: on any error no file is created and an
/// existing `path` is left as it was.
/// \param[in] path the file to create or replace.
/// \param[in] hm the moments to write.
/// \throws std::invalid_argument as write_moments (nothing is written).
/// \throws qkgeom::io_error (a std::runtime_error) naming the file when it
///         cannot be created, written or renamed into place.
/// \sa load_moments
template <class = void>
void save_moments(std::filesystem::path const& path, head_moments const& hm) {
    detail::check_shard_for_writing(hm);
    std::ostringstream buf(std::ios::binary);
    write_moments(buf, hm);
    std::string const bytes = buf.str();
    io::detail::write_file_bytes(
        path, std::span<unsigned char const>(reinterpret_cast<unsigned char const*>(bytes.data()), bytes.size()));
}

/// \brief Read a shard file (errors name the file, field and value).
/// \param[in] path the file, holding exactly one shard.
/// \returns the moments.
/// \throws qkgeom::input_error when the path is not a regular file (as
///         io::regular_file_size: a FIFO is never opened), the file cannot
///         be opened (with the operating system's reason), for anything
///         read_moments rejects, or when bytes follow the checksum.
/// \throws std::bad_alloc as read_moments.
/// \sa save_moments, merge_moment_files
template <class = void>
head_moments load_moments(std::filesystem::path const& path) {
    std::string const src = path.string();
    (void)io::regular_file_size(path);
    errno = 0;
    std::ifstream is(path, std::ios::binary);
    if (!is) detail::fail_input(src, "file", src, "cannot open file: " + io::detail::errno_text(errno));
    head_moments hm = read_moments(is, src);
    if (is.peek() != std::char_traits<char>::eof())
        detail::fail_input(src, "checksum", "", "trailing bytes after the shard's checksum (one shard per file)");
    return hm;
}

/// \brief Loads shard files of one head and merges them (head_moments::operator+=,
/// Chan merge), in the order given: the reduce step of a sharded run.
/// Every file is validated as load_moments; the shards must agree on layer,
/// q_head, k_head and d.
/// \param[in] paths one or more shard files.
/// \returns the merged moments.
/// \throws std::invalid_argument when `paths` is empty.
/// \throws qkgeom::input_error naming the file: anything load_moments
///         rejects, or a shard of another head or dimension than the first
///         (field "layer", "q_head", "k_head" or "d"; the message names both
///         files' values).
/// \throws std::bad_alloc as read_moments.
template <class = void>
head_moments merge_moment_files(std::span<std::filesystem::path const> paths) {
    if (paths.empty()) detail::fail_arg("qkgeom::merge_moment_files", "no shard files given; count", 0);
    head_moments out = load_moments(paths[0]);
    for (std::size_t i = 1; i < paths.size(); ++i) {
        head_moments const o = load_moments(paths[i]);
        std::string const src = paths[i].string(), first = paths[0].string();
        auto differ = [&](std::string_view field, std::int64_t a, std::int64_t b) {
            if (a != b)
                detail::fail_input(src, field, b,
                                   "shard of another head: " + std::string(field) + " differs from " +
                                       std::to_string(a) + " in " + first);
        };
        differ("layer", out.id.layer, o.id.layer);
        differ("q_head", out.id.q_head, o.id.q_head);
        differ("k_head", out.id.k_head, o.id.k_head);
        differ("d", out.d, o.d);
        out += o;
    }
    return out;
}

}  // namespace qkgeom
