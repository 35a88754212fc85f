// qkgeom — the pictures of a study (docs/study-pictures.md): many runs
// (models, checkpoints) side by side. Built from the computed study
// (study::study_result) with the building blocks of report/svg.hpp, under the
// same conventions (docs/pictures.md): one standalone SVG 1.1 document per
// picture, a <title>, axis ticks and labels, free text XML-escaped, a NaN never
// drawn as 0 (a gap in a line, a point left out, a hatched heatmap cell).
//
// Every picture function returns std::nullopt when its data is absent (no
// finite value to draw), and write_study_pictures then writes no file.
// Marks carry a class per series and data-* attributes (run names, values
// with 17 significant digits, "n/a" for NaN) so that tests and readers can
// take the numbers back out of the file.
#pragma once

#include <qkgeom/report/svg.hpp>
#include <qkgeom/study/types.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace qkgeom {
namespace report {

/// \name Study picture file names (fixed ones; the others are a prefix, a
/// slug of the model / metric / benchmark names and ".svg")
///@{
inline constexpr std::string_view study_profile_quintile_svg_file = "study_profile_quintile.svg";
inline constexpr std::string_view study_profile_decile_svg_file = "study_profile_decile.svg";
inline constexpr std::string_view study_profile_tokens_svg_file = "study_profile_tokens.svg";
inline constexpr std::string_view study_taxonomy_svg_file = "study_taxonomy.svg";
///@}

namespace detail {

/// A file-name-safe slug: lower-case [a-z0-9_-] only, every other run of
/// characters one '_', no leading / trailing '_', at most 48 characters,
/// "x" when nothing is left.
inline std::string study_slug(std::string_view s) {
    std::string out;
    for (char ch : s) {
        char c = ch;
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
        bool const ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        if (!ok) c = '_';
        if (c == '_' && (out.empty() || out.back() == '_')) continue;
        out += c;
    }
    if (out.size() > 48) out.resize(48);
    while (!out.empty() && out.back() == '_') out.pop_back();
    return out.empty() ? "x" : out;
}

/// Unique file names: a name already taken gets "-2", "-3", … before ".svg".
class study_file_names {
public:
    std::string take(std::string const& stem) {
        std::string f = stem + ".svg";
        for (int k = 2; used_.count(f) != 0; ++k) f = stem + "-" + std::to_string(k) + ".svg";
        used_.insert(f);
        return f;
    }

private:
    std::set<std::string> used_;
};

inline std::string const& study_model_of(study::run_summary const& r) {
    return r.spec.model.empty() ? r.spec.name : r.spec.model;
}
inline std::string const& study_family_of(study::run_summary const& r) {
    return r.spec.family.empty() ? study_model_of(r) : r.spec.family;
}

/// A number for a data-* attribute: 17 significant digits, "n/a" for NaN.
inline std::string study_num(double v) { return label(v, 17); }

/// The value of `metric` of a run (NaN when absent).
inline study::estimate study_metric(study::run_summary const& r, std::string const& metric) {
    auto const it = r.metrics.find(metric);
    return it == r.metrics.end() ? study::estimate{} : it->second;
}

inline bool study_any_finite(std::vector<double> const& v) {
    return std::any_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

inline std::string study_join(std::vector<double> const& v) {
    std::string s;
    for (double x : v) s += (s.empty() ? "" : " ") + study_num(x);
    return s;
}

/// Family colours: palette order of first appearance in the study's runs.
struct study_colours {
    std::map<std::string, std::size_t> index;
    std::vector<std::string> families;
    explicit study_colours(study::study_result const& r) {
        for (auto const& run : r.runs)
            if (index.emplace(study_family_of(run), families.size()).second) families.push_back(study_family_of(run));
    }
    [[nodiscard]] std::string colour(std::string const& family) const {
        auto const it = index.find(family);
        return std::string(palette[(it == index.end() ? 0 : it->second) % palette.size()]);
    }
    /// Legend entries of the families in `drawn`, in palette order.
    [[nodiscard]] std::vector<std::pair<std::string, std::string>> entries(std::set<std::string> const& drawn) const {
        std::vector<std::pair<std::string, std::string>> e;
        for (auto const& f : families)
            if (drawn.count(f) != 0) e.emplace_back(colour(f), f);
        return e;
    }
};

/// The trajectory grouped by model (order of first appearance), steps in order.
inline std::vector<std::pair<std::string, std::vector<study::trajectory_step const*>>> study_models(
    study::study_result const& r) {
    std::vector<std::pair<std::string, std::vector<study::trajectory_step const*>>> out;
    std::map<std::string, std::size_t> at;
    for (auto const& s : r.trajectory) {
        auto const [it, fresh] = at.emplace(s.model, out.size());
        if (fresh) out.emplace_back(s.model, std::vector<study::trajectory_step const*>{});
        out[it->second].second.push_back(&s);
    }
    return out;
}

/// Line opacity per run: the checkpoints of a model with ≥ 2 steps rise from
/// 0.3 (first) to 1 (last); every other run 1.
inline std::vector<double> study_opacity(study::study_result const& r) {
    std::vector<double> o(r.runs.size(), 1.0);
    for (auto const& [model, steps] : study_models(r)) {
        if (steps.size() < 2) continue;
        for (std::size_t k = 0; k < steps.size(); ++k)
            if (steps[k]->run < o.size()) o[steps[k]->run] = 0.3 + 0.7 * double(k) / double(steps.size() - 1);
    }
    return o;
}

/// Tokens as a short label: 1024 → "1K", 65536 → "64K", 2^20 → "1M"
/// (binary multiples; decimal thousands too), else the number.
inline std::string study_tokens(double v) {
    if (!std::isfinite(v)) return label(v);
    for (auto [unit, suffix] : {std::pair{1048576.0, "M"}, std::pair{1000000.0, "M"}, std::pair{1024.0, "K"},
                                std::pair{1000.0, "K"}})
        if (v >= unit && std::fmod(v, unit) == 0) return label(v / unit, 6) + suffix;
    return label(v, 6);
}

/// Tick labels under a categorical x axis at x = 0, 1, …; rotated when long.
inline void study_category_ticks(svg_doc& doc, scale const& sx, scale const& sy, std::vector<std::string> const& names) {
    std::size_t longest = 0;
    for (auto const& n : names) longest = std::max(longest, n.size());
    bool const rotate = longest * 7.0 > std::abs(sx(1.0) - sx(0.0));
    for (std::size_t i = 0; i < names.size(); ++i) {
        double const x = sx(double(i)), y = sy.r0 + 16;
        doc.line(x, sy.r0, x, sy.r0 + 5, "#333333");
        if (rotate)
            doc.text(x + 4, y, names[i], "end",
                     "class=\"xtick\" font-size=\"10\" transform=\"rotate(-30 " + px(x + 4) + " " + px(y) + ")\"");
        else doc.text(x, y, names[i], "middle", "class=\"xtick\"");
    }
}

/// Ticks with given labels on a vertical axis at x (left side: labels to
/// the left; right side: to the right).
inline void study_y_ticks(svg_doc& doc, double x, scale const& sy, std::vector<double> const& at,
                          std::vector<std::string> const& labels, bool right) {
    for (std::size_t i = 0; i < at.size() && i < labels.size(); ++i) {
        double const y = sy(at[i]);
        doc.line(right ? x : x - 5, y, right ? x + 5 : x, y, "#333333");
        doc.text(right ? x + 8 : x - 8, y + 4, labels[i], right ? "start" : "end");
    }
}

/// A frame with room for a legend on the right and, for categorical run
/// names, below the plot.
inline svg_frame study_frame(picture_options const& opt, double legend_room, double below = 0) {
    svg_frame f = opt.frame;
    f.right += legend_room;
    f.height += below;
    f.bottom += below;
    return f;
}

/// The domain of the finite values, 0 included when `with_zero`.
inline std::array<double, 2> study_domain(extent e, bool with_zero = false) {
    if (with_zero) e.add(0.0);
    return nice_domain(e.empty() ? 0.0 : e.lo, e.empty() ? 1.0 : e.hi);
}

/// One line per run over categorical bins (the profiles): runs with no finite
/// value are not drawn; NaN bins are gaps; colour by family, opacity by
/// checkpoint; a marker per finite bin.
inline std::optional<std::string> study_bins_svg(study::study_result const& r,
                                                 std::vector<std::vector<double>> const& per_run,
                                                 std::vector<std::string> const& bins, std::string const& title,
                                                 std::string const& what, std::string const& xlabel,
                                                 picture_options const& opt) {
    extent ey;
    std::size_t drawn = 0;
    for (auto const& v : per_run) {
        for (double x : v) ey.add(x);
        drawn += study_any_finite(v) ? 1 : 0;
    }
    if (drawn == 0 || bins.empty()) return std::nullopt;
    svg_frame const f = study_frame(opt, 160, 20);
    auto const yd = opt.y_domain ? *opt.y_domain : study_domain(ey);
    scale const sx{-0.5, double(bins.size()) - 0.5, f.left, f.width - f.right};
    scale const sy{yd[0], yd[1], f.height - f.bottom, f.top};
    svg_doc doc(f, title,
                plural(drawn, "run") + " with data (" + std::to_string(r.runs.size() - drawn) + " without); " + what +
                    "; colour: family; fainter: earlier checkpoint");
    doc.begin_plot(sx, sy, {}, ticks(yd[0], yd[1], 5), xlabel, "AP (mean PP over heads)");
    study_category_ticks(doc, sx, sy, bins);
    study_colours const colours(r);
    auto const opacity = study_opacity(r);
    std::set<std::string> families;
    std::vector<double> xs(bins.size());
    for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = double(i);
    for (std::size_t k = 0; k < per_run.size() && k < r.runs.size(); ++k) {
        auto const& v = per_run[k];
        if (!study_any_finite(v)) continue;
        auto const& fam = study_family_of(r.runs[k]);
        families.insert(fam);
        std::string const c = colours.colour(fam), name = xml_escape(r.runs[k].spec.name);
        doc.gapped_path(xs, v, sx, sy, "run", c, 2.0,
                        "stroke-opacity=\"" + px(opacity[k]) + "\" data-run=\"" + name + "\" data-family=\"" +
                            xml_escape(fam) + "\" data-values=\"" + study_join(v) + "\"");
        for (std::size_t i = 0; i < v.size() && i < xs.size(); ++i)
            if (std::isfinite(v[i]))
                doc.circle(sx(xs[i]), sy(v[i]), 3.0, c,
                           "class=\"marker\" fill-opacity=\"" + px(opacity[k]) + "\" data-run=\"" + name + "\"");
    }
    doc.end_plot();
    doc.legend(f.width - f.right + 20, f.top + 12, colours.entries(families), true);
    return doc.finish();
}

}  // namespace detail

/// \brief Quintile or decile AP profiles of every run, one line each
/// (<path class="run" data-run data-family data-values>, a
/// <circle class="marker"> per finite bin); colour by family (palette order
/// of first appearance), checkpoints of one model fainter when earlier.
/// \param[in] r the computed study.
/// \param[in] bins 5 (quintiles) or 10 (deciles; any other value too).
/// \param[in] opt frame and y domain.
/// \returns the SVG, or std::nullopt when no run has a finite bin.
inline std::optional<std::string> study_profile_svg(study::study_result const& r, int bins,
                                                    picture_options const& opt = {}) {
    bool const q = bins == 5;
    std::size_t const n = q ? 5 : 10;
    std::vector<std::vector<double>> per_run;
    for (auto const& run : r.runs) {
        if (q) per_run.emplace_back(run.quintile.begin(), run.quintile.end());
        else per_run.emplace_back(run.decile.begin(), run.decile.end());
    }
    std::vector<std::string> names;
    for (std::size_t i = 0; i < n; ++i)
        names.push_back(std::to_string(i * 100 / n) + "–" + std::to_string((i + 1) * 100 / n) + "%");
    return detail::study_bins_svg(r, per_run, names, std::string("AP profile by ") + (q ? "quintile" : "decile"),
                                  "point: mean AP over heads of a context " + std::string(q ? "quintile" : "decile"),
                                  "query position, share of the context", opt);
}

/// \brief The token-range AP profile of every run (run_summary::token_profile
/// over r.token_edges: bin i is [edges[i], edges[i+1]) tokens), one line each
/// as study_profile_svg; x tick labels "0–1K", "1K–2K", ….
/// \param[in] r the computed study.
/// \param[in] opt frame and y domain.
/// \returns the SVG, or std::nullopt when there are no bins or no finite value.
inline std::optional<std::string> study_token_profile_svg(study::study_result const& r,
                                                          picture_options const& opt = {}) {
    if (r.token_edges.size() < 2) return std::nullopt;
    std::size_t const n = r.token_edges.size() - 1;
    std::vector<std::vector<double>> per_run;
    for (auto const& run : r.runs) {
        std::vector<double> v(n, study::nan);
        for (std::size_t i = 0; i < n && i < run.token_profile.size(); ++i) v[i] = run.token_profile[i];
        per_run.push_back(std::move(v));
    }
    std::vector<std::string> names;
    for (std::size_t i = 0; i < n; ++i)
        names.push_back(detail::study_tokens(r.token_edges[i]) + "–" + detail::study_tokens(r.token_edges[i + 1]));
    return detail::study_bins_svg(r, per_run, names, "AP profile by token range",
                                  "point: mean AP over heads of the buckets in the range",
                                  "query position (tokens) [from, to)", opt);
}

namespace detail {

inline constexpr std::array<std::string_view, 4> study_trajectory_metrics{"ap_overall", "ap_first_20pct",
                                                                          "ap_last_20pct", "ap_drop"};

/// Run names and phase changes of a model's steps (x = 0, 1, …).
inline std::vector<std::string> study_step_names(study::study_result const& r,
                                                 std::vector<study::trajectory_step const*> const& steps) {
    std::vector<std::string> names;
    for (auto const* s : steps) names.push_back(r.runs.at(s->run).spec.name);
    return names;
}

/// A dashed line and a label where the phase changes (and at the first step
/// when it has a phase).
inline void study_phases(svg_doc& doc, study::study_result const& r,
                         std::vector<study::trajectory_step const*> const& steps, scale const& sx, scale const& sy) {
    std::string prev;
    for (std::size_t k = 0; k < steps.size(); ++k) {
        auto const& phase = r.runs.at(steps[k]->run).spec.ckpt.phase;
        if (phase == prev || phase.empty()) {
            prev = phase;
            continue;
        }
        prev = phase;
        double const x = sx(double(k) - (k == 0 ? 0.0 : 0.5));
        if (k > 0) doc.line(x, sy.r0, x, sy.r1, "#999999", 1.0, "class=\"phase\" stroke-dasharray=\"4 3\"");
        doc.text(x + 4, sy.r1 + 14, phase, "start",
                 "class=\"phase-label\" font-size=\"10\" fill=\"#555555\" data-step=\"" + std::to_string(k) + "\"");
    }
}

}  // namespace detail

/// \brief A model's checkpoint trajectory: ap_overall, ap_first_20pct,
/// ap_last_20pct and ap_drop (the runs' model-level means over heads) against
/// the checkpoint sequence (x = position in the trajectory, labelled with the
/// run names; dashed lines where the phase changes). Per metric a
/// <path class="metric" data-metric data-values>, a <circle class="point"
/// data-metric data-run data-value> per finite value and a
/// <line class="ci"> from lo to hi where the value and its bootstrap interval
/// are finite.
/// \param[in] r the computed study.
/// \param[in] steps the model's steps in order (pointers into r.trajectory).
/// \param[in] opt frame and y domain.
/// \returns the SVG, or std::nullopt with fewer than 2 steps or no finite value.
/// \throws std::out_of_range when a step's run is not in r.runs.
inline std::optional<std::string> study_trajectory_svg(study::study_result const& r,
                                                       std::vector<study::trajectory_step const*> const& steps,
                                                       picture_options const& opt = {}) {
    if (steps.size() < 2) return std::nullopt;
    std::vector<std::vector<study::estimate>> est(detail::study_trajectory_metrics.size());
    detail::extent ey;
    for (std::size_t m = 0; m < est.size(); ++m)
        for (auto const* s : steps) {
            est[m].push_back(detail::study_metric(r.runs.at(s->run), std::string(detail::study_trajectory_metrics[m])));
            for (double v : {est[m].back().value, est[m].back().lo, est[m].back().hi}) ey.add(v);
        }
    if (ey.empty()) return std::nullopt;
    svg_frame const f = detail::study_frame(opt, 160, 60);
    auto const yd = opt.y_domain ? *opt.y_domain : detail::study_domain(ey, true);
    detail::scale const sx{-0.5, double(steps.size()) - 0.5, f.left, f.width - f.right};
    detail::scale const sy{yd[0], yd[1], f.height - f.bottom, f.top};
    detail::svg_doc doc(f, "Checkpoint trajectory — " + steps.front()->model,
                        detail::plural(steps.size(), "checkpoint") +
                            "; means over heads, whiskers: bootstrap interval over heads; dashed: phase change");
    doc.begin_plot(sx, sy, {}, detail::ticks(yd[0], yd[1], 5), "checkpoint (run), in training order",
                   "AP (mean PP over heads)");
    detail::study_category_ticks(doc, sx, sy, detail::study_step_names(r, steps));
    detail::study_phases(doc, r, steps, sx, sy);
    std::vector<std::pair<std::string, std::string>> legend;
    for (std::size_t m = 0; m < est.size(); ++m) {
        std::string const c(detail::palette[m]), name(detail::study_trajectory_metrics[m]);
        std::vector<double> xs, ys;
        for (std::size_t k = 0; k < steps.size(); ++k) {
            xs.push_back(double(k));
            ys.push_back(est[m][k].value);
        }
        doc.gapped_path(xs, ys, sx, sy, "metric", c, 2.0,
                        "data-metric=\"" + name + "\" data-values=\"" + detail::study_join(ys) + "\"");
        for (std::size_t k = 0; k < steps.size(); ++k) {
            auto const& e = est[m][k];
            std::string const who = "data-metric=\"" + name + "\" data-run=\"" +
                                    detail::xml_escape(r.runs.at(steps[k]->run).spec.name) + "\"";
            double const x = sx(double(k)) + (double(m) - 1.5) * 3.0;  // side by side, not on top of each other
            if (std::isfinite(e.value) && std::isfinite(e.lo) && std::isfinite(e.hi))
                doc.line(x, sy(e.lo), x, sy(e.hi), c, 1.0,
                         "class=\"ci\" " + who + " data-lo=\"" + detail::study_num(e.lo) + "\" data-hi=\"" +
                             detail::study_num(e.hi) + "\"");
            if (std::isfinite(e.value))
                doc.circle(sx(double(k)), sy(e.value), 3.5, c,
                           "class=\"point\" " + who + " data-value=\"" + detail::study_num(e.value) + "\"");
        }
        legend.emplace_back(c, name);
    }
    doc.end_plot();
    doc.legend(f.width - f.right + 20, f.top + 12, legend, true);
    return doc.finish();
}

namespace detail {

/// The three geometric means of the bias picture, relative to the first step.
struct study_bias_series {
    std::string_view cls, name, colour;
    double study::trajectory_step::*gm;
};
inline constexpr std::array<study_bias_series, 3> study_bias_lines{
    study_bias_series{"gm_bias", "|bias_strength|", "#111111", &study::trajectory_step::gm_bias},
    study_bias_series{"gm_mu_q_a", "|μ_Q^a|", "#1f77b4", &study::trajectory_step::gm_mu_q_a},
    study_bias_series{"gm_alpha_k", "|α_K|", "#ff7f0e", &study::trajectory_step::gm_alpha_k}};

/// log10 of gm(step) / gm(first step) per step; NaN where either is not a
/// finite positive number.
inline std::vector<double> study_log_ratio(std::vector<study::trajectory_step const*> const& steps,
                                           double study::trajectory_step::*gm) {
    std::vector<double> out;
    double const base = steps.front()->*gm;
    for (auto const* s : steps) {
        double const v = s->*gm;
        bool const ok = std::isfinite(base) && base > 0 && std::isfinite(v) && v > 0;
        out.push_back(ok ? std::log10(v / base) : study::nan);
    }
    return out;
}

/// The upper panel: the three ratios on a log axis.
inline void study_bias_ratios(svg_doc& doc, std::vector<study::trajectory_step const*> const& steps, scale const& sx,
                              double y_bottom, double y_top) {
    std::array<std::vector<double>, 3> lr;
    extent e;
    for (std::size_t q = 0; q < lr.size(); ++q) {
        lr[q] = study_log_ratio(steps, study_bias_lines[q].gm);
        for (double v : lr[q]) e.add(v);
    }
    auto const yd = study_domain(e, true);
    scale const sy{yd[0], yd[1], y_bottom, y_top};
    doc.begin_plot(sx, sy, {}, {}, "", "ratio to the first checkpoint (log)");
    std::vector<double> at;
    std::vector<std::string> labels;
    for (double t : ticks(yd[0], yd[1], 5)) {
        at.push_back(t);
        labels.push_back(label(std::pow(10.0, t), 3));
        doc.line(sx.r0, sy(t), sx.r1, sy(t), "#e6e6e6");
    }
    study_y_ticks(doc, sx.r0, sy, at, labels, false);
    std::vector<double> xs;
    for (std::size_t k = 0; k < steps.size(); ++k) xs.push_back(double(k));
    for (std::size_t q = 0; q < lr.size(); ++q) {
        auto const& s = study_bias_lines[q];
        std::vector<double> ratio;
        for (double v : lr[q]) ratio.push_back(std::isfinite(v) ? std::pow(10.0, v) : study::nan);
        doc.gapped_path(xs, lr[q], sx, sy, s.cls, s.colour, 2.0, "data-ratios=\"" + study_join(ratio) + "\"");
        for (std::size_t k = 0; k < xs.size(); ++k)
            if (std::isfinite(lr[q][k]))
                doc.circle(sx(xs[k]), sy(lr[q][k]), 3.0, s.colour,
                           "class=\"ratio\" data-quantity=\"" + std::string(s.cls) + "\" data-step=\"" +
                               std::to_string(k) + "\" data-value=\"" + study_num(ratio[k]) + "\"");
    }
    doc.end_plot();
}

/// One stacked bar of the lower panel (positive parts stack up from 0,
/// negative parts down), and the dot at dlog_bias.
inline void study_bias_bar(svg_doc& doc, study::study_result const& r, study::trajectory_step const& s, double x,
                           double w, scale const& sy) {
    std::string const run = "data-run=\"" + xml_escape(r.runs.at(s.run).spec.name) + "\"";
    double up = 0, down = 0;
    bool any = false;
    for (auto [cls, v, colour] : {std::tuple{"dlog_mu_q_a", s.dlog_mu_q_a, "#1f77b4"},
                                  std::tuple{"dlog_alpha_k", s.dlog_alpha_k, "#ff7f0e"}}) {
        if (!std::isfinite(v)) continue;
        any = true;
        double& base = v >= 0 ? up : down;
        double const a = sy(base), b = sy(base + v);
        doc.rect(x - w / 2, std::min(a, b), w, std::abs(a - b), colour,
                 "class=\"" + std::string(cls) + "\" " + run + " data-value=\"" + study_num(v) + "\"");
        base += v;
    }
    if (std::isfinite(s.dlog_bias))
        doc.circle(x, sy(s.dlog_bias), 4.0, "#111111",
                   "class=\"dlog_bias\" stroke=\"#ffffff\" " + run + " data-value=\"" + study_num(s.dlog_bias) + "\"");
    else if (any || s.from != static_cast<std::size_t>(-1))
        doc.text(x, sy(0.0) - 4, "n/a", "middle", "class=\"na\" font-size=\"10\" " + run);
}

/// The lower panel: per step the stacked changes and the dot.
inline void study_bias_changes(svg_doc& doc, study::study_result const& r,
                               std::vector<study::trajectory_step const*> const& steps, scale const& sx,
                               double y_bottom, double y_top) {
    extent e;
    for (auto const* s : steps) {
        double up = 0, down = 0;
        for (double v : {s->dlog_mu_q_a, s->dlog_alpha_k})
            if (std::isfinite(v)) (v >= 0 ? up : down) += v;
        e.add(up);
        e.add(down);
        e.add(s->dlog_bias);
    }
    auto const yd = study_domain(e, true);
    scale const sy{yd[0], yd[1], y_bottom, y_top};
    doc.begin_plot(sx, sy, {}, ticks(yd[0], yd[1], 4), "", "Δ ln, step to step");
    doc.raw("<g class=\"decomposition\" data-y-domain=\"" + study_num(yd[0]) + " " + study_num(yd[1]) +
            "\" data-y-pixels=\"" + study_num(y_bottom) + " " + study_num(y_top) + "\">\n");
    doc.line(sx.r0, sy(0.0), sx.r1, sy(0.0), "#333333", 1.0, "class=\"zero\"");
    double const w = 0.5 * std::abs(sx(1.0) - sx(0.0));
    for (std::size_t k = 0; k < steps.size(); ++k) study_bias_bar(doc, r, *steps[k], sx(double(k)), w, sy);
    doc.raw("</g>\n");
    doc.end_plot();
}

}  // namespace detail

/// \brief The bias decomposition of a model's trajectory (the thesis'
/// Figure 6.5). Upper panel: the geometric means gm_bias, gm_mu_q_a and
/// gm_alpha_k of every step divided by the first step's, on a log axis
/// (<path class="gm_bias|gm_mu_q_a|gm_alpha_k" data-ratios>, a
/// <circle class="ratio"> per finite ratio). Lower panel: per step the
/// changes dlog_mu_q_a and dlog_alpha_k as stacked bars (<rect
/// class="dlog_mu_q_a|dlog_alpha_k" data-run data-value>; positive parts
/// stack up from 0, negative parts down) and their sum dlog_bias as a dot
/// (<circle class="dlog_bias">); the panel's group <g class="decomposition">
/// carries data-y-domain and data-y-pixels (bottom, top) for reading values
/// back. A NaN change draws no bar; a step with no finite dlog_bias shows "n/a".
/// \param[in] r the computed study.
/// \param[in] steps the model's steps in order (pointers into r.trajectory).
/// \param[in] opt frame (the canvas is 1.5 × its height).
/// \returns the SVG, or std::nullopt with fewer than 2 steps or nothing finite.
/// \throws std::out_of_range when a step's run is not in r.runs.
inline std::optional<std::string> study_bias_svg(study::study_result const& r,
                                                 std::vector<study::trajectory_step const*> const& steps,
                                                 picture_options const& opt = {}) {
    if (steps.size() < 2) return std::nullopt;
    bool any = false;
    for (auto const* s : steps)
        for (double v : {s->dlog_bias, s->dlog_mu_q_a, s->dlog_alpha_k}) any = any || std::isfinite(v);
    for (auto const& l : detail::study_bias_lines)
        any = any || detail::study_any_finite(detail::study_log_ratio(steps, l.gm));
    if (!any) return std::nullopt;
    picture_options tall = opt;
    tall.frame.height = opt.frame.height * 1.5;
    svg_frame const f = detail::study_frame(tall, 170, 60);
    detail::scale const sx{-0.5, double(steps.size()) - 0.5, f.left, f.width - f.right};
    double const gap = 36, panel = (f.height - f.top - f.bottom - gap) / 2;
    detail::svg_doc doc(f, "Bias decomposition — " + steps.front()->model,
                        "which factor moved: Δlog|bias_strength| = Δlog|μ_Q^a| + Δlog|α_K| (geometric means over heads)");
    detail::study_bias_ratios(doc, steps, sx, f.top + panel, f.top);
    double const lb = f.height - f.bottom, lt = lb - panel;
    detail::study_bias_changes(doc, r, steps, sx, lb, lt);
    detail::study_category_ticks(doc, sx, detail::scale{0, 1, lb, lt}, detail::study_step_names(r, steps));
    detail::study_phases(doc, r, steps, sx, detail::scale{0, 1, f.top + panel, f.top});
    std::vector<std::pair<std::string, std::string>> legend;
    for (auto const& l : detail::study_bias_lines) legend.emplace_back(std::string(l.colour), std::string(l.name));
    doc.legend(f.width - f.right + 20, f.top + 12, legend, true);
    doc.legend(f.width - f.right + 20, lt + 12,
               {{"#1f77b4", "Δlog|μ_Q^a| (bar)"}, {"#ff7f0e", "Δlog|α_K| (bar)"}, {"#111111", "Δlog|bias| (dot)"}});
    return doc.finish();
}

/// \brief Taxonomy shares per run: one horizontal stacked bar per run with
/// heads (<rect class="share" data-run data-class data-count data-share>,
/// one per class with a non-zero count, widths = count / heads of the run),
/// class colours of class_colour(), a legend. Runs without heads are listed
/// in the subtitle's count, not drawn.
/// \param[in] r the computed study.
/// \param[in] opt frame (the height grows with the number of runs).
/// \returns the SVG, or std::nullopt when no run has a taxonomy count.
inline std::optional<std::string> study_taxonomy_svg(study::study_result const& r, picture_options const& opt = {}) {
    std::vector<std::pair<std::size_t, double>> rows;  // run, total heads
    for (std::size_t i = 0; i < r.runs.size(); ++i) {
        double total = 0;
        for (auto const& [k, c] : r.runs[i].taxonomy) total += double(std::max<std::int64_t>(c, 0));
        if (total > 0) rows.emplace_back(i, total);
    }
    if (rows.empty()) return std::nullopt;
    svg_frame f = detail::study_frame(opt, 190);
    f.left = 170;
    double const row_h = 22;
    f.height = std::max(f.height, f.top + f.bottom + row_h * double(rows.size()));
    detail::scale const sx{0.0, 1.0, f.left, f.width - f.right};
    detail::scale const sy{0.0, double(rows.size()), f.top, f.height - f.bottom};  // row i from top
    detail::svg_doc doc(f, "Head taxonomy per run",
                        detail::plural(rows.size(), "run") + " with heads (" +
                            std::to_string(r.runs.size() - rows.size()) + " without); bar: share of the run's heads per class");
    doc.begin_plot(detail::scale{0.0, 1.0, f.left, f.width - f.right}, detail::scale{0, 1, f.height - f.bottom, f.top},
                   {0.0, 0.2, 0.4, 0.6, 0.8, 1.0}, {}, "share of the run's heads", "");
    for (std::size_t k = 0; k < rows.size(); ++k) {
        auto const& run = r.runs[rows[k].first];
        std::string const name = detail::xml_escape(run.spec.name);
        double const y = sy(double(k)) + 3, h = row_h - 6;
        doc.text(f.left - 8, y + h / 2 + 4, run.spec.name, "end", "class=\"run-label\"");
        double acc = 0;
        for (auto cls : taxonomy_classes) {
            auto const it = run.taxonomy.find(cls);
            if (it == run.taxonomy.end() || it->second <= 0) continue;
            double const share = double(it->second) / rows[k].second;
            doc.rect(sx(acc), y, sx(acc + share) - sx(acc), h, detail::class_colour(cls),
                     "class=\"share\" data-run=\"" + name + "\" data-class=\"" + std::string(to_string(cls)) +
                         "\" data-count=\"" + std::to_string(it->second) + "\" data-share=\"" +
                         detail::study_num(share) + "\"");
            acc += share;
        }
    }
    doc.end_plot();
    std::vector<std::pair<std::string, std::string>> legend;
    for (auto cls : taxonomy_classes) legend.emplace_back(detail::class_colour(cls), std::string(to_string(cls)));
    doc.legend(f.width - f.right + 20, f.top + 12, legend);
    return doc.finish();
}

namespace detail {

inline constexpr std::string_view study_hatch_defs =
    "<defs><pattern id=\"study-hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
    "patternTransform=\"rotate(45)\"><rect x=\"0\" y=\"0\" width=\"6\" height=\"6\" fill=\"#eeeeee\"/>"
    "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#aaaaaa\" stroke-width=\"2\"/></pattern></defs>\n";

/// A vertical colour bar for [c0, c1] between pixel rows by0 (bottom) and by1 (top).
inline void study_colour_bar(svg_doc& doc, double bx, double by0, double by1, double c0, double c1,
                             std::string_view what) {
    double const bw = 16;
    doc.raw("<g class=\"colourbar\" data-range=\"" + study_num(c0) + " " + study_num(c1) + "\">\n");
    int const steps = 32;
    for (int s = 0; s < steps; ++s) {
        double const ya = by0 - (by0 - by1) * (s + 1) / steps;
        doc.rect(bx, ya, bw, (by0 - by1) / steps + 0.5, sequential((s + 0.5) / steps));
    }
    doc.rect(bx, by1, bw, by0 - by1, "none", "stroke=\"#333333\"");
    for (double t : ticks(c0, c1, 5)) {
        double const y = by0 - (by0 - by1) * (t - c0) / (c1 - c0);
        doc.line(bx + bw, y, bx + bw + 4, y, "#333333");
        doc.text(bx + bw + 6, y + 4, label(t));
    }
    doc.text(bx + bw / 2, by1 - 8, what, "middle");
    doc.raw("</g>\n");
}

}  // namespace detail

/// \brief The layer-depth × run heatmap of one metric: rows = runs with cells
/// for it (study order), columns = the r.depth_bins relative depth bins
/// (layer / n_layers); colour = the cell's mean over heads on the sequential
/// scale over the finite range (colour bar). Each cell is
/// <rect class="cell" data-run data-bin data-value data-n>; a NaN or missing
/// cell is <rect class="cell-na"> hatched grey, never coloured as a value.
/// \param[in] r the computed study.
/// \param[in] metric the metric (depth_cell::metric).
/// \param[in] opt frame (the height grows with the number of runs).
/// \returns the SVG, or std::nullopt when the metric has no finite cell.
inline std::optional<std::string> study_depth_svg(study::study_result const& r, std::string const& metric,
                                                  picture_options const& opt = {}) {
    auto const nb = static_cast<std::size_t>(std::max<std::int64_t>(r.depth_bins, 1));
    std::map<std::size_t, std::vector<study::depth_cell const*>> rows;
    detail::extent ev;
    for (auto const& c : r.depth) {
        if (c.metric != metric || c.run >= r.runs.size() || c.bin < 0 || static_cast<std::size_t>(c.bin) >= nb) continue;
        auto& row = rows[c.run];
        row.resize(nb, nullptr);
        row[static_cast<std::size_t>(c.bin)] = &c;
        ev.add(c.value);
    }
    if (ev.empty()) return std::nullopt;
    svg_frame f = detail::study_frame(opt, 110);
    f.left = 170;
    f.height = std::max(f.height, f.top + f.bottom + 20.0 * double(rows.size()));
    double c0 = ev.lo, c1 = ev.hi;
    if (!(c1 > c0)) {
        c0 -= 0.005;
        c1 += 0.005;
    }
    detail::scale const sx{0.0, 1.0, f.left, f.width - f.right};
    detail::scale const sy{0.0, double(rows.size()), f.top, f.height - f.bottom};
    detail::svg_doc doc(f, "Layer depth × run — " + metric,
                        "colour: mean " + metric + " over the heads in the depth bin; hatched: n/a (no finite value)");
    doc.raw(detail::study_hatch_defs);
    doc.begin_plot(detail::scale{0, 1, f.left, f.width - f.right}, detail::scale{0, 1, f.height - f.bottom, f.top},
                   detail::ticks(0, 1, 5), {}, "layer depth, share of the model's layers (layer / n_layers)", "");
    std::size_t k = 0;
    for (auto const& [run, cells] : rows) {
        std::string const name = detail::xml_escape(r.runs[run].spec.name);
        double const y = sy(double(k)), h = sy(double(k + 1)) - y;
        doc.text(f.left - 8, y + h / 2 + 4, r.runs[run].spec.name, "end", "class=\"run-label\"");
        for (std::size_t b = 0; b < nb; ++b) {
            double const x = sx(double(b) / double(nb)), w = sx(double(b + 1) / double(nb)) - x;
            auto const* c = cells[b];
            std::string const who = "data-run=\"" + name + "\" data-bin=\"" + std::to_string(b) + "\"";
            if (c == nullptr || !std::isfinite(c->value)) {
                doc.rect(x, y, w, h, "url(#study-hatch)", "class=\"cell-na\" " + who + " data-value=\"n/a\"");
                continue;
            }
            doc.rect(x, y, w, h, detail::sequential((c->value - c0) / (c1 - c0)),
                     "class=\"cell\" " + who + " data-value=\"" + detail::study_num(c->value) + "\" data-n=\"" +
                         std::to_string(c->n) + "\"");
        }
        ++k;
    }
    doc.end_plot();
    detail::study_colour_bar(doc, f.width - f.right + 24, f.height - f.bottom, f.top, c0, c1, metric);
    return doc.finish();
}

namespace detail {

inline std::string study_corr_text(study::correlation_row const& c) {
    return "n=" + std::to_string(c.n) + ": Pearson r=" + label(c.pearson, 3) + " (p=" + label(c.p_pearson, 3) +
           "), Spearman ρ=" + label(c.spearman, 3) + " (p=" + label(c.p_spearman, 3) + "), Kendall τ=" +
           label(c.kendall, 3) + " (p=" + label(c.p_kendall, 3) + ")" + (c.p_method.empty() ? "" : ", p " + c.p_method);
}

/// The runs with a finite metric value and a finite score.
inline std::vector<std::size_t> study_pairs(study::study_result const& r, std::string const& metric,
                                            std::string const& bench) {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < r.runs.size(); ++i) {
        auto const it = r.runs[i].scores.find(bench);
        if (it != r.runs[i].scores.end() && std::isfinite(it->second) &&
            std::isfinite(study_metric(r.runs[i], metric).value))
            out.push_back(i);
    }
    return out;
}

}  // namespace detail

/// \brief A metric against a benchmark score, one point per run with both
/// finite (<circle class="run" data-run data-family data-x data-y>, a
/// <line class="ci"> from lo to hi where finite, a <text class="run-label">),
/// coloured by family; the subtitle gives the "all" row of r.correlations for
/// the pair, and the within-family rows are listed under the legend
/// (<text class="family-corr">).
/// \param[in] r the computed study.
/// \param[in] metric the metric (run_summary::metrics key).
/// \param[in] bench the benchmark (run_summary::scores key).
/// \param[in] opt frame.
/// \returns the SVG, or std::nullopt when fewer than 3 runs have both numbers.
inline std::optional<std::string> study_scatter_svg(study::study_result const& r, std::string const& metric,
                                                    std::string const& bench, picture_options const& opt = {}) {
    auto const idx = detail::study_pairs(r, metric, bench);
    if (idx.size() < 3) return std::nullopt;
    detail::extent ex, ey;
    for (auto i : idx) {
        ex.add(r.runs[i].scores.at(bench));
        auto const e = detail::study_metric(r.runs[i], metric);
        for (double v : {e.value, e.lo, e.hi}) ey.add(v);
    }
    std::string sub = "no correlation row";
    std::vector<study::correlation_row const*> fam;
    for (auto const& c : r.correlations)
        if (c.metric == metric && c.benchmark == bench) {
            if (c.group == "all") sub = "all runs, " + detail::study_corr_text(c);
            else fam.push_back(&c);
        }
    svg_frame const f = detail::study_frame(opt, 230);
    double const pad = ex.empty() ? 0.0 : 0.05 * (ex.hi - ex.lo);
    ex.add(ex.lo - pad);
    ex.add(ex.hi + pad);
    auto const xd = detail::study_domain(ex), yd = opt.y_domain ? *opt.y_domain : detail::study_domain(ey);
    detail::scale const sx{xd[0], xd[1], f.left, f.width - f.right};
    detail::scale const sy{yd[0], yd[1], f.height - f.bottom, f.top};
    detail::svg_doc doc(f, metric + " against " + bench, sub);
    doc.begin_plot(sx, sy, detail::ticks(xd[0], xd[1], 5), detail::ticks(yd[0], yd[1], 5), bench + " score",
                   metric + " (mean over heads)");
    detail::study_colours const colours(r);
    std::set<std::string> families;
    for (auto i : idx) {
        auto const& run = r.runs[i];
        auto const e = detail::study_metric(run, metric);
        double const x = sx(run.scores.at(bench)), y = sy(e.value);
        std::string const c = colours.colour(detail::study_family_of(run)), name = detail::xml_escape(run.spec.name);
        families.insert(detail::study_family_of(run));
        if (std::isfinite(e.lo) && std::isfinite(e.hi))
            doc.line(x, sy(e.lo), x, sy(e.hi), c, 1.0, "class=\"ci\" data-run=\"" + name + "\"");
        doc.circle(x, y, 4.5, c,
                   "class=\"run\" stroke=\"#ffffff\" data-run=\"" + name + "\" data-family=\"" +
                       detail::xml_escape(detail::study_family_of(run)) + "\" data-x=\"" +
                       detail::study_num(run.scores.at(bench)) + "\" data-y=\"" + detail::study_num(e.value) + "\"");
        doc.text(x + 6, y - 6, run.spec.name, "start", "class=\"run-label\" font-size=\"10\"");
    }
    doc.end_plot();
    auto const entries = colours.entries(families);
    doc.legend(f.width - f.right + 20, f.top + 12, entries);
    double y = f.top + 30 + 18.0 * double(entries.size());
    for (auto const* c : fam) {
        doc.text(f.width - f.right + 20, y, c->group + ": n=" + std::to_string(c->n) + ", ρ=" +
                                                 detail::label(c->spearman, 3) + ", τ=" + detail::label(c->kendall, 3),
                 "start", "class=\"family-corr\" font-size=\"10\"");
        y += 14;
    }
    return doc.finish();
}

/// \brief Per-length benchmark score and token-range plasticity of one run
/// (a length_correlations entry): x = the length bins ("lo–hi" tokens), the
/// score on the left y axis (<path class="score">, <circle class="score-point"
/// data-bin data-value>), the plasticity on the right y axis (<path
/// class="plasticity">, <circle class="plasticity-point">); NaN is a gap.
/// The subtitle gives the Spearman correlation over the bins.
/// \param[in] r the computed study (for the run's name).
/// \param[in] lc the entry.
/// \param[in] opt frame.
/// \returns the SVG, or std::nullopt when no bin has a finite number.
inline std::optional<std::string> study_length_svg(study::study_result const& r, study::length_correlation const& lc,
                                                   picture_options const& opt = {}) {
    std::vector<double> xs, score, plast;
    std::vector<std::string> names;
    detail::extent es, ep;
    for (auto const& p : lc.points) {
        xs.push_back(double(xs.size()));
        score.push_back(p.score);
        plast.push_back(p.plasticity);
        es.add(p.score);
        ep.add(p.plasticity);
        names.push_back(detail::study_tokens(p.lo) + "–" + detail::study_tokens(p.hi));
    }
    if (es.empty() && ep.empty()) return std::nullopt;
    svg_frame f = detail::study_frame(opt, 60, 20);
    auto const ds = detail::study_domain(es), dp = detail::study_domain(ep);
    detail::scale const sx{-0.5, double(xs.size()) - 0.5, f.left, f.width - f.right};
    detail::scale const ss{ds[0], ds[1], f.height - f.bottom, f.top}, sp{dp[0], dp[1], f.height - f.bottom, f.top};
    std::string const run = lc.run < r.runs.size() ? r.runs[lc.run].spec.name : lc.model;
    detail::svg_doc doc(f, lc.benchmark + " by length — " + run,
                        "left axis (blue): " + lc.benchmark + " score; right axis (orange): plasticity (AP); Spearman ρ=" +
                            detail::label(lc.corr.spearman, 3) + " (p=" + detail::label(lc.corr.p_spearman, 3) +
                            ", n=" + std::to_string(lc.corr.n) + ")");
    doc.begin_plot(sx, ss, {}, detail::ticks(ds[0], ds[1], 5), "context length (tokens) [from, to)",
                   lc.benchmark + " score");
    detail::study_category_ticks(doc, sx, ss, names);
    std::vector<std::string> pl;
    auto const pt = detail::ticks(dp[0], dp[1], 5);
    for (double t : pt) pl.push_back(detail::label(t));
    detail::study_y_ticks(doc, sx.r1, sp, pt, pl, true);
    double const ry = (sp.r0 + sp.r1) / 2, rx = f.width - 14;
    doc.text(rx, ry, "plasticity (AP)", "middle",
             "class=\"ylabel-right\" transform=\"rotate(90 " + detail::px(rx) + " " + detail::px(ry) + ")\"");
    for (auto [cls, v, s, c] : {std::tuple{"score", &score, &ss, "#1f77b4"}, std::tuple{"plasticity", &plast, &sp, "#ff7f0e"}}) {
        doc.gapped_path(xs, *v, sx, *s, cls, c, 2.0, "data-values=\"" + detail::study_join(*v) + "\"");
        for (std::size_t i = 0; i < xs.size(); ++i)
            if (std::isfinite((*v)[i]))
                doc.circle(sx(xs[i]), (*s)((*v)[i]), 3.5, c,
                           "class=\"" + std::string(cls) + "-point\" data-bin=\"" + std::to_string(i) +
                               "\" data-value=\"" + detail::study_num((*v)[i]) + "\"");
    }
    doc.end_plot();
    return doc.finish();
}

/// \brief Per-head trajectories of one metric across a model's checkpoints
/// (a head_trajectories entry: the same heads in every checkpoint): one thin
/// grey <path class="head" data-head data-values> per head, the mean over the
/// heads' finite values per checkpoint as a red <path class="mean"
/// data-values> with <circle class="mean-point">; NaN is a gap.
/// \param[in] r the computed study (run names for the x axis).
/// \param[in] ht the entry.
/// \param[in] opt frame and y domain.
/// \returns the SVG, or std::nullopt with fewer than 2 checkpoints, no head or
///          no finite value.
inline std::optional<std::string> study_heads_svg(study::study_result const& r, study::head_trajectory const& ht,
                                                  picture_options const& opt = {}) {
    if (ht.runs.size() < 2 || ht.heads.empty()) return std::nullopt;
    std::size_t const n = ht.runs.size();
    detail::extent ey;
    std::vector<double> sum(n, 0.0), mean(n, study::nan), xs(n);
    std::vector<std::int64_t> cnt(n, 0);
    for (auto const& row : ht.values)
        for (std::size_t k = 0; k < n && k < row.size(); ++k)
            if (std::isfinite(row[k])) {
                ey.add(row[k]);
                sum[k] += row[k];
                ++cnt[k];
            }
    if (ey.empty()) return std::nullopt;
    std::vector<std::string> names;
    for (std::size_t k = 0; k < n; ++k) {
        xs[k] = double(k);
        if (cnt[k] > 0) mean[k] = sum[k] / double(cnt[k]);
        names.push_back(ht.runs[k] < r.runs.size() ? r.runs[ht.runs[k]].spec.name : "?");
    }
    svg_frame const f = detail::study_frame(opt, 150, 60);
    auto const yd = opt.y_domain ? *opt.y_domain : detail::study_domain(ey);
    detail::scale const sx{-0.5, double(n) - 0.5, f.left, f.width - f.right};
    detail::scale const sy{yd[0], yd[1], f.height - f.bottom, f.top};
    detail::svg_doc doc(f, ht.metric + " per head — " + ht.model,
                        detail::plural(ht.heads.size(), "head") + " present in every checkpoint; grey: one head, red: mean over heads");
    doc.begin_plot(sx, sy, {}, detail::ticks(yd[0], yd[1], 5), "checkpoint (run), in training order", ht.metric);
    detail::study_category_ticks(doc, sx, sy, names);
    for (std::size_t h = 0; h < ht.heads.size() && h < ht.values.size(); ++h) {
        std::vector<double> v(n, study::nan);
        std::copy_n(ht.values[h].begin(), std::min(n, ht.values[h].size()), v.begin());
        doc.gapped_path(xs, v, sx, sy, "head", "#999999", 0.8,
                        "stroke-opacity=\"0.6\" data-head=\"" + detail::head_name(ht.heads[h]) + "\" data-values=\"" +
                            detail::study_join(v) + "\"");
    }
    doc.gapped_path(xs, mean, sx, sy, "mean", "#d62728", 3.0, "data-values=\"" + detail::study_join(mean) + "\"");
    for (std::size_t k = 0; k < n; ++k)
        if (std::isfinite(mean[k])) doc.circle(sx(xs[k]), sy(mean[k]), 3.5, "#d62728", "class=\"mean-point\"");
    doc.end_plot();
    doc.legend(f.width - f.right + 20, f.top + 12, {{"#999999", "one head"}, {"#d62728", "mean over heads"}}, true);
    return doc.finish();
}

namespace detail {

/// The (metric, benchmark) pairs of r.correlations, in order of first appearance.
inline std::vector<std::pair<std::string, std::string>> study_corr_pairs(study::study_result const& r) {
    std::vector<std::pair<std::string, std::string>> out;
    std::set<std::pair<std::string, std::string>> seen;
    for (auto const& c : r.correlations)
        if (seen.emplace(c.metric, c.benchmark).second) out.emplace_back(c.metric, c.benchmark);
    return out;
}

/// The depth metrics of r.depth, in order of first appearance.
inline std::vector<std::string> study_depth_metrics(study::study_result const& r) {
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (auto const& c : r.depth)
        if (seen.insert(c.metric).second) out.push_back(c.metric);
    return out;
}

/// The root element's width or height (the canvas size; 0 if absent).
inline double study_size(std::string const& svg, std::string const& what) {
    auto const root = svg.find("<svg ");
    auto const at = svg.find(" " + what + "=\"", root);
    if (root == std::string::npos || at == std::string::npos) return 0;
    return std::strtod(svg.c_str() + at + what.size() + 3, nullptr);
}

/// Writes pictures into one folder under unique names.
struct study_writer {
    std::filesystem::path dir;
    picture_options opt;
    study_file_names names;
    std::vector<picture_file> out;
    void put(std::string const& stem, std::optional<std::string> const& svg, std::string alt) {
        if (!svg) return;
        std::string const file = names.take(stem);
        auto const p = dir / file;
        write_text_file(p, "qkgeom::report::write_study_pictures", *svg);
        out.push_back({p, file, std::move(alt), study_size(*svg, "width"), study_size(*svg, "height")});
    }
};

}  // namespace detail

/// \brief Write every study picture whose data is present into `dir` (which
/// must exist), in this order: study_profile_quintile.svg,
/// study_profile_decile.svg, study_profile_tokens.svg; per model with ≥ 2
/// trajectory steps study_trajectory_<model>.svg and study_bias_<model>.svg;
/// study_taxonomy.svg; study_depth_<metric>.svg per r.depth metric;
/// study_scatter_<metric>_<benchmark>.svg per (metric, benchmark) of
/// r.correlations with ≥ 3 runs having both numbers;
/// study_length_<benchmark>_<model>.svg per r.length_correlations entry;
/// study_heads_<model>_<metric>.svg per r.head_trajectories entry. Names are
/// slugs ([a-z0-9_-]); a name taken already gets "-2", "-3", …. A picture
/// without data is not written. Existing files are overwritten.
/// \param[in] dir the folder; it must exist.
/// \param[in] r the computed study.
/// \param[in] opt frame and domains (the y domain is used by the profile,
///            trajectory and head pictures only).
/// \returns the files written, in order (width / height: each SVG's canvas).
/// \throws std::runtime_error naming a file that cannot be written;
///         std::out_of_range when a trajectory step names no run of r.
inline std::vector<picture_file> write_study_pictures(std::filesystem::path const& dir, study::study_result const& r,
                                                      picture_options const& opt = {}) {
    using detail::study_slug;
    detail::study_writer w{dir, opt, {}, {}};
    w.put("study_profile_quintile", study_profile_svg(r, 5, opt), "AP profile by quintile, one line per run");
    w.put("study_profile_decile", study_profile_svg(r, 10, opt), "AP profile by decile, one line per run");
    w.put("study_profile_tokens", study_token_profile_svg(r, opt), "AP profile by token range, one line per run");
    for (auto const& [model, steps] : detail::study_models(r)) {
        w.put("study_trajectory_" + study_slug(model), study_trajectory_svg(r, steps, opt),
              "Checkpoint trajectory of " + model + ": AP overall, first and last 20%, drop");
        w.put("study_bias_" + study_slug(model), study_bias_svg(r, steps, opt),
              "Bias decomposition of " + model + ": which of |mu_Q^a| and |alpha_K| moved");
    }
    w.put("study_taxonomy", study_taxonomy_svg(r, opt), "Head taxonomy shares per run");
    for (auto const& m : detail::study_depth_metrics(r))
        w.put("study_depth_" + study_slug(m), study_depth_svg(r, m, opt), "Layer depth x run heatmap of " + m);
    for (auto const& [m, b] : detail::study_corr_pairs(r))
        w.put("study_scatter_" + study_slug(m) + "_" + study_slug(b), study_scatter_svg(r, m, b, opt),
              m + " against the " + b + " score, one point per run");
    for (auto const& lc : r.length_correlations)
        w.put("study_length_" + study_slug(lc.benchmark) + "_" + study_slug(lc.model), study_length_svg(r, lc, opt),
              lc.benchmark + " score and plasticity by length for " + lc.model);
    for (auto const& ht : r.head_trajectories)
        w.put("study_heads_" + study_slug(ht.model) + "_" + study_slug(ht.metric), study_heads_svg(r, ht, opt),
              ht.metric + " per head across the checkpoints of " + ht.model);
    return std::move(w.out);
}

}  // namespace report
}  // namespace qkgeom
