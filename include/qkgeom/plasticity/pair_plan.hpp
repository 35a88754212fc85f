// qkgeom — the pair plan of attention plasticity (method §6, §9.10): which
// keys form groups (one example in one key bucket), which key buckets each
// query bucket may use (earlier, present, inside the window), how many
// (query bucket, pair) evaluations that makes, and whether the head is
// enumerated exactly or sampled. Computed once per head from the keys'
// buckets and example ids; shared by the CPU path and the LibTorch path.
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/plasticity/options.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

namespace qkgeom::detail {

/// The first token position of a bucket (for the sliding window).
template <class = void>  // instantiated on use
std::int64_t bucket_first_position(bucket_spec const& s, std::int64_t b) {
    if (s.scheme == bucket_scheme::log) {
        std::int64_t const i_min = ceil_log2(static_cast<std::uint64_t>(s.width));
        return b <= i_min ? 0 : (std::int64_t{1} << b) - 1;
    }
    return b * s.width;
}
/// The last token position of a bucket.
template <class = void>  // instantiated on use
std::int64_t bucket_last_position(bucket_spec const& s, std::int64_t b) {
    if (s.scheme == bucket_scheme::log) return (std::int64_t{1} << (b + 1)) - 2;
    return (b + 1) * s.width - 1;
}

/// Is key bucket c < b inside the window of query bucket b? Uniform/all:
/// c ≥ b − span, span = max(1, ⌈W/B⌉) (method §6). Log: the bucket's last
/// position reaches the query bucket's first position minus W (which is the
/// same rule for uniform buckets). Needs `f.buckets` when a window is set.
template <class = void>  // instantiated on use
bool in_window(capture_facts const& f, std::int64_t b, std::int64_t c) {
    if (f.sliding_window <= 0) return true;
    bucket_spec const& s = *f.buckets;
    if (s.scheme != bucket_scheme::log) {
        std::int64_t const span = std::max<std::int64_t>(1, (f.sliding_window + s.width - 1) / s.width);
        return c >= b - span;
    }
    return bucket_last_position(s, c) >= bucket_first_position(s, b) - f.sliding_window;
}

/// The sampling stream of one head (method §6): the seed mixed with the head's
/// identity, so that heads sharing key positions draw independent pairs:
///     h = splitmix64(seed ^ 0x7061697273616D70)   // "pairsamp"
///     h = splitmix64(h ^ layer); h = splitmix64(h ^ q_head); h = splitmix64(h ^ k_head)
/// (fields as two's-complement 64-bit words). A cell (b, c) of the head then
/// draws from mt19937_64 seeded with splitmix64(splitmix64(h ^ b) ^ c).
/// The one implementation, for every path that samples.
constexpr std::uint64_t head_stream_seed(std::uint64_t seed, head_id const& id) noexcept {
    std::uint64_t h = splitmix64(seed ^ 0x7061697273616D70ULL);
    h = hash_step(h, static_cast<std::uint64_t>(id.layer));
    h = hash_step(h, static_cast<std::uint64_t>(id.q_head));
    return hash_step(h, static_cast<std::uint64_t>(id.k_head));
}

/// The keys of one example in one key bucket (row indices, ascending).
struct key_group {
    std::int64_t example = 0;
    std::vector<index_t> keys;
};

/// Per key bucket: its keys in groups of ≥ 2, its pairs, its largest group.
struct cell_size {
    std::int64_t keys = 0, pairs = 0;
    std::size_t largest = 0;
};

[[nodiscard]] inline std::int64_t pairs_of(std::size_t m) noexcept {
    return static_cast<std::int64_t>(m * (m > 0 ? m - 1 : 0) / 2);
}

/// One query bucket of the plan: its admissible key buckets (ascending).
struct query_plan {
    std::int64_t bucket = 0;
    std::vector<std::int64_t> cells;  ///< admissible key buckets c (method §9.10)
    bool evaluated = false;           ///< has a bucket model and at least one admissible key bucket
};

/// The pair plan of one head (method §6).
struct pair_plan {
    /// key bucket → its groups, ascending by example id.
    std::map<std::int64_t, std::vector<key_group>> groups;
    std::map<std::int64_t, cell_size> sizes;  ///< per key bucket
    std::vector<query_plan> queries;          ///< one per query bucket model, ascending
    std::int64_t total_pairs = 0;             ///< (query bucket, pair) evaluations of exact enumeration
    bool sampled = false;                     ///< enumeration: sampled (true) or exact

    /// The groups of key bucket c (empty when absent).
    template <class = void>  // instantiated on use
    [[nodiscard]] std::vector<key_group> const& groups_of(std::int64_t c) const {
        static std::vector<key_group> const none;
        auto const it = groups.find(c);
        return it == groups.end() ? none : it->second;
    }

    /// The sizes summed over `cells` (keys, pairs) and their largest group.
    template <class = void>  // instantiated on use
    [[nodiscard]] cell_size total_size(std::vector<std::int64_t> const& cells) const {
        cell_size t;
        for (auto c : cells) {
            auto const it = sizes.find(c);
            if (it == sizes.end()) continue;
            t.keys += it->second.keys;
            t.pairs += it->second.pairs;
            t.largest = std::max(t.largest, it->second.largest);
        }
        return t;
    }

    /// `prefix` policy: per example, its keys in all `cells`, ascending
    /// (one group per example, ascending by example id).
    template <class = void>  // instantiated on use
    [[nodiscard]] std::vector<key_group> prefix_groups(std::vector<std::int64_t> const& cells) const {
        std::map<std::int64_t, std::vector<index_t>> per_example;
        for (auto c : cells)
            for (auto const& g : groups_of(c)) {
                auto& v = per_example[g.example];
                v.insert(v.end(), g.keys.begin(), g.keys.end());
            }
        std::vector<key_group> out;
        out.reserve(per_example.size());
        for (auto& [ex, idx] : per_example) {
            std::sort(idx.begin(), idx.end());
            out.push_back({ex, std::move(idx)});
        }
        return out;
    }
};

/// The plan of one head: `key_bucket` and `key_example` per key row (validated),
/// `query_buckets` the query bucket models' (bucket id, used) in ascending
/// order. Exact when the options say so, or (automatic) when the head's
/// admissible (query bucket, pair) evaluations number ≤ max_exact_pairs.
template <class = void>  // instantiated on use
pair_plan plan_pairs(std::span<std::int64_t const> key_bucket, std::span<std::int64_t const> key_example,
                            std::span<std::pair<std::int64_t, bool> const> query_buckets, capture_facts const& facts,
                            plasticity_options const& opt) {
    pair_plan plan;
    {
        std::map<std::int64_t, std::map<std::int64_t, std::vector<index_t>>> by_example;
        for (std::size_t i = 0; i < key_bucket.size(); ++i)
            by_example[key_bucket[i]][key_example[i]].push_back(static_cast<index_t>(i));
        for (auto& [c, m] : by_example) {
            auto& v = plan.groups[c];
            v.reserve(m.size());
            for (auto& [ex, idx] : m) v.push_back({ex, std::move(idx)});
        }
    }
    for (auto const& [c, gs] : plan.groups) {
        auto& z = plan.sizes[c];
        for (auto const& g : gs)
            if (g.keys.size() >= 2) {
                z.keys += static_cast<std::int64_t>(g.keys.size());
                z.pairs += pairs_of(g.keys.size());
                z.largest = std::max(z.largest, g.keys.size());
            }
    }
    for (auto const& [b, used] : query_buckets) {
        query_plan q;
        q.bucket = b;
        for (auto const& [c, gs] : plan.groups)
            if (c < b && in_window(facts, b, c)) q.cells.push_back(c);
        q.evaluated = used && !q.cells.empty();
        if (q.evaluated) {
            if (opt.pairs == pair_policy::same_bucket) {
                plan.total_pairs += plan.total_size(q.cells).pairs;
            } else {
                std::map<std::int64_t, std::size_t> per_example;
                for (auto c : q.cells)
                    for (auto const& g : plan.groups_of(c)) per_example[g.example] += g.keys.size();
                for (auto const& [e, m] : per_example) plan.total_pairs += pairs_of(m);
            }
        }
        plan.queries.push_back(std::move(q));
    }
    plan.sampled = opt.enumeration == enumeration_policy::sampled ||
                   (opt.enumeration == enumeration_policy::automatic && plan.total_pairs > opt.max_exact_pairs);
    return plan;
}

}  // namespace qkgeom::detail
