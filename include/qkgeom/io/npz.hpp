// qkgeom — NumPy .npz reader and writer (ZIP archives of .npy members).
//
// Format: an .npz is a ZIP archive (PKWARE APPNOTE.TXT 6.3) whose members
// are .npy files (NEP 1, npy.hpp) named "<key>.npy"; np.savez stores them
// (method 0), np.savez_compressed deflates them (method 8, raw RFC 1951).
// The parts of the ZIP format used here:
//
//   local file header   PK\3\4, version, flags, method, time, date, crc-32,
//                       compressed size, size, name length, extra length,
//                       name, extra; then the (compressed) data; then, when
//                       flag bit 3 is set, a data descriptor
//                       [PK\7\8] crc-32, compressed size, size (8-byte sizes
//                       when the local header has a ZIP64 extra field)
//   central directory   PK\1\2, one header per member: the authoritative
//                       crc-32 and sizes, and the local header's offset
//   ZIP64 end record    PK\6\6 + locator PK\6\7, when a count, size or
//                       offset does not fit the 16/32-bit fields (which then
//                       hold 0xFFFF / 0xFFFFFFFF)
//   end record          PK\5\6, at the end of the file (+ a comment)
//
// ZIP64 extra field (id 0x0001): the 64-bit values of the fields that hold
// 0xFFFFFFFF, in the order size, compressed size, local header offset, disk.
// numpy always opens its members with force_zip64=True, so every member of an
// np.savez archive has a ZIP64 local header (sizes 0xFFFFFFFF, real sizes in
// the extra field) while its central directory entry usually has none.
//
// Deflate needs zlib: define QKGEOM_HAVE_ZLIB=1 and link zlib (the CMake
// target qkgeom::qkgeom and the installed qkgeom.pc do both when qkgeom was
// configured with zlib). Without it, stored archives work and a deflated
// member fails with a message saying so. CRC-32 is computed here (no zlib).
//
// Reading validates everything: signatures, that every record lies inside
// the file, the end record's counts and offsets, one disk only, no
// encryption, methods 0 and 8 only, member names (non-empty, no NUL, end in
// ".npy", no duplicates), local header == central directory (name, method,
// crc-32, sizes), data descriptors, members that do not overlap, the
// inflated size, the CRC-32, and then each member as a .npy. Errors are
// qkgeom::input_error with source "<file>" or "<file>[<member>]", the field
// and the offending value, e.g.
//   "x.npz[vectors.npy]: crc32: CRC-32 mismatch: the archive records 0x1c291ca3 (value 0x1c291ca2)".
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/io/npy.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if defined(QKGEOM_HAVE_ZLIB)
#if QKGEOM_HAVE_ZLIB
#if !__has_include(<zlib.h>)
#error "qkgeom/io/npz.hpp: QKGEOM_HAVE_ZLIB=1 but <zlib.h> was not found (install zlib's headers or define QKGEOM_HAVE_ZLIB=0)"
#endif
#include <zlib.h>
#define QKGEOM_NPZ_DEFLATE 1
#endif
#endif
#ifndef QKGEOM_NPZ_DEFLATE
#define QKGEOM_NPZ_DEFLATE 0
#endif

namespace qkgeom::io {

/// \brief Compression of the members an .npz writer produces.
enum class npz_compression : std::uint8_t {
    stored = 0,   ///< ZIP method 0, as np.savez
    deflate = 8,  ///< ZIP method 8 (raw deflate), as np.savez_compressed; needs zlib
};

/// \brief Whether this build can read and write deflated members
/// (QKGEOM_HAVE_ZLIB=1 and <zlib.h> found).
/// \returns true when deflate is compiled in.
constexpr bool npz_deflate_available() noexcept { return QKGEOM_NPZ_DEFLATE != 0; }

/// \brief Options of serialize_npz / write_npz.
struct npz_write_options {
    npz_compression compression = npz_compression::stored;  ///< method of every member
    int level = 6;                 ///< deflate level 1 (fast) .. 9 (small)
    bool force_zip64 = false;      ///< ZIP64 extra fields and end records even when the sizes fit 32 bits
    bool data_descriptor = false;  ///< CRC-32 and sizes after the data (flag bit 3), as streaming writers do
};

/// \brief What the central directory says about one member (list_npz).
struct zip_member_info {
    std::string name;                   ///< member name as stored ("vectors.npy")
    std::uint16_t method = 0;           ///< 0 stored, 8 deflate
    std::uint16_t flags = 0;            ///< general purpose bit flag (bit 3: data descriptor)
    std::uint32_t crc32 = 0;            ///< CRC-32 of the uncompressed data
    std::uint64_t compressed_size = 0;  ///< bytes stored in the archive
    std::uint64_t size = 0;             ///< bytes after decompression
    std::uint64_t offset = 0;           ///< of the local header
    bool zip64 = false;                 ///< the local header carries a ZIP64 extra field
};

/// \brief One array of an .npz: its key (member name without ".npy") and the array.
struct npz_member {
    std::string key;    ///< member name without ".npy"
    npy_array array;    ///< the array
};

/// \brief An .npz archive in memory: arrays in archive order, keys unique.
struct npz_file {
    std::vector<npz_member> members;  ///< in archive order; keys unique (add() enforces it)

    /// \brief The array of a key.
    /// \param[in] key the key, with or without the ".npy" suffix.
    /// \returns a pointer into `members` (invalidated when members change), or
    ///          nullptr when no member has that key.
    [[nodiscard]] npy_array const* find(std::string_view key) const noexcept {
        if (key.size() >= 4 && key.substr(key.size() - 4) == ".npy") key.remove_suffix(4);
        for (auto const& m : members)
            if (m.key == key) return &m.array;
        return nullptr;
    }
    /// \brief The array of a key, which must be present.
    /// \param[in] key the key, with or without the ".npy" suffix.
    /// \param[in] source file name (or label) used in the error message.
    /// \returns a reference into `members`.
    /// \throws qkgeom::input_error naming the source and key when absent.
    [[nodiscard]] npy_array const& at(std::string_view key, std::string const& source = "<npz>") const {
        if (auto const* a = find(key)) return *a;
        std::string k(key);
        if (!k.ends_with(".npy")) k += ".npy";
        qkgeom::detail::fail_input(source, k, "<missing>", "required member is missing from the archive");
    }
    /// \brief Appends an array.
    /// \param[in] key the key; a trailing ".npy" is removed.
    /// \param[in] a the array (not validated here; serialize_npz does).
    /// \throws std::invalid_argument for a duplicate key, a key containing NUL,
    ///         or a member name ("<key>.npy") longer than 65535 bytes.
    void add(std::string key, npy_array a) {
        constexpr std::string_view fn = "qkgeom::io::npz_file::add";
        if (key.ends_with(".npy")) key.resize(key.size() - 4);
        if (key.find('\0') != std::string::npos) qkgeom::detail::fail_arg(fn, "key contains a NUL byte; key", key);
        if (key.size() + 4 > 0xFFFF) qkgeom::detail::fail_arg(fn, "key longer than 65531 bytes; length", key.size());
        if (find(key)) qkgeom::detail::fail_arg(fn, "duplicate key", key);
        members.push_back({std::move(key), std::move(a)});
    }
};

namespace detail {

inline constexpr std::array<std::uint32_t, 256> crc32_table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
        std::uint32_t c = n;
        for (int k = 0; k < 8; ++k) c = (c & 1U) ? 0xEDB88320U ^ (c >> 1) : c >> 1;
        t[n] = c;
    }
    return t;
}();

inline std::string hex32(std::uint32_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s = "0x";
    for (int i = 7; i >= 0; --i) s.push_back(digits[(v >> (4 * i)) & 0xFU]);
    return s;
}

}  // namespace detail

/// \brief CRC-32 (ISO-HDLC, polynomial 0xEDB88320, as ZIP and zlib) of
/// `data`, continuing from `crc` (0 to start): crc32(b, crc32(a)) == crc32(a + b).
/// \param[in] data the bytes.
/// \param[in] crc the CRC of the bytes before `data`, or 0.
/// \returns the CRC-32 of everything so far.
[[nodiscard]] inline std::uint32_t crc32(std::span<unsigned char const> data, std::uint32_t crc = 0) noexcept {
    std::uint32_t c = ~crc;
    for (unsigned char b : data) c = detail::crc32_table[(c ^ b) & 0xFFU] ^ (c >> 8);
    return ~c;
}

namespace detail {

// ZIP signatures (APPNOTE 4.3)
inline constexpr std::uint32_t zip_local_sig = 0x04034b50U;       // PK\3\4
inline constexpr std::uint32_t zip_central_sig = 0x02014b50U;     // PK\1\2
inline constexpr std::uint32_t zip_end_sig = 0x06054b50U;         // PK\5\6
inline constexpr std::uint32_t zip64_end_sig = 0x06064b50U;       // PK\6\6
inline constexpr std::uint32_t zip64_locator_sig = 0x07064b50U;   // PK\6\7
inline constexpr std::uint32_t zip_descriptor_sig = 0x08074b50U;  // PK\7\8
inline constexpr std::uint32_t u32_max = 0xFFFFFFFFU;

/// Little-endian appender.
struct zip_out {
    std::vector<unsigned char> b;
    void put(std::uint64_t v, std::size_t n) {
        std::size_t const at = b.size();
        b.resize(at + n);
        store_le(b.data() + at, v, n);
    }
    void bytes(std::span<unsigned char const> s) {
        std::size_t const at = b.size();
        b.resize(at + s.size());
        if (!s.empty()) std::memcpy(b.data() + at, s.data(), s.size());
    }
    void text(std::string_view s) {
        bytes(std::span<unsigned char const>(reinterpret_cast<unsigned char const*>(s.data()), s.size()));
    }
};

#if QKGEOM_NPZ_DEFLATE
inline constexpr std::size_t zlib_chunk = std::size_t{1} << 30;  // avail_in/out are 32-bit
/// Deflate bombs: a deflated member that inflates to more than
/// npz_bomb_floor bytes must do so at most npz_max_inflate_ratio-fold.
/// Real activations compress about 1.1-fold and index arrays a few-fold, so
/// only constant data or a bomb comes near deflate's maximum of 1032-fold;
/// memory for a deflated member stays within max(64 MiB, 200 x its size).
inline constexpr std::uint64_t npz_bomb_floor = std::uint64_t{64} << 20;
inline constexpr std::uint64_t npz_max_inflate_ratio = 200;

inline std::vector<unsigned char> deflate_raw(std::span<unsigned char const> in, int level) {
    constexpr std::string_view fn = "qkgeom::io::serialize_npz";
    z_stream zs{};
    if (deflateInit2(&zs, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        throw io_error("<deflate>", std::string(fn) + ": zlib deflateInit2 failed (level " + std::to_string(level) + ")");
    std::vector<unsigned char> out(static_cast<std::size_t>(deflateBound(&zs, static_cast<uLong>(in.size()))) + 64);
    std::size_t in_off = 0, out_off = 0;
    int ret = Z_OK;
    while (ret != Z_STREAM_END) {
        if (zs.avail_in == 0 && in_off < in.size()) {
            std::size_t const n = std::min(in.size() - in_off, zlib_chunk);
            zs.next_in = const_cast<Bytef*>(in.data() + in_off);  // zlib does not write through next_in
            zs.avail_in = static_cast<uInt>(n);
            in_off += n;
        }
        if (out.size() - out_off < 4096) out.resize(out.size() + std::max<std::size_t>(out.size() / 2, 65536));
        std::size_t const room = std::min(out.size() - out_off, zlib_chunk);
        zs.next_out = out.data() + out_off;
        zs.avail_out = static_cast<uInt>(room);
        ret = deflate(&zs, in_off == in.size() ? Z_FINISH : Z_NO_FLUSH);
        out_off += room - zs.avail_out;
        if (ret == Z_STREAM_ERROR) {
            deflateEnd(&zs);
            throw io_error("<deflate>", std::string(fn) + ": zlib deflate failed (code " + std::to_string(ret) + ")");
        }
    }
    deflateEnd(&zs);
    out.resize(out_off);
    return out;
}

/// Inflates exactly `size` bytes from a raw deflate stream that must be
/// consumed completely; problems are reported against `src`. A member that
/// would inflate beyond npz_bomb_floor at a ratio above npz_max_inflate_ratio
/// is refused before inflating (docs/dataset.md#limits).
inline std::vector<unsigned char> inflate_raw(std::span<unsigned char const> in, std::uint64_t size,
                                              std::string const& src) {
    using qkgeom::detail::fail_input;
    if (size > npz_bomb_floor && size / npz_max_inflate_ratio > in.size())
        fail_input(src, "size", size,
                   "deflated member of " + std::to_string(in.size()) + " bytes would inflate " +
                       std::to_string(size / std::max<std::uint64_t>(1, in.size())) +
                       "-fold, beyond the limit of " + std::to_string(npz_max_inflate_ratio) +
                       "-fold for members over " + std::to_string(npz_bomb_floor >> 20) +
                       " MiB (a deflate bomb, or constant data: re-save with np.savez)");
    z_stream zs{};
    if (inflateInit2(&zs, -15) != Z_OK) fail_input(src, "deflate", "inflateInit2", "zlib initialisation failed");
    // One spare byte detects data that inflates to more than the declared size.
    // The buffer starts small and doubles as inflating proves the data is
    // there: a member claiming more than it holds costs no large allocation.
    std::size_t const cap = static_cast<std::size_t>(size) + 1;
    std::vector<unsigned char> out(std::min(cap, std::max<std::size_t>(in.size() * 4, std::size_t{1} << 16)));
    std::size_t in_off = 0, out_off = 0;
    int ret = Z_OK;
    std::string problem;
    for (;;) {
        if (zs.avail_in == 0 && in_off < in.size()) {
            std::size_t const n = std::min(in.size() - in_off, zlib_chunk);
            zs.next_in = const_cast<Bytef*>(in.data() + in_off);
            zs.avail_in = static_cast<uInt>(n);
            in_off += n;
        }
        if (zs.avail_out == 0) {
            if (out_off == out.size() && out.size() < cap) out.resize(std::min(cap, out.size() * 2));
            std::size_t const n = std::min(out.size() - out_off, zlib_chunk);
            zs.next_out = out.data() + out_off;
            zs.avail_out = static_cast<uInt>(n);
            out_off += n;
        }
        ret = inflate(&zs, Z_NO_FLUSH);
        if (ret == Z_STREAM_END) break;
        if (ret == Z_OK) continue;
        if (ret == Z_BUF_ERROR) {
            if (zs.avail_out == 0 && out_off == out.size()) {
                if (out.size() < cap) continue;  // grow the buffer
                problem = "data inflates to more than the declared size";
            } else if (zs.avail_in == 0 && in_off == in.size()) problem = "deflate stream truncated";
            else continue;
        } else {
            problem = std::string("corrupt deflate data: ") + (zs.msg ? zs.msg : "zlib error");
        }
        break;
    }
    std::uint64_t const produced = static_cast<std::uint64_t>(out_off - zs.avail_out);
    std::uint64_t const consumed = static_cast<std::uint64_t>(in_off - zs.avail_in);
    inflateEnd(&zs);
    if (!problem.empty()) fail_input(src, "deflate", produced, problem + " (bytes inflated so far)");
    if (produced != size)
        fail_input(src, "size", produced,
                   "inflated size differs from the size the archive records (" + std::to_string(size) + ")");
    if (consumed != in.size())
        fail_input(src, "compressed_size", in.size(),
                   "deflate stream ends after " + std::to_string(consumed) + " bytes, before the member's");
    out.resize(static_cast<std::size_t>(size));
    return out;
}
#endif

/// One member located by the central directory: its info and its raw (compressed) bytes.
struct zip_entry {
    zip_member_info info;
    std::span<unsigned char const> data;
};

/// A field to take from a ZIP64 extra field: where to store it and its width
/// (8 bytes for sizes and offsets, 4 for the disk number).
struct zip64_want {
    std::uint64_t* value;
    std::size_t width;
};

/// Reads a ZIP64 extra field (id 1) of an extra block: the values of the
/// `want` fields (in order) that are marked 0xFFFFFFFF / 0xFFFF. Returns
/// whether a ZIP64 field was present.
inline bool zip64_extra(std::span<unsigned char const> extra, std::string const& src, std::string_view where,
                        std::span<zip64_want const> want) {
    using qkgeom::detail::fail_input;
    std::size_t p = 0;
    bool found = false;
    while (p < extra.size()) {
        if (extra.size() - p < 4)
            fail_input(src, std::string(where) + " extra field", extra.size() - p,
                       "truncated extra field header (needs 4 bytes), bytes left");
        auto const id = static_cast<std::uint16_t>(load_le(extra.data() + p, 2));
        std::size_t const len = static_cast<std::size_t>(load_le(extra.data() + p + 2, 2));
        p += 4;
        if (len > extra.size() - p)
            fail_input(src, std::string(where) + " extra field", len,
                       "extra field 0x" + hex32(id).substr(6) + " longer than the " + std::to_string(extra.size() - p) +
                           " bytes left; length");
        if (id == 0x0001) {
            if (found) fail_input(src, std::string(where) + " extra field", "0x0001", "duplicate ZIP64 extra field");
            found = true;
            std::size_t q = 0;
            for (auto const& w : want) {
                if (len - q < w.width)
                    fail_input(src, std::string(where) + " ZIP64 extra field", len,
                               "too short for the fields marked 0xFFFFFFFF; length");
                *w.value = load_le(extra.data() + p + q, w.width);
                q += w.width;
            }
        }
        p += len;
    }
    if (!found && !want.empty())
        fail_input(src, std::string(where) + " ZIP64 extra field", "<missing>",
                   "a size or offset is 0xFFFFFFFF but there is no ZIP64 extra field");
    return found;
}

/// Little-endian reads at byte offsets of an archive held in memory (the
/// callers have checked the bounds).
struct zip_bytes {
    std::span<unsigned char const> z;
    [[nodiscard]] std::uint16_t u16(std::size_t p) const { return static_cast<std::uint16_t>(load_le(z.data() + p, 2)); }
    [[nodiscard]] std::uint32_t u32(std::size_t p) const { return static_cast<std::uint32_t>(load_le(z.data() + p, 4)); }
    [[nodiscard]] std::uint64_t u64(std::size_t p) const { return load_le(z.data() + p, 8); }
};

/// Where the central directory lies: from the end record (ZIP64 when the
/// end record says so).
struct zip_directory {
    std::uint64_t count = 0, cd_size = 0, cd_off = 0;
    std::size_t cd_end = 0;  ///< where the (ZIP64) end record starts
};

/// The signature at offset 0 and the end of central directory record (and
/// its ZIP64 form); see the file comment.
inline zip_directory zip_end_record(std::span<unsigned char const> z, std::string const& src) {
    using qkgeom::detail::fail_input;
    std::size_t const n = z.size();
    zip_bytes const rd{z};
    auto u16 = [&](std::size_t p) { return rd.u16(p); };
    auto u32 = [&](std::size_t p) { return rd.u32(p); };
    auto u64 = [&](std::size_t p) { return rd.u64(p); };
    if (n < 4 || (u32(0) != zip_local_sig && u32(0) != zip_end_sig)) {
        std::string seen;
        for (std::size_t i = 0; i < std::min<std::size_t>(n, 4); ++i) {
            static constexpr char hx[] = "0123456789abcdef";
            seen += "\\x";
            seen.push_back(hx[z[i] >> 4]);
            seen.push_back(hx[z[i] & 0xF]);
        }
        fail_input(src, "signature", seen.empty() ? std::string("<empty>") : seen,
                   n < 4 ? "file truncated: too short for a ZIP archive"
                         : "not an .npz (ZIP) archive: expected PK\\x03\\x04 or PK\\x05\\x06 at offset 0");
    }
    // --- end of central directory record: the last PK\5\6 whose comment ends the file
    if (n < 22) fail_input(src, "end of central directory", n, "file truncated: a ZIP archive has at least 22 bytes");
    std::size_t eocd = n;
    for (std::size_t p = n - 22 + 1; p-- > 0 && n - p <= 22 + 0xFFFF;) {
        if (u32(p) == zip_end_sig && static_cast<std::size_t>(u16(p + 20)) == n - p - 22) {
            eocd = p;
            break;
        }
    }
    if (eocd == n)
        fail_input(src, "end of central directory", n,
                   "record not found (archive truncated, or trailing bytes after it); file size");
    std::uint64_t disk = u16(eocd + 4), cd_disk = u16(eocd + 6), count_disk = u16(eocd + 8), count = u16(eocd + 10);
    std::uint64_t cd_size = u32(eocd + 12), cd_off = u32(eocd + 16);
    std::size_t cd_end = eocd;
    if (count_disk == 0xFFFF || count == 0xFFFF || cd_size == u32_max || cd_off == u32_max) {
        if (eocd < 20 || u32(eocd - 20) != zip64_locator_sig)
            fail_input(src, "zip64 end of central directory locator", "<missing>",
                       "the end record holds 0xFFFF/0xFFFFFFFF but no ZIP64 locator precedes it");
        std::size_t const loc = eocd - 20;
        if (u32(loc + 4) != 0 || u32(loc + 16) > 1)
            fail_input(src, "zip64 locator disks", u32(loc + 16), "multi-disk archives are not supported");
        std::uint64_t const rec = u64(loc + 8);
        if (rec > loc || loc - rec < 56)
            fail_input(src, "zip64 end of central directory offset", rec,
                       "outside the file (must leave 56 bytes before the locator at " + std::to_string(loc) + ")");
        auto const r = static_cast<std::size_t>(rec);
        if (u32(r) != zip64_end_sig)
            fail_input(src, "zip64 end of central directory signature", hex32(u32(r)), "bad signature (expected PK\\x06\\x06)");
        std::uint64_t const rsize = u64(r + 4);
        if (rsize < 44 || rsize != loc - r - 12)
            fail_input(src, "zip64 end of central directory size", rsize,
                       "inconsistent with the locator position (expected " + std::to_string(loc - r - 12) + ")");
        disk = u32(r + 16);
        cd_disk = u32(r + 20);
        count_disk = u64(r + 24);
        count = u64(r + 32);
        cd_size = u64(r + 40);
        cd_off = u64(r + 48);
        cd_end = r;
    }
    if (disk != 0 || cd_disk != 0) fail_input(src, "disk number", disk != 0 ? disk : cd_disk, "multi-disk archives are not supported");
    if (count_disk != count)
        fail_input(src, "entries", count_disk, "entries on this disk differ from the total " + std::to_string(count));
    if (cd_off > cd_end || cd_size != cd_end - cd_off)
        fail_input(src, "central directory", std::to_string(cd_off) + "+" + std::to_string(cd_size),
                   "offset + size do not end where the end record starts (" + std::to_string(cd_end) +
                       "; truncated archive or prepended data)");
    if (count > cd_size / 46)
        fail_input(src, "entries", count, "more entries than fit in the central directory of " + std::to_string(cd_size) + " bytes");
    return {count, cd_size, cd_off, cd_end};
}

/// The central directory's entries (names, methods, sizes, offsets; ZIP64
/// extra fields), each checked against the directory's bounds.
inline std::vector<zip_entry> zip_central_directory(std::span<unsigned char const> z, std::string const& src,
                                                    zip_directory const& dir) {
    using qkgeom::detail::fail_input;
    zip_bytes const rd{z};
    auto u16 = [&](std::size_t p) { return rd.u16(p); };
    auto u32 = [&](std::size_t p) { return rd.u32(p); };
    auto const [count, cd_size, cd_off, cd_end] = dir;
    (void)cd_size;
    std::vector<zip_entry> out;
    out.reserve(static_cast<std::size_t>(count));
    std::set<std::string> names;
    std::size_t p = static_cast<std::size_t>(cd_off);
    for (std::uint64_t i = 0; i < count; ++i) {
        std::string const where = "central directory entry " + std::to_string(i);
        if (cd_end - p < 46) fail_input(src, where, cd_end - p, "truncated: needs 46 bytes, bytes left");
        if (u32(p) != zip_central_sig)
            fail_input(src, where + " signature", hex32(u32(p)), "bad signature (expected PK\\x01\\x02)");
        zip_entry e;
        auto& m = e.info;
        m.flags = u16(p + 8);
        m.method = u16(p + 10);
        m.crc32 = u32(p + 16);
        m.compressed_size = u32(p + 20);
        m.size = u32(p + 24);
        std::size_t const nlen = u16(p + 28), xlen = u16(p + 30), clen = u16(p + 32);
        std::uint64_t mdisk = u16(p + 34);
        m.offset = u32(p + 42);
        if (cd_end - p - 46 < nlen + xlen + clen)
            fail_input(src, where, nlen + xlen + clen, "name, extra field and comment run past the central directory; their length");
        m.name.assign(reinterpret_cast<char const*>(z.data() + p + 46), nlen);
        std::string const msrc = src + "[" + m.name + "]";
        if (m.name.empty()) fail_input(src, where + " name", "''", "empty member name");
        if (m.name.find('\0') != std::string::npos) fail_input(src, where + " name", m.name, "member name contains a NUL byte");
        if (!names.insert(m.name).second) fail_input(msrc, "name", m.name, "duplicate member name");
        std::vector<zip64_want> want;
        if (m.size == u32_max) want.push_back({&m.size, 8});
        if (m.compressed_size == u32_max) want.push_back({&m.compressed_size, 8});
        if (m.offset == u32_max) want.push_back({&m.offset, 8});
        if (mdisk == 0xFFFF) want.push_back({&mdisk, 4});
        std::span<unsigned char const> const cx(z.data() + p + 46 + nlen, xlen);
        if (!want.empty()) zip64_extra(cx, msrc, "central", want);
        if (mdisk != 0) fail_input(msrc, "disk number start", mdisk, "multi-disk archives are not supported");
        if (m.flags & 0x0041U) fail_input(msrc, "flags", m.flags, "encrypted members are not supported");
        if (m.method != 0 && m.method != 8)
            fail_input(msrc, "compression method", m.method, "unsupported (supported: 0 stored, 8 deflate)");
        if (m.method == 0 && m.size != m.compressed_size)
            fail_input(msrc, "compressed_size", m.compressed_size,
                       "a stored member's compressed size must equal its size " + std::to_string(m.size));
        if (m.method == 8 && (m.size - std::min<std::uint64_t>(m.size, 1024)) / 1032 > m.compressed_size)  // deflate expands at most 1032:1
            fail_input(msrc, "size", m.size,
                       "larger than " + std::to_string(m.compressed_size) + " deflated bytes can hold");
        out.push_back(std::move(e));
        p += 46 + nlen + xlen + clen;
    }
    if (p != cd_end)
        fail_input(src, "central directory", cd_end - p,
                   "bytes left over after the " + std::to_string(count) + " entries the end record announces");
    return out;
}

/// The local headers, data and data descriptors of the entries (each must
/// agree with the central directory and lie before it); sets each entry's
/// data, and checks that no two members overlap.
inline void zip_local_headers(std::span<unsigned char const> z, std::string const& src, std::uint64_t cd_off,
                              std::vector<zip_entry>& out) {
    using qkgeom::detail::fail_input;
    zip_bytes const rd{z};
    auto u16 = [&](std::size_t p) { return rd.u16(p); };
    auto u32 = [&](std::size_t p) { return rd.u32(p); };
    std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // [begin, end) of each member
    std::vector<std::string const*> span_names;
    for (auto& e : out) {
        auto& m = e.info;
        std::string const msrc = src + "[" + m.name + "]";
        if (m.offset > cd_off || cd_off - m.offset < 30)
            fail_input(msrc, "local header offset", m.offset,
                       "local header (30 bytes) does not fit before the central directory at " + std::to_string(cd_off));
        auto const h = static_cast<std::size_t>(m.offset);
        if (u32(h) != zip_local_sig)
            fail_input(msrc, "local header signature", hex32(u32(h)), "bad signature (expected PK\\x03\\x04)");
        std::uint16_t const lflags = u16(h + 6), lmethod = u16(h + 8);
        std::uint32_t const lcrc = u32(h + 14);
        std::uint64_t lcsize = u32(h + 18), lsize = u32(h + 22);
        std::size_t const nlen = u16(h + 26), xlen = u16(h + 28);
        if (static_cast<std::uint64_t>(cd_off - m.offset - 30) < nlen + xlen)
            fail_input(msrc, "local header", nlen + xlen, "name and extra field run into the central directory; their length");
        std::string_view const lname(reinterpret_cast<char const*>(z.data() + h + 30), nlen);
        if (lname != m.name) fail_input(msrc, "local header name", std::string(lname), "differs from the central directory name");
        if (lmethod != m.method)
            fail_input(msrc, "local header compression method", lmethod,
                       "differs from the central directory's " + std::to_string(m.method));
        if (lflags & 0x0041U) fail_input(msrc, "local header flags", lflags, "encrypted members are not supported");
        std::vector<zip64_want> want;
        if (lsize == u32_max) want.push_back({&lsize, 8});
        if (lcsize == u32_max) want.push_back({&lcsize, 8});
        std::span<unsigned char const> const lx(z.data() + h + 30 + nlen, xlen);
        m.zip64 = zip64_extra(lx, msrc, "local", want);
        std::uint64_t const data = m.offset + 30 + nlen + xlen;
        if (m.compressed_size > cd_off - data)
            fail_input(msrc, "compressed_size", m.compressed_size,
                       "data runs into the central directory (" + std::to_string(cd_off - data) + " bytes available)");
        std::uint64_t end = data + m.compressed_size;
        bool const descriptor = (lflags & 0x0008U) != 0;
        std::uint32_t crc = lcrc;
        std::uint64_t csize = lcsize, size = lsize;
        if (descriptor) {
            std::size_t const w = m.zip64 ? 8 : 4;
            auto d = static_cast<std::size_t>(end);
            if (cd_off - end >= 4 && u32(d) == zip_descriptor_sig) d += 4;
            if (cd_off - d < 4 + 2 * w)
                fail_input(msrc, "data descriptor", cd_off - d, "truncated: needs " + std::to_string(4 + 2 * w) + " bytes, bytes left");
            crc = u32(d);
            csize = load_le(z.data() + d + 4, w);
            size = load_le(z.data() + d + 4 + w, w);
            end = d + 4 + 2 * w;
        }
        std::string const from = descriptor ? "data descriptor" : "local header";
        if (crc != m.crc32)
            fail_input(msrc, from + " crc32", hex32(crc), "differs from the central directory's " + hex32(m.crc32));
        if (csize != m.compressed_size)
            fail_input(msrc, from + " compressed_size", csize,
                       "differs from the central directory's " + std::to_string(m.compressed_size));
        if (size != m.size)
            fail_input(msrc, from + " size", size, "differs from the central directory's " + std::to_string(m.size));
        e.data = z.subspan(static_cast<std::size_t>(data), static_cast<std::size_t>(m.compressed_size));
        spans.emplace_back(m.offset, end);
        span_names.push_back(&m.name);
    }
    std::vector<std::size_t> order(spans.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return spans[a].first < spans[b].first; });
    for (std::size_t i = 1; i < order.size(); ++i) {
        auto const& prev = spans[order[i - 1]];
        auto const& cur = spans[order[i]];
        if (cur.first < prev.second)
            fail_input(src + "[" + *span_names[order[i]] + "]", "local header offset", cur.first,
                       "overlaps member '" + *span_names[order[i - 1]] + "' (which ends at " +
                           std::to_string(prev.second) + ")");
    }
}

/// Parses the structure of a ZIP archive held in memory; see the file comment.
inline std::vector<zip_entry> parse_zip(std::span<unsigned char const> z, std::string const& src) {
    zip_directory const dir = zip_end_record(z, src);
    std::vector<zip_entry> out = zip_central_directory(z, src, dir);
    zip_local_headers(z, src, dir.cd_off, out);
    return out;
}

/// The uncompressed bytes of a member, CRC-checked.
inline std::vector<unsigned char> zip_member_bytes(zip_entry const& e, std::string const& src) {
    using qkgeom::detail::fail_input;
    std::string const msrc = src + "[" + e.info.name + "]";
    std::vector<unsigned char> bytes;
    if (e.info.method == 0) {
        bytes.assign(e.data.begin(), e.data.end());
    } else {
#if QKGEOM_NPZ_DEFLATE
        bytes = inflate_raw(e.data, e.info.size, msrc);
#else
        fail_input(msrc, "compression method", 8,
                   "deflated member (np.savez_compressed), but qkgeom was built without zlib "
                   "(define QKGEOM_HAVE_ZLIB=1 and link zlib, or re-save with np.savez)");
#endif
    }
    std::uint32_t const crc = qkgeom::io::crc32(bytes);
    if (crc != e.info.crc32)
        fail_input(msrc, "crc32", hex32(crc), "CRC-32 mismatch: the archive records " + hex32(e.info.crc32));
    return bytes;
}

}  // namespace detail

/// \brief The members of a ZIP/.npz archive as its central directory
/// describes them, after validating the archive structure (no decompression).
/// Members need not be .npy files here.
/// \param[in] bytes the whole archive.
/// \param[in] source file name (or label) used in error messages.
/// \returns one entry per member, in central-directory order.
/// \throws qkgeom::input_error naming the source, member, field and value:
///         bad signatures, truncation, inconsistent ZIP64 records, multi-disk
///         or encrypted archives, compression other than stored/deflate,
///         empty, NUL-containing or duplicate names, local headers or data
///         descriptors that disagree with the central directory, overlapping
///         members.
[[nodiscard]] inline std::vector<zip_member_info> list_npz(std::span<unsigned char const> bytes,
                                                           std::string const& source = "<npz>") {
    auto const entries = detail::parse_zip(bytes, source);
    std::vector<zip_member_info> out;
    out.reserve(entries.size());
    for (auto const& e : entries) out.push_back(e.info);
    return out;
}

/// \brief Parses a complete .npz archive held in memory: every member is
/// located, decompressed, CRC-checked and parsed as .npy; keys are the member
/// names without ".npy" (as numpy's NpzFile.files).
/// \param[in] bytes the whole archive.
/// \param[in] source  file name (or label) used in error messages.
/// \returns the arrays, in archive order.
/// \throws qkgeom::input_error naming the source, member, field and value for
///         any structural problem (as list_npz), a non-.npy member name, a
///         deflated member without zlib, a corrupt deflate stream or a size
///         mismatch after inflating, a CRC mismatch or an invalid .npy
///         member (as parse_npy).
/// \throws std::bad_alloc if the members cannot be held in memory.
[[nodiscard]] inline npz_file parse_npz(std::span<unsigned char const> bytes, std::string const& source = "<npz>") {
    auto const entries = detail::parse_zip(bytes, source);
    npz_file f;
    f.members.reserve(entries.size());
    for (auto const& e : entries) {
        std::string const msrc = source + "[" + e.info.name + "]";
        if (!e.info.name.ends_with(".npy"))
            qkgeom::detail::fail_input(msrc, "name", e.info.name, "not a .npy member (.npz member names end in .npy)");
        auto const raw = detail::zip_member_bytes(e, source);
        f.members.push_back({e.info.name.substr(0, e.info.name.size() - 4), parse_npy(raw, msrc)});
    }
    return f;
}

/// \brief Reads and parses an .npz file.
/// \param[in] path the file.
/// \returns the arrays, as parse_npz.
/// \throws qkgeom::input_error (source = path) when the path is not a regular
///         file (as regular_file_size), cannot be opened or read (with the
///         operating system's reason), and for everything parse_npz rejects.
/// \throws std::bad_alloc if the file does not fit in memory.
[[nodiscard]] inline npz_file read_npz(std::filesystem::path const& path) {
    auto const bytes = detail::read_file_bytes(path);
    return parse_npz(bytes, path.string());
}

/// \brief Serialises arrays as an .npz (ZIP) archive: members "<key>.npy" in
/// order, stored or deflated, ZIP64 records wherever a size or offset needs
/// them (or everywhere with force_zip64), a fixed timestamp (1980-01-01) so
/// that equal input gives equal bytes.
/// \param[in] f the arrays; every key must satisfy the npz_file::add rules.
/// \param[in] opt compression, level, ZIP64 and data-descriptor options.
/// \returns the complete archive.
/// \throws std::invalid_argument for an invalid array (serialize_npy), a bad
///         key (npz_file::add rules), an unknown compression, deflate without
///         zlib or a level outside 1..9.
/// \throws qkgeom::io_error (a std::runtime_error) for a zlib failure while deflating.
/// \throws std::bad_alloc if the archive cannot be held in memory.
[[nodiscard]] inline std::vector<unsigned char> serialize_npz(npz_file const& f, npz_write_options const& opt = {}) {
    constexpr std::string_view fn = "qkgeom::io::serialize_npz";
    using detail::u32_max;
    if (opt.compression != npz_compression::stored && opt.compression != npz_compression::deflate)
        qkgeom::detail::fail_arg(fn, "unknown compression", static_cast<int>(opt.compression));
    if (opt.compression == npz_compression::deflate && !npz_deflate_available())
        qkgeom::detail::fail_arg(fn,
                                 "deflate needs zlib, and qkgeom was built without it (QKGEOM_HAVE_ZLIB); compression",
                                 "deflate");
    if (opt.compression == npz_compression::deflate && (opt.level < 1 || opt.level > 9))
        qkgeom::detail::fail_arg(fn, "deflate level must be in 1..9", opt.level);
    {
        std::set<std::string_view> keys;
        for (auto const& m : f.members) {
            if (m.key.find('\0') != std::string::npos) qkgeom::detail::fail_arg(fn, "key contains a NUL byte; key", m.key);
            if (m.key.size() + 4 > 0xFFFF) qkgeom::detail::fail_arg(fn, "key longer than 65531 bytes; length", m.key.size());
            if (!keys.insert(m.key).second) qkgeom::detail::fail_arg(fn, "duplicate key", m.key);
        }
    }
    std::uint16_t const method = static_cast<std::uint16_t>(opt.compression);
    constexpr std::uint16_t dos_time = 0, dos_date = (0 << 9) | (1 << 5) | 1;  // 1980-01-01 00:00:00
    struct cd_rec {
        std::string name;
        std::uint16_t flags;
        std::uint32_t crc;
        std::uint64_t csize, size, offset;
    };
    std::vector<cd_rec> recs;
    detail::zip_out o;
    for (auto const& m : f.members) {
        std::string const name = m.key + ".npy";
        auto const raw = serialize_npy(m.array);
        std::uint32_t const crc = qkgeom::io::crc32(raw);
        std::vector<unsigned char> packed;
#if QKGEOM_NPZ_DEFLATE
        if (opt.compression == npz_compression::deflate) packed = detail::deflate_raw(raw, opt.level);
#endif
        std::span<unsigned char const> const data = opt.compression == npz_compression::deflate
                                                        ? std::span<unsigned char const>(packed)
                                                        : std::span<unsigned char const>(raw);
        std::uint64_t const size = raw.size(), csize = data.size(), offset = o.b.size();
        bool const zip64 = opt.force_zip64 || size >= u32_max || csize >= u32_max;
        std::uint16_t flags = opt.data_descriptor ? 0x0008 : 0;
        bool const utf8 = std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
        if (utf8) flags |= 0x0800;
        std::uint16_t const version = zip64 ? 45 : 20;
        // local header
        o.put(detail::zip_local_sig, 4);
        o.put(version, 2);
        o.put(flags, 2);
        o.put(method, 2);
        o.put(dos_time, 2);
        o.put(dos_date, 2);
        std::uint64_t const lcrc = opt.data_descriptor ? 0 : crc;
        std::uint64_t const lcsize = opt.data_descriptor ? 0 : csize, lsize = opt.data_descriptor ? 0 : size;
        o.put(lcrc, 4);
        o.put(zip64 ? u32_max : lcsize, 4);
        o.put(zip64 ? u32_max : lsize, 4);
        o.put(name.size(), 2);
        o.put(zip64 ? 20 : 0, 2);
        o.text(name);
        if (zip64) {
            o.put(0x0001, 2);
            o.put(16, 2);
            o.put(lsize, 8);
            o.put(lcsize, 8);
        }
        o.bytes(data);
        if (opt.data_descriptor) {
            std::size_t const w = zip64 ? 8 : 4;
            o.put(detail::zip_descriptor_sig, 4);
            o.put(crc, 4);
            o.put(csize, w);
            o.put(size, w);
        }
        recs.push_back({name, flags, crc, csize, size, offset});
    }
    std::uint64_t const cd_off = o.b.size();
    bool any64 = opt.force_zip64;
    for (auto const& r : recs) {
        bool const big_size = opt.force_zip64 || r.size >= u32_max, big_csize = opt.force_zip64 || r.csize >= u32_max;
        bool const big_off = opt.force_zip64 || r.offset >= u32_max;
        bool const zip64 = big_size || big_csize || big_off;
        any64 = any64 || zip64;
        std::uint16_t const version = zip64 ? 45 : 20;
        std::size_t const xlen = zip64 ? 4 + 8 * (std::size_t{big_size} + big_csize + big_off) : 0;
        o.put(detail::zip_central_sig, 4);
        o.put((3U << 8) | 45U, 2);  // made by: UNIX, APPNOTE 4.5
        o.put(version, 2);
        o.put(r.flags, 2);
        o.put(method, 2);
        o.put(dos_time, 2);
        o.put(dos_date, 2);
        o.put(r.crc, 4);
        o.put(big_csize ? u32_max : r.csize, 4);
        o.put(big_size ? u32_max : r.size, 4);
        o.put(r.name.size(), 2);
        o.put(xlen, 2);
        o.put(0, 2);                    // comment length
        o.put(0, 2);                    // disk number start
        o.put(0, 2);                    // internal attributes
        o.put(0100644U << 16, 4);       // external attributes: regular file, rw-r--r--
        o.put(big_off ? u32_max : r.offset, 4);
        o.text(r.name);
        if (zip64) {
            o.put(0x0001, 2);
            o.put(xlen - 4, 2);
            if (big_size) o.put(r.size, 8);
            if (big_csize) o.put(r.csize, 8);
            if (big_off) o.put(r.offset, 8);
        }
    }
    std::uint64_t const cd_size = o.b.size() - cd_off, count = recs.size();
    bool const end64 = any64 || count >= 0xFFFF || cd_size >= u32_max || cd_off >= u32_max;
    if (end64) {
        std::uint64_t const rec = o.b.size();
        o.put(detail::zip64_end_sig, 4);
        o.put(44, 8);  // size of the remaining record
        o.put((3U << 8) | 45U, 2);
        o.put(45, 2);
        o.put(0, 4);
        o.put(0, 4);
        o.put(count, 8);
        o.put(count, 8);
        o.put(cd_size, 8);
        o.put(cd_off, 8);
        o.put(detail::zip64_locator_sig, 4);
        o.put(0, 4);
        o.put(rec, 8);
        o.put(1, 4);
    }
    o.put(detail::zip_end_sig, 4);
    o.put(0, 2);
    o.put(0, 2);
    std::uint64_t const c16 = end64 ? 0xFFFF : count;
    o.put(c16, 2);
    o.put(c16, 2);
    o.put(end64 ? u32_max : cd_size, 4);
    o.put(end64 ? u32_max : cd_off, 4);
    o.put(0, 2);  // comment length
    return std::move(o.b);
}

/// \brief Writes an .npz file (see serialize_npz), created or truncated.
/// \param[in] path the file.
/// \param[in] f the arrays.
/// \param[in] opt the writer options.
/// \throws std::invalid_argument as serialize_npz.
/// \throws qkgeom::io_error naming the path when the file cannot be written
///         (atomic: temporary file in the same directory, then rename).
inline void write_npz(std::filesystem::path const& path, npz_file const& f, npz_write_options const& opt = {}) {
    auto const bytes = serialize_npz(f, opt);
    detail::write_file_bytes(path, bytes);
}

}  // namespace qkgeom::io
