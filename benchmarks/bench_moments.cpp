// Moment accumulation (method §1) and the reference points measured in the same
// run: the machine's Eigen GEMM rate and a plain streaming read of the same
// bytes; plus the scaling of moments over rows (1K…1M per head) and over d
// (32…256); the machine's double-precision FMA peak per instruction-set level
// (bm_fma_peak/<level>, simd::fma_peak_probe) and the moments at every level
// (bm_moments_isa/<level>/d:<d>, capped with simd::scoped_limit), so that the
// moments' rate is read as a fraction of the peak of the same run.
//
// Flop counts. The accumulator's dominant cost is a symmetric rank-k update of
// the lower half of the co-moment, n·d·(d+1) flops actually needed (a multiply
// and an add per lower-triangle entry per row); the GEMM reference computes a
// full product, 2·m·n·k flops.
#include "workload.hpp"

#include <benchmark/benchmark.h>

#include <qkgeom/simd/moment_kernels.hpp>

#include <random>
#include <string>
#include <vector>

namespace {

using namespace qkbench;

/// n rows of d N(0, 1) f32 values spread over 16 buckets (as a head's capture is).
struct flat_capture {
    rows_f32 x;
    std::vector<std::int64_t> t, bucket;
};

flat_capture make_capture(index_t n, index_t d) {
    std::mt19937_64 gen(1);
    std::normal_distribution<float> nd;
    flat_capture c;
    c.x.resize(n, d);
    c.t.resize(std::size_t(n));
    c.bucket.resize(std::size_t(n));
    for (index_t i = 0; i < n; ++i) {
        c.t[std::size_t(i)] = (i * 4096) / n;
        c.bucket[std::size_t(i)] = c.t[std::size_t(i)] / 256;  // 16 buckets
        for (index_t j = 0; j < d; ++j) c.x(i, j) = nd(gen);
    }
    return c;
}

void moments_counters(benchmark::State& st, index_t n, index_t d) {
    double const flops = double(n) * double(d) * double(d + 1);
    st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    st.counters["rows"] = double(n);
    st.counters["d"] = double(d);
    st.SetBytesProcessed(std::int64_t(st.iterations()) * std::int64_t(n) * d * 4);
}

/// The timed loop of the moments benchmarks: one kind of one realistic head
/// (8,192 rows of d, 16 buckets), f32 in.
void run_moments(benchmark::State& st, index_t d) {
    index_t const n = 8192;
    auto const c = make_capture(n, d);
    for (auto _ : st) {
        qkgeom::bucketed_moments bm(d);
        bm.add(c.x, c.t, c.bucket);
        benchmark::DoNotOptimize(bm.buckets.begin()->second.c_xx.data());
    }
    moments_counters(st, n, d);
}

/// Whether `level` is the active one under the caller's scoped_limit; false (and an error row) when
/// QKGEOM_ISA caps it below the level asked for.
bool at_level(benchmark::State& st, qkgeom::simd::isa level) {
    if (qkgeom::simd::active() == level) return true;
    st.SkipWithError("level capped by QKGEOM_ISA");
    return false;
}

/// Throughput: one kind of one realistic head (8,192 rows, 16 buckets), f32 in.
void bm_moments_accumulate(benchmark::State& st) { run_moments(st, index_t(st.range(0))); }
BENCHMARK(bm_moments_accumulate)->ArgName("d")->Arg(64)->Arg(128)->Unit(benchmark::kMicrosecond);

/// The double-precision FMA peak of one level: independent FMA chains
/// (simd::fma_peak_probe), GFLOP/s of CPU time. Skipped (with an error row)
/// when QKGEOM_ISA caps the level below the one asked for.
void bm_fma_peak(benchmark::State& st, qkgeom::simd::isa level) {
    qkgeom::simd::scoped_limit const cap(level);
    if (!at_level(st, level)) return;
    double flops = 0;
    for (auto _ : st) {
        auto const r = qkgeom::simd::fma_peak_probe(1 << 16);
        benchmark::DoNotOptimize(r.checksum);
        flops += r.flops;
    }
    st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
}

/// bm_moments_accumulate at one level (simd::scoped_limit).
void bm_moments_isa(benchmark::State& st, qkgeom::simd::isa level, index_t d) {
    qkgeom::simd::scoped_limit const cap(level);
    if (at_level(st, level)) run_moments(st, d);
}

/// Registers bm_fma_peak/<level> and bm_moments_isa/<level>/d:{64,128} for
/// every level this CPU has (simd::detected() and below).
int register_levels() {
    for (int l = 0; l <= int(qkgeom::simd::detected()); ++l) {
        auto const level = qkgeom::simd::isa(l);
        std::string const name = qkgeom::simd::isa_name(level);
        benchmark::RegisterBenchmark(("bm_fma_peak/" + name).c_str(), bm_fma_peak, level)
            ->Unit(benchmark::kMicrosecond);
        for (index_t d : {64, 128})
            benchmark::RegisterBenchmark(("bm_moments_isa/" + name + "/d:" + std::to_string(d)).c_str(),
                                         bm_moments_isa, level, d)
                ->Unit(benchmark::kMicrosecond);
    }
    return 0;
}
[[maybe_unused]] int const registered_levels = register_levels();

/// Reference: the machine's Eigen GEMM rate, double (what the moments accumulate
/// in), a square 512³ product.
void bm_eigen_gemm(benchmark::State& st) {
    index_t const n = index_t(st.range(0));
    Eigen::MatrixXd const a = Eigen::MatrixXd::Random(n, n), b = Eigen::MatrixXd::Random(n, n);
    Eigen::MatrixXd c(n, n);
    for (auto _ : st) {
        c.noalias() = a * b;
        benchmark::DoNotOptimize(c.data());
    }
    st.counters["GFLOP/s"] =
        benchmark::Counter(2.0 * double(n) * n * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(bm_eigen_gemm)->ArgName("n")->Arg(64)->Arg(512)->Unit(benchmark::kMicrosecond);

/// Reference: Eigen GEMM XᵀX of the moments' shape (8,192 × d), double, full product.
void bm_eigen_gemm_xtx(benchmark::State& st) {
    index_t const n = 8192, d = index_t(st.range(0));
    Eigen::MatrixXd const x = make_capture(n, d).x.cast<double>();
    Eigen::MatrixXd out(d, d);
    for (auto _ : st) {
        out.noalias() = x.transpose() * x;
        benchmark::DoNotOptimize(out.data());
    }
    st.counters["GFLOP/s"] =
        benchmark::Counter(2.0 * n * double(d) * d * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(bm_eigen_gemm_xtx)->ArgName("d")->Arg(64)->Arg(128)->Unit(benchmark::kMicrosecond);

/// Reference: a plain streaming read (sum) of the same f32 bytes.
void bm_stream_read(benchmark::State& st) {
    index_t const n = 8192, d = index_t(st.range(0));
    auto const c = make_capture(n, d);
    for (auto _ : st) {
        float acc[16] = {};
        float const* p = c.x.data();
        auto const m = std::size_t(c.x.size());
        for (std::size_t j = 0; j + 16 <= m; j += 16)
            for (int u = 0; u < 16; ++u) acc[u] += p[j + std::size_t(u)];
        benchmark::DoNotOptimize(acc);
    }
    st.SetBytesProcessed(std::int64_t(st.iterations()) * std::int64_t(n) * d * 4);
}
BENCHMARK(bm_stream_read)->ArgName("d")->Arg(64)->Arg(128)->Unit(benchmark::kMicrosecond);

/// Scaling over rows per head (d = 128): cost ∝ rows.
void bm_scale_moments_rows(benchmark::State& st) {
    index_t const n = index_t(st.range(0)), d = 128;
    auto const c = make_capture(n, d);
    for (auto _ : st) {
        qkgeom::bucketed_moments bm(d);
        bm.add(c.x, c.t, c.bucket);
        benchmark::DoNotOptimize(bm.buckets.begin()->second.c_xx.data());
    }
    moments_counters(st, n, d);
}
BENCHMARK(bm_scale_moments_rows)
    ->ArgName("rows")
    ->RangeMultiplier(4)
    ->Range(1 << 10, 1 << 20)
    ->Unit(benchmark::kMillisecond);

/// Scaling over d (65,536 rows): cost ∝ d² (d·(d+1)).
void bm_scale_moments_d(benchmark::State& st) {
    index_t const n = 1 << 16, d = index_t(st.range(0));
    auto const c = make_capture(n, d);
    for (auto _ : st) {
        qkgeom::bucketed_moments bm(d);
        bm.add(c.x, c.t, c.bucket);
        benchmark::DoNotOptimize(bm.buckets.begin()->second.c_xx.data());
    }
    moments_counters(st, n, d);
}
BENCHMARK(bm_scale_moments_d)->ArgName("d")->Arg(32)->Arg(64)->Arg(128)->Arg(256)->Unit(benchmark::kMillisecond);

}  // namespace
