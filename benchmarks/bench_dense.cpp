// The dense Gram path of the plasticity (method §5 exactness identity): one key
// bucket holding m keys of one sequence (a dense capture keeps every token),
// and the query bucket after it; d = 128, exact, no empirical check. Three
// measurements per m:
//   bm_dense_plasticity  the whole attention_plasticity call;
//   bm_dense_gram        the Gram part alone: the same tiled GEMMs
//                        (detail::gram_tiles, the library's own loop);
//   the Φ pass           = whole − Gram (the summary table computes it).
// Flops of the Gram part: 2·d per pair (the upper tiles and the diagonal tiles).
#include "workload.hpp"

#include <qkgeom/plasticity/closed_form.hpp>  // detail::dense_group_t (not in the umbrella with QKGEOM_COMPILED)

#include <benchmark/benchmark.h>

#include <random>

namespace {

using namespace qkbench;

struct dense_case {
    /// The keys (no query rows: no empirical check) and the facts (L = 2m).
    qkgeom::head_capture<rows_f32> head;
    qkgeom::householder_result model;
    std::int64_t L = 0;
};

dense_case make_dense(index_t m, index_t d = 128) {
    std::mt19937_64 gen(11);
    std::normal_distribution<double> nd;
    dense_case c;
    c.L = 2 * m;
    // Queries at positions m .. 2m−1 in bucket 1 (width m) with a positional
    // drift on coordinate 0; the Householder model comes from their moments.
    index_t const nq = std::min<index_t>(m, 4096);
    rows_f32 q(nq, d);
    std::vector<std::int64_t> qp(static_cast<std::size_t>(nq)), qb(static_cast<std::size_t>(nq), 1);
    for (index_t i = 0; i < nq; ++i) {
        qp[std::size_t(i)] = m + (i * m) / nq;
        for (index_t j = 0; j < d; ++j) q(i, j) = float(nd(gen) + (j == 0 ? 1e-3 * double(qp[std::size_t(i)]) : 0.0));
    }
    c.model = qkgeom::householder(q, qp, qb);
    auto& k = c.head.keys;
    k.vectors.resize(m, d);
    k.position.values().resize(std::size_t(m));
    k.bucket.values().assign(std::size_t(m), 0);
    k.example_id.values().assign(std::size_t(m), 0);
    for (index_t i = 0; i < m; ++i) {
        k.position.values()[std::size_t(i)] = i;
        for (index_t j = 0; j < d; ++j) k.vectors(i, j) = float(nd(gen) + (j == 0 ? -2e-3 * double(i) : 0.0));
    }
    c.head.facts.context_length = c.L;
    return c;
}

void dense_counters(benchmark::State& st, index_t m, index_t d) {
    double const pairs = double(m) * double(m - 1) / 2;
    st.counters["keys"] = double(m);
    st.counters["pairs"] = pairs;
    st.counters["pairs/s"] = benchmark::Counter(pairs, benchmark::Counter::kIsIterationInvariantRate);
    st.counters["gram_GFLOP/s"] =
        benchmark::Counter(pairs * 2.0 * double(d) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

qkgeom::plasticity_options dense_options() {
    qkgeom::plasticity_options o;
    o.enumeration = qkgeom::enumeration_policy::exact;
    return o;
}

void bm_dense_plasticity(benchmark::State& st) {
    index_t const m = index_t(st.range(0));
    auto const c = make_dense(m);
    auto const opt = dense_options();
    for (auto _ : st) {
        // The head without query rows: attention_plasticity(model, keys, facts, id)
        // without that overload's copy of the key rows.
        auto const r = qkgeom::attention_plasticity(c.model, c.head, opt);
        benchmark::DoNotOptimize(r.ap_overall);
    }
    dense_counters(st, m, c.head.keys.vectors.cols());
}

/// The same without the split of AP_drop (docs/beyond-split.md): the Φ pass
/// alone, against the same Gram pass (the split's cost is the difference to
/// bm_dense_plasticity).
void bm_dense_plasticity_nosplit(benchmark::State& st) {
    index_t const m = index_t(st.range(0));
    auto const c = make_dense(m);
    auto opt = dense_options();
    opt.split_profile = false;
    for (auto _ : st) {
        auto const r = qkgeom::attention_plasticity(c.model, c.head, opt);
        benchmark::DoNotOptimize(r.ap_overall);
    }
    dense_counters(st, m, c.head.keys.vectors.cols());
}

void bm_dense_gram(benchmark::State& st) {
    index_t const m = index_t(st.range(0));
    auto const c = make_dense(m);
    auto const opt = dense_options();
    qkgeom::index_t const d = c.head.keys.vectors.cols();
    auto const& s = c.model.buckets.back();
    Eigen::MatrixXd K = c.head.keys.vectors.cast<double>();
    for (auto _ : st) {
        double sink = 0;
        qkgeom::detail::dense_group_t<> g(K, s.mean, s.var, Eigen::MatrixXd{});
        g.for_each_tile(opt.tile_keys, [&](index_t, index_t, index_t, index_t, Eigen::MatrixXd const& G) { sink += G(0, 0); });
        benchmark::DoNotOptimize(sink);
    }
    dense_counters(st, m, d);
}

#define QKGEOM_DENSE_SIZES ->ArgName("keys")->Arg(1024)->Arg(2048)->Arg(4096)->Arg(8192)->Arg(16384)
BENCHMARK(bm_dense_plasticity) QKGEOM_DENSE_SIZES->Unit(benchmark::kMillisecond);
BENCHMARK(bm_dense_plasticity_nosplit) QKGEOM_DENSE_SIZES->Unit(benchmark::kMillisecond);
BENCHMARK(bm_dense_gram) QKGEOM_DENSE_SIZES->Unit(benchmark::kMillisecond);
BENCHMARK(bm_dense_plasticity)->ArgName("keys")->Arg(65536)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(bm_dense_plasticity_nosplit)->ArgName("keys")->Arg(65536)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(bm_dense_gram)->ArgName("keys")->Arg(65536)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

}  // namespace
