// qkgeom — the compiled part (optional; CMake target qkgeom::compiled).
//
// With QKGEOM_COMPILED defined in every translation unit of a program,
// the kernel headers of include/qkgeom/simd/ declare their dispatching entry
// points only, and none of them includes <immintrin.h>: the umbrella header
// compiles faster (docs/architecture.md, "Compile cost"). This translation
// unit defines those entry points once, from the same headers: one
// implementation of each kernel in both modes.
#ifndef QKGEOM_COMPILED
#define QKGEOM_COMPILED 1
#endif
#define QKGEOM_COMPILED_IMPLEMENTATION 1

#include <qkgeom/simd/moment_kernels.hpp>
#include <qkgeom/simd/rope_kernels.hpp>
#include <qkgeom/simd/score_kernels.hpp>
#include <qkgeom/simd/sse2.hpp>

namespace qkgeom::detail::mom {
// The row types the moments read in place (stats/moments.hpp: f32 and f64 rows).
template void centre_pack<float>(simd::isa, float const*, index_t, index_t const*, double const*, index_t, index_t,
                                 double*, double*, double*, double*);
template void centre_pack<double>(simd::isa, double const*, index_t, index_t const*, double const*, index_t, index_t,
                                  double*, double*, double*, double*);
}  // namespace qkgeom::detail::mom

// The plasticity engine (method §5–6), declared extern in plasticity/engine.hpp.
#include <qkgeom/plasticity/attention_plasticity.hpp>

template qkgeom::plasticity_result qkgeom::detail::evaluate_plasticity<void>(
    qkgeom::householder_result const&, qkgeom::detail::key_store const&, qkgeom::detail::query_store const&,
    qkgeom::capture_facts const&, qkgeom::plasticity_options const&);

// PCA, planar rotation and Householder decomposition of a head's moments
// (method §2–4), declared extern in analysis/analyze.hpp.
#include <qkgeom/analysis/analyze.hpp>

template qkgeom::head_analysis qkgeom::detail::closed_forms<void>(qkgeom::head_moments const&,
                                                                  qkgeom::analysis_options const&);

// analyze_head for the common row types, declared extern in analysis/analyze.hpp.
template qkgeom::head_analysis qkgeom::analyze_head(
    qkgeom::head_capture<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> const&,
    qkgeom::analysis_options const&);
template qkgeom::head_analysis qkgeom::analyze_head(
    qkgeom::head_capture<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> const&,
    qkgeom::analysis_options const&);
template qkgeom::head_analysis qkgeom::analyze_head(qkgeom::head_capture<Eigen::MatrixXd> const&,
                                                    qkgeom::analysis_options const&);
