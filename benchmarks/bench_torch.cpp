// Benchmarks of the LibTorch adapter on a device (issue 18): the device
// moments (torch_capture in device_moments mode) and the Gram plasticity
// (torch_attention_plasticity), each with its ratio to the same device's GEMM
// rate (torch::mm), measured in the same run. Built as qkgeom_bench_torch
// only when LibTorch is found (the main qkgeom_bench keeps no LibTorch
// dependency); scripts/bench.sh runs it when it was built.
//
// Every case exists for the CPU device (runs everywhere, exercises the code
// path) and for CUDA; without a CUDA device each CUDA case reports
// "no CUDA device: skipped" (SkipWithError: visible in the console and as
// error_occurred / error_message in the JSON).
//
//   bm_torch_gemm/<dev>_<f32|f64>             torch::mm of N×N matrices (N = 4096 on CUDA,
//                                             1024 on the CPU): GFLOP/s = 2N³/t
//   bm_torch_device_moments/<dev>_<f32|bf16>  one benchmark-shaped head (d = 128, 8,192 query
//                                             and 8,192 key rows, 16 buckets of 512 rows,
//                                             2 sequences of 4,096 tokens, every token kept):
//                                             the capture call, the device GEMMs and Chan merges,
//                                             and the copy of the moments to the host.
//                                             GFLOP/s counts n·d·(d+1) per kind (the symmetric
//                                             second moments, as bm_moments_accumulate);
//                                             vs_gemm_f64 = GFLOP/s / the f64 GEMM rate (the
//                                             device accumulates in f64).
//   bm_torch_gram/<dev>/keys:M                the Gram plasticity of one dense key bucket
//                                             (M keys of one sequence, the shape of bm_dense_gram):
//                                             gram_GFLOP/s counts 2·d per pair (as bm_dense_gram);
//                                             vs_gemm_f32 = gram_GFLOP/s / the f32 GEMM rate (the
//                                             Gram GEMM runs in f32 for f32 keys).
//
// The GEMM rate used by the ratios is measured once per (device, dtype) when
// first needed (best of three torch::mm at the size of the GEMM case), so the
// ratios hold whatever --benchmark_filter selects.
#include <qkgeom/adapters/torch.hpp>
#include <qkgeom/adapters/torch_capture.hpp>
#include <qkgeom/adapters/torch_plasticity.hpp>
#include <qkgeom/geometry/householder.hpp>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

namespace {

using qkgeom::index_t;

enum class device_kind : std::uint8_t { cpu = 0, cuda = 1 };

/// False (and the case marked skipped, visibly) when a CUDA case has no CUDA device.
bool device_ready(benchmark::State& st, device_kind k) {
    if (k == device_kind::cuda && !torch::cuda::is_available()) {
        st.SkipWithError("no CUDA device: skipped");
        return false;
    }
    return true;
}

at::Device device_of(device_kind k) { return k == device_kind::cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU); }

void sync(at::Device const& d) {
    if (d.is_cuda()) torch::cuda::synchronize();
}

/// The GEMM edge per device: 4096 on a GPU, 1024 on the CPU (a 4096³ f64 GEMM
/// takes a minute on a small CPU with a reference BLAS; 1024 is already in the
/// regime where a tuned BLAS runs at its peak).
std::int64_t gemm_n(device_kind k) { return k == device_kind::cuda ? 4096 : 1024; }

/// Best of three torch::mm at gemm_n, in GFLOP/s; measured once per (device, dtype).
double gemm_rate(device_kind k, at::ScalarType dt) {
    static std::map<std::pair<int, int>, double> cache;
    auto const key = std::pair{static_cast<int>(k), static_cast<int>(dt)};
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    at::Device const dev = device_of(k);
    std::int64_t const n = gemm_n(k);
    auto const o = at::TensorOptions().dtype(dt).device(dev);
    at::Tensor const a = at::randn({n, n}, o), b = at::randn({n, n}, o);
    at::Tensor c = at::mm(a, b);  // warm-up (cuBLAS handles, thread pools)
    sync(dev);
    double best = 0;
    for (int r = 0; r < 3; ++r) {
        auto const t0 = std::chrono::steady_clock::now();
        c = at::mm(a, b);
        sync(dev);
        double const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, 2.0 * double(n) * double(n) * double(n) * 1e-9 / s);
    }
    benchmark::DoNotOptimize(c.data_ptr());
    return cache[key] = best;
}

void bm_torch_gemm(benchmark::State& st, device_kind k, at::ScalarType dt) {
    if (!device_ready(st, k)) return;
    at::Device const dev = device_of(k);
    std::int64_t const n = gemm_n(k);
    auto const o = at::TensorOptions().dtype(dt).device(dev);
    at::Tensor const a = at::randn({n, n}, o), b = at::randn({n, n}, o);
    at::Tensor c = at::mm(a, b);
    sync(dev);
    for (auto _ : st) {
        c = at::mm(a, b);
        sync(dev);
    }
    benchmark::DoNotOptimize(c.data_ptr());
    st.counters["n"] = double(n);
    st.counters["threads"] = double(at::get_num_threads());
    st.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// --- device moments -----------------------------------------------------------
constexpr std::int64_t kD = 128, kT = 4096, kSeq = 2, kWidth = 256;

qkgeom::io::manifest moments_manifest() {
    qkgeom::rope_spec rope;
    rope.pairing = qkgeom::rope_pairing::rotate_half;
    rope.rotary_dim = kD;
    rope.theta = 10000.0;
    // bucket scheme `all`: every token kept, 16 buckets of 256 positions.
    return qkgeom::make_capture_manifest("bench", qkgeom::uniform_layout(1, 1, 1, kD), rope,
                                         qkgeom::capture_sampler{{qkgeom::bucket_scheme::all, kWidth, 1.0}, 7},
                                         qkgeom::io::head_sampling{1, 0}, kT);
}

void bm_torch_device_moments(benchmark::State& st, device_kind k, at::ScalarType dt) {
    if (!device_ready(st, k)) return;
    at::Device const dev = device_of(k);
    at::manual_seed(3);
    auto const o = at::TensorOptions().dtype(at::kFloat);
    // [B, H, T, D] post-RoPE rows with a positional drift on coordinate 0.
    at::Tensor const t = at::arange(kT, o).view({1, 1, kT, 1});
    at::Tensor const q = (at::randn({kSeq, 1, kT, kD}, o) + t * 1e-3).to(dt).to(dev);
    at::Tensor const kk = (at::randn({kSeq, 1, kT, kD}, o) - t * 2e-3).to(dt).to(dev);
    at::Tensor const pos = at::arange(kT, at::TensorOptions().dtype(at::kLong));
    at::Tensor const ex = at::arange(kSeq, at::TensorOptions().dtype(at::kLong));
    auto const manifest = moments_manifest();
    qkgeom::torch_capture_options opt;
    opt.mode = qkgeom::torch_capture_mode::device_moments;
    sync(dev);
    double buckets = 0;
    auto const t0 = std::chrono::steady_clock::now();
    for (auto _ : st) {
        qkgeom::torch_capture<float> cap(manifest, opt);
        cap(0, q, kk, pos, ex, std::nullopt);
        auto const r = cap.result();  // synchronises and copies the moments to the host
        buckets = double(r.heads[0].q.buckets.size());
        benchmark::DoNotOptimize(r.heads[0].q.buckets.begin()->second.c_xx.data());
    }
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double const rows = double(kSeq * kT);  // per kind
    double const flops = 2.0 * rows * double(kD) * double(kD + 1);
    st.counters["rows"] = 2.0 * rows;
    st.counters["buckets"] = buckets;
    st.counters["d"] = double(kD);
    st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    double const g = gemm_rate(k, at::kDouble);
    st.counters["gemm_f64_GFLOP/s"] = g;
    st.counters["vs_gemm_f64"] = flops * double(st.iterations()) * 1e-9 / seconds / g;
}

// --- the Gram plasticity of one dense key bucket ------------------------------
struct gram_case {
    qkgeom::householder_result model;
    qkgeom::token_rows<at::Tensor> keys;
    qkgeom::capture_facts facts;
};

/// M keys of one sequence in bucket 0, the queries after them in bucket 1
/// with a positional drift on coordinate 0 (the shape of bm_dense_gram).
gram_case make_gram(index_t m, at::Device dev) {
    std::mt19937_64 gen(11);
    std::normal_distribution<double> nd;
    gram_case c;
    index_t const nq = std::min<index_t>(m, 4096);
    Eigen::MatrixXd q(nq, kD);
    std::vector<std::int64_t> qp(static_cast<std::size_t>(nq)), qb(static_cast<std::size_t>(nq), 1);
    for (index_t i = 0; i < nq; ++i) {
        qp[std::size_t(i)] = m + (i * m) / nq;
        for (index_t j = 0; j < kD; ++j) q(i, j) = double(float(nd(gen) + (j == 0 ? 1e-3 * double(qp[std::size_t(i)]) : 0.0)));
    }
    c.model = qkgeom::householder(q, qp, qb);
    at::Tensor kt = at::empty({m, kD}, at::TensorOptions().dtype(at::kFloat));
    auto* p = kt.data_ptr<float>();
    std::vector<std::int64_t> kp(static_cast<std::size_t>(m)), kb(static_cast<std::size_t>(m), 0),
        ke(static_cast<std::size_t>(m), 0);
    for (index_t i = 0; i < m; ++i) {
        kp[std::size_t(i)] = i;
        for (index_t j = 0; j < kD; ++j) p[i * kD + j] = float(nd(gen) + (j == 0 ? -2e-3 * double(i) : 0.0));
    }
    c.keys = {kt.to(dev), qkgeom::token_positions(std::move(kp)), qkgeom::token_buckets(std::move(kb)),
              qkgeom::example_ids(std::move(ke))};
    c.facts.context_length = 2 * m;
    return c;
}

void bm_torch_gram(benchmark::State& st, device_kind k) {
    if (!device_ready(st, k)) return;
    at::Device const dev = device_of(k);
    index_t const m = index_t(st.range(0));
    auto const c = make_gram(m, dev);
    qkgeom::plasticity_options opt;
    opt.enumeration = qkgeom::enumeration_policy::exact;
    std::int64_t n_pairs = 0;
    sync(dev);
    auto const t0 = std::chrono::steady_clock::now();
    for (auto _ : st) {
        auto const r = qkgeom::torch_attention_plasticity(c.model, c.keys, c.facts, opt);  // ends with a host copy
        n_pairs = r.n_pairs;
        benchmark::DoNotOptimize(r.cells.data());
    }
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double const pairs = double(m) * double(m - 1) / 2;
    st.counters["keys"] = double(m);
    st.counters["pairs"] = pairs;
    st.counters["pairs_evaluated"] = double(n_pairs);
    st.counters["pairs/s"] = benchmark::Counter(pairs, benchmark::Counter::kIsIterationInvariantRate);
    st.counters["gram_GFLOP/s"] =
        benchmark::Counter(pairs * 2.0 * double(kD) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    double const g = gemm_rate(k, at::kFloat);
    st.counters["gemm_f32_GFLOP/s"] = g;
    st.counters["vs_gemm_f32"] = pairs * 2.0 * double(kD) * double(st.iterations()) * 1e-9 / seconds / g;
}

BENCHMARK_CAPTURE(bm_torch_gemm, cpu_f32, device_kind::cpu, at::kFloat)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_torch_gemm, cpu_f64, device_kind::cpu, at::kDouble)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_torch_gemm, cuda_f32, device_kind::cuda, at::kFloat)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_torch_gemm, cuda_f64, device_kind::cuda, at::kDouble)->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(bm_torch_device_moments, cpu_f32, device_kind::cpu, at::kFloat)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_torch_device_moments, cpu_bf16, device_kind::cpu, at::kBFloat16)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_torch_device_moments, cuda_f32, device_kind::cuda, at::kFloat)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_torch_device_moments, cuda_bf16, device_kind::cuda, at::kBFloat16)->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(bm_torch_gram, cpu, device_kind::cpu)->ArgName("keys")->Arg(4096)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_torch_gram, cuda, device_kind::cuda)->ArgName("keys")->Arg(4096)->Arg(16384)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
