// qkgeom — binary serialisation of head_moments, so that shards reduced on
// different machines can be combined (method §1). The byte layout is documented
// in docs/moments.md ("Shard file format"); it is little-endian on every host.
#pragma once

#include <qkgeom/errors.hpp>
#include <qkgeom/moments.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <ostream>
#include <string>
#include <string_view>

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

private:
    std::istream& is_;
    std::string source_;
    fnv1a hash_;
    std::size_t offset_ = 0;
};

}  // namespace detail

/// \brief Write `hm` in the shard format (docs/moments.md). Only the lower
/// triangle of each co-moment matrix is stored.
/// \param[out] os binary output stream; bytes are appended at its position.
/// \param[in] hm the moments to write.
/// \pre every stored bucket has dimension hm.d, n ≥ 1, finite statistics and a
///      non-negative bucket id (not checked here; read_moments rejects a shard
///      that breaks any of these).
/// \throws std::invalid_argument for d outside [1, moments_max_dim];
///         std::runtime_error when the stream is in a failed state after
///         writing; std::ios_base::failure if `os` has exceptions enabled.
/// \sa read_moments, save_moments
template <class = void>
void write_moments(std::ostream& os, head_moments const& hm) {
    if (hm.d < 1 || static_cast<std::uint64_t>(hm.d) > moments_max_dim)
        detail::fail_arg("qkgeom::write_moments",
                         "head dimension must be in [1, " + std::to_string(moments_max_dim) + "]; d", hm.d);
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

/// \brief Read one shard written by `write_moments`, validating everything:
/// magic, version, flags, dimension, bucket order, counts, finiteness,
/// non-negative second moments and the checksum.
/// \param[in,out] is binary input stream positioned at the shard; on success
///            it is left just after the checksum.
/// \param[in] source  name used in error messages (file name or stream label)
/// \returns the moments, with both triangles of each co-moment matrix filled.
/// \throws qkgeom::input_error naming the source, the field and the value:
///         truncated data, bad magic, unsupported version, non-zero flags,
///         d outside [1, moments_max_dim], bucket ids negative or not strictly
///         ascending, a bucket count n < 1, a non-finite value, m2_t < 0,
///         positions violating 0 ≤ t_min ≤ mean_t ≤ t_max (to a small
///         tolerance), a negative co-moment diagonal, or a checksum mismatch.
/// \throws std::bad_alloc if memory for the buckets cannot be allocated.
/// \sa write_moments, load_moments
template <class = void>
head_moments read_moments(std::istream& is, std::string const& source = "<stream>") {
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
    head_moments hm(di, id);
    for (kind w : {kind::query, kind::key}) {
        std::string const kn = kind_name(w);
        std::uint64_t const nb = r.u64(kn + ".n_buckets");
        std::int64_t prev = -1;
        for (std::uint64_t bi = 0; bi < nb; ++bi) {
            std::string const f = kn + ".buckets[" + std::to_string(bi) + "]";
            std::int64_t const bucket = r.i64(f + ".bucket");
            if (bucket <= prev)
                detail::fail_input(source, f + ".bucket", bucket,
                                   "bucket ids must be non-negative and strictly ascending");
            prev = bucket;
            moments m(di);
            m.n = r.i64(f + ".n");
            if (m.n < 1) detail::fail_input(source, f + ".n", m.n, "a stored bucket must hold at least one row");
            m.mean_t = r.f64(f + ".mean_t");
            m.m2_t = r.f64(f + ".m2_t");
            if (m.m2_t < 0) detail::fail_input(source, f + ".m2_t", m.m2_t, "sum of squares must be >= 0");
            m.t_min = r.f64(f + ".t_min");
            m.t_max = r.f64(f + ".t_max");
            if (!(m.t_min >= 0 && m.t_min <= m.mean_t * (1 + 1e-12) + 1e-9 && m.t_max >= m.mean_t * (1 - 1e-12) - 1e-9))
                detail::fail_input(source, f + ".t_min", m.t_min,
                                   "positions must satisfy 0 <= t_min <= mean_t <= t_max (t_max " +
                                       detail::to_text(m.t_max) + ")");
            for (index_t i = 0; i < di; ++i) m.mean_x(i) = r.f64(f + ".mean_x");
            for (index_t i = 0; i < di; ++i) m.c_xt(i) = r.f64(f + ".c_xt");
            for (index_t i = 0; i < di; ++i)
                for (index_t j = 0; j <= i; ++j) m.c_xx(i, j) = m.c_xx(j, i) = r.f64(f + ".c_xx");
            for (index_t i = 0; i < di; ++i)
                if (m.c_xx(i, i) < 0)
                    detail::fail_input(source, f + ".c_xx", m.c_xx(i, i),
                                       "diagonal of the co-moment matrix must be >= 0 (entry " +
                                           std::to_string(i) + ")");
            hm[w].buckets.emplace(bucket, std::move(m));
        }
    }
    std::uint64_t const expect = r.hash();
    std::uint64_t const stored = r.u64("checksum");
    if (stored != expect)
        detail::fail_input(source, "checksum", stored, "checksum mismatch: the shard is corrupted");
    return hm;
}

/// \brief Write a shard file (one shard per file; an existing file is truncated).
/// \param[in] path the file to create.
/// \param[in] hm the moments to write.
/// \pre as write_moments.
/// \throws std::runtime_error naming the file when it cannot be opened or written.
/// \throws std::invalid_argument as write_moments (the file is then left
///         created and empty).
/// \sa load_moments
template <class = void>
void save_moments(std::filesystem::path const& path, head_moments const& hm) {
    std::ofstream os(path, std::ios::binary | std::ios::trunc);
    if (!os) throw std::runtime_error("qkgeom::save_moments: cannot open '" + path.string() + "' for writing");
    write_moments(os, hm);
    os.close();
    if (!os) throw std::runtime_error("qkgeom::save_moments: writing '" + path.string() + "' failed");
}

/// \brief Read a shard file (errors name the file, field and value).
/// \param[in] path the file, holding exactly one shard.
/// \returns the moments.
/// \throws qkgeom::input_error when the file cannot be opened, for anything
///         read_moments rejects, or when bytes follow the checksum.
/// \throws std::bad_alloc as read_moments.
/// \sa save_moments
template <class = void>
head_moments load_moments(std::filesystem::path const& path) {
    std::ifstream is(path, std::ios::binary);
    if (!is) throw input_error(path.string(), "", "", "qkgeom::load_moments: cannot open '" + path.string() + "'");
    head_moments hm = read_moments(is, path.string());
    if (is.peek() != std::char_traits<char>::eof())
        throw input_error(path.string(), "checksum", "",
                          path.string() + ": trailing bytes after the shard's checksum (one shard per file)");
    return hm;
}

}  // namespace qkgeom
