// libFuzzer target: qkgeom::io::parse_safetensors on arbitrary bytes, then a
// serialise/parse round trip. Only qkgeom::input_error may escape the parser.
#include <qkgeom/io/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
    try {
        auto const f = qkgeom::io::parse_safetensors(std::span<unsigned char const>(data, size), "fuzz.safetensors");
        for (auto const& [name, t] : f.tensors) {
            auto const a = qkgeom::io::to_npy_array(t);
            if (t.shape.size() == 2 && qkgeom::io::dtype_is_float(t.type)) (void)qkgeom::io::npy_to_matrix(a);
            if (!qkgeom::io::dtype_is_float(t.type)) (void)qkgeom::io::npy_to_int64(a);
        }
        auto const g = qkgeom::io::parse_safetensors(qkgeom::io::serialize_safetensors(f), "again.safetensors");
        if (g.tensors.size() != f.tensors.size() || g.metadata != f.metadata) __builtin_trap();
        for (auto const& [name, t] : f.tensors)
            if (g.tensors.at(name).data != t.data || g.tensors.at(name).shape != t.shape) __builtin_trap();
    } catch (qkgeom::input_error const&) {
    }
    return 0;
}
