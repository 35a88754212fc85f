// qkgeom — the study's index.html (docs/study-pictures.md): one
// self-contained page (no scripts, no external URLs, inline CSS only) with the
// run record, the runs table (status, benchmark scores, the model-level
// metrics with their bootstrap intervals), the correlation tables, the
// checkpoint trajectory with the bias decomposition, every study picture and
// links to the CSV tables. Pictures are referenced with <img> as in
// report/html.hpp (whose building blocks it uses); every text from a file or
// a name is XML-escaped, every link percent-encoded.
#pragma once

#include <qkgeom/report/html.hpp>
#include <qkgeom/report/study_svg.hpp>
#include <qkgeom/report/study_tables.hpp>
#include <qkgeom/study/types.hpp>

#include <array>
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom {
namespace report {

/// \brief What the study page shows besides the computed study.
struct study_page {
    std::string title;  ///< page title and heading (escaped); "" = the study's title
    std::string intro;  ///< a paragraph of plain text (escaped)
    std::vector<std::pair<std::string, std::string>> run;  ///< the run record (what, value)
    std::vector<std::string> tables;                       ///< CSV file names to link, relative to the page
    std::vector<picture_file> pictures;                    ///< shown in order; src = picture_file::file
    std::string runs_dir;  ///< relative folder holding each run's analysis folder, "" = none
};

namespace detail {

/// The model-level metrics of the runs table (value [lo, hi]).
inline constexpr std::array<std::string_view, 7> study_table_metrics{
    "ap_overall", "ap_first_20pct", "ap_last_20pct", "ap_drop", "bias_strength", "abs_r_k_a", "abs_r_q_a"};

inline std::string study_td(std::string_view text) { return "<td>" + xml_escape(text) + "</td>"; }

/// "value [lo, hi]" (the interval only when one bound is finite); "n/a" for NaN.
inline std::string study_estimate_text(study::estimate const& e) {
    std::string s = label(e.value);
    if (std::isfinite(e.lo) || std::isfinite(e.hi)) s += " [" + label(e.lo) + ", " + label(e.hi) + "]";
    return s;
}

inline std::string study_checkpoint_text(study::checkpoint const& c) {
    std::string s;
    if (c.step) s += "step " + std::to_string(*c.step);
    if (c.tokens) s += (s.empty() ? "" : ", ") + study_tokens(*c.tokens) + " tokens";
    return s;
}

/// The runs table: one row per run.
inline void study_runs_html(std::string& s, study::study_result const& r, study_page const& page) {
    s += "<h2>Runs</h2>\n<table class=\"runs\">\n<thead><tr><th>run</th><th>family</th><th>model</th><th>phase</th>"
         "<th>checkpoint</th><th>status</th><th>n_heads</th>";
    for (auto const& b : r.benchmarks) s += "<th>" + xml_escape(b) + "</th>";
    for (auto m : study_table_metrics) s += "<th>" + std::string(m) + "</th>";
    s += "</tr></thead>\n<tbody>\n";
    for (auto const& run : r.runs) {
        bool const ours = run.status == study::run_status::analysed || run.status == study::run_status::cached;
        std::string name = xml_escape(run.spec.name);
        if (!page.runs_dir.empty() && ours)
            name = "<a href=\"" + xml_escape(url_path(page.runs_dir + "/" + run.spec.name + "/index.html")) + "\">" +
                   name + "</a>";
        s += "<tr class=\"run\"><td>" + name + "</td>" + study_td(study_family_of(run)) + study_td(study_model_of(run)) +
             study_td(run.spec.ckpt.phase) + study_td(study_checkpoint_text(run.spec.ckpt));
        std::string status(study::to_string(run.status));
        if (!run.message.empty()) status += ": " + run.message;
        s += "<td class=\"status\" style=\"text-align:left\">" + xml_escape(status) + "</td><td>" +
             std::to_string(run.n_heads) + "</td>";
        for (auto const& b : r.benchmarks) {
            auto const it = run.scores.find(b);
            s += "<td>" + label(it == run.scores.end() ? study::nan : it->second) + "</td>";
        }
        for (auto m : study_table_metrics) s += study_td(study_estimate_text(study_metric(run, std::string(m))));
        s += "</tr>\n";
    }
    s += "</tbody>\n</table>\n<p>Metrics: mean over heads [bootstrap interval over heads]; n/a: no finite value.</p>\n";
}

inline void study_corr_cells(std::string& s, study::correlation_row const& c) {
    s += "<td>" + std::to_string(c.n) + "</td>";
    for (double v : {c.pearson, c.p_pearson, c.spearman, c.p_spearman, c.kendall, c.p_kendall})
        s += "<td>" + label(v) + "</td>";
    s += study_td(c.p_method);
}

/// The correlation table and the per-length correlations.
inline void study_corr_html(std::string& s, study::study_result const& r) {
    std::string const head =
        "<th>n</th><th>pearson</th><th>p_pearson</th><th>spearman</th><th>p_spearman</th><th>kendall</th>"
        "<th>p_kendall</th><th>p_method</th>";
    if (!r.correlations.empty()) {
        s += "<h2>Correlations</h2>\n<table class=\"correlations\">\n<thead><tr><th>metric</th><th>benchmark</th>"
             "<th>group</th>" + head + "</tr></thead>\n<tbody>\n";
        for (auto const& c : r.correlations) {
            s += "<tr>" + study_td(c.metric) + study_td(c.benchmark) + study_td(c.group);
            study_corr_cells(s, c);
            s += "</tr>\n";
        }
        s += "</tbody>\n</table>\n";
    }
    if (!r.length_correlations.empty()) {
        s += "<h2>Per-length correlations</h2>\n<table class=\"length-correlations\">\n<thead><tr><th>benchmark</th>"
             "<th>model</th><th>run</th>" + head + "</tr></thead>\n<tbody>\n";
        for (auto const& lc : r.length_correlations) {
            s += "<tr>" + study_td(lc.benchmark) + study_td(lc.model) +
                 study_td(lc.run < r.runs.size() ? r.runs[lc.run].spec.name : "");
            study_corr_cells(s, lc.corr);
            s += "</tr>\n";
        }
        s += "</tbody>\n</table>\n";
    }
}

/// The trajectory with the bias decomposition.
inline void study_trajectory_html(std::string& s, study::study_result const& r) {
    if (r.trajectory.empty()) return;
    s += "<h2>Checkpoint trajectory and bias decomposition</h2>\n<table class=\"trajectory\">\n<thead><tr>"
         "<th>model</th><th>run</th><th>phase</th><th>checkpoint</th><th>order</th>";
    std::array<std::string_view, 6> const metrics{"bias_strength", "abs_alpha_k", "abs_r_k_a",
                                                  "ap_overall",    "ap_first_20pct", "ap_drop"};
    for (auto m : metrics) s += "<th>" + std::string(m) + "</th>";
    s += "<th>gm_bias</th><th>gm_mu_q_a</th><th>gm_alpha_k</th><th>n_decomposed</th><th>dlog_bias</th>"
         "<th>dlog_mu_q_a</th><th>dlog_alpha_k</th></tr></thead>\n<tbody>\n";
    for (auto const& st : r.trajectory) {
        auto const& run = r.runs.at(st.run);
        s += "<tr>" + study_td(st.model) + study_td(run.spec.name) + study_td(run.spec.ckpt.phase) +
             study_td(study_checkpoint_text(run.spec.ckpt)) + "<td>" + label(st.order) + "</td>";
        for (auto m : metrics) s += "<td>" + label(study_metric(run, std::string(m)).value) + "</td>";
        for (double v : {st.gm_bias, st.gm_mu_q_a, st.gm_alpha_k}) s += "<td>" + label(v) + "</td>";
        s += "<td>" + std::to_string(st.n_decomposed) + "</td>";
        for (double v : {st.dlog_bias, st.dlog_mu_q_a, st.dlog_alpha_k}) s += "<td>" + label(v) + "</td>";
        s += "</tr>\n";
    }
    s += "</tbody>\n</table>\n<p>gm_*: geometric means over the heads where both factors are finite and non-zero; "
         "dlog_bias = dlog_mu_q_a + dlog_alpha_k, the change from the previous checkpoint of the model.</p>\n";
}

}  // namespace detail

/// \brief The HTML text of the study page: title, intro, the run record, the
/// runs table (run, family, model, phase, checkpoint, status with the failure
/// message, n_heads, each benchmark score, and ap_overall, ap_first_20pct,
/// ap_last_20pct, ap_drop, bias_strength, abs_r_k_a, abs_r_q_a as
/// "value [lo, hi]"), the correlation tables, the trajectory with the bias
/// decomposition, every picture (<img>, as report/html.hpp) and links to the
/// CSV tables. A run that was analysed or cached links to
/// `<runs_dir>/<run name>/index.html` when page.runs_dir is not empty.
/// \param[in] r the computed study.
/// \param[in] page the page's texts, pictures and links.
/// \returns the complete HTML document.
/// \throws std::out_of_range when a trajectory step names no run of r.
inline std::string study_index_html(study::study_result const& r, study_page const& page) {
    using detail::xml_escape;
    std::string const title = page.title.empty() ? (r.title.empty() ? "qkgeom study" : r.title) : page.title;
    std::string s = detail::page_head(title);
    s += "<h1>" + xml_escape(title) + "</h1>\n";
    if (!page.intro.empty()) s += "<p>" + xml_escape(page.intro) + "</p>\n";
    if (!page.run.empty()) {
        s += "<h2>This run</h2>\n<table class=\"record\">\n<tbody>\n";
        for (auto const& [what, value] : page.run)
            s += "<tr>" + detail::study_td(what) + "<td style=\"text-align:left\">" + xml_escape(value) + "</td></tr>\n";
        s += "</tbody>\n</table>\n";
    }
    detail::study_runs_html(s, r, page);
    detail::study_corr_html(s, r);
    detail::study_trajectory_html(s, r);
    if (!page.pictures.empty()) {
        s += "<h2>Pictures</h2>\n<p>docs/study-pictures.md says how to read each picture.</p>\n";
        for (auto const& p : page.pictures) detail::picture_html(s, to_html(p));
    }
    if (!page.tables.empty()) {
        s += "<h2>Tables</h2>\n";
        detail::links_html(s, page.tables);
    }
    s += "</body>\n</html>\n";
    return s;
}

/// \brief Write study_index_html(r, page) to `path`.
/// \param[in] path the file, created or truncated (usually `<dir>/index.html`).
/// \param[in] r the computed study.
/// \param[in] page the page's texts, pictures and links.
/// \throws std::runtime_error naming the path when it cannot be opened or
///         written; std::out_of_range as study_index_html.
inline void write_study_index_html(std::filesystem::path const& path, study::study_result const& r,
                                   study_page const& page) {
    detail::write_text_file(path, "qkgeom::report::write_study_index_html", study_index_html(r, page));
}

}  // namespace report
}  // namespace qkgeom
