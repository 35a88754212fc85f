// libFuzzer target: qkgeom::json::parse on arbitrary bytes; valid documents
// must survive dump -> parse -> dump unchanged, and manifest parsing may only
// fail with qkgeom::input_error.
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/io/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
    std::string_view const text(reinterpret_cast<char const*>(data), size);
    try {
        auto const v = qkgeom::json::parse(text, "fuzz.json");
        std::string const once = qkgeom::json::dump(v);
        std::string const twice = qkgeom::json::dump(qkgeom::json::parse(once, "again.json"));
        if (once != twice) __builtin_trap();
        (void)qkgeom::json::dump(v, 2);
    } catch (qkgeom::input_error const&) {
    }
    try {
        (void)qkgeom::io::parse_manifest(text, "fuzz-manifest.json");
    } catch (qkgeom::input_error const&) {
    }
    return 0;
}
