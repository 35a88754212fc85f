// qkgeom — the pictures of method §7 as dependency-free SVG: per-head
// plasticity profiles with the model mean, the 2D plasticity heatmap, the
// component weights, the r_q / r_k taxonomy scatter, and the model comparison
// of the decile AP profiles. docs/pictures.md says how to read each one.
//
// Every picture is one standalone SVG 1.1 document (plain text, well-formed
// XML, `viewBox` and fixed width/height, a white background, a visible title
// and a <title> element, axis ticks and labels). Free text (model names,
// titles) is XML-escaped. A NaN value is never drawn at 0: a NaN profile
// point is a gap in its line, a NaN scatter point is left out and counted in
// the legend as "n/a", an empty heatmap cell is blank.
//
// Geometry (for people reading coordinates back, e.g. the tests): a data
// value x in the x-domain [x0, x1] is drawn at
//   px = left + (x − x0) / (x1 − x0) · (width − left − right)
// and y in [y0, y1] at
//   py = top + (y1 − y) / (y1 − y0) · (height − top − bottom)
// with the margins of `svg_frame`. Domains are "nice" (rounded to tick steps)
// unless given in `picture_options`. Each plot group carries its domains as
// attributes: <g class="plot" data-x-domain="x0 x1" data-y-domain="y0 y1">.
//
// Memory: the pictures are drawn from `model_pictures`, a compact per-model
// accumulator (per head: the profile τ_b/AP_b, the component weights, PC0
// r_q/r_k, the class and the decile profile; per model: the heatmap sums), so
// a streaming caller can drop each `head_analysis` after `add`.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/analysis/model_pictures.hpp>
#include <qkgeom/report/csv.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom::report {

// ---------------------------------------------------------------------------
// File names (what write_pictures / write_model_comparison write)
// ---------------------------------------------------------------------------
/// \name Picture file names
///@{
inline constexpr std::string_view profile_svg_file = "plasticity_profile.svg";
inline constexpr std::string_view heatmap_svg_file = "plasticity_heatmap.svg";
inline constexpr std::string_view component_weights_svg_file = "component_weights.svg";
inline constexpr std::string_view taxonomy_svg_file = "taxonomy_scatter.svg";
inline constexpr std::string_view model_comparison_svg_file = "model_comparison.svg";
inline constexpr std::string_view split_svg_file = "plasticity_split.svg";
inline constexpr std::string_view rope_bands_svg_file = "rope_bands.svg";
inline constexpr std::string_view gqa_svg_file = "gqa_groups.svg";
///@}

/// \brief Canvas size and plot margins in pixels (user units of the viewBox).
struct svg_frame {
    double width = 720;  ///< canvas width
    double height = 440; ///< canvas height
    double left = 76;    ///< room for the y tick labels and the y label
    double right = 24;   ///< plots with a legend or colour bar add their own room
    double top = 52;     ///< title and subtitle
    double bottom = 60;  ///< x tick labels and the x label
};

/// \brief Options of every picture. Empty domains are chosen from the data.
///
/// \pre a given domain is finite with d0 < d1, and the frame's margins leave a
///      positive plot area (neither is checked: otherwise coordinates are
///      non-finite or the plot is inverted; nothing throws).
struct picture_options {
    svg_frame frame{};  ///< canvas and margins
    std::optional<std::array<double, 2>> y_domain;  ///< profiles / comparison / weights: fixed y range
    std::optional<std::array<double, 2>> x_domain;  ///< profiles: fixed x (position) range
    taxonomy_thresholds thresholds{};               ///< scatter: the lines at ±low, ±high (method §2)
};

// ---------------------------------------------------------------------------
// Compact picture data: the model-level data lives in analysis/model_pictures.hpp
// (namespace qkgeom); these names keep the report spellings working.
// ---------------------------------------------------------------------------
using qkgeom::band_picture;
using qkgeom::collect_pictures;
using qkgeom::head_picture;
using qkgeom::heatmap_total;
using qkgeom::model_pictures;
using qkgeom::picture_data;

// ---------------------------------------------------------------------------
// SVG building blocks
// ---------------------------------------------------------------------------
namespace detail {


/// Text escaped for XML character data and attribute values. Characters that
/// XML 1.0 does not allow (C0 controls other than tab, LF, CR) become '?'.
inline std::string xml_escape(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&apos;"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') out += '?';
                else out += c;
        }
    }
    return out;
}

/// A pixel coordinate: fixed, 2 decimals, trailing zeros dropped.
inline std::string px(double v) {
    if (!std::isfinite(v)) return "0";
    std::array<char, 64> buf{};
    auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::fixed, 2);
    std::string s(buf.data(), r.ptr);
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    if (s == "-0") s = "0";
    return s;
}

/// A number for a label: up to `digits` significant digits; NaN as "n/a".
inline std::string label(double v, int digits = 4) {
    if (std::isnan(v)) return "n/a";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (v == 0) return "0";
    std::array<char, 64> buf{};
    auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::general, digits);
    return std::string(buf.data(), r.ptr);
}

/// Linear map of a data interval onto a pixel interval.
struct scale {
    double d0 = 0, d1 = 1, r0 = 0, r1 = 1;
    [[nodiscard]] double operator()(double v) const { return r0 + (v - d0) / (d1 - d0) * (r1 - r0); }
};

/// A tick step of 1, 2 or 5 × 10^k giving about `target` intervals.
inline double nice_step(double span, int target) {
    double const raw = span / std::max(1, target);
    double const mag = std::pow(10.0, std::floor(std::log10(raw)));
    double const f = raw / mag;
    return (f < 1.5 ? 1.0 : f < 3.0 ? 2.0 : f < 7.0 ? 5.0 : 10.0) * mag;
}

/// A domain covering [lo, hi] rounded out to tick steps; a degenerate or
/// empty range gets a unit-wide domain around it.
inline std::array<double, 2> nice_domain(double lo, double hi, int target = 5) {
    if (!std::isfinite(lo) || !std::isfinite(hi)) return {0.0, 1.0};
    if (hi - lo <= 1e-12 * std::max(1.0, std::abs(hi))) {
        double const pad = std::max(0.05 * std::abs(hi), 0.05);
        lo -= pad;
        hi += pad;
    }
    double const step = nice_step(hi - lo, target);
    return {std::floor(lo / step) * step, std::ceil(hi / step) * step};
}

/// Tick values inside [d0, d1] at a nice step.
inline std::vector<double> ticks(double d0, double d1, int target = 5) {
    std::vector<double> t;
    if (!(d1 > d0)) return t;
    double const step = nice_step(d1 - d0, target);
    double const first = std::ceil(d0 / step - 1e-9) * step;
    for (int i = 0; i < 100; ++i) {
        double v = first + step * i;
        if (v > d1 + 1e-9 * step) break;
        if (std::abs(v) < 1e-12 * step) v = 0;
        t.push_back(v);
    }
    return t;
}

/// Finite min/max of a range of values (NaN when none is finite).
struct extent {
    double lo = std::numeric_limits<double>::infinity();
    double hi = -std::numeric_limits<double>::infinity();
    void add(double v) {
        if (!std::isfinite(v)) return;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    [[nodiscard]] bool empty() const { return !(lo <= hi); }
};

/// Colours: a categorical palette (Tableau 10) and a sequential scale
/// (viridis anchors, interpolated in sRGB; its luminance rises monotonically).
inline constexpr std::array<std::string_view, 10> palette{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

inline std::string hex(int r, int g, int b) {
    constexpr char const* digits = "0123456789abcdef";
    std::string s = "#";
    for (int c : {r, g, b}) {
        c = std::clamp(c, 0, 255);
        s += digits[c / 16];
        s += digits[c % 16];
    }
    return s;
}

/// Sequential colour of t in [0, 1] (clamped).
inline std::string sequential(double t) {
    static constexpr std::array<std::array<int, 3>, 10> anchors{{{68, 1, 84},
                                                                  {72, 40, 120},
                                                                  {62, 73, 137},
                                                                  {49, 104, 142},
                                                                  {38, 130, 142},
                                                                  {31, 158, 137},
                                                                  {53, 183, 121},
                                                                  {110, 206, 88},
                                                                  {181, 222, 43},
                                                                  {253, 231, 37}}};
    if (!(t >= 0)) t = 0;
    if (t > 1) t = 1;
    double const x = t * double(anchors.size() - 1);
    auto const i = std::min<std::size_t>(static_cast<std::size_t>(x), anchors.size() - 2);
    double const f = x - double(i);
    auto const mix = [&](int c) {
        return static_cast<int>(std::lround(anchors[i][static_cast<std::size_t>(c)] * (1 - f) +
                                            anchors[i + 1][static_cast<std::size_t>(c)] * f));
    };
    return hex(mix(0), mix(1), mix(2));
}

/// Colour of a taxonomy class (method §2).
inline std::string_view class_colour(head_class c) {
    switch (c) {
        case head_class::position_dominated: return "#d62728";
        case head_class::q_positional: return "#ff7f0e";
        case head_class::k_positional: return "#9467bd";
        case head_class::content_focused: return "#1f77b4";
        case head_class::mixed: return "#2ca02c";
        case head_class::undefined: break;
    }
    return "#7f7f7f";
}

/// A small SVG document builder.
class svg_doc {
public:
    svg_doc(svg_frame const& f, std::string_view title, std::string_view subtitle) : f_(f) {
        s_ += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
        s_ += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + px(f.width) + "\" height=\"" +
              px(f.height) + "\" viewBox=\"0 0 " + px(f.width) + " " + px(f.height) +
              "\" font-family=\"DejaVu Sans, Arial, Helvetica, sans-serif\" font-size=\"12\">\n";
        s_ += "<title>" + xml_escape(title) + "</title>\n";
        s_ += "<rect class=\"background\" x=\"0\" y=\"0\" width=\"" + px(f.width) + "\" height=\"" + px(f.height) +
              "\" fill=\"#ffffff\"/>\n";
        text(f.width / 2, 20, title, "middle", "font-size=\"15\" font-weight=\"bold\"");
        if (!subtitle.empty()) text(f.width / 2, 38, subtitle, "middle", "font-size=\"11\" fill=\"#555555\"");
    }
    void raw(std::string_view s) { s_ += s; }
    void text(double x, double y, std::string_view t, std::string_view anchor = "start", std::string_view extra = {}) {
        s_ += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" text-anchor=\"" + std::string(anchor) + "\"";
        if (!extra.empty()) s_ += " " + std::string(extra);
        s_ += ">" + xml_escape(t) + "</text>\n";
    }
    void line(double x0, double y0, double x1, double y1, std::string_view stroke, double width = 1,
              std::string_view extra = {}) {
        s_ += "<line x1=\"" + px(x0) + "\" y1=\"" + px(y0) + "\" x2=\"" + px(x1) + "\" y2=\"" + px(y1) +
              "\" stroke=\"" + std::string(stroke) + "\" stroke-width=\"" + px(width) + "\"";
        if (!extra.empty()) s_ += " " + std::string(extra);
        s_ += "/>\n";
    }
    void rect(double x, double y, double w, double h, std::string_view fill, std::string_view extra = {}) {
        s_ += "<rect x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) + "\" height=\"" + px(h) +
              "\" fill=\"" + std::string(fill) + "\"";
        if (!extra.empty()) s_ += " " + std::string(extra);
        s_ += "/>\n";
    }
    void circle(double x, double y, double r, std::string_view fill, std::string_view extra = {}) {
        s_ += "<circle cx=\"" + px(x) + "\" cy=\"" + px(y) + "\" r=\"" + px(r) + "\" fill=\"" + std::string(fill) +
              "\"";
        if (!extra.empty()) s_ += " " + std::string(extra);
        s_ += "/>\n";
    }
    /// A line through the points, with a gap at every NaN (never a point at
    /// 0): one <path> whose subpaths are the runs of finite points; an
    /// isolated point is a zero-length subpath drawn by the round cap.
    void gapped_path(std::span<double const> xs, std::span<double const> ys, scale const& sx, scale const& sy,
                     std::string_view cls, std::string_view stroke, double width, std::string_view extra = {}) {
        std::string d;
        bool pen = false;
        std::size_t run = 0;
        for (std::size_t i = 0; i < xs.size() && i < ys.size(); ++i) {
            if (!std::isfinite(xs[i]) || !std::isfinite(ys[i])) {
                if (pen && run == 1) d += " l0 0";
                pen = false;
                continue;
            }
            d += d.empty() ? "" : " ";
            d += (pen ? "L" : "M") + px(sx(xs[i])) + " " + px(sy(ys[i]));
            run = pen ? run + 1 : 1;
            pen = true;
        }
        if (pen && run == 1) d += " l0 0";
        s_ += "<path class=\"" + std::string(cls) + "\" d=\"" + d + "\" fill=\"none\" stroke=\"" + std::string(stroke) +
              "\" stroke-width=\"" + px(width) + "\" stroke-linejoin=\"round\" stroke-linecap=\"round\"";
        if (!extra.empty()) s_ += " " + std::string(extra);
        s_ += "/>\n";
    }
    /// Axes of the plot area: frame, grid, ticks, tick labels, axis labels.
    /// Opens <g class="plot" …>; close it with end_plot().
    void begin_plot(scale const& sx, scale const& sy, std::vector<double> const& xt, std::vector<double> const& yt,
                    std::string_view xlabel, std::string_view ylabel) {
        double const x0 = sx.r0, x1 = sx.r1, y0 = sy.r0, y1 = sy.r1;  // y0 bottom, y1 top
        s_ += "<g class=\"axes\" stroke-linecap=\"square\">\n";
        for (double t : xt) {
            double const x = sx(t);
            line(x, y1, x, y0, "#e6e6e6");
            line(x, y0, x, y0 + 5, "#333333");
            text(x, y0 + 18, label(t), "middle");
        }
        for (double t : yt) {
            double const y = sy(t);
            line(x0, y, x1, y, "#e6e6e6");
            line(x0 - 5, y, x0, y, "#333333");
            text(x0 - 8, y + 4, label(t), "end");
        }
        s_ += "<rect x=\"" + px(x0) + "\" y=\"" + px(y1) + "\" width=\"" + px(x1 - x0) + "\" height=\"" +
              px(y0 - y1) + "\" fill=\"none\" stroke=\"#333333\"/>\n";
        text((x0 + x1) / 2, f_.height - 14, xlabel, "middle", "class=\"xlabel\"");
        double const ly = (y0 + y1) / 2;
        text(16, ly, ylabel, "middle",
             "class=\"ylabel\" transform=\"rotate(-90 16 " + px(ly) + ")\"");
        s_ += "</g>\n";
        s_ += "<g class=\"plot\" data-x-domain=\"" + label(sx.d0, 17) + " " + label(sx.d1, 17) +
              "\" data-y-domain=\"" + label(sy.d0, 17) + " " + label(sy.d1, 17) + "\">\n";
    }
    void end_plot() { s_ += "</g>\n"; }
    /// Legend entries at (x, y) going down: a swatch and a label each.
    void legend(double x, double y, std::vector<std::pair<std::string, std::string>> const& entries,
                bool lines = false) {
        s_ += "<g class=\"legend\">\n";
        for (auto const& [colour, name] : entries) {
            if (lines) line(x, y - 4, x + 18, y - 4, colour, 2.5);
            else circle(x + 9, y - 4, 4.5, colour);
            text(x + 24, y, name);
            y += 18;
        }
        s_ += "</g>\n";
    }
    [[nodiscard]] std::string finish() {
        s_ += "</svg>\n";
        return std::move(s_);
    }

private:
    svg_frame f_;
    std::string s_;
};

inline std::string head_name(head_id const& id) {
    return "layer " + std::to_string(id.layer) + " q_head " + std::to_string(id.q_head) + " k_head " +
           std::to_string(id.k_head);
}

inline std::string plural(std::size_t n, std::string_view what) {
    return std::to_string(n) + " " + std::string(what) + (n == 1 ? "" : "s");
}

}  // namespace detail

// ---------------------------------------------------------------------------
// The pictures
// ---------------------------------------------------------------------------

/// \brief Per-head plasticity profiles (method §6): AP_b against the bucket
/// position τ_b, a thin line per head (<path class="head">) and the model
/// mean as a thick line (<path class="mean">: per query bucket, the mean of
/// the finite AP_b over heads at the mean τ_b). NaN AP_b are gaps.
/// \param[in] m the model's picture data (may hold no heads: an empty plot).
/// \param[in] opt frame, domains and thresholds.
/// \returns the SVG document.
inline std::string profile_svg(model_pictures const& m, picture_options const& opt = {}) {
    svg_frame const f = opt.frame;
    detail::extent ex, ey;
    std::int64_t L = 0;
    std::size_t n_missing = 0;
    for (auto const& h : m.heads) {
        L = std::max(L, h.context_length);
        for (std::size_t i = 0; i < h.ap.size(); ++i) {
            if (!std::isfinite(h.ap[i])) ++n_missing;
            else {
                ex.add(h.tau[i]);
                ey.add(h.ap[i]);
            }
        }
    }
    std::array<double, 2> xd = opt.x_domain ? *opt.x_domain
                               : L > 0      ? std::array<double, 2>{0.0, double(L)}
                                            : detail::nice_domain(ex.empty() ? 0 : ex.lo, ex.empty() ? 1 : ex.hi);
    std::array<double, 2> yd = opt.y_domain ? *opt.y_domain
                                            : detail::nice_domain(ey.empty() ? 0 : ey.lo, ey.empty() ? 1 : ey.hi);
    detail::scale const sx{xd[0], xd[1], f.left, f.width - f.right};
    detail::scale const sy{yd[0], yd[1], f.height - f.bottom, f.top};
    std::string sub = detail::plural(m.heads.size(), "head") + "; thin: one head, thick: mean over heads";
    if (n_missing > 0) sub += "; " + std::to_string(n_missing) + " n/a buckets shown as gaps";
    detail::svg_doc doc(f, "Plasticity profile — " + m.model, sub);
    doc.begin_plot(sx, sy, detail::ticks(xd[0], xd[1], 6), detail::ticks(yd[0], yd[1], 5),
                   "query bucket position τ_b (tokens)", "AP_b (mean PP)");
    // Per-bucket mean over heads (finite AP_b only).
    struct acc {
        double tau = 0, ap = 0;
        std::int64_t n = 0;
    };
    std::map<std::int64_t, acc> mean;
    for (std::size_t k = 0; k < m.heads.size(); ++k) {
        auto const& h = m.heads[k];
        doc.gapped_path(h.tau, h.ap, sx, sy, "head", detail::palette[k % detail::palette.size()], 1.0,
                        "stroke-opacity=\"0.55\" data-head=\"" + detail::head_name(h.id) + "\"");
        for (std::size_t i = 0; i < h.ap.size(); ++i)
            if (std::isfinite(h.ap[i]) && std::isfinite(h.tau[i])) {
                auto& a = mean[h.q_bucket[i]];
                a.tau += h.tau[i];
                a.ap += h.ap[i];
                ++a.n;
            }
    }
    std::vector<double> mx, my;
    for (auto const& [b, a] : mean) {
        mx.push_back(a.tau / double(a.n));
        my.push_back(a.ap / double(a.n));
    }
    doc.gapped_path(mx, my, sx, sy, "mean", "#111111", 3.0);
    doc.end_plot();
    return doc.finish();
}

/// \brief The model's 2D heatmap (method §6, §9.13): x = query-to-midpoint
/// distance τ_b − (t_i + t_j)/2, y = inter-key distance |t_i − t_j|, colour =
/// mean PP of the cell = Σ sums / Σ counts over heads. Cells with no pair are
/// blank; the axes are cropped to the bins that hold data. A colour bar shows
/// the scale. Each drawn cell is <rect class="cell" data-value="…">.
/// \param[in] m the model's picture data (may hold no heads: an empty plot).
/// \param[in] opt frame, domains and thresholds.
/// \returns the SVG document.
inline std::string heatmap_svg(model_pictures const& m, picture_options const& opt = {}) {
    svg_frame f = opt.frame;
    double const bar_room = 90;
    svg_frame inner = f;
    inner.right += bar_room;
    auto const& hm = m.heatmap;
    Eigen::Index const nd = hm.sum.rows(), no = hm.sum.cols();
    // Crop to the occupied bins; colour domain from the finite cell means.
    Eigen::Index i0 = nd, i1 = -1, j0 = no, j1 = -1;
    detail::extent ev;
    for (Eigen::Index i = 0; i < nd; ++i)
        for (Eigen::Index j = 0; j < no; ++j)
            if (hm.count(i, j) > 0) {
                i0 = std::min(i0, i);
                i1 = std::max(i1, i);
                j0 = std::min(j0, j);
                j1 = std::max(j1, j);
                ev.add(hm.mean(i, j));
            }
    bool const any = i1 >= 0;
    std::string sub = detail::plural(static_cast<std::size_t>(hm.n_heads), "head") +
                      "; colour: mean PP per cell (sum of sums / sum of counts); blank: no pair";
    if (hm.n_heads_other_grid > 0) sub += "; " + std::to_string(hm.n_heads_other_grid) + " heads on another grid left out";
    detail::svg_doc doc(f, "Plasticity heatmap — " + m.model, sub);
    std::array<double, 2> const xd = any ? std::array<double, 2>{hm.offset_edges[static_cast<std::size_t>(j0)],
                                                                 hm.offset_edges[static_cast<std::size_t>(j1 + 1)]}
                                         : std::array<double, 2>{0.0, 1.0};
    std::array<double, 2> const yd = any ? std::array<double, 2>{hm.distance_edges[static_cast<std::size_t>(i0)],
                                                                 hm.distance_edges[static_cast<std::size_t>(i1 + 1)]}
                                         : std::array<double, 2>{0.0, 1.0};
    detail::scale const sx{xd[0], xd[1], inner.left, inner.width - inner.right};
    detail::scale const sy{yd[0], yd[1], inner.height - inner.bottom, inner.top};
    double c0 = ev.empty() ? 0.0 : ev.lo, c1 = ev.empty() ? 1.0 : ev.hi;
    if (!(c1 > c0)) {
        c0 -= 0.005;
        c1 += 0.005;
    }
    auto const colour_t = [&](double v) { return (v - c0) / (c1 - c0); };
    // Cells first, then the axes drawn over them (grid lines hidden by cells is fine).
    std::string cells;
    if (any)
        for (Eigen::Index i = i0; i <= i1; ++i)
            for (Eigen::Index j = j0; j <= j1; ++j) {
                if (hm.count(i, j) <= 0) continue;
                double const v = hm.mean(i, j);
                double const xa = sx(hm.offset_edges[static_cast<std::size_t>(j)]);
                double const xb = sx(hm.offset_edges[static_cast<std::size_t>(j + 1)]);
                double const ya = sy(hm.distance_edges[static_cast<std::size_t>(i + 1)]);
                double const yb = sy(hm.distance_edges[static_cast<std::size_t>(i)]);
                cells += "<rect class=\"cell\" x=\"" + detail::px(xa) + "\" y=\"" + detail::px(ya) + "\" width=\"" +
                         detail::px(xb - xa) + "\" height=\"" + detail::px(yb - ya) + "\" fill=\"" +
                         detail::sequential(colour_t(v)) + "\" data-value=\"" + detail::label(v, 17) +
                         "\" data-count=\"" + std::to_string(hm.count(i, j)) + "\"><title>" +
                         detail::xml_escape("distance [" + detail::label(hm.distance_edges[static_cast<std::size_t>(i)]) +
                                            ", " + detail::label(hm.distance_edges[static_cast<std::size_t>(i + 1)]) +
                                            "), offset [" +
                                            detail::label(hm.offset_edges[static_cast<std::size_t>(j)]) + ", " +
                                            detail::label(hm.offset_edges[static_cast<std::size_t>(j + 1)]) +
                                            "): mean PP " + detail::label(v) + ", " +
                                            std::to_string(hm.count(i, j)) + " pairs") +
                         "</title></rect>\n";
            }
    auto const tick_list = [](std::vector<double> const& edges, Eigen::Index a, Eigen::Index b) {
        std::vector<double> t;
        if (b < a) return t;
        auto const n = static_cast<std::size_t>(b - a + 2);
        std::size_t const stride = std::max<std::size_t>(1, (n + 7) / 8);
        for (std::size_t k = 0; k < n; k += stride) t.push_back(edges[static_cast<std::size_t>(a) + k]);
        // the last edge too, unless it would crowd the last regular tick
        if ((n - 1) % stride != 0 && 2 * ((n - 1) % stride) >= stride) t.push_back(edges[static_cast<std::size_t>(b + 1)]);
        return t;
    };
    doc.begin_plot(sx, sy, any ? tick_list(hm.offset_edges, j0, j1) : detail::ticks(0, 1),
                   any ? tick_list(hm.distance_edges, i0, i1) : detail::ticks(0, 1),
                   "query-to-midpoint distance τ_b − (t_i + t_j)/2 (tokens)", "inter-key distance |t_i − t_j| (tokens)");
    doc.raw(cells);
    if (!any) doc.text((sx.r0 + sx.r1) / 2, (sy.r0 + sy.r1) / 2, "n/a: no evaluated pairs", "middle");
    doc.end_plot();
    // Colour bar.
    double const bx = f.width - f.right - bar_room + 24, bw = 16;
    double const by0 = sy.r0, by1 = sy.r1;  // bottom, top
    doc.raw("<g class=\"colourbar\">\n");
    int const steps = 32;
    for (int s = 0; s < steps; ++s) {
        double const t = (s + 0.5) / steps;
        double const ya = by0 - (by0 - by1) * (s + 1) / steps;
        doc.rect(bx, ya, bw, (by0 - by1) / steps + 0.5, detail::sequential(t));
    }
    doc.raw("<rect x=\"" + detail::px(bx) + "\" y=\"" + detail::px(by1) + "\" width=\"" + detail::px(bw) +
            "\" height=\"" + detail::px(by0 - by1) + "\" fill=\"none\" stroke=\"#333333\"/>\n");
    for (double t : detail::ticks(c0, c1, 5)) {
        double const y = by0 - (by0 - by1) * colour_t(t);
        doc.line(bx + bw, y, bx + bw + 4, y, "#333333");
        doc.text(bx + bw + 6, y + 4, detail::label(t));
    }
    doc.text(bx + bw / 2, by1 - 8, "PP", "middle");
    doc.raw("</g>\n");
    return doc.finish();
}

/// \brief Component weights (method §4, head_component_weights.csv): per query
/// coordinate j the mean `component_weight` over heads as a bar
/// (<rect class="mean">) and the per-head spread as a min–max whisker
/// (<line class="spread">). A coordinate with no finite weight is left out.
/// \param[in] m the model's picture data (may hold no heads: an empty plot).
/// \param[in] opt frame, domains and thresholds.
/// \returns the SVG document.
inline std::string component_weights_svg(model_pictures const& m, picture_options const& opt = {}) {
    svg_frame const f = opt.frame;
    std::size_t d = 0;
    for (auto const& h : m.heads) d = std::max(d, h.component_weight.size());
    std::vector<double> mean(d, 0.0), lo(d, qkgeom::detail::nan), hi(d, qkgeom::detail::nan);
    std::vector<std::int64_t> n(d, 0);
    detail::extent ey;
    for (auto const& h : m.heads)
        for (std::size_t j = 0; j < h.component_weight.size(); ++j) {
            double const w = h.component_weight[j];
            if (!std::isfinite(w)) continue;
            mean[j] += w;
            lo[j] = n[j] == 0 ? w : std::min(lo[j], w);
            hi[j] = n[j] == 0 ? w : std::max(hi[j], w);
            ++n[j];
            ey.add(w);
        }
    for (std::size_t j = 0; j < d; ++j) mean[j] = n[j] > 0 ? mean[j] / double(n[j]) : qkgeom::detail::nan;
    std::array<double, 2> const yd =
        opt.y_domain ? *opt.y_domain : detail::nice_domain(0.0, ey.empty() ? 1.0 : std::max(ey.hi, 0.0));
    std::array<double, 2> const xd{-0.5, double(std::max<std::size_t>(d, 1)) - 0.5};
    detail::scale const sx{xd[0], xd[1], f.left, f.width - f.right};
    detail::scale const sy{yd[0], yd[1], f.height - f.bottom, f.top};
    detail::svg_doc doc(f, "Component weights — " + m.model,
                        detail::plural(m.heads.size(), "head") +
                            "; bar: mean weight over heads, whisker: min–max over heads; weights sum to 1 per head");
    std::vector<double> xt;
    if (d > 0) {
        double const step = std::max(1.0, detail::nice_step(double(d - 1), 8));
        for (double v = 0; v <= double(d - 1) + 1e-9; v += step) xt.push_back(v);
    }
    doc.begin_plot(sx, sy, xt, detail::ticks(yd[0], yd[1], 5), "query coordinate j (original basis)",
                   "component weight");
    double const bw = std::max(1.0, 0.7 * (sx(1.0) - sx(0.0)));
    double const base = sy(std::clamp(0.0, yd[0], yd[1]));
    for (std::size_t j = 0; j < d; ++j) {
        if (n[j] == 0) continue;
        double const x = sx(double(j));
        double const y = sy(mean[j]);
        doc.rect(x - bw / 2, std::min(y, base), bw, std::abs(base - y), "#4c78a8",
                 "class=\"mean\" data-component=\"" + std::to_string(j) + "\" data-value=\"" +
                     detail::label(mean[j], 17) + "\"");
        doc.line(x, sy(lo[j]), x, sy(hi[j]), "#222222", 1.0, "class=\"spread\"");
        doc.line(x - bw / 4, sy(lo[j]), x + bw / 4, sy(lo[j]), "#222222", 1.0);
        doc.line(x - bw / 4, sy(hi[j]), x + bw / 4, sy(hi[j]), "#222222", 1.0);
    }
    if (d == 0) doc.text((sx.r0 + sx.r1) / 2, (sy.r0 + sy.r1) / 2, "n/a: no heads", "middle");
    doc.end_plot();
    return doc.finish();
}

/// \brief The r_q / r_k taxonomy scatter (method §2): PC0 r_q (x) against r_k
/// (y) per head (<circle class="head">), coloured by class, with dashed lines
/// at ±low and ±high; a legend with the count per class. A head with a NaN
/// correlation is not drawn; the legend counts it as "n/a".
/// \param[in] m the model's picture data (may hold no heads: an empty plot).
/// \param[in] opt frame, domains and thresholds.
/// \returns the SVG document.
inline std::string taxonomy_svg(model_pictures const& m, picture_options const& opt = {}) {
    svg_frame f = opt.frame;
    double const legend_room = 190;
    svg_frame inner = f;
    inner.right += legend_room;
    // Square plot area.
    double const side = std::min(inner.width - inner.left - inner.right, inner.height - inner.top - inner.bottom);
    detail::scale const sx{-1.0, 1.0, inner.left, inner.left + side};
    detail::scale const sy{-1.0, 1.0, inner.top + side, inner.top};
    std::map<head_class, std::size_t> counts;
    std::size_t n_na = 0;
    for (auto const& h : m.heads) {
        ++counts[h.taxonomy];
        if (!std::isfinite(h.pc0_r_q) || !std::isfinite(h.pc0_r_k)) ++n_na;
    }
    detail::svg_doc doc(f, "Head taxonomy — " + m.model,
                        detail::plural(m.heads.size(), "head") + "; PC0 of the combined Q+K PCA; lines at ±" +
                            detail::label(opt.thresholds.low) + " (low) and ±" + detail::label(opt.thresholds.high) +
                            " (high)");
    std::vector<double> const t{-1.0, -0.5, 0.0, 0.5, 1.0};
    doc.begin_plot(sx, sy, t, t, "r_q (PC0 vs query position)", "r_k (PC0 vs key position)");
    doc.raw("<g class=\"thresholds\" stroke-dasharray=\"5 4\">\n");
    for (double s : {-1.0, 1.0})
        for (auto [v, c] : {std::pair{opt.thresholds.low, "#888888"}, std::pair{opt.thresholds.high, "#444444"}}) {
            doc.line(sx(s * v), sy.r0, sx(s * v), sy.r1, c, 1.0, "class=\"threshold\"");
            doc.line(sx.r0, sy(s * v), sx.r1, sy(s * v), c, 1.0, "class=\"threshold\"");
        }
    doc.raw("</g>\n");
    for (auto const& h : m.heads) {
        if (!std::isfinite(h.pc0_r_q) || !std::isfinite(h.pc0_r_k)) continue;
        doc.circle(sx(std::clamp(h.pc0_r_q, -1.0, 1.0)), sy(std::clamp(h.pc0_r_k, -1.0, 1.0)), 4.5,
                   detail::class_colour(h.taxonomy),
                   "class=\"head\" fill-opacity=\"0.8\" stroke=\"#ffffff\" stroke-width=\"0.8\" data-class=\"" +
                       std::string(to_string(h.taxonomy)) + "\" data-head=\"" + detail::head_name(h.id) + "\"");
    }
    doc.end_plot();
    std::vector<std::pair<std::string, std::string>> entries;
    for (auto k : taxonomy_classes) {
        auto const it = counts.find(k);
        std::size_t const c = it == counts.end() ? 0 : it->second;
        std::string name = std::string(to_string(k)) + ": " + std::to_string(c);
        if (k == head_class::undefined) name += " (n/a, not drawn)";
        entries.emplace_back(std::string(detail::class_colour(k)), name);
    }
    (void)n_na;
    doc.legend(inner.left + side + 24, inner.top + 12, entries);
    return doc.finish();
}

namespace detail {

/// Per layer (ascending; −1 for heads without one) and for the model (last
/// entry, layer = INT64_MAX): the mean over heads of the three parts of
/// AP_drop and of AP_drop, over the heads whose three parts are finite.
struct split_means {
    std::int64_t layer = 0;
    std::int64_t n_heads = 0;
    std::array<double, 3> part{0.0, 0.0, 0.0};
    double ap_drop = 0;
};

inline std::vector<split_means> split_by_layer(model_pictures const& m) {
    std::map<std::int64_t, split_means> by;
    split_means all;
    all.layer = std::numeric_limits<std::int64_t>::max();
    for (auto const& h : m.heads) {
        auto const& s = h.drop_split;
        if (!std::isfinite(s[0]) || !std::isfinite(s[1]) || !std::isfinite(s[2]) || !std::isfinite(h.ap_drop))
            continue;
        for (split_means* e : {&by[h.id.layer], &all}) {
            for (std::size_t k = 0; k < 3; ++k) e->part[k] += s[k];
            e->ap_drop += h.ap_drop;
            ++e->n_heads;
        }
    }
    std::vector<split_means> out;
    for (auto& [layer, e] : by) {
        e.layer = layer;
        out.push_back(e);
    }
    out.push_back(all);
    for (auto& e : out) {
        if (e.n_heads == 0) continue;
        for (auto& v : e.part) v /= double(e.n_heads);
        e.ap_drop /= double(e.n_heads);
    }
    return out;
}

}  // namespace detail

/// \brief The split of AP_drop (docs/beyond-split.md) per layer and for the
/// model: per layer a stacked bar of the mean bias part, content part and
/// both-removed remainder over the layer's heads (<rect class="part"
/// data-part="bias|content|neither" data-value>; positive parts stack up from
/// 0, negative parts down), and a marker at the mean AP_drop (<circle
/// class="total">), which the three parts sum to. The last bar ("all") is the
/// model. Heads whose parts are not all finite are left out (the subtitle
/// counts the heads drawn).
/// \param[in] m the model's picture data (may hold no heads: an empty plot).
/// \param[in] opt frame and y domain.
/// \returns the SVG document.
inline std::string split_svg(model_pictures const& m, picture_options const& opt = {}) {
    svg_frame f = opt.frame;
    double const legend_room = 150;
    svg_frame inner = f;
    inner.right += legend_room;
    auto const groups = detail::split_by_layer(m);
    detail::extent ey;
    ey.add(0.0);
    for (auto const& g : groups) {
        if (g.n_heads == 0) continue;
        double up = 0, down = 0;
        for (double v : g.part) (v > 0 ? up : down) += v;
        ey.add(up);
        ey.add(down);
        ey.add(g.ap_drop);
    }
    std::array<double, 2> const yd = opt.y_domain ? *opt.y_domain : detail::nice_domain(ey.lo, ey.hi);
    double const nb = double(groups.size());
    detail::scale const sx{-0.5, nb - 0.5, inner.left, inner.width - inner.right};
    detail::scale const sy{yd[0], yd[1], inner.height - inner.bottom, inner.top};
    detail::svg_doc doc(f, "Where AP_drop comes from — " + m.model,
                        detail::plural(std::size_t(groups.back().n_heads), "head") +
                            "; per layer the mean bias part, content part and remainder; dot: mean AP_drop");
    std::vector<double> xt;
    double const step = std::max(1.0, detail::nice_step(std::max(1.0, nb - 1), 10));
    for (double v = 0; v <= nb - 2 + 1e-9; v += step) xt.push_back(v);
    doc.begin_plot(sx, sy, xt, detail::ticks(yd[0], yd[1], 5), "layer (last bar: all heads)",
                   "AP_drop and its parts");
    static constexpr std::array<std::string_view, 3> names{"bias", "content", "neither"};
    static constexpr std::array<std::string_view, 3> colours{"#d62728", "#1f77b4", "#bbbbbb"};
    double const bw = std::max(2.0, 0.7 * (sx(1.0) - sx(0.0)));
    for (std::size_t i = 0; i < groups.size(); ++i) {
        auto const& g = groups[i];
        double const x = sx(double(i));
        if (i + 1 == groups.size()) doc.text(x, sy.r0 + 30, "all", "middle", "class=\"all\"");
        if (g.n_heads == 0) continue;
        double up = 0, down = 0;
        for (std::size_t k = 0; k < 3; ++k) {
            double const v = g.part[k];
            double& at = v > 0 ? up : down;
            double const y0 = sy(at), y1 = sy(at + v);
            at += v;
            doc.rect(x - bw / 2, std::min(y0, y1), bw, std::abs(y1 - y0), colours[k],
                     "class=\"part\" data-part=\"" + std::string(names[k]) + "\" data-layer=\"" +
                         (i + 1 == groups.size() ? std::string("all") : std::to_string(g.layer)) +
                         "\" data-value=\"" + detail::label(v, 17) + "\"");
        }
        doc.circle(x, sy(g.ap_drop), 3.5, "#000000",
                   "class=\"total\" data-value=\"" + detail::label(g.ap_drop, 17) + "\"");
    }
    doc.line(sx.r0, sy(0.0), sx.r1, sy(0.0), "#333333", 1.0, "class=\"zero\"");
    doc.end_plot();
    doc.legend(inner.width - inner.right + 20, inner.top + 12,
               {{std::string(colours[0]), "bias part"},
                {std::string(colours[1]), "content part"},
                {std::string(colours[2]), "remainder (neither)"},
                {"#000000", "AP_drop"}});
    return doc.finish();
}

namespace detail {

/// The mean over heads of the RoPE band shares (rope_bands_svg): per band
/// the three shares' means over the heads where each is finite, and the
/// bands' wavelength ranges (of the first head with bands). Heads with
/// another band layout (count or rotary flags) are counted in `other`.
struct band_means {
    std::vector<band_picture> mean;              // the wavelengths of the first head, the shares' means
    std::vector<std::array<std::int64_t, 3>> n;  // heads per band and share
    std::int64_t heads = 0, other = 0;
};

inline band_means mean_bands(model_pictures const& m) {
    band_means out;
    for (auto const& h : m.heads) {
        if (h.rope_bands.empty()) continue;
        if (out.heads == 0 && out.other == 0) {
            out.mean = h.rope_bands;
            out.n.assign(h.rope_bands.size(), {0, 0, 0});
            for (auto& b : out.mean) b.content_var_share = b.v_share_first_20pct = b.v_share_last_20pct = 0;
        }
        bool same = h.rope_bands.size() == out.mean.size();
        for (std::size_t k = 0; same && k < out.mean.size(); ++k) same = h.rope_bands[k].rotary == out.mean[k].rotary;
        if (!same) {
            ++out.other;
            continue;
        }
        ++out.heads;
        for (std::size_t k = 0; k < out.mean.size(); ++k) {
            auto const& b = h.rope_bands[k];
            double const v[3] = {b.content_var_share, b.v_share_first_20pct, b.v_share_last_20pct};
            double* const acc[3] = {&out.mean[k].content_var_share, &out.mean[k].v_share_first_20pct,
                                    &out.mean[k].v_share_last_20pct};
            for (std::size_t j = 0; j < 3; ++j)
                if (std::isfinite(v[j])) *acc[j] += v[j], ++out.n[k][j];
        }
    }
    for (std::size_t k = 0; k < out.mean.size(); ++k) {
        double* const acc[3] = {&out.mean[k].content_var_share, &out.mean[k].v_share_first_20pct,
                                &out.mean[k].v_share_last_20pct};
        for (std::size_t j = 0; j < 3; ++j) *acc[j] = out.n[k][j] > 0 ? *acc[j] / double(out.n[k][j]) : qkgeom::detail::nan;
    }
    return out;
}

/// A wavelength in tokens, short: one decimal below 10, then whole numbers,
/// k and M for thousands and millions ("6.3", "15", "2.5k", "63k", "1.2M").
inline std::string tokens_short(double x) {
    if (!std::isfinite(x)) return "inf";
    std::string_view unit;
    if (x >= 1e6) x /= 1e6, unit = "M";
    else if (x >= 1e3) x /= 1e3, unit = "k";
    std::array<char, 32> buf{};
    auto const r = std::to_chars(buf.data(), buf.data() + buf.size(), x, std::chars_format::fixed, x < 10 ? 1 : 0);
    return std::string(buf.data(), r.ptr) + std::string(unit);
}

/// "a–b" (wavelengths in tokens) for a rotary band, "unrotated" otherwise.
inline std::string band_label(band_picture const& b) {
    if (!b.rotary) return "unrotated";
    return tokens_short(b.wavelength_lo) + "–" + tokens_short(b.wavelength_hi);
}

}  // namespace detail

/// \brief Which frequencies carry content (docs/beyond-rope.md): per RoPE
/// frequency band (x, high → low frequency; under each band its wavelength
/// range in tokens) three bars, each the mean over heads of one share: the
/// queries' content variance (content_var_share), and the score-difference
/// variance v of the first- and last-quintile query buckets
/// (v_share_first_20pct, v_share_last_20pct). <rect class="share"
/// data-share="content|v_first|v_last" data-band data-value>. Heads without
/// RoPE settings have no bands and are not drawn; heads with another band
/// layout than the first are left out (both counted in the subtitle); with
/// no bands at all the plot is empty and says so.
/// \param[in] m the model's picture data.
/// \param[in] opt frame and y domain (default [0, 1]).
/// \returns the SVG document.
inline std::string rope_bands_svg(model_pictures const& m, picture_options const& opt = {}) {
    svg_frame f = opt.frame;
    svg_frame inner = f;
    inner.right += 190;
    inner.bottom += 26;  // the wavelength labels (two rows)
    auto const bm = detail::mean_bands(m);
    std::size_t const nb = bm.mean.size();
    std::array<double, 2> const yd = opt.y_domain ? *opt.y_domain : std::array<double, 2>{0.0, 1.0};
    detail::scale const sx{-0.5, std::max(1.0, double(nb)) - 0.5, inner.left, inner.width - inner.right};
    detail::scale const sy{yd[0], yd[1], inner.height - inner.bottom, inner.top};
    std::int64_t const without = std::int64_t(m.heads.size()) - bm.heads - bm.other;
    std::string sub = nb == 0 ? "no head has RoPE settings (the capture's manifest records none): nothing to show"
                              : detail::plural(std::size_t(bm.heads), "head") + " with RoPE bands; bar: mean share over heads";
    if (nb != 0 && without > 0) sub += "; " + std::to_string(without) + " without RoPE settings";
    if (bm.other > 0) sub += "; " + std::to_string(bm.other) + " with another band layout left out";
    detail::svg_doc doc(f, "Which frequencies carry content — " + m.model, sub);
    std::vector<double> xt;
    for (std::size_t k = 0; k < nb; ++k) xt.push_back(double(k));
    doc.begin_plot(sx, sy, xt, detail::ticks(yd[0], yd[1], 5),
                   "RoPE band (high → low frequency; wavelength range in tokens)", "share");
    static constexpr std::array<std::string_view, 3> names{"content", "v_first", "v_last"};
    static constexpr std::array<std::string_view, 3> colours{"#7f7f7f", "#1f77b4", "#d62728"};
    double const gw = 0.8 * (sx(1.0) - sx(0.0)), bw = gw / 3;
    for (std::size_t k = 0; k < nb; ++k) {
        auto const& b = bm.mean[k];
        double const x = sx(double(k));
        // labels alternate between two rows so that neighbours never overlap
        doc.text(x, sy.r0 + 31 + double(k % 2) * 12, detail::band_label(b), "middle",
                 "class=\"band-label\" font-size=\"10\"");
        double const v[3] = {b.content_var_share, b.v_share_first_20pct, b.v_share_last_20pct};
        for (std::size_t j = 0; j < 3; ++j) {
            if (!std::isfinite(v[j])) continue;
            double const y0 = sy(std::clamp(0.0, yd[0], yd[1])), y1 = sy(std::clamp(v[j], yd[0], yd[1]));
            doc.rect(x - gw / 2 + double(j) * bw, std::min(y0, y1), bw, std::abs(y1 - y0), colours[j],
                     "class=\"share\" data-share=\"" + std::string(names[j]) + "\" data-band=\"" + std::to_string(k) +
                         "\" data-value=\"" + detail::label(v[j], 17) + "\"");
        }
    }
    doc.end_plot();
    doc.legend(inner.width - inner.right + 20, inner.top + 12,
               {{std::string(colours[0]), "content variance (queries)"},
                {std::string(colours[1]), "v, first 20% of positions"},
                {std::string(colours[2]), "v, last 20% of positions"}});
    return doc.finish();
}

/// \brief Do heads that share a key head agree (docs/beyond-gqa.md): per
/// layer (x; the last position "all" is the model row) and per metric
/// (profile, ap_drop, bias_strength: one line each) log10 of the GQA ratio
/// MS_within / MS_between of gqa_groups.csv: 0 means no group effect, below
/// 0 the heads of a group are more alike than heads of different groups.
/// <circle class="ratio" data-metric data-layer data-value> with data-value
/// the ratio itself; rows whose status is not "ok" or whose ratio is 0 or
/// infinite are gaps (the subtitle counts them).
/// \param[in] m the model's picture data (its `gqa` rows).
/// \param[in] opt frame and y domain (log10 units).
/// \returns the SVG document.
inline std::string gqa_svg(model_pictures const& m, picture_options const& opt = {}) {
    svg_frame f = opt.frame;
    svg_frame inner = f;
    inner.right += 150;
    std::int64_t last = -1;  // the largest layer; "all" goes one to its right
    for (auto const& r : m.gqa) last = std::max(last, r.layer);
    auto const pos = [&](std::int64_t layer) { return double(layer < 0 ? last + 1 : layer); };
    detail::extent ey;
    ey.add(0.0);
    std::size_t drawn = 0, gaps = 0;
    auto const finite_ratio = [](gqa_metric_row const& r) {
        return r.status == "ok" && std::isfinite(r.ratio) && r.ratio > 0;
    };
    for (auto const& r : m.gqa) {
        if (!finite_ratio(r)) {
            ++gaps;
            continue;
        }
        ey.add(std::log10(r.ratio));
        ++drawn;
    }
    std::array<double, 2> const yd = opt.y_domain ? *opt.y_domain : detail::nice_domain(ey.lo, ey.hi);
    double const nx = double(last + 2);  // layers 0 … last, then "all"
    detail::scale const sx{-0.5, nx - 0.5, inner.left, inner.width - inner.right};
    detail::scale const sy{yd[0], yd[1], inner.height - inner.bottom, inner.top};
    std::string const sub = m.gqa.empty() ? std::string("no GQA rows (heads without layer / key-head ids?): nothing to show")
                                          : std::to_string(drawn) + " ratios drawn, " + std::to_string(gaps) +
                                                " without one (status not ok, or 0 / inf); 0 = no group effect";
    detail::svg_doc doc(f, "Do heads sharing a key head agree — " + m.model, sub);
    std::vector<double> xt;
    double const step = std::max(1.0, detail::nice_step(std::max(1.0, nx - 2), 10));
    for (double v = 0; v <= nx - 2 + 1e-9; v += step) xt.push_back(v);
    doc.begin_plot(sx, sy, xt, detail::ticks(yd[0], yd[1], 5), "layer (last: all layers)",
                   "log10 MS_within / MS_between");
    doc.text(sx(nx - 1), sy.r0 + 18, "all", "middle", "class=\"all\"");
    doc.line(sx.r0, sy(0.0), sx.r1, sy(0.0), "#333333", 1.0, "class=\"zero\"");
    std::vector<std::pair<std::string, std::string>> entries;
    for (std::size_t k = 0; k < gqa_metric_names.size(); ++k) {
        std::string const metric(gqa_metric_names[k]);
        std::string const colour(detail::palette[k % detail::palette.size()]);
        std::vector<double> xs, ys;
        for (auto const& r : m.gqa) {
            if (r.metric != metric || r.layer < 0) continue;
            xs.push_back(pos(r.layer));
            ys.push_back(finite_ratio(r) ? std::log10(r.ratio) : qkgeom::detail::nan);
        }
        doc.gapped_path(xs, ys, sx, sy, "metric", colour, 2.0, "data-metric=\"" + metric + "\"");
        for (auto const& r : m.gqa) {
            if (r.metric != metric || !finite_ratio(r)) continue;
            doc.circle(sx(pos(r.layer)), sy(std::log10(r.ratio)), 4.0, colour,
                       "class=\"ratio\" data-metric=\"" + metric + "\" data-layer=\"" +
                           (r.layer < 0 ? std::string("all") : std::to_string(r.layer)) + "\" data-value=\"" +
                           detail::label(r.ratio, 17) + "\"");
        }
        entries.emplace_back(colour, metric);
    }
    doc.end_plot();
    doc.legend(inner.width - inner.right + 20, inner.top + 12, entries, true);
    return doc.finish();
}

/// \brief Model comparison (method §6 "Model level"): the decile AP profile
/// averaged over heads, one line per model (<path class="model">) with a
/// marker per finite decile; x = decile centre as a fraction of the context
/// length. A NaN decile is a gap. `models` are the model_report.csv rows.
/// \param[in] models the models, one line (and palette colour) each, in order.
/// \param[in] opt frame and y domain.
/// \returns the SVG document.
inline std::string model_comparison_svg(std::span<model_entry const> models, picture_options const& opt = {}) {
    svg_frame f = opt.frame;
    double const legend_room = 150;
    svg_frame inner = f;
    inner.right += legend_room;
    detail::extent ey;
    for (auto const& m : models)
        for (double v : m.summary.ap_decile) ey.add(v);
    std::array<double, 2> const yd =
        opt.y_domain ? *opt.y_domain : detail::nice_domain(ey.empty() ? 0 : ey.lo, ey.empty() ? 1 : ey.hi);
    detail::scale const sx{0.0, 1.0, inner.left, inner.width - inner.right};
    detail::scale const sy{yd[0], yd[1], inner.height - inner.bottom, inner.top};
    detail::svg_doc doc(f, "Model comparison — decile AP profiles",
                        detail::plural(models.size(), "model") +
                            "; each point: AP averaged over the query buckets of a context decile, then over heads");
    doc.begin_plot(sx, sy, {0.0, 0.2, 0.4, 0.6, 0.8, 1.0}, detail::ticks(yd[0], yd[1], 5),
                   "query position τ_b / context length L (decile centres)", "AP (mean PP)");
    std::vector<std::pair<std::string, std::string>> entries;
    for (std::size_t k = 0; k < models.size(); ++k) {
        auto const& m = models[k];
        std::string const colour(detail::palette[k % detail::palette.size()]);
        std::vector<double> xs, ys(m.summary.ap_decile.begin(), m.summary.ap_decile.end());
        for (std::size_t i = 0; i < ys.size(); ++i) xs.push_back((double(i) + 0.5) / double(ys.size()));
        doc.gapped_path(xs, ys, sx, sy, "model", colour, 2.5, "data-model=\"" + detail::xml_escape(m.model) + "\"");
        for (std::size_t i = 0; i < ys.size(); ++i)
            if (std::isfinite(ys[i])) doc.circle(sx(xs[i]), sy(ys[i]), 3.5, colour, "class=\"marker\"");
        entries.emplace_back(colour, m.model);
    }
    doc.end_plot();
    doc.legend(inner.width - inner.right + 20, inner.top + 12, entries, true);
    return doc.finish();
}

// --- files ------------------------------------------------------------------

namespace detail {
inline void write_text_file(std::filesystem::path const& path, std::string_view fn, std::string const& text) {
    to_file(path, fn, [&](std::ostream& os) { os.write(text.data(), static_cast<std::streamsize>(text.size())); });
}
}  // namespace detail

/// \brief A picture written to disk: its file name (relative to the report
/// directory) and the alt text / caption an HTML page shows with it.
struct picture_file {
    std::filesystem::path path;  ///< where it was written
    std::string file;            ///< file name, e.g. "plasticity_profile.svg"
    std::string alt;             ///< one-line description
    double width = 0, height = 0;  ///< the canvas size (picture_options::frame)
};

/// \brief Write the seven per-model pictures into `out_dir` (which must
/// exist): plasticity_profile.svg, plasticity_heatmap.svg,
/// component_weights.svg, taxonomy_scatter.svg, plasticity_split.svg,
/// rope_bands.svg, gqa_groups.svg.
/// Existing files are overwritten.
/// \param[in] out_dir the directory; it must exist (it is not created).
/// \param[in] m the model's picture data.
/// \param[in] opt frame, domains and thresholds, used for all seven.
/// \returns the seven files, in that order.
/// \throws std::runtime_error naming a file that cannot be opened or written
///         (files written before it are left in place).
inline std::vector<picture_file> write_pictures(std::filesystem::path const& out_dir, model_pictures const& m,
                                                picture_options const& opt = {}) {
    std::vector<picture_file> out;
    auto const one = [&](std::string_view file, std::string const& svg, std::string alt) {
        auto const p = out_dir / std::string(file);
        detail::write_text_file(p, "qkgeom::report::write_pictures", svg);
        out.push_back({p, std::string(file), std::move(alt), opt.frame.width, opt.frame.height});
    };
    one(profile_svg_file, profile_svg(m, opt),
        "Plasticity profile of " + m.model + ": AP_b against bucket position per head, with the mean over heads");
    one(heatmap_svg_file, heatmap_svg(m, opt),
        "Plasticity heatmap of " + m.model + ": mean PP by inter-key distance and query-to-midpoint distance");
    one(component_weights_svg_file, component_weights_svg(m, opt),
        "Component weights of " + m.model + ": mean and min-max over heads per query coordinate");
    one(taxonomy_svg_file, taxonomy_svg(m, opt),
        "Head taxonomy of " + m.model + ": PC0 r_q against r_k per head with the threshold lines");
    one(split_svg_file, split_svg(m, opt),
        "Split of AP_drop of " + m.model + ": bias part, content part and remainder per layer and for the model");
    one(rope_bands_svg_file, rope_bands_svg(m, opt),
        "RoPE bands of " + m.model + ": per frequency band its share of content variance and of v, early and late");
    one(gqa_svg_file, gqa_svg(m, opt),
        "GQA groups of " + m.model + ": within-group / between-group variance ratio per layer and metric");
    return out;
}

/// \brief Write model_comparison.svg (one line per model) to `path`.
/// \param[in] path the file, created or truncated (conventionally named
///            model_comparison_svg_file).
/// \param[in] models the models, as model_comparison_svg.
/// \param[in] opt frame and y domain.
/// \returns the file's entry (file = path's file name; alt lists the models).
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline picture_file write_model_comparison(std::filesystem::path const& path, std::span<model_entry const> models,
                                           picture_options const& opt = {}) {
    detail::write_text_file(path, "qkgeom::report::write_model_comparison", model_comparison_svg(models, opt));
    std::string names;
    for (auto const& m : models) names += (names.empty() ? "" : ", ") + m.model;
    return {path, path.filename().string(), "Model comparison of the decile AP profiles: " + names, opt.frame.width,
            opt.frame.height};
}

}  // namespace qkgeom::report
