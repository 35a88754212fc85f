// qkgeom — binary serialisation of head_moments, so that shards reduced on
// different machines can be combined (method §1). The byte layout is documented
// in docs/moments.md ("Shard file format"); it is little-endian on every host.
// Format version 2 records the bucket scheme the shard's buckets were computed
// with; version 1 (no scheme) is still read, and written for a shard without one.
#pragma once

#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/validate.hpp>
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
#include <utility>
#include <vector>

namespace qkgeom {

/// Magic bytes opening every shard file.
inline constexpr std::array<char, 8> moments_magic{'Q', 'K', 'G', 'M', 'O', 'M', '\r', '\n'};
/// Newest shard format version: 2 records the bucket scheme (written when a
/// scheme is given); version 1 has none (written without one). Both are read.
inline constexpr std::uint32_t moments_format_version = 2;
/// The shard format version without a bucket scheme (still read and written).
inline constexpr std::uint32_t moments_format_version_without_scheme = 1;

/// Largest head dimension a shard may declare (guards allocations on bad input):
/// the limit of every analysis entry point, qkgeom::max_head_dim (core/validate.hpp).
inline constexpr std::uint64_t moments_max_dim = static_cast<std::uint64_t>(max_head_dim);

/// \brief A shard as stored: the moments, the bucket scheme their bucket ids
/// were computed with (format version 2; nullopt for a version 1 shard, which
/// records none), and, for a shard that was read, its size and stored
/// checksum (FNV-1a over its bytes: with the size, they identify its content).
struct moments_shard {
    head_moments stats;                  ///< the moments of one head
    std::optional<bucket_spec> buckets;  ///< the bucket scheme, or none recorded
    std::uint64_t bytes = 0;             ///< read: the shard's size in bytes
    std::uint64_t checksum = 0;          ///< read: its stored checksum
};

/// \brief The bucket scheme as text, for messages: "uniform width 256 rate 1",
/// "log width 64 rate 2", "all width 128", or "none recorded".
inline std::string bucket_scheme_text(std::optional<bucket_spec> const& s) {
    if (!s) return "none recorded";
    std::string t = std::string(bucket_scheme_name(s->scheme)) + " width " + std::to_string(s->width);
    if (s->scheme != bucket_scheme::all) t += " rate " + detail::to_text(s->rate);
    return t;
}

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

/// A bucket scheme a shard can record: a known scheme, width >= 1, rate
/// finite and > 0 (field, value, problem), or nullopt.
inline std::optional<shard_problem> check_shard_scheme(bucket_spec const& s) {
    auto const code = static_cast<unsigned>(s.scheme);
    if (code > static_cast<unsigned>(bucket_scheme::all))
        return shard_problem{"bucket_scheme", std::to_string(code), "unknown bucket scheme (0 uniform, 1 log, 2 all)"};
    if (s.width < 1) return shard_problem{"bucket_width", std::to_string(s.width), "bucket width must be >= 1"};
    if (!(std::isfinite(s.rate) && s.rate > 0))
        return shard_problem{"bucket_rate", to_text(s.rate), "keep rate must be finite and > 0"};
    return std::nullopt;
}

/// A stored bucket whose positions (t_min .. t_max, already checked to be
/// integers in [0, 2^53]) do not lie in its bucket id under the scheme.
inline std::optional<shard_problem> check_bucket_in_scheme(std::int64_t bucket, moments const& m, bucket_spec const& s,
                                                           std::string const& f) {
    auto const lo = bucket_of_unchecked(s, static_cast<std::int64_t>(m.t_min));
    auto const hi = bucket_of_unchecked(s, static_cast<std::int64_t>(m.t_max));
    if (lo == bucket && hi == bucket) return std::nullopt;
    return shard_problem{f + ".bucket", std::to_string(bucket),
                         "positions t_min " + to_text(m.t_min) + " .. t_max " + to_text(m.t_max) + " lie in bucket " +
                             std::to_string(lo) + (hi == lo ? "" : " .. " + std::to_string(hi)) +
                             " under the shard's bucket scheme (" + bucket_scheme_text(s) + "), not in this one"};
}

/// Checks a whole head_moments for write_moments: d, both kinds' d, every
/// bucket, and with a bucket scheme the scheme and every bucket id under it.
template <class = void>
void check_shard_for_writing(head_moments const& hm, std::optional<bucket_spec> const& scheme = std::nullopt) {
    constexpr std::string_view fn = "qkgeom::write_moments";
    if (hm.d < 1 || static_cast<std::uint64_t>(hm.d) > moments_max_dim)
        fail_arg(fn, "head dimension must be in [1, " + std::to_string(moments_max_dim) + "]; d", hm.d);
    if (scheme)
        if (auto const p = check_shard_scheme(*scheme)) fail_arg(fn, p->field + ": " + p->problem, p->value);
    for (kind w : {kind::query, kind::key}) {
        std::string const kn = kind_name(w);
        auto const& bm = hm[w];
        if (!bm.buckets.empty() && bm.d != hm.d)
            fail_arg(fn, kn + ".d differs from the head dimension " + std::to_string(hm.d) + "; " + kn + ".d", bm.d);
        std::size_t bi = 0;
        for (auto const& [bucket, m] : bm.buckets) {
            std::string const f = kn + ".buckets[" + std::to_string(bi++) + "]";
            auto p = check_shard_bucket(bucket, m, hm.d, f);
            if (!p && scheme) p = check_bucket_in_scheme(bucket, m, *scheme, f);
            if (p) fail_arg(fn, p->field + ": " + p->problem, p->value);
        }
    }
}

}  // namespace detail

/// \brief Write `hm` in the shard format (docs/moments.md): version 2 with
/// the bucket scheme `buckets` when given, else version 1 (no scheme). Only
/// the lower triangle of each co-moment matrix is stored. Everything
/// read_moments rejects is refused here first, before any byte is written,
/// so a written shard always reads back.
/// \param[out] os binary output stream; bytes are appended at its position.
/// \param[in] hm the moments to write.
/// \param[in] buckets the bucket scheme hm's bucket ids were computed with;
///            every bucket's positions must lie in its id under it.
/// \throws std::invalid_argument naming the field and value for d outside
///         [1, moments_max_dim], a kind whose d differs, or a bucket that
///         breaks a rule of docs/moments.md "What a shard must satisfy"
///         (negative id, n < 1, non-finite value, inconsistent counts and
///         positions, negative co-moment diagonal); with `buckets`, an
///         unknown scheme, width < 1, a rate not finite and > 0, or a bucket
///         whose positions lie outside its id under the scheme; nothing is
///         written then.
/// \throws std::runtime_error when the stream is in a failed state after
///         writing; std::ios_base::failure if `os` has exceptions enabled.
/// \sa read_moments, save_moments
template <class = void>
void write_moments(std::ostream& os, head_moments const& hm, std::optional<bucket_spec> const& buckets) {
    detail::check_shard_for_writing(hm, buckets);
    detail::le_writer w(os);
    w.bytes(moments_magic.data(), moments_magic.size());
    w.u32(buckets ? moments_format_version : moments_format_version_without_scheme);
    w.u32(0);  // flags, reserved
    w.i64(hm.id.layer);
    w.i64(hm.id.q_head);
    w.i64(hm.id.k_head);
    w.u64(static_cast<std::uint64_t>(hm.d));
    if (buckets) {  // version 2: the bucket scheme
        w.u32(static_cast<std::uint32_t>(buckets->scheme));
        w.u32(0);  // reserved
        w.i64(buckets->width);
        w.f64(buckets->rate);
    }
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

/// \brief Write `hm` as a version 1 shard (no bucket scheme): as
/// write_moments(os, hm, std::nullopt).
template <class = void>
void write_moments(std::ostream& os, head_moments const& hm) {
    write_moments(os, hm, std::nullopt);
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

/// Reads the bucket scheme of a version 2 shard (after d) and checks it.
template <class = void>
bucket_spec read_shard_scheme(le_reader& r) {
    std::uint32_t const code = r.u32("bucket_scheme");
    std::uint32_t const reserved = r.u32("bucket_reserved");
    bucket_spec s;
    s.width = r.i64("bucket_width");
    s.rate = r.f64("bucket_rate");
    if (code > static_cast<std::uint32_t>(bucket_scheme::all))
        fail_input(r.source(), "bucket_scheme", code, "unknown bucket scheme (0 uniform, 1 log, 2 all)");
    if (reserved != 0) fail_input(r.source(), "bucket_reserved", reserved, "reserved field must be 0");
    s.scheme = static_cast<bucket_scheme>(code);
    if (auto const p = check_shard_scheme(s)) fail_input(r.source(), p->field, p->value, p->problem);
    return s;
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
/// \returns the shard: the moments, with both triangles of each co-moment
///          matrix filled; the bucket scheme (version 2) or none (version 1);
///          its size and stored checksum.
/// \throws qkgeom::input_error naming the source, the field and the value
///         (bytes from the stream quoted escaped): truncated data, bad magic,
///         a version other than 1 and 2, non-zero flags, d outside [1,
///         moments_max_dim], a bad bucket scheme (version 2), a bucket count
///         larger than the bytes left can hold, bucket ids negative or not
///         strictly ascending, a bucket that breaks a consistency rule or
///         whose positions lie outside its id under the recorded scheme, a
///         non-finite value, or a checksum mismatch.
/// \throws std::bad_alloc if memory for the buckets cannot be allocated
///         (never more than about twice the bytes the stream really holds).
/// \sa write_moments, load_moments_shard, read_moments
template <class = void>
moments_shard read_moments_shard(std::istream& is, std::string const& source = "<stream>") {
    std::int64_t const left = detail::stream_bytes_left(is);
    detail::le_reader r(is, source);
    std::array<char, 8> magic{};
    r.bytes(magic.data(), magic.size(), "magic");
    if (magic != moments_magic)
        detail::fail_input(source, "magic", std::string(magic.data(), magic.size()),
                           "not a qkgeom moments shard (bad magic bytes)");
    std::uint32_t const version = r.u32("version");
    if (version != moments_format_version && version != moments_format_version_without_scheme)
        detail::fail_input(source, "version", version,
                           "unsupported shard format version (this build reads versions " +
                               std::to_string(moments_format_version_without_scheme) + " and " +
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
    moments_shard out{head_moments(di, id), std::nullopt, 0, 0};
    if (version == moments_format_version) out.buckets = detail::read_shard_scheme(r);
    head_moments& hm = out.stats;
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
            auto p = detail::check_shard_bucket(bucket, m, di, f);
            if (!p && out.buckets) p = detail::check_bucket_in_scheme(bucket, m, *out.buckets, f);
            if (p) detail::fail_input(source, p->field, p->value, p->problem);
            hm[w].buckets.emplace(bucket, std::move(m));
        }
    }
    std::uint64_t const expect = r.hash();
    std::uint64_t const stored = r.u64("checksum");
    if (stored != expect)
        detail::fail_input(source, "checksum", stored, "checksum mismatch: the shard is corrupted");
    out.bytes = r.offset();
    out.checksum = stored;
    return out;
}

/// \brief Read one shard (read_moments_shard) and return its moments only.
/// \param[in,out] is binary input stream positioned at the shard; on success
///            it is left just after the checksum.
/// \param[in] source  name used in error messages (file name or stream label)
/// \returns the moments, with both triangles of each co-moment matrix filled.
/// \throws qkgeom::input_error, std::bad_alloc as read_moments_shard.
/// \sa write_moments, load_moments
template <class = void>
head_moments read_moments(std::istream& is, std::string const& source = "<stream>") {
    return read_moments_shard(is, source).stats;
}

/// \brief Write a shard file (one shard per file). The shard is validated
/// first (as write_moments), written to a temporary file in the same
/// directory and renamed onto `path`: on any error no file is created and an
/// existing `path` is left as it was.
/// \param[in] path the file to create or replace.
/// \param[in] hm the moments to write.
/// \param[in] buckets the bucket scheme hm's bucket ids were computed with
///            (format version 2), or nullopt (version 1, no scheme).
/// \throws std::invalid_argument as write_moments (nothing is written).
/// \throws qkgeom::io_error (a std::runtime_error) naming the file when it
///         cannot be created, written or renamed into place.
/// \sa load_moments_shard
template <class = void>
void save_moments(std::filesystem::path const& path, head_moments const& hm,
                  std::optional<bucket_spec> const& buckets) {
    detail::check_shard_for_writing(hm, buckets);
    std::ostringstream buf(std::ios::binary);
    write_moments(buf, hm, buckets);
    std::string const bytes = buf.str();
    io::detail::write_file_bytes(
        path, std::span<unsigned char const>(reinterpret_cast<unsigned char const*>(bytes.data()), bytes.size()));
}

/// \brief Write a version 1 shard file (no bucket scheme): as
/// save_moments(path, hm, std::nullopt).
/// \sa load_moments
template <class = void>
void save_moments(std::filesystem::path const& path, head_moments const& hm) {
    save_moments(path, hm, std::nullopt);
}

/// \brief Read a shard file with its bucket scheme (errors name the file,
/// field and value).
/// \param[in] path the file, holding exactly one shard (version 1 or 2).
/// \returns the shard (moments, bucket scheme or none, size, checksum).
/// \throws qkgeom::input_error when the path is not a regular file (as
///         io::regular_file_size: a FIFO is never opened), the file cannot
///         be opened (with the operating system's reason), for anything
///         read_moments_shard rejects, or when bytes follow the checksum.
/// \throws std::bad_alloc as read_moments_shard.
/// \sa save_moments, merge_moment_shards
template <class = void>
moments_shard load_moments_shard(std::filesystem::path const& path) {
    std::string const src = path.string();
    (void)io::regular_file_size(path);
    errno = 0;
    std::ifstream is(path, std::ios::binary);
    if (!is) detail::fail_input(src, "file", src, "cannot open file: " + io::detail::errno_text(errno));
    moments_shard s = read_moments_shard(is, src);
    if (is.peek() != std::char_traits<char>::eof())
        detail::fail_input(src, "checksum", "", "trailing bytes after the shard's checksum (one shard per file)");
    return s;
}

/// \brief Read a shard file's moments (load_moments_shard without the scheme).
/// \param[in] path the file, holding exactly one shard.
/// \returns the moments.
/// \throws qkgeom::input_error, std::bad_alloc as load_moments_shard.
/// \sa save_moments, merge_moment_files
template <class = void>
head_moments load_moments(std::filesystem::path const& path) {
    return load_moments_shard(path).stats;
}

namespace detail {

/// What identifies a file: its canonical path, and its size (two paths of
/// one size are compared with std::filesystem::equivalent: the same file
/// through symbolic or hard links).
struct shard_file_id {
    std::filesystem::path path, canonical;
    std::uintmax_t size = 0;
    explicit shard_file_id(std::filesystem::path const& p) : path(p) {
        std::error_code ec;
        canonical = std::filesystem::weakly_canonical(p, ec);
        if (ec) canonical = p.lexically_normal();
        size = std::filesystem::file_size(p, ec);
        if (ec) size = static_cast<std::uintmax_t>(-1);
    }
    [[nodiscard]] bool same(shard_file_id const& o) const {
        if (canonical == o.canonical) return true;
        std::error_code ec;
        return size == o.size && std::filesystem::equivalent(path, o.path, ec) && !ec;
    }
};

/// Whether two files hold the same bytes (compared in 64 KiB blocks).
inline bool same_shard_bytes(std::filesystem::path const& a, std::filesystem::path const& b) {
    std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
    if (!fa || !fb) return false;
    std::vector<char> ba(1 << 16), bb(1 << 16);
    for (;;) {
        fa.read(ba.data(), static_cast<std::streamsize>(ba.size()));
        fb.read(bb.data(), static_cast<std::streamsize>(bb.size()));
        if (fa.gcount() != fb.gcount() || !std::equal(ba.begin(), ba.begin() + fa.gcount(), bb.begin())) return false;
        if (fa.gcount() == 0 || !fa || !fb) return !fa && !fb && fa.eof() && fb.eof();
    }
}

/// The checks of merge_moment_shards between a shard and the first one.
template <class = void>
void check_mergeable(moments_shard const& first, std::filesystem::path const& first_path, moments_shard const& o,
                     std::filesystem::path const& path) {
    std::string const src = path.string(), f = first_path.string();
    auto differ = [&](std::string_view field, std::int64_t a, std::int64_t b) {
        if (a != b)
            fail_input(src, field, b,
                       "shard of another head: " + std::string(field) + " differs from " + std::to_string(a) + " in " + f);
    };
    differ("layer", first.stats.id.layer, o.stats.id.layer);
    differ("q_head", first.stats.id.q_head, o.stats.id.q_head);
    differ("k_head", first.stats.id.k_head, o.stats.id.k_head);
    differ("d", first.stats.d, o.stats.d);
    if (first.buckets == o.buckets) return;
    std::string const mine = bucket_scheme_text(o.buckets), theirs = bucket_scheme_text(first.buckets);
    std::string const why =
        !o.buckets      ? "the shard records no bucket scheme (format version 1) but " + f + " records " + theirs
        : !first.buckets ? "the shard's bucket scheme is " + mine + " but " + f + " records none (format version 1)"
                         : "the shard's bucket scheme is " + mine + " but that of " + f + " is " + theirs;
    fail_input(src, "bucket_scheme", mine,
               why + ": the bucket ids cannot be checked to mean the same positions, so they are not merged");
}

}  // namespace detail

/// \brief Loads shard files of one head and merges them (head_moments::operator+=,
/// Chan merge), in the order given: the reduce step of a sharded run.
/// Every file is validated as load_moments_shard; no file may be given twice
/// (the same file through any path, symbolic or hard link) or be a
/// byte-identical copy of another (same size, checksum and bytes): either
/// would count its rows twice. The shards must agree on layer, q_head,
/// k_head, d and the bucket scheme (all recording the same one, or all
/// recording none: version 1 shards, whose schemes cannot be checked).
/// \param[in] paths one or more shard files.
/// \returns the merged moments with the common bucket scheme.
/// \throws std::invalid_argument when `paths` is empty.
/// \throws qkgeom::input_error naming the file: anything load_moments_shard
///         rejects; a file given twice or a copy (field "file", naming both
///         files); a shard of another head or dimension than the first
///         (field "layer", "q_head", "k_head" or "d") or of another bucket
///         scheme (field "bucket_scheme"; the message names both files and
///         both schemes).
/// \throws std::bad_alloc as read_moments.
template <class = void>
moments_shard merge_moment_shards(std::span<std::filesystem::path const> paths) {
    if (paths.empty()) detail::fail_arg("qkgeom::merge_moment_files", "no shard files given; count", 0);
    std::vector<detail::shard_file_id> ids;
    for (auto const& p : paths) ids.emplace_back(p);
    for (std::size_t i = 1; i < paths.size(); ++i)
        for (std::size_t j = 0; j < i; ++j)
            if (ids[j].same(ids[i]))
                detail::fail_input(paths[i].string(), "file", paths[i].string(),
                                   "the same file as " + paths[j].string() +
                                       " (given twice): its rows would be counted twice");
    moments_shard out = load_moments_shard(paths[0]);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> seen{{out.bytes, out.checksum}};
    for (std::size_t i = 1; i < paths.size(); ++i) {
        moments_shard const o = load_moments_shard(paths[i]);
        for (std::size_t j = 0; j < i; ++j)
            if (seen[j] == std::pair{o.bytes, o.checksum} && detail::same_shard_bytes(paths[j], paths[i]))
                detail::fail_input(paths[i].string(), "file", paths[i].string(),
                                   "byte-identical to " + paths[j].string() + " (" + std::to_string(o.bytes) +
                                       " bytes, checksum " + std::to_string(o.checksum) +
                                       "): a copy of a shard would count its rows twice");
        seen.emplace_back(o.bytes, o.checksum);
        detail::check_mergeable(out, paths[0], o, paths[i]);
        out.stats += o.stats;
    }
    out.bytes = out.checksum = 0;  // describe the inputs, not the merge
    return out;
}

/// \brief merge_moment_shards without the bucket scheme: the merged moments.
/// \param[in] paths one or more shard files.
/// \returns the merged moments.
/// \throws as merge_moment_shards.
template <class = void>
head_moments merge_moment_files(std::span<std::filesystem::path const> paths) {
    return merge_moment_shards(paths).stats;
}

}  // namespace qkgeom
