// qkgeom — attention plasticity of one head from validated rows (method §5–6):
// the pair plan, then per query bucket its cells (exact or sampled, with the
// empirical cross-check when the bucket has query rows), then the
// aggregates. The public entry points (<qkgeom/plasticity/attention_plasticity.hpp>)
// read and validate the rows and call `evaluate_plasticity`.
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/cancel.hpp>
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
#include <random>
#include <span>
#include <unordered_set>
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

/// The pairs a sampled check of one cell draws from (method §9.14): the
/// recorded draws `acc.kept` of a sampled enumeration, or the admissible
/// pairs of `groups` numbered group by group (within a group, pair (a, b),
/// a < b, is number b(b − 1)/2 + a: one number per pair, each pair oriented
/// as the exact pass records it).
/// `lookup` > 0: when there are at most that many pairs, a table gives the
/// group of each pair number in one look-up.
struct pair_population {
    std::vector<std::array<index_t, 2>> const* kept = nullptr;
    std::vector<key_group> const* groups = nullptr;
    std::vector<std::int64_t> cum;    ///< exact enumeration: cumulative pair counts of the groups
    std::vector<std::int32_t> owner;  ///< ... and, when they are few, the group of each pair number
    std::int64_t total = 0;

    pair_population(cell_acc const& acc, std::vector<key_group> const& gs, std::int64_t lookup) {
        if (acc.emp == emp_pass::keep) {
            kept = &acc.kept;
            total = static_cast<std::int64_t>(acc.kept.size());
            return;
        }
        groups = &gs;
        for (auto const& g : gs) cum.push_back(total += pairs_of(g.keys.size()));
        if (total <= lookup)
            for (std::size_t gi = 0; gi < gs.size(); ++gi)
                owner.insert(owner.end(), static_cast<std::size_t>(cum[gi] - (gi > 0 ? cum[gi - 1] : 0)),
                             static_cast<std::int32_t>(gi));
    }

    /// The group of pair number u (exact enumeration).
    [[nodiscard]] std::size_t group_of(std::int64_t u) const {
        return owner.empty() ? static_cast<std::size_t>(std::upper_bound(cum.begin(), cum.end(), u) - cum.begin())
                             : static_cast<std::size_t>(owner[static_cast<std::size_t>(u)]);
    }

    /// Pair number u as row indices (i, j), in the order the pass records them.
    [[nodiscard]] std::array<index_t, 2> pair(std::int64_t u) const {
        if (kept != nullptr) return (*kept)[static_cast<std::size_t>(u)];
        auto const gi = group_of(u);
        auto const t = u - (gi > 0 ? cum[gi - 1] : 0);  // b(b − 1)/2 + a, a < b
        auto b = static_cast<std::int64_t>((1.0 + std::sqrt(1.0 + 8.0 * double(t))) / 2.0);
        while (b * (b - 1) / 2 > t) --b;
        while ((b + 1) * b / 2 <= t) ++b;
        auto const a = t - b * (b - 1) / 2;
        auto const& g = (*groups)[gi].keys;
        return {g[static_cast<std::size_t>(a)], g[static_cast<std::size_t>(b)]};
    }
};

/// The sampled empirical check of one cell after its closed-form pass
/// (method §9.14, `empirical_policy::sampled`, docs/plasticity.md): ⌊budget/2⌋
/// draws, each a pair uniform over the cell's evaluated pairs (sampled
/// enumeration: its recorded draws `acc.kept`; exact: the admissible pairs of
/// `groups`, one drawn again while the closed form skips it, at most 16
/// tries per draw, only when the cell skipped a pair) and two distinct queries
/// r ≠ s uniform over the bucket's n_b; the value 2·[r and s disagree]
/// (`disagreement`) has the pair's PP̂ as its mean, so the mean of the draws
/// is unbiased for the counted `empirical`. Draws depend on (seed, head, b, c).
template <class Evaluator>
void draw_empirical(Evaluator& ev, key_store const& ks, bucket_eval const& e, std::vector<key_group> const& groups,
                    cell_acc& acc, plasticity_options const& opt, std::int64_t b, std::int64_t c, bool had_skips) {
    std::mt19937_64 gen(empirical_stream(opt.seed, b, c));
    std::int64_t const n_draws = opt.empirical_budget / 2;
    pair_population const pop(acc, groups, std::min<std::int64_t>(32 * n_draws, 1 << 20));
    auto const nq = static_cast<std::uint64_t>(e.emp.nq);
    auto pick = [&](index_t& i, index_t& j) {
        if (pop.kept != nullptr) {
            auto const& p = (*pop.kept)[uniform_below(gen, pop.kept->size())];
            i = p[0], j = p[1];
            return true;
        }
        auto const u = static_cast<std::int64_t>(uniform_below(gen, static_cast<std::uint64_t>(pop.total)));
        auto const& g = groups[pop.group_of(u)].keys;
        auto const a = uniform_below(gen, g.size());
        auto bb = uniform_below(gen, g.size() - 1);
        bb += bb >= a ? 1 : 0;
        i = g[std::min(a, bb)], j = g[std::max(a, bb)];  // the order the exact pass records
        return !had_skips || ev.evaluates(e, i, j);
    };
    acc.emp_sampled = true;
    for (std::int64_t k = 0; k < n_draws; ++k) {
        if ((k & 0x3fff) == 0x3fff) check_cancelled();  // a safe point every 16,384 draws (up to 5·10⁸ per cell)
        index_t i = 0, j = 0;
        bool ok = false;
        for (int t = 0; t < 16 && !ok; ++t) ok = pick(i, j);
        if (!ok) continue;
        auto const r = uniform_below(gen, nq);
        auto s = uniform_below(gen, nq - 1);
        s += s >= r ? 1 : 0;
        acc.emp_sum += disagreement(*e.emp.queries, static_cast<index_t>(r), static_cast<index_t>(s), ks.orig.row(i),
                                    ks.orig.row(j));
        ++acc.emp_n;
    }
}

/// The pair-sampled empirical check of one cell after its closed-form pass
/// (method §9.14, docs/plasticity.md): m = `empirical_pairs` distinct pairs
/// drawn uniformly, without replacement, from the cell's evaluated pairs (a
/// pair the closed form skips is passed over), each counted against every
/// query of the bucket as the counted check counts it (`count_listed`), and
/// its closed-form PP. The cell's empirical value is the closed form's mean
/// plus the mean over the sample of PP̂ − PP (the difference estimator:
/// unbiased, and its error is that of the model's misfit, not of the pairs'
/// spread). Returns false, with nothing recorded, when fewer than two
/// evaluated pairs turned up in 16·m + 64 tries (the cell then draws).
/// Pairs depend on (seed, head, b, c).
template <class Evaluator>
bool pair_sample_empirical(Evaluator& ev, detail::dep_t<empirical_check, Evaluator>& emp, bucket_eval const& e,
                           std::vector<key_group> const& groups, cell_acc& acc, plasticity_options const& opt,
                           std::int64_t b, std::int64_t c) {
    std::mt19937_64 gen(empirical_stream(opt.seed, b, c));
    std::int64_t const m = opt.empirical_pairs;
    pair_population const pop(acc, groups, std::min<std::int64_t>(64 * m, 1 << 20));
    std::unordered_set<std::int64_t> seen;
    std::vector<std::array<index_t, 2>> pairs;
    std::vector<double> pp;
    for (std::int64_t t = 0; t < 16 * m + 64 && std::ssize(pairs) < m && std::ssize(seen) < pop.total; ++t) {
        auto const u = static_cast<std::int64_t>(uniform_below(gen, static_cast<std::uint64_t>(pop.total)));
        if (!seen.insert(u).second) continue;
        auto const ij = pop.pair(u);
        double x = 0;
        if (!ev.closed_pp(e, ij[0], ij[1], x)) continue;  // skipped by the closed form (v ≤ 0): not in the cell
        pairs.push_back(ij);
        pp.push_back(x);
    }
    if (pairs.size() < 2) return false;
    std::vector<std::int64_t> wins;
    emp.count_listed(e.emp, pairs, wins);
    auto const nq = double(e.emp.nq);
    for (std::size_t k = 0; k < pairs.size(); ++k) {
        double const p = double(wins[k]) / nq;
        double const dk = 4.0 * p * (1.0 - p) * e.emp.emp_scale - pp[k];
        acc.emp_sum += dk;
        acc.emp_sumsq += dk * dk;
    }
    acc.emp_n = std::ssize(pairs);
    acc.emp_population = acc.n;
    acc.emp_paired = true;
    return true;
}

/// Asks the cache for the rotated rows the direct path will read next: a
/// group's keys lie an example apart in the rows, and most groups of a
/// `same_bucket` cell hold one key (no pair), so the rows of the next groups
/// with pairs are requested until `rows_ahead` rows are in flight. Dense
/// groups (copied row by row) are not prefetched. No effect on results.
template <class = void>  // instantiated on use
class group_prefetcher {
public:
    group_prefetcher(key_store const& ks, std::vector<key_group> const& groups, plasticity_options const& opt)
        : ks_(ks), groups_(groups), dense_(opt.dense_min_keys) {}

    /// Before group `gi` is evaluated: its rows leave the window, later ones join it.
    void ahead_of(std::size_t gi) {
        if (gi < next_ && direct(gi)) in_flight_ -= static_cast<index_t>(groups_[gi].keys.size());
        next_ = std::max(next_, gi + 1);
        auto const bytes = static_cast<std::size_t>(ks_.d) * sizeof(double);
        for (; next_ < groups_.size() && in_flight_ < rows_ahead; ++next_) {
            if (!direct(next_)) continue;
            for (index_t i : groups_[next_].keys) prefetch_bytes(ks_.rot.row(i).data(), bytes);
            in_flight_ += static_cast<index_t>(groups_[next_].keys.size());
        }
    }

private:
    static constexpr index_t rows_ahead = 12;
    [[nodiscard]] bool direct(std::size_t g) const {
        auto const n = static_cast<index_t>(groups_[g].keys.size());
        return n >= 2 && n < dense_;
    }
    key_store const& ks_;
    std::vector<key_group> const& groups_;
    index_t dense_;
    std::size_t next_ = 0;
    index_t in_flight_ = 0;
};

/// How the empirical check treats one cell (method §9.14).
enum class emp_mode { counted, paired, drawn };

/// The empirical check of a cell of `pairs` pairs (sampled enumeration: its
/// draws) in a bucket of nq ≥ 2 queries: under `empirical_policy::sampled`,
/// counted when its nq · pairs evaluations are within
/// max(`empirical_max_exact`, `empirical_budget`); otherwise pair-sampled
/// (`pair_sample_empirical`) while nq · `empirical_pairs` ≤ 32 ·
/// `empirical_budget` (a draw costs about as much as 64 counted
/// evaluations, docs/performance.md) — counted whole when it has no more
/// than 4 · `empirical_pairs` pairs; drawn (`draw_empirical`) beyond.
template <class = void>  // instantiated on use
emp_mode empirical_mode(plasticity_options const& opt, std::int64_t nq, std::int64_t pairs) {
    std::int64_t const counted = std::max(opt.empirical_max_exact, opt.empirical_budget);
    if (opt.empirical_check != empirical_policy::sampled || nq < 2 || pairs <= counted / nq) return emp_mode::counted;
    std::int64_t const m = opt.empirical_pairs;
    if (m < 2 || nq > 32 * opt.empirical_budget / m) return emp_mode::drawn;
    return pairs <= 4 * m ? emp_mode::counted : emp_mode::paired;
}

/// Every pair of a cell's groups, in group order (the rows fetched ahead).
template <class Evaluator>
void evaluate_cell_exact(Evaluator& ev, key_store const& ks, bucket_eval const& e,
                         std::vector<key_group> const& groups, cell_acc& acc, plasticity_options const& opt) {
    group_prefetcher pf(ks, groups, opt);
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
        pf.ahead_of(gi);
        evaluate_group_exact(ev, ks, e, groups[gi].keys, acc, opt);
    }
}

/// One cell: every pair (exact) or the drawn pairs (sampled) of `groups`;
/// its empirical check counted pair by pair (`mode` counted), or sampled
/// after the pass.
template <class Evaluator>
plasticity_cell evaluate_cell(Evaluator& ev, detail::dep_t<empirical_check, Evaluator>& emp, key_store const& ks,
                              bucket_eval const& e, std::vector<key_group> const& groups, bool sampled,
                              plasticity_options const& opt, std::int64_t b, std::int64_t c, split_acc* split,
                              emp_mode mode) {
    cell_acc acc;
    bool const after = mode != emp_mode::counted && e.emp.active();
    if (after) acc.emp = sampled ? emp_pass::keep : emp_pass::none;
    std::int64_t const skipped = ev.skipped();
    if (sampled) {
        evaluate_cell_sampled(ev, e, sampling_groups(groups), acc, opt, b, c);
    } else {
        evaluate_cell_exact(ev, ks, e, groups, acc, opt);
    }
    if (after && acc.n > 0 && !(mode == emp_mode::paired && pair_sample_empirical(ev, emp, e, groups, acc, opt, b, c)))
        draw_empirical(ev, ks, e, groups, acc, opt, b, c, ev.skipped() != skipped);
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
    // method §9.14: which cells the empirical check counts (prepared here) and which draw after their pass
    std::int64_t const nq = emp.query_count(s.bucket);
    auto const planned = [&](std::int64_t pairs) { return res.sampled && pairs > 0 ? opt.samples_per_cell : pairs; };
    std::vector<emp_mode> mode(prefix ? 1 : qp.cells.size());
    std::vector<std::int64_t> counted;
    if (prefix) {
        std::int64_t pairs = 0;
        for (auto const& g : groups) pairs += pairs_of(g.keys.size());
        mode[0] = empirical_mode(opt, nq, planned(pairs));
        if (mode[0] == emp_mode::counted) counted = qp.cells;
    } else {
        for (std::size_t i = 0; i < qp.cells.size(); ++i) {
            mode[i] = empirical_mode(opt, nq, planned(plan.total_size({qp.cells[i]}).pairs));
            if (mode[i] == emp_mode::counted) counted.push_back(qp.cells[i]);
        }
    }
    emp.prepare(s.bucket, counted, prefix ? &groups : nullptr, res.sampled, e.emp);
    std::vector<split_acc> sc;
    if (!prefix) {  // same_bucket
        auto const first = res.cells.size();
        sc.resize(qp.cells.size());
        for (std::size_t i = 0; i < qp.cells.size(); ++i)
            res.cells.push_back(evaluate_cell(ev, emp, ks, e, plan.groups_of(qp.cells[i]), res.sampled, opt, s.bucket,
                                              qp.cells[i], &sc[i], mode[i]));
        same_bucket_profile(std::span<plasticity_cell const>(res.cells).subspan(first), pb);
    } else {  // prefix: per example, its keys in all admissible buckets
        sc.resize(1);
        res.cells.push_back(
            evaluate_cell(ev, emp, ks, e, groups, res.sampled, opt, s.bucket, -1, sc.data(), mode[0]));
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
    for (std::size_t i = 0; i < model.buckets.size(); ++i) {
        check_cancelled();  // a safe point (core/cancel.hpp)
        evaluate_query_bucket(ev, emp, model.buckets[i], plan.queries[i], plan, ks, opt, res, ref);
    }
    aggregate(res, opt.weighting);
    aggregate_split(res, ref.on, ref.per_bucket || ref.n_buckets > 0, ref.n_buckets);
    return res;
}

}  // namespace qkgeom::detail
