// libFuzzer target: qkgeom::io::parse_npz (the ZIP structure, ZIP64 records,
// data descriptors, inflate when zlib is available, CRC-32, the .npy members)
// on arbitrary bytes. Every failure must be a qkgeom::input_error; anything
// else (crash, sanitizer report, other exception) is a bug. An archive that
// parses must survive serialise -> parse in every writer mode with the same
// arrays.
#include <qkgeom/io/npz.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
    namespace io = qkgeom::io;
    std::span<unsigned char const> const bytes(data, size);
    try {
        (void)io::list_npz(bytes, "fuzz.npz");
    } catch (qkgeom::input_error const&) {
    }
    try {
        auto const f = io::parse_npz(bytes, "fuzz.npz");
        std::size_t total = 0;
        for (auto const& m : f.members) total += m.array.data.size();
        if (total > (std::size_t{1} << 20)) return 0;
        for (int mode = 0; mode < 4; ++mode) {
            io::npz_write_options opt;
            opt.force_zip64 = (mode & 1) != 0;
            opt.data_descriptor = (mode & 2) != 0;
            if (io::npz_deflate_available() && mode == 3) opt.compression = io::npz_compression::deflate;
            auto const g = io::parse_npz(io::serialize_npz(f, opt), "again.npz");
            if (g.members.size() != f.members.size()) __builtin_trap();
            for (std::size_t i = 0; i < f.members.size(); ++i) {
                auto const& a = f.members[i];
                auto const& b = g.members[i];
                if (a.key != b.key || a.array.data != b.array.data || a.array.shape != b.array.shape ||
                    a.array.descr != b.array.descr || a.array.fortran_order != b.array.fortran_order)
                    __builtin_trap();
            }
        }
    } catch (qkgeom::input_error const&) {
    }
    return 0;
}
