// qkgeom program — `qkgeom merge SHARD... -o FILE`: the streaming design made
// visible: moments shards of one head (qkgeom::save_moments, docs/moments.md),
// each read with the full validation of load_moments, merged exactly
// (head_moments::operator+=) and written as one shard (docs/cli.md#merge).
#include "program.hpp"

#include <qkgeom/io/moments_io.hpp>
#include <qkgeom/stats/moments.hpp>

#include <filesystem>
#include <iostream>
#include <string>

namespace qkgeom_app {

int run_merge(cli const& c) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto const st = fs::symlink_status(c.out, ec);
    if (fs::exists(st) && !fs::is_regular_file(st))
        throw run_error("-o " + c.out.string() + ": exists and is not a regular file");
    for (auto const& in : c.inputs)
        if (fs::exists(st) && fs::equivalent(in, c.out, ec))
            throw run_error("-o " + c.out.string() + ": is also an input shard (" + in.string() +
                            "); write the merge to a new file");
    // Each shard validated as load_moments_shard; the same file twice, a
    // byte-identical copy, a shard of another head, d or bucket scheme is
    // refused naming both files (input_error names the file and field).
    qkgeom::moments_shard const total = qkgeom::merge_moment_shards(c.inputs);
    check_interrupted();
    // written next to FILE and renamed: never a partial FILE; version 2 when
    // the shards record their bucket scheme
    qkgeom::save_moments(c.out, total.stats, total.buckets);
    auto const& m = total.stats;
    std::cout << "merged " << c.inputs.size() << " shard(s) of head layer " << m.id.layer << " q_head "
              << m.id.q_head << " k_head " << m.id.k_head << " (d = " << m.d << ", bucket scheme "
              << qkgeom::bucket_scheme_text(total.buckets)
              << (total.buckets ? "" : ": format version 1 shards, not checked") << "): " << m.q.count()
              << " query rows in " << m.q.buckets.size() << " bucket(s), " << m.k.count() << " key rows in "
              << m.k.buckets.size() << " bucket(s), written to " << c.out.string() << "\n";
    return 0;
}

}  // namespace qkgeom_app
