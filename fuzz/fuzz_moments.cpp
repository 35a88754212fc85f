// libFuzzer target: qkgeom::read_moments_shard (the moments shard reader,
// io/moments_io.hpp) on arbitrary bytes. Every failure must be a
// qkgeom::input_error; anything else (crash, sanitizer report, other
// exception, an allocation beyond the fuzzer's -rss_limit_mb) is a bug. A
// shard that reads must be accepted by write_moments (it refuses exactly what
// read_moments rejects) and re-serialise to the same bytes.
//
// Seed corpus: when the first corpus directory given on the command line is
// empty, a few valid shards (d = 1, 3, 8; query and key buckets; without and
// with a bucket scheme) are written into it before fuzzing starts.
#include <qkgeom/io/moments_io.hpp>

#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

void write_seeds(std::filesystem::path const& dir) {
    int k = 0;
    for (qkgeom::index_t d : {1, 3, 8}) {
        qkgeom::head_moments hm(d, {d, 2 * d, d - 1});
        for (int part = 0; part < 2; ++part) {
            qkgeom::index_t const n = 5 + 7 * d + part;
            Eigen::MatrixXd x(n, d);
            std::vector<std::int64_t> t(static_cast<std::size_t>(n)), b(t.size());
            for (qkgeom::index_t i = 0; i < n; ++i) {
                for (qkgeom::index_t j = 0; j < d; ++j) x(i, j) = 0.25 * static_cast<double>((i * 7 + j * 3) % 11) - 1;
                t[static_cast<std::size_t>(i)] = (i * 13 + part) % 40;
                b[static_cast<std::size_t>(i)] = t[static_cast<std::size_t>(i)] / 8;
            }
            hm.add(part == 0 ? qkgeom::kind::query : qkgeom::kind::key, x, t, b);
        }
        std::ofstream os(dir / ("seed" + std::to_string(k++) + ".qkm"), std::ios::binary);
        qkgeom::write_moments(os, hm);  // format version 1: no bucket scheme
        std::ofstream os2(dir / ("seed" + std::to_string(k++) + ".qkm"), std::ios::binary);
        qkgeom::write_moments(os2, hm, qkgeom::bucket_spec{qkgeom::bucket_scheme::uniform, 8});  // version 2
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    for (int i = 1; i < *argc; ++i) {
        std::string const a = (*argv)[i];
        if (a.empty() || a[0] == '-') continue;
        std::error_code ec;
        if (std::filesystem::is_directory(a, ec) && std::filesystem::is_empty(a, ec)) write_seeds(a);
        break;
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
    std::string const bytes(reinterpret_cast<char const*>(data), size);
    try {
        std::istringstream in(bytes);
        auto const shard = qkgeom::read_moments_shard(in, "fuzz.qkm");
        auto const used = static_cast<std::size_t>(in.tellg() == std::istream::pos_type(-1) ? size : static_cast<std::size_t>(in.tellg()));
        std::ostringstream out;
        // must not throw: a shard that reads can be written, with its bucket
        // scheme (format version 2) or without one (version 1), to the same bytes
        qkgeom::write_moments(out, shard.stats, shard.buckets);
        if (out.str() != bytes.substr(0, used)) __builtin_trap();
    } catch (qkgeom::input_error const&) {
    }
    return 0;
}
