// qkgeom — the declaration of the plasticity engine (method §5–6): the one
// function the public entry points (<qkgeom/plasticity/attention_plasticity.hpp>) and the
// LibTorch path hand validated rows to. Its definition is
// plasticity/evaluate.hpp; with compiled parts (QKGEOM_COMPILED, the CMake
// target qkgeom::compiled, docs/architecture.md "Compile cost") it is
// instantiated once in src/qkgeom_compiled.cpp and the headers that include
// the umbrella parse neither it nor the closed-form and empirical passes.
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/geometry/householder.hpp>
#include <qkgeom/plasticity/options.hpp>
#include <qkgeom/plasticity/rows.hpp>
#include <qkgeom/simd/dispatch.hpp>

#include <Eigen/Core>

namespace qkgeom::detail {

/// The d × d covariance blockdiag(σ²_pos, Σ_b) of a bucket of the `full`
/// semantic model (method §4–5); shared with the rank
/// stability (beyond/ranks.hpp) and the LibTorch path.
template <class Dep = void>
Eigen::MatrixXd full_bucket_covariance(detail::dep_t<bucket_semantics, Dep> const& s, index_t d) {
    using MatX = detail::dep_t<Eigen::MatrixXd, Dep>;
    MatX V = MatX::Zero(d, d);
    V(0, 0) = s.var(0);
    V.bottomRightCorner(d - 1, d - 1) = s.cov;
    return V;
}

/// Attention plasticity of one head (method §5–6) from its Householder model,
/// its validated keys and (possibly no) query rows: the pair plan, the cells of
/// every query bucket (closed form, exact or sampled, with the empirical check
/// where the bucket has query rows), then the aggregates (method §6, §9.10–9.13).
/// A function template, instantiated on use (or once, in src/qkgeom_compiled.cpp,
/// with compiled parts).
/// \param[in] model the head's Householder decomposition (`householder_of`).
/// \param[in] ks the validated keys (original basis and rotated).
/// \param[in] qs the validated query rows by bucket (empty: no empirical check).
/// \param[in] facts the head's capture facts (context length, bucket scheme).
/// \param[in] opt the plasticity options, already checked.
/// \returns the plasticity result; degenerate cells are NaN with their flags.
/// \throws std::bad_alloc when the work buffers cannot be allocated.
template <class Dep = void>
plasticity_result evaluate_plasticity(detail::dep_t<householder_result, Dep> const& model,
                                      detail::dep_t<key_store, Dep> const& ks,
                                      detail::dep_t<query_store, Dep> const& qs,
                                      capture_facts const& facts, plasticity_options const& opt);

#if defined(QKGEOM_COMPILED)
extern template plasticity_result evaluate_plasticity<void>(householder_result const&, key_store const&,
                                                            query_store const&, capture_facts const&,
                                                            plasticity_options const&);
#endif

}  // namespace qkgeom::detail
