// qkgeom program — the reports: the model table, per model its CSVs and
// pictures, the model comparison and index.html (method §7, docs/outputs.md,
// docs/pictures.md).
#include "program.hpp"

#include <qkgeom/report/csv.hpp>
#include <qkgeom/report/html.hpp>
#include <qkgeom/report/svg.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom_app {

std::string model_table(std::vector<std::pair<std::string, qkgeom::model_summary>> const& table) {
    std::string text = "model      heads  ap_overall  ap_first_20pct  ap_last_20pct  ap_drop  gaussian_gap  bias_strength\n";
    for (auto const& [name, m] : table) {
        char line[256];
        std::snprintf(line, sizeof line, "%-10s %5lld  %10.4f  %14.4f  %13.4f  %7.4f  %12.4f  %13.3g\n", name.c_str(),
                      static_cast<long long>(m.all.n_heads), m.all["ap_overall"], m.all["ap_first_20pct"],
                      m.all["ap_last_20pct"], m.all["ap_drop"], m.all["gaussian_gap"], m.all["bias_strength"]);
        text += line;
    }
    return text;
}

void write_text(std::filesystem::path const& p, std::string const& text) {
    std::FILE* fp = std::fopen(p.string().c_str(), "w");
    if (fp == nullptr) throw run_error("cannot write " + p.string() + ": " + std::strerror(errno));
    bool const ok = std::fputs(text.c_str(), fp) >= 0;
    if (std::fclose(fp) != 0 || !ok) throw run_error("writing " + p.string() + " failed: " + std::strerror(errno));
}

std::string one_line(std::string_view msg) {
    std::string out;
    for (char ch : msg) {
        auto const u = static_cast<unsigned char>(ch);
        if (ch == '\n') out += "\\n";
        else if (ch == '\r') out += "\\r";
        else if (ch == '\t') out += "\\t";
        else if (u < 0x20 || u == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", u);
            out += buf;
        } else out += ch;
    }
    return out;
}

std::string nan_notes(std::vector<qkgeom::head_analysis> const& heads) {
    std::size_t late = 0;
    for (auto const& h : heads)
        if (std::isfinite(h.plasticity.ap_overall) && !std::isfinite(h.plasticity.ap_last_20pct)) ++late;
    if (late == 0) return {};
    return "note: ap_last_20pct and ap_drop are NaN for " + std::to_string(late) + " of " +
           std::to_string(heads.size()) +
           " heads: no query position lies in the last 20% of the context length (the captured sequences are "
           "shorter than the context length the capture records; --context sets another, method §9.12)\n";
}

namespace {

/// The CSV names written by write_reports, each prefixed with `dir`.
std::vector<std::string> csv_links(std::string const& dir) {
    std::vector<std::string> out;
    for (auto f : {qkgeom::report::head_metrics_file, qkgeom::report::head_bucket_plasticity_file, qkgeom::report::head_profile_file,
                   qkgeom::report::head_component_weights_file, qkgeom::report::qk_pca_file,
                   qkgeom::report::model_report_file, qkgeom::report::layer_report_file,
                   qkgeom::report::head_rope_bands_file, qkgeom::report::head_rope_bucket_bands_file,
                   qkgeom::report::gqa_groups_file})
        out.push_back(dir + std::string(f));
    return out;
}

}  // namespace

struct report_page::impl {
    qkgeom::report::html_page page;
    qkgeom::report::picture_options popt;
    bool pictures = true;
};

report_page::report_page(std::string title, std::string intro, qkgeom::analysis_options const& opt, bool pictures,
                         std::vector<std::pair<std::string, std::string>> run)
    : impl_(new impl) {
    impl_->page.title = std::move(title);
    impl_->page.run = std::move(run);
    impl_->page.intro = std::move(intro);
    impl_->popt.thresholds = opt.pca.thresholds;
    impl_->pictures = pictures;
}

report_page::~report_page() { delete impl_; }

qkgeom::model_summary report_page::add_model(std::filesystem::path const& dir, std::string const& prefix,
                                             std::string const& name, std::vector<qkgeom::head_analysis> const& heads) {
    qkgeom::report::write_reports(dir, name, heads);
    qkgeom::model_summary summary = qkgeom::summarise_model(heads);
    if (impl_->pictures) {
        // The pictures of one model into `dir` (method §7, docs/pictures.md)
        // and its section of index.html; the picture data is compact
        // (profiles, heatmap sums, weights, r_q/r_k), no rows.
        auto const pics = qkgeom::report::collect_pictures(name, heads);
        qkgeom::report::html_model sec{{pics.model, summary.all}, {}, csv_links(prefix)};
        for (auto const& p : qkgeom::report::write_pictures(dir, pics, impl_->popt))
            sec.pictures.push_back(qkgeom::report::to_html(p, prefix));
        impl_->page.models.push_back(std::move(sec));
    }
    return summary;
}

void report_page::finish(std::filesystem::path const& out, std::vector<std::string> const& files) {
    if (!impl_->pictures || impl_->page.models.empty()) return;
    std::vector<qkgeom::report::model_entry> entries;
    for (auto const& sec : impl_->page.models) entries.push_back(sec.entry);
    impl_->page.overview.push_back(qkgeom::report::to_html(qkgeom::report::write_model_comparison(
        out / std::string(qkgeom::report::model_comparison_svg_file), entries, impl_->popt)));
    impl_->page.files = files;
    qkgeom::report::write_index_html(out / std::string(qkgeom::report::index_html_file), impl_->page);
}

void write_run_reports(std::filesystem::path const& dir, std::string const& name,
                       std::vector<qkgeom::head_analysis> const& heads, cli const& c) {
    qkgeom::report::write_reports(dir, name, heads);
    if (!c.pictures) return;
    qkgeom::report::picture_options popt;
    popt.thresholds = c.opt.pca.thresholds;
    qkgeom::report::write_pictures(dir, qkgeom::report::collect_pictures(name, heads), popt);
}

}  // namespace qkgeom_app
