// qkgeom — the study's tables, computed from the runs' heads
// (docs/study.md#tables): model-level metrics with bootstrap intervals over
// heads, profiles (quintile, decile, token ranges), the checkpoint trajectory
// with the exact bias decomposition, taxonomy counts, the layer-depth × run
// heatmap, correlations with benchmark scores (exact permutation p-values),
// the per-length correlation, and per-head trajectories across checkpoints.
#pragma once

#include <qkgeom/analysis/model.hpp>
#include <qkgeom/study/metrics.hpp>
#include <qkgeom/study/stats.hpp>
#include <qkgeom/study/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom {
namespace study {

/// \brief A run as the study found it: its status and, unless it failed or
/// was given by its numbers, its heads.
struct run_outcome {
    run_status status = run_status::failed;
    std::string message;  ///< why it failed
    run_heads heads;
    std::filesystem::path folder;  ///< the analysis folder read (cache entry or the run's own)
    /// What the cache found and did besides (a damaged entry analysed again); else empty.
    std::string note;
};

/// \brief The default token-range edges: 0, then powers of two from the
/// smallest one above the smallest τ_b up to the smallest one above the
/// largest τ_b, at most 8 ranges (docs/study.md#profiles).
/// \param[in] tau_min smallest τ_b with a finite AP_b over the study's heads
/// \param[in] tau_max largest such τ_b
/// \returns the edges; empty when no head has a profile (tau_max not finite).
inline std::vector<double> default_token_edges(double tau_min, double tau_max) {
    if (!std::isfinite(tau_min) || !std::isfinite(tau_max)) return {};
    double top = 1;
    while (top <= tau_max) top *= 2;
    double first = 1;
    while (first <= tau_min && first < top) first *= 2;
    first = std::max(first, top / 128);
    std::vector<double> e{0};
    for (double x = first; x <= top; x *= 2) e.push_back(x);
    return e;
}

namespace detail {

/// One metric of one head: a head_metric_names entry, or an abs_ derived one.
inline double head_metric(head_row const& h, std::string_view name) {
    std::string_view base = name;
    bool const absolute = name.starts_with("abs_");
    if (absolute) base = name.substr(4);
    for (std::size_t i = 0; i < head_metric_names.size(); ++i)
        if (head_metric_names[i] == base) return absolute ? std::abs(h.metrics[i]) : h.metrics[i];
    return nan;
}

/// A stream seed from the study seed and two indices (splitmix64 mixing).
inline std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b) {
    auto step = [](std::uint64_t x) {
        x += 0x9e3779b97f4a7c15ULL;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
        return x ^ (x >> 31);
    };
    return step(step(step(seed) ^ a) ^ b);
}

/// A stream key from names (FNV-1a over the parts, each ended by a 0 byte),
/// so a statistic's random stream depends on what it is about, not on where
/// it falls in a list that may grow.
inline std::uint64_t name_key(std::initializer_list<std::string_view> parts) {
    std::uint64_t h = 0xcbf29ce484222325ULL;
    auto add = [&](unsigned char c) {
        h ^= c;
        h *= 0x100000001b3ULL;
    };
    for (auto const part : parts) {
        for (char const c : part) add(static_cast<unsigned char>(c));
        add(0);
    }
    return h;
}

/// The model table row of a run with heads.
inline void summarise_heads(study_spec const& spec, std::size_t run_index, run_heads const& rh,
                            std::vector<double> const& edges, run_summary& s) {
    s.n_heads = static_cast<std::int64_t>(rh.heads.size());
    s.n_layers = rh.n_layers;
    auto const names = study_metric_names();
    std::vector<double> v(rh.heads.size());
    for (std::size_t m = 0; m < names.size(); ++m) {
        for (std::size_t h = 0; h < rh.heads.size(); ++h) v[h] = head_metric(rh.heads[h], names[m]);
        auto const iv = bootstrap_mean(v, spec.bootstrap_level, spec.bootstrap_resamples,
                                       mix_seed(spec.seed, run_index, name_key({names[m]})));
        s.metrics[names[m]] = estimate{iv.mean, iv.lo, iv.hi, iv.n};
    }
    for (auto const& h : rh.heads) ++s.taxonomy[h.taxonomy];
    if (!rh.has_profiles) {
        s.quintile = rh.report_quintile;
        s.decile = rh.report_decile;
        s.token_profile.assign(edges.empty() ? 0 : edges.size() - 1, nan);
        return;
    }
    std::vector<double> per_head(rh.heads.size());
    auto mean_over_heads = [&](auto&& of) {  // the model-level rule: finite values only
        for (std::size_t h = 0; h < rh.heads.size(); ++h) per_head[h] = of(rh.heads[h]);
        return finite_mean(per_head);
    };
    for (std::size_t i = 0; i < 5; ++i)
        s.quintile[i] = mean_over_heads([&](head_row const& h) { return head_quintiles(h)[i]; });
    for (std::size_t i = 0; i < 10; ++i)
        s.decile[i] = mean_over_heads([&](head_row const& h) { return head_deciles(h)[i]; });
    for (std::size_t i = 0; i + 1 < edges.size(); ++i)
        s.token_profile.push_back(
            mean_over_heads([&](head_row const& h) { return token_range_profile(h, edges[i], edges[i + 1]); }));
}

/// The model table row of a run given by its numbers.
inline void summarise_given(run_spec const& r, std::vector<double> const& edges, run_summary& s) {
    for (auto const& n : study_metric_names()) {
        auto const it = r.metrics.find(n);
        s.metrics[n] = estimate{it == r.metrics.end() ? nan : it->second, nan, nan, 0};
    }
    s.token_profile.assign(edges.empty() ? 0 : edges.size() - 1, nan);
}

/// The trajectory's sort key of a run: order, else step, else tokens, else
/// its position in the file.
inline std::pair<int, double> order_key(run_spec const& r) {
    if (r.ckpt.order) return {0, *r.ckpt.order};
    if (r.ckpt.step) return {1, double(*r.ckpt.step)};
    if (r.ckpt.tokens) return {2, *r.ckpt.tokens};
    return {3, double(r.index)};
}

/// Runs per model (runs that did not fail), in checkpoint order.
inline std::map<std::string, std::vector<std::size_t>> runs_by_model(std::vector<run_summary> const& runs) {
    std::map<std::string, std::vector<std::size_t>> out;
    for (std::size_t i = 0; i < runs.size(); ++i)
        if (runs[i].status != run_status::failed) out[runs[i].spec.model].push_back(i);
    for (auto& [_, v] : out)
        std::stable_sort(v.begin(), v.end(),
                         [&](std::size_t a, std::size_t b) { return order_key(runs[a].spec) < order_key(runs[b].spec); });
    return out;
}

/// Geometric means of |bias_strength|, |mu_q_a|, |alpha_k| over the heads
/// where mu_q_a and alpha_k are finite and non-zero; for a run given by its
/// numbers, the given values (abs_ or plain) themselves.
inline void geometric_means(run_spec const& r, run_heads const* rh, trajectory_step& t) {
    if (rh == nullptr) {
        auto given = [&](std::string const& n) {
            auto it = r.metrics.find("abs_" + n);
            if (it == r.metrics.end()) it = r.metrics.find(n);
            return it == r.metrics.end() ? nan : std::abs(it->second);
        };
        t.gm_mu_q_a = given("mu_q_a");
        t.gm_alpha_k = given("alpha_k");
        t.gm_bias = given("bias_strength");
        return;
    }
    double lm = 0, la = 0, lb = 0;
    std::int64_t n = 0;
    for (auto const& h : rh->heads) {
        // bias_strength = mu_q_a · alpha_k per head (method §3): the identity
        // Δlog G|b| = Δlog G|μ| + Δlog G|α| holds to rounding over one head set.
        double const m = head_metric(h, "mu_q_a"), a = head_metric(h, "alpha_k"), b = head_metric(h, "bias_strength");
        if (!std::isfinite(m) || !std::isfinite(a) || !std::isfinite(b) || m == 0 || a == 0 || b == 0) continue;
        lm += std::log(std::abs(m));
        la += std::log(std::abs(a));
        lb += std::log(std::abs(b));
        ++n;
    }
    t.n_decomposed = n;
    if (n == 0) return;
    t.gm_mu_q_a = std::exp(lm / double(n));
    t.gm_alpha_k = std::exp(la / double(n));
    t.gm_bias = std::exp(lb / double(n));
}

inline std::vector<trajectory_step> trajectory(std::vector<run_summary> const& runs,
                                               std::vector<run_outcome> const& outcomes) {
    std::vector<trajectory_step> out;
    for (auto const& [model, idx] : runs_by_model(runs)) {
        bool const checkpoints = std::any_of(idx.begin(), idx.end(), [&](std::size_t i) { return runs[i].spec.ckpt.given(); });
        if (!checkpoints) continue;
        for (std::size_t k = 0; k < idx.size(); ++k) {
            trajectory_step t;
            t.model = model;
            t.run = idx[k];
            t.order = order_key(runs[idx[k]].spec).second;
            bool const has_heads = outcomes[idx[k]].status != run_status::given;
            geometric_means(runs[idx[k]].spec, has_heads ? &outcomes[idx[k]].heads : nullptr, t);
            if (k > 0) {
                auto const& p = out.back();
                t.from = idx[k - 1];
                t.dlog_mu_q_a = std::log(t.gm_mu_q_a) - std::log(p.gm_mu_q_a);
                t.dlog_alpha_k = std::log(t.gm_alpha_k) - std::log(p.gm_alpha_k);
                t.dlog_bias = std::log(t.gm_bias) - std::log(p.gm_bias);
            }
            out.push_back(t);
        }
    }
    return out;
}

/// The run standing for a model against a benchmark: its last checkpoint.
inline std::map<std::string, std::size_t> model_representatives(std::vector<run_summary> const& runs) {
    std::map<std::string, std::size_t> rep;
    for (auto const& [model, idx] : runs_by_model(runs)) rep[model] = idx.back();
    return rep;
}

inline correlation_row correlation_of(std::string metric, std::string bench, std::string group,
                                      std::vector<double> const& x, std::vector<double> const& y, std::uint64_t seed) {
    correlation_options o;
    o.seed = seed;
    auto const c = correlate(x, y, o);
    return {std::move(metric), std::move(bench), std::move(group), c.n, c.pearson, c.p_pearson, c.spearman,
            c.p_spearman, c.kendall, c.p_kendall, c.p_method};
}

inline void correlations(study_spec const& spec, study_result& r) {
    auto const rep = model_representatives(r.runs);
    std::vector<std::string> metrics = spec.correlate;
    if (metrics.empty())
        for (auto m : default_correlate) metrics.emplace_back(m);
    for (auto const& b : r.benchmarks)
        for (auto const& m : metrics) {
            std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> groups;  // "" = all
            for (auto const& [model, i] : rep) {
                auto const& run = r.runs[i];
                auto const sc = run.scores.find(b);
                double const v = run.metrics.at(m).value;
                if (sc == run.scores.end() || !std::isfinite(sc->second) || !std::isfinite(v)) continue;
                for (std::string const& g : {std::string(), run.spec.family}) {
                    groups[g].first.push_back(v);
                    groups[g].second.push_back(sc->second);
                }
            }
            for (auto const& [g, xy] : groups)
                if (xy.first.size() >= 3)
                    r.correlations.push_back(correlation_of(m, b, g.empty() ? "all" : g, xy.first, xy.second,
                                                            mix_seed(spec.seed, 7, name_key({m, b, g}))));
        }
}

inline void length_correlations(study_spec const& spec, std::vector<run_outcome> const& outcomes, study_result& r) {
    auto const rep = model_representatives(r.runs);
    for (auto const& b : spec.benchmarks) {
        std::map<std::string, std::vector<length_score>> per_model;
        for (auto const& s : b.by_length) per_model[s.model].push_back(s);
        for (auto const& [model, scores] : per_model) {
            auto const it = rep.find(model);
            if (it == rep.end() || !outcomes[it->second].heads.has_profiles) continue;
            length_correlation lc{b.name, model, it->second, {}, {}};
            std::vector<double> x, y;
            auto const& heads = outcomes[it->second].heads.heads;
            std::vector<double> per_head(heads.size());
            for (auto const& s : scores) {
                for (std::size_t h = 0; h < heads.size(); ++h) per_head[h] = token_range_profile(heads[h], s.lo, s.hi);
                lc.points.push_back({s.lo, s.hi, s.score, finite_mean(per_head)});
                x.push_back(lc.points.back().plasticity);
                y.push_back(s.score);
            }
            lc.corr = correlation_of("plasticity_by_length", b.name, model, x, y, mix_seed(spec.seed, 11, name_key({b.name, model})));
            r.correlations.push_back(lc.corr);
            r.length_correlations.push_back(std::move(lc));
        }
    }
}

inline void depth_cells(study_spec const& spec, std::vector<run_outcome> const& outcomes, study_result& r) {
    std::vector<std::string> metrics = spec.heatmap;
    if (metrics.empty()) metrics.emplace_back("ap_drop");
    r.depth_bins = spec.depth_bins;
    for (auto const& m : metrics)
        for (std::size_t i = 0; i < outcomes.size(); ++i) {
            auto const& rh = outcomes[i].heads;
            if (rh.heads.empty() || rh.n_layers < 1) continue;
            std::vector<double> sum(static_cast<std::size_t>(spec.depth_bins), 0.0);
            std::vector<std::int64_t> cnt(sum.size(), 0);
            for (auto const& h : rh.heads) {
                double const v = head_metric(h, m);
                if (!std::isfinite(v) || h.id.layer < 0) continue;
                auto const bin = std::min<std::int64_t>(spec.depth_bins - 1, h.id.layer * spec.depth_bins / rh.n_layers);
                sum[static_cast<std::size_t>(bin)] += v;
                ++cnt[static_cast<std::size_t>(bin)];
            }
            for (std::size_t b = 0; b < sum.size(); ++b)
                r.depth.push_back({m, i, static_cast<std::int64_t>(b), cnt[b] > 0 ? sum[b] / double(cnt[b]) : nan, cnt[b]});
        }
}

inline void head_trajectories(study_spec const& spec, std::vector<run_outcome> const& outcomes, study_result& r) {
    std::vector<std::string> metrics = spec.trajectory;
    if (metrics.empty()) metrics.emplace_back("ap_drop");
    std::map<std::string, std::vector<std::size_t>> models;
    for (auto const& t : r.trajectory)
        if (outcomes[t.run].status != run_status::given && !outcomes[t.run].heads.heads.empty())
            models[t.model].push_back(t.run);
    for (auto const& [model, runs] : models) {
        if (runs.size() < 2) continue;
        std::map<head_id, std::vector<head_row const*>> common;
        for (std::size_t k = 0; k < runs.size(); ++k)
            for (auto const& h : outcomes[runs[k]].heads.heads) {
                auto& v = common[h.id];
                if (v.size() == k) v.push_back(&h);  // present in every earlier checkpoint
            }
        for (auto const& m : metrics) {
            head_trajectory ht{model, m, runs, {}, {}};
            for (auto const& [id, rows] : common) {
                if (rows.size() != runs.size()) continue;
                ht.heads.push_back(id);
                auto& vals = ht.values.emplace_back();
                for (auto const* h : rows) vals.push_back(head_metric(*h, m));
            }
            if (!ht.heads.empty()) r.head_trajectories.push_back(std::move(ht));
        }
    }
}

}  // namespace detail

/// \brief Computes every table of a study from its runs.
/// \param[in] spec the study (settings, benchmarks, runs).
/// \param[in] outcomes one per spec.runs entry, same order.
/// \returns the study's tables (docs/study.md#tables).
/// \throws std::invalid_argument when outcomes.size() differs from spec.runs.size().
[[nodiscard]] inline study_result compute_study(study_spec const& spec, std::vector<run_outcome> const& outcomes) {
    if (outcomes.size() != spec.runs.size())
        throw std::invalid_argument("qkgeom::study::compute_study: " + std::to_string(outcomes.size()) +
                                    " outcomes for " + std::to_string(spec.runs.size()) + " runs");
    study_result r;
    r.title = spec.title;
    for (auto const& b : spec.benchmarks) r.benchmarks.push_back(b.name);
    r.token_edges = spec.token_edges;
    if (r.token_edges.empty()) {
        double lo = INFINITY, hi = -INFINITY;
        for (auto const& o : outcomes)
            for (auto const& h : o.heads.heads)
                for (auto const& p : h.profile)
                    if (std::isfinite(p.tau) && std::isfinite(p.ap)) lo = std::min(lo, p.tau), hi = std::max(hi, p.tau);
        r.token_edges = default_token_edges(lo, hi);
    }
    for (std::size_t i = 0; i < spec.runs.size(); ++i) {
        run_summary s;
        s.spec = spec.runs[i];
        s.status = outcomes[i].status;
        s.message = outcomes[i].message;
        s.note = outcomes[i].note;
        if (s.status == run_status::given) detail::summarise_given(s.spec, r.token_edges, s);
        else if (s.status != run_status::failed) detail::summarise_heads(spec, i, outcomes[i].heads, r.token_edges, s);
        for (auto const& b : spec.benchmarks)
            if (auto const it = b.overall.find(s.spec.model); it != b.overall.end()) s.scores[b.name] = it->second;
        r.runs.push_back(std::move(s));
    }
    r.trajectory = detail::trajectory(r.runs, outcomes);
    detail::correlations(spec, r);
    detail::length_correlations(spec, outcomes, r);
    detail::depth_cells(spec, outcomes, r);
    detail::head_trajectories(spec, outcomes, r);
    return r;
}

}  // namespace study
}  // namespace qkgeom
