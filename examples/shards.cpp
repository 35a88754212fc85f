// Reduce a capture in shards (as separate machines would), save each shard's
// moments to a file, load and merge them in another order, and check the
// result equals a single pass over all rows (method §1).
//
// Expected output (numbers vary by platform in the last digits only):
//   4 shards written to <dir>
//   merged: q rows 4000, k rows 4000, buckets 16
//   max relative difference to a single pass: <1e-12 -> ok
#include <qkgeom/io/moments_io.hpp>
#include <qkgeom/plasticity.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>
#include <vector>

int main(int argc, char** argv) {
    std::filesystem::path const dir = argc > 1 ? argv[1] : std::filesystem::temp_directory_path() / "qkgeom_shards";
    std::filesystem::create_directories(dir);
    constexpr int n = 4000, d = 32, width = 256;
    std::mt19937 gen(42);
    std::normal_distribution<float> nd;
    Eigen::MatrixXf q(n, d), k(n, d);
    std::vector<int> pos(n), bucket(n);
    for (int i = 0; i < n; ++i) {
        pos[i] = i;
        bucket[i] = i / width;
        for (int j = 0; j < d; ++j) {
            q(i, j) = nd(gen) + (j == 0 ? 0.002f * static_cast<float>(i) : 0.0f);
            k(i, j) = nd(gen) - (j == 1 ? 0.003f * static_cast<float>(i) : 0.0f);
        }
    }
    qkgeom::head_id const id{.layer = 0, .q_head = 2, .k_head = 0};
    // Shards: contiguous chunks of tokens (e.g. one per machine / per batch of sequences).
    std::vector<std::filesystem::path> files;
    for (int s = 0; s < 4; ++s) {
        int const lo = s * n / 4, hi = (s + 1) * n / 4;
        qkgeom::head_moments shard(d, id);
        auto const p = std::span(pos).subspan(lo, hi - lo);
        auto const b = std::span(bucket).subspan(lo, hi - lo);
        shard.add(qkgeom::kind::query, q.middleRows(lo, hi - lo), p, b);
        shard.add(qkgeom::kind::key, k.middleRows(lo, hi - lo), p, b);
        files.push_back(dir / ("shard" + std::to_string(s) + ".qkm"));
        qkgeom::save_moments(files.back(), shard);
    }
    std::printf("%zu shards written to %s\n", files.size(), dir.string().c_str());

    std::reverse(files.begin(), files.end());  // merge order does not matter
    qkgeom::head_moments merged;
    for (auto const& f : files) merged += qkgeom::load_moments(f);

    qkgeom::head_moments single(d, id);
    single.add(qkgeom::kind::query, q, pos, bucket);
    single.add(qkgeom::kind::key, k, pos, bucket);
    double worst = 0;
    for (auto w : {qkgeom::kind::query, qkgeom::kind::key})
        for (auto const& [bkt, m] : single[w].buckets) {
            auto const& o = merged[w].buckets.at(bkt);
            worst = std::max(worst, (m.c_xx - o.c_xx).cwiseAbs().maxCoeff() / m.c_xx.cwiseAbs().maxCoeff());
            worst = std::max(worst, (m.c_xt - o.c_xt).cwiseAbs().maxCoeff() / m.c_xt.cwiseAbs().maxCoeff());
        }
    std::printf("merged: q rows %lld, k rows %lld, buckets %zu\n", static_cast<long long>(merged.q.count()),
                static_cast<long long>(merged.k.count()), merged.q.buckets.size());
    bool const ok = worst < 1e-12 && merged.q.count() == n;
    std::printf("max relative difference to a single pass: %.2e -> %s\n", worst, ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
