// qkgeom — attention plasticity of one head from validated rows (method §5–6):
// the pair plan, then per query bucket its cells (exact or sampled, with the
// empirical cross-check when the bucket has query rows), then the
// aggregates. The public entry points (<qkgeom/plasticity/attention_plasticity.hpp>)
// read and validate the rows and call `evaluate_plasticity`.
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/geometry/householder.hpp>
#include <qkgeom/plasticity/aggregate.hpp>
#include <qkgeom/plasticity/closed_form.hpp>
#include <qkgeom/plasticity/empirical.hpp>
#include <qkgeom/plasticity/engine.hpp>
#include <qkgeom/plasticity/options.hpp>
#include <qkgeom/plasticity/pair_plan.hpp>
#include <qkgeom/plasticity/rows.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace qkgeom::detail {

/// The Gaussian model of one query bucket in the rotated basis (method §4–5).
template <class Dep = void>
bucket_eval bucket_eval_of(detail::dep_t<bucket_semantics, Dep> const& s, index_t d) {
    using BEval = detail::dep_t<bucket_eval, Dep>;
    BEval e;
    e.w = s.mean;
    e.tau = s.tau;
    if (s.cov.size() != 0) e.V = full_bucket_covariance(s, d);
    else e.var = s.var;
    return e;
}

/// The first-quintile reference of the frozen-content counterfactual
/// (docs/beyond-split.md): the query-count-weighted mean of μ_b, σ²_b (and Σ_b
/// under `full`) over the buckets with a model whose quintile ⌊5τ_b/L⌋ is 0.
struct split_reference {
    bool on = false;           ///< options.split_profile
    bool per_bucket = false;   ///< global_linear: each bucket's own content (it does not change with b)
    std::int64_t n_buckets = 0;
    double alpha_pos = nan;
    Eigen::VectorXd mean, var;  ///< (d) coordinates 1..d−1 hold the reference; 0 unused
    Eigen::MatrixXd cov;        ///< (d−1)² under `full`, else empty
    row_block pref;             ///< full: K̃[:, 1:] Σ_ref, one row per key (split_model::pref); else empty
};

template <class Dep = void>
split_reference split_reference_of(detail::dep_t<householder_result, Dep> const& model,
                                   detail::dep_t<key_store, Dep> const& ks, std::int64_t L, bool on) {
    using VecX = detail::dep_t<Eigen::VectorXd, Dep>;
    using MatX = detail::dep_t<Eigen::MatrixXd, Dep>;
    using SplitRef = detail::dep_t<split_reference, Dep>;
    SplitRef r;
    r.on = on;
    r.alpha_pos = model.alpha_pos;
    r.per_bucket = model.model == semantic_model::global_linear;
    if (!on) return r;
    double wsum = 0;
    for (auto const& s : model.buckets) {
        if (!s.used || quantile_of(s.tau, s.n_queries, L, 5) != 0) continue;
        auto const w = double(s.n_queries);
        if (r.n_buckets++ == 0) {
            r.mean = VecX::Zero(s.mean.size());
            r.var = VecX::Zero(s.var.size());
            if (s.cov.size() != 0) r.cov = MatX::Zero(s.cov.rows(), s.cov.cols());
        }
        wsum += w;
        r.mean += w * s.mean;
        r.var += w * s.var;
        if (r.cov.size() != 0) r.cov += w * s.cov;
    }
    if (r.n_buckets > 0) {
        r.mean /= wsum;
        r.var /= wsum;
        if (r.cov.size() != 0) r.cov /= wsum;
    }
    if (r.cov.size() != 0 && ks.d > 1) r.pref.noalias() = ks.rot.rightCols(ks.d - 1) * r.cov;  // one GEMM per head
    return r;
}

/// The split model of one query bucket: its own positional coordinate with
/// the reference content (or its own content under global_linear).
template <class Dep = void>
split_model split_model_of(detail::dep_t<bucket_semantics, Dep> const& s,
                           detail::dep_t<split_reference, Dep> const& ref) {
    using SModel = detail::dep_t<split_model, Dep>;
    SModel m;
    m.on = ref.on;
    m.alpha_pos = ref.alpha_pos;
    m.frozen = ref.per_bucket || ref.n_buckets > 0;
    if (!m.on || !m.frozen) return m;
    m.wf = s.mean;
    m.varf = s.var;
    if (ref.per_bucket) {
        m.covf = s.cov;
        return m;
    }
    index_t const d = s.mean.size();
    m.wf.tail(d - 1) = ref.mean.tail(d - 1);
    m.varf.tail(d - 1) = ref.var.tail(d - 1);
    m.covf = ref.cov;
    if (ref.pref.size() != 0) m.pref = ref.pref.data();
    return m;
}

/// The split bucket of one query bucket from its cells' split sums: the four
/// AP_b by the plasticity rule (the mean of the non-empty cells' means), the
/// parts of m and v pooled over its pairs.
template <class = void>  // instantiated on use
split_bucket split_bucket_of(std::int64_t b, std::vector<split_acc> const& cells, bool frozen,
                                    std::int64_t& degenerate) {
    split_acc pooled;
    double sum[4] = {0, 0, 0, 0};
    std::int64_t n_cells = 0;
    for (auto const& c : cells) {
        if (c.n == 0) continue;
        ++n_cells;
        auto const n = double(c.n);
        sum[0] += c.act / n;
        sum[1] += c.nd / n;
        sum[2] += c.fr / n;
        sum[3] += c.ne / n;
        pooled.add(c);
    }
    degenerate += pooled.degenerate;
    return finish_split_bucket(b, pooled, sum, n_cells, frozen);
}

/// The groups of ≥ 2 keys among `groups` (sampling draws from them).
template <class = void>  // instantiated on use
std::vector<std::vector<index_t> const*> sampling_groups(std::vector<key_group> const& groups) {
    std::vector<std::vector<index_t> const*> gs;
    for (auto const& g : groups)
        if (g.keys.size() >= 2) gs.push_back(&g.keys);
    return gs;
}

/// One cell: every pair (exact) or the drawn pairs (sampled) of `groups`.
template <class Evaluator>
plasticity_cell evaluate_cell(Evaluator& ev, key_store const& ks, bucket_eval const& e,
                              std::vector<key_group> const& groups, bool sampled, plasticity_options const& opt,
                              std::int64_t b, std::int64_t c, split_acc* split = nullptr) {
    cell_acc acc;
    if (sampled) {
        evaluate_cell_sampled(ev, e, sampling_groups(groups), acc, opt, b, c);
    } else {
        for (auto const& g : groups) evaluate_group_exact(ev, ks, e, g.keys, acc, opt);
    }
    if (split != nullptr) *split = acc.split;
    return finish_cell(acc, b, c, sampled);
}

/// One query bucket: its cells appended to `res.cells`, its profile entry to
/// `res.profile` (method §6, §9.10–9.11), its split entry to `res.split.profile`.
template <class Evaluator>
void evaluate_query_bucket(Evaluator& ev, detail::dep_t<empirical_check, Evaluator>& emp, bucket_semantics const& s,
                           query_plan const& qp,
                           pair_plan const& plan, key_store const& ks, plasticity_options const& opt,
                           plasticity_result& res, split_reference const& ref = {}) {
    using BEval = detail::dep_t<bucket_eval, Evaluator>;
    plasticity_bucket pb;
    pb.q_bucket = s.bucket;
    pb.n_queries = s.n_queries;
    pb.tau = s.tau;
    pb.quintile = quantile_of(s.tau, s.n_queries, res.context_length, 5);
    pb.decile = quantile_of(s.tau, s.n_queries, res.context_length, 10);
    if (!qp.evaluated) {  // method §6: no earlier key bucket; §9.8: no bucket model
        ++res.n_query_buckets_skipped;
        res.profile.push_back(pb);
        res.split.profile.emplace_back().q_bucket = s.bucket;
        return;
    }
    BEval e = bucket_eval_of(s, ks.d);
    e.split = split_model_of(s, ref);
    bool const prefix = opt.pairs == pair_policy::prefix;
    std::vector<key_group> const groups = prefix ? plan.prefix_groups(qp.cells) : std::vector<key_group>{};
    emp.prepare(s.bucket, qp.cells, prefix ? &groups : nullptr, res.sampled, e.emp);
    std::vector<split_acc> sc;
    if (!prefix) {  // same_bucket
        auto const first = res.cells.size();
        sc.resize(qp.cells.size());
        for (std::size_t i = 0; i < qp.cells.size(); ++i)
            res.cells.push_back(
                evaluate_cell(ev, ks, e, plan.groups_of(qp.cells[i]), res.sampled, opt, s.bucket, qp.cells[i], &sc[i]));
        same_bucket_profile(std::span<plasticity_cell const>(res.cells).subspan(first), pb);
    } else {  // prefix: per example, its keys in all admissible buckets
        sc.resize(1);
        res.cells.push_back(
            evaluate_cell(ev, ks, e, groups, res.sampled, opt, s.bucket, -1, sc.data()));
        prefix_profile(res.cells.back(), pb);
    }
    res.n_pairs += pb.n_pairs;
    res.profile.push_back(pb);
    res.split.profile.push_back(split_bucket_of(s.bucket, sc, e.split.on && e.split.frozen, res.split.n_pairs_degenerate));
}

// evaluate_plasticity (declared in plasticity/engine.hpp, with its documentation).
template <class Dep>
plasticity_result evaluate_plasticity(detail::dep_t<householder_result, Dep> const& model,
                                      detail::dep_t<key_store, Dep> const& ks,
                                      detail::dep_t<query_store, Dep> const& qs,
                                      capture_facts const& facts, plasticity_options const& opt) {
    using PRes = detail::dep_t<plasticity_result, Dep>;
    using EmpCheck = detail::dep_t<empirical_check, Dep>;
    using SplitRef = detail::dep_t<split_reference, Dep>;
    using PairEval = detail::dep_t<pair_evaluator, Dep>;
    using PPlan = detail::dep_t<pair_plan, Dep>;
    std::int64_t max_pos = std::max(qs.max_position, model.max_position);  // queries: rows and moments
    for (auto t : ks.position) max_pos = std::max(max_pos, t);
    PRes res;
    res.context_length = facts.context_length > 0 ? facts.context_length : max_pos + 1;  // method §9.12
    res.ap_decile.fill(nan);
    res.heatmap = make_heatmap(opt.heatmap, facts, res.context_length, opt.pairs);

    std::vector<std::pair<std::int64_t, bool>> models;
    models.reserve(model.buckets.size());
    for (auto const& s : model.buckets) models.emplace_back(s.bucket, s.used);
    PPlan const plan = plan_pairs(ks.bucket, ks.example, models, facts, opt);
    res.sampled = plan.sampled;

    EmpCheck emp(ks, qs, plan, opt);
    PairEval ev(ks, res.heatmap, res.n_pairs_skipped, emp);
    SplitRef const ref = split_reference_of(model, ks, res.context_length, opt.split_profile);
    for (std::size_t i = 0; i < model.buckets.size(); ++i)
        evaluate_query_bucket(ev, emp, model.buckets[i], plan.queries[i], plan, ks, opt, res, ref);
    aggregate(res, opt.weighting);
    aggregate_split(res, ref.on, ref.per_bucket || ref.n_buckets > 0, ref.n_buckets);
    return res;
}

}  // namespace qkgeom::detail
