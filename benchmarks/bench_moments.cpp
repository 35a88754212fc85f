// Moment accumulation throughput (SPEC §1) against the machine's Eigen GEMM
// rate, measured in the same run. Counters: input bytes/s and GFLOP/s. The
// accumulator's dominant cost is a symmetric rank-k update of the lower half,
// n·d·(d+1) ≈ n·d² flops actually performed; the GEMM reference computes the
// full XᵀX, 2·n·d² flops. Issue 7 turns these into the ratio table.
#include <qkgeom/moments.hpp>

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace {

struct capture {
    Eigen::MatrixXf x;
    std::vector<int> t, bucket;
};

capture make_capture(int n, int d) {
    std::mt19937 gen(1);
    std::normal_distribution<float> nd;
    capture c;
    c.x.resize(n, d);
    c.t.resize(static_cast<std::size_t>(n));
    c.bucket.resize(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        c.t[static_cast<std::size_t>(i)] = i;
        c.bucket[static_cast<std::size_t>(i)] = i / 512;  // 16 buckets for n = 8192
        for (int j = 0; j < d; ++j) c.x(i, j) = nd(gen);
    }
    return c;
}

void bm_moments_accumulate(benchmark::State& st) {
    int const n = 8192, d = static_cast<int>(st.range(0));
    auto const c = make_capture(n, d);
    for (auto _ : st) {
        qkgeom::bucketed_moments bm(d);
        bm.add(c.x, c.t, c.bucket);
        benchmark::DoNotOptimize(bm.buckets.begin()->second.c_xx.data());
    }
    double const flops = double(n) * d * d;
    st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * n * d * 4);
}
BENCHMARK(bm_moments_accumulate)->Arg(64)->Arg(128)->Unit(benchmark::kMicrosecond);

// Reference point: Eigen GEMM XᵀX of the same shape (double), full product.
void bm_eigen_gemm(benchmark::State& st) {
    int const n = 8192, d = static_cast<int>(st.range(0));
    Eigen::MatrixXd const x = make_capture(n, d).x.cast<double>();
    Eigen::MatrixXd out(d, d);
    for (auto _ : st) {
        out.noalias() = x.transpose() * x;
        benchmark::DoNotOptimize(out.data());
    }
    double const flops = 2.0 * n * d * d;
    st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(bm_eigen_gemm)->Arg(64)->Arg(128)->Unit(benchmark::kMicrosecond);

}  // namespace
