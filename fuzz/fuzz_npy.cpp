// libFuzzer target: qkgeom::io::parse_npy on arbitrary bytes, then the
// conversions. Every failure must be a qkgeom::input_error; anything else
// (crash, sanitizer report, other exception) is a bug.
#include <qkgeom/io/npy.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
    try {
        auto const a = qkgeom::io::parse_npy(std::span<unsigned char const>(data, size), "fuzz.npy");
        auto const t = qkgeom::io::npy_dtype(a, "fuzz.npy");
        if (a.size() <= (1 << 20)) {
            if (qkgeom::io::dtype_is_float(t)) {
                if (a.shape.size() == 2) (void)qkgeom::io::npy_to_matrix(a, "fuzz.npy");
            } else {
                (void)qkgeom::io::npy_to_int64(a, "fuzz.npy");
            }
            // re-serialise and re-parse: must round-trip
            auto const b = qkgeom::io::parse_npy(qkgeom::io::serialize_npy(a), "again.npy");
            if (b.data != a.data || b.shape != a.shape || b.descr != a.descr) __builtin_trap();
        }
    } catch (qkgeom::input_error const&) {
    }
    return 0;
}
