// qkgeom — index.html: one self-contained page (no scripts, no external
// URLs, inline CSS only) that shows the method §7 pictures next to the model
// table (the model_report.csv rows) and links every CSV.
//
// Pictures are referenced, not inlined: <img src="…svg" width height alt>,
// with src relative to the page, so the SVG files stay standalone (openable on
// their own, diffable) and the page stays small. Moving the output directory
// as a whole keeps the page working; docs/pictures.md documents the layout.
#pragma once

#include <qkgeom/report/csv.hpp>
#include <qkgeom/report/svg.hpp>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom::report {

/// \brief File name of the page.
inline constexpr std::string_view index_html_file = "index.html";

/// \brief One picture on the page.
struct html_picture {
    std::string src;      ///< path relative to index.html, '/' separated
    std::string alt;      ///< alt text (also the caption)
    double width = 720;   ///< displayed size in CSS pixels
    double height = 440;  ///< displayed height in CSS pixels
};

/// \brief One model: its table row, its pictures and its files.
struct html_model {
    model_entry entry;                  ///< name and head_set_summary (the model_report.csv row)
    std::vector<html_picture> pictures; ///< its per-model pictures
    std::vector<std::string> files;     ///< links (CSV, text), relative to index.html
};

/// \brief The page.
struct html_page {
    std::string title = "qkgeom report";  ///< page title and heading (escaped)
    std::string intro;                   ///< a paragraph of plain text (escaped)
    std::vector<html_picture> overview;  ///< pictures shown above the models (e.g. the model comparison)
    std::vector<html_model> models;      ///< one table row and one section each, in order
    std::vector<std::string> files;      ///< page-level links (e.g. summary.txt)
    /// The run that wrote the page, (what, value) rows shown in a table at the
    /// end (the program records its command line, input and options here).
    std::vector<std::pair<std::string, std::string>> run;
};

/// \brief The page entry for a written picture, its src prefixed with `dir`
/// ("" or e.g. "steady/").
/// \param[in] p the picture as write_pictures returned it.
/// \param[in] dir prefix of the src, '/'-terminated or empty.
/// \returns the entry: src = dir + p.file, alt, width and height from `p`.
inline html_picture to_html(picture_file const& p, std::string_view dir = {}) {
    return {std::string(dir) + p.file, p.alt, p.width, p.height};
}

namespace detail {

/// Percent-encode a relative URL path: unreserved characters and '/' stay.
inline std::string url_path(std::string_view s) {
    constexpr char const* hexd = "0123456789ABCDEF";
    std::string out;
    for (char ch : s) {
        auto const c = static_cast<unsigned char>(ch);
        bool const keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                          c == '_' || c == '.' || c == '~' || c == '/';
        if (keep) out += ch;
        else {
            out += '%';
            out += hexd[c >> 4];
            out += hexd[c & 15];
        }
    }
    return out;
}

/// The metrics of the model table (mean over heads; model_report.csv column
/// `mean_<name>`).
inline constexpr std::array<std::string_view, 11> table_metrics{
    "ap_overall", "ap_first_20pct", "ap_last_20pct", "ap_drop",  "gaussian_gap", "bias_strength",
    "position_r", "q_R2_pos",       "pc0_r_q",       "pc0_r_k", "separation_strength"};

inline void picture_html(std::string& s, html_picture const& p) {
    s += "<figure><img src=\"" + xml_escape(url_path(p.src)) + "\" width=\"" + px(p.width) + "\" height=\"" +
         px(p.height) + "\" alt=\"" + xml_escape(p.alt) + "\"><figcaption>" + xml_escape(p.alt) + " (<a href=\"" +
         xml_escape(url_path(p.src)) + "\">" + xml_escape(p.src) + "</a>)</figcaption></figure>\n";
}

inline void links_html(std::string& s, std::vector<std::string> const& files) {
    if (files.empty()) return;
    s += "<ul class=\"files\">\n";
    for (auto const& f : files)
        s += "<li><a href=\"" + xml_escape(url_path(f)) + "\">" + xml_escape(f) + "</a></li>\n";
    s += "</ul>\n";
}

/// The start of a report page up to and including <body>: doctype, charset,
/// the escaped title and the pages' style sheet (index.html and the study
/// page share it).
inline std::string page_head(std::string_view title) {
    return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + xml_escape(title) +
           "</title>\n<style>\n"
           "body{font-family:\"DejaVu Sans\",Arial,Helvetica,sans-serif;margin:24px;color:#111;background:#fff}\n"
           "table{border-collapse:collapse;font-size:13px;margin:12px 0}\n"
           "th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}\n"
           "th:first-child,td:first-child{text-align:left}\n"
           "th{background:#f2f2f2}\n"
           "figure{display:inline-block;margin:8px 12px 16px 0;vertical-align:top}\n"
           "figure img{border:1px solid #ddd;display:block}\n"
           "figcaption{font-size:12px;color:#444;max-width:720px}\n"
           ".files{font-size:13px}\n"
           "</style>\n</head>\n<body>\n";
}

}  // namespace detail

/// \brief The HTML text of the page: title, intro, the model table (one row
/// per model: n_heads, the means of `detail::table_metrics`, the taxonomy
/// counts; NaN shown as "n/a"), the overview pictures, then per model its
/// pictures and file links. Text is XML-escaped; picture and link paths are
/// percent-encoded.
/// \param[in] page the content.
/// \returns the complete HTML document.
inline std::string index_html(html_page const& page) {
    using detail::xml_escape;
    std::string s = detail::page_head(page.title);

    s += "<h1>" + xml_escape(page.title) + "</h1>\n";
    if (!page.intro.empty()) s += "<p>" + xml_escape(page.intro) + "</p>\n";

    // The model table (model_report.csv rows).
    s += "<h2>Models</h2>\n<table class=\"models\">\n<thead><tr><th>model</th><th>n_heads</th>";
    for (auto m : detail::table_metrics) s += "<th>mean_" + std::string(m) + "</th>";
    for (auto k : taxonomy_classes) s += "<th>n_" + std::string(to_string(k)) + "</th>";
    s += "</tr></thead>\n<tbody>\n";
    for (auto const& m : page.models) {
        auto const& sm = m.entry.summary;
        s += "<tr><td><a href=\"#model-" + std::to_string(&m - page.models.data()) + "\">" +
             xml_escape(m.entry.model) + "</a></td><td>" + std::to_string(sm.n_heads) + "</td>";
        for (auto name : detail::table_metrics) s += "<td>" + detail::label(sm[name]) + "</td>";
        for (auto k : taxonomy_classes) {
            auto const it = sm.taxonomy_counts.find(k);
            s += "<td>" + std::to_string(it == sm.taxonomy_counts.end() ? 0 : it->second) + "</td>";
        }
        s += "</tr>\n";
    }
    s += "</tbody>\n</table>\n";
    s += "<p>Means over heads of the head_metrics.csv columns (finite values only; n/a: none finite), as in "
         "model_report.csv. See docs/pictures.md for how to read the pictures.</p>\n";
    detail::links_html(s, page.files);

    if (!page.overview.empty()) {
        s += "<h2>Overview</h2>\n";
        for (auto const& p : page.overview) detail::picture_html(s, p);
    }
    for (auto const& m : page.models) {
        s += "<h2 id=\"model-" + std::to_string(&m - page.models.data()) + "\">Model " + xml_escape(m.entry.model) +
             "</h2>\n";
        for (auto const& p : m.pictures) detail::picture_html(s, p);
        detail::links_html(s, m.files);
    }
    if (!page.run.empty()) {
        s += "<h2>This run</h2>\n<table class=\"run\">\n<tbody>\n";
        for (auto const& [what, value] : page.run)
            s += "<tr><td>" + xml_escape(what) + "</td><td style=\"text-align:left\">" + xml_escape(value) +
                 "</td></tr>\n";
        s += "</tbody>\n</table>\n";
    }
    s += "</body>\n</html>\n";
    return s;
}

/// \brief Write index_html(page) to `path`.
/// \param[in] path the file, created or truncated (usually `<dir>/index.html`).
/// \param[in] page the content.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_index_html(std::filesystem::path const& path, html_page const& page) {
    detail::write_text_file(path, "qkgeom::report::write_index_html", index_html(page));
}

}  // namespace qkgeom::report
