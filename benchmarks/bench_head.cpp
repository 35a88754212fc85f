// Per-head workloads on one realistic head (workload.hpp): the finalisation
// closed forms (PCA, rotation, Householder), the normality diagnostics, the
// plasticity (same_bucket and prefix, exact, with the empirical check) and
// the whole head end to end.
#include "workload.hpp"

#include <qkgeom/simd/dispatch.hpp>

#include <benchmark/benchmark.h>

namespace {

using namespace qkbench;

qkgeom::head_moments head_moments_of(head_data const& h) {
    qkgeom::head_moments hm(h.queries.vectors.cols(), h.id);
    hm.add(qkgeom::kind::query, h.queries);
    hm.add(qkgeom::kind::key, h.keys);
    return hm;
}

void head_counters(benchmark::State& st, head_data const& h) {
    st.counters["q_rows"] = double(h.queries.vectors.rows());
    st.counters["k_rows"] = double(h.keys.vectors.rows());
    st.counters["d"] = double(h.queries.vectors.cols());
}

void bm_head_moments(benchmark::State& st) {
    auto const& h = realistic_head();
    for (auto _ : st) {
        auto hm = head_moments_of(h);
        benchmark::DoNotOptimize(hm.q.buckets.begin()->second.c_xx.data());
    }
    head_counters(st, h);
    st.SetBytesProcessed(std::int64_t(st.iterations()) * std::int64_t(h.bytes()));
}
BENCHMARK(bm_head_moments)->Unit(benchmark::kMillisecond);

void bm_finalise_pca(benchmark::State& st) {
    auto const hm = head_moments_of(realistic_head());
    for (auto _ : st) benchmark::DoNotOptimize(qkgeom::pca(hm).pc0_r_q);
}
BENCHMARK(bm_finalise_pca)->Unit(benchmark::kMillisecond);

void bm_finalise_rotation(benchmark::State& st) {
    auto const hm = head_moments_of(realistic_head());
    for (auto _ : st) benchmark::DoNotOptimize(qkgeom::planar_rotation(hm).bias_strength);
}
BENCHMARK(bm_finalise_rotation)->Unit(benchmark::kMillisecond);

void bm_finalise_householder(benchmark::State& st) {
    auto const hm = head_moments_of(realistic_head());
    for (auto _ : st) benchmark::DoNotOptimize(qkgeom::householder(hm).sigma2_pos);
}
BENCHMARK(bm_finalise_householder)->Unit(benchmark::kMillisecond);

void bm_diagnostics(benchmark::State& st) {
    auto const& h = realistic_head();
    auto const model = qkgeom::householder(head_moments_of(h));
    for (auto _ : st) benchmark::DoNotOptimize(qkgeom::householder_diagnostics(model, h.queries.vectors, h.queries.position).pos_ks_p);
    head_counters(st, h);
}
BENCHMARK(bm_diagnostics)->Unit(benchmark::kMillisecond);

// Plasticity, exact, with the empirical cross-check (the query rows passed)
// or without it (a head with no query rows: the keys and facts only).
void plasticity(benchmark::State& st, qkgeom::pair_policy pairs, bool with_queries) {
    auto const& h = realistic_head();
    auto const model = qkgeom::householder(head_moments_of(h));
    auto opt = cli_options(model_shape{}).plasticity;
    opt.pairs = pairs;
    opt.enumeration = qkgeom::enumeration_policy::exact;
    std::int64_t pairs_evaluated = 0;
    for (auto _ : st) {
        auto const r = with_queries ? qkgeom::attention_plasticity(model, h, opt)
                                    : qkgeom::attention_plasticity(model, h.keys, h.facts, h.id, opt);
        pairs_evaluated = r.n_pairs;
        benchmark::DoNotOptimize(r.ap_overall);
    }
    head_counters(st, h);
    st.counters["pairs"] = double(pairs_evaluated);
    st.counters["pairs/s"] =
        benchmark::Counter(double(pairs_evaluated), benchmark::Counter::kIsIterationInvariantRate);
}
void bm_plasticity_same_bucket(benchmark::State& st) { plasticity(st, qkgeom::pair_policy::same_bucket, true); }
void bm_plasticity_prefix(benchmark::State& st) { plasticity(st, qkgeom::pair_policy::prefix, true); }
void bm_plasticity_same_bucket_no_empirical(benchmark::State& st) {
    plasticity(st, qkgeom::pair_policy::same_bucket, false);
}
void bm_plasticity_prefix_no_empirical(benchmark::State& st) { plasticity(st, qkgeom::pair_policy::prefix, false); }
BENCHMARK(bm_plasticity_same_bucket)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_plasticity_prefix)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_plasticity_same_bucket_no_empirical)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_plasticity_prefix_no_empirical)->Unit(benchmark::kMillisecond);

// One head end to end (analyze_head, the options of `qkgeom analyze`).
void bm_head_analyze(benchmark::State& st) {
    auto const& h = realistic_head();
    auto opt = cli_options(model_shape{});
    if (st.range(0) == 1) opt.plasticity.pairs = qkgeom::pair_policy::prefix;
    for (auto _ : st) benchmark::DoNotOptimize(analyze(h, opt).plasticity.ap_overall);
    head_counters(st, h);
}
BENCHMARK(bm_head_analyze)->ArgName("prefix")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

/// Issue 17: the analyses beyond the thesis on the same head, measured in one
/// run: arg 0 = none of them (split_profile off, ranks off, no RoPE facts),
/// arg 1 = all of them (the defaults, with the head's RoPE recorded in its
/// facts as a capture records it: rotate_half over the 64 rotary
/// dimensions, theta 10000, so the RoPE check and bands run). The ratio
/// 1 / 0 is the "≤ 20 % over analyze_head" (summarise.py); args 2,
/// 3, 4 run one analysis each (the split, the rank stability, the RoPE
/// bands) for the breakdown.
void bm_head_analyze_beyond(benchmark::State& st) {
    static head_data const h = [] {
        head_data x = realistic_head();
        qkgeom::rope_spec r;
        r.rotary_dim = layer_of(model_shape{}, 0).rotary_dims;
        r.theta = layer_of(model_shape{}, 0).rope_theta;
        x.facts.rope = r;
        return x;
    }();
    auto opt = cli_options(model_shape{});
    head_data const* used = &h;
    // 0: none; 1: all; 2: the split only; 3: the rank stability only; 4: RoPE bands only.
    auto const arg = st.range(0);
    opt.plasticity.split_profile = arg == 1 || arg == 2;
    opt.ranks_on = arg == 1 || arg == 3;
    if (arg != 1 && arg != 4) used = &realistic_head();  // no RoPE facts: rope_bands returns at once
    for (auto _ : st) benchmark::DoNotOptimize(analyze(*used, opt).plasticity.ap_overall);
    head_counters(st, *used);
}
BENCHMARK(bm_head_analyze_beyond)->ArgName("beyond")->DenseRange(0, 4)->Unit(benchmark::kMillisecond);

/// The same head (same_bucket) with the dispatched kernels capped at the
/// generic level (SSE2 without -march): the gain of the runtime dispatch,
/// measured in the same run. The run's active level is in the JSON context
/// (`qkgeom_isa`).
void bm_head_analyze_generic(benchmark::State& st) {
    auto const& h = realistic_head();
    auto const opt = cli_options(model_shape{});
    qkgeom::simd::scoped_limit const cap(qkgeom::simd::isa::generic);
    for (auto _ : st) benchmark::DoNotOptimize(analyze(h, opt).plasticity.ap_overall);
    head_counters(st, h);
}
BENCHMARK(bm_head_analyze_generic)->Unit(benchmark::kMillisecond);

[[maybe_unused]] bool const isa_context = [] {
    benchmark::AddCustomContext("qkgeom_isa", qkgeom::simd::isa_name(qkgeom::simd::active()));
    return true;
}();

}  // namespace
