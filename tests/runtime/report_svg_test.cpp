// SVG pictures and index.html (method §7, docs/pictures.md): well-formed XML,
// one element per head / bucket / cell, planted values at the documented
// pixel coordinates, NaN never drawn at 0, text escaped, heatmap colours
// ordered like the values, a self-contained page. The heads are built by hand
// (no analysis runs here) to keep this translation unit light.
#include "temp_dir.hpp"
#include "xml_check.hpp"

#include <qkgeom/report/html.hpp>
#include <qkgeom/report/svg.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_report_svg_test {

namespace {

namespace rep = qkgeom::report;
namespace fs = std::filesystem;
using strings = std::vector<std::string>;
constexpr double NaN = std::numeric_limits<double>::quiet_NaN();

using qkgeom_test::attr, qkgeom_test::elements, qkgeom_test::xml_error;  // xml_check.hpp (tested below)

/// The coordinates of a path `d` (M/L commands; "l0 0" adds none).
struct path_data {
    std::vector<std::pair<double, double>> pts;
    int subpaths = 0;
};
path_data parse_d(std::string const& d) {
    path_data out;
    std::istringstream in(d);
    std::string tok;
    while (in >> tok) {
        if (tok[0] == 'M' || tok[0] == 'L') {
            if (tok[0] == 'M') ++out.subpaths;
            double const x = std::stod(tok.substr(1));
            std::string ys;
            in >> ys;
            out.pts.emplace_back(x, std::stod(ys));
        } else if (tok == "l0") {
            in >> tok;  // "0"
        }
    }
    return out;
}

double luminance(std::string const& hex) {
    REQUIRE(hex.size() == 7);
    auto const c = [&](int k) { return std::stoi(hex.substr(1 + 2 * k, 2), nullptr, 16) / 255.0; };
    return 0.2126 * c(0) + 0.7152 * c(1) + 0.0722 * c(2);
}

std::size_t count(std::string const& s, std::string const& what) {
    std::size_t n = 0;
    for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
}

// --- hand-made heads -------------------------------------------------------
qkgeom::head_analysis make_head(std::int64_t q_head, std::vector<double> const& tau, std::vector<double> const& ap) {
    qkgeom::head_analysis h;
    h.id = {0, q_head, q_head / 2};
    for (std::size_t i = 0; i < tau.size(); ++i) {
        qkgeom::plasticity_bucket b;
        b.q_bucket = static_cast<std::int64_t>(i) + 1;
        b.tau = tau[i];
        b.ap = ap[i];
        h.plasticity.profile.push_back(b);
    }
    h.plasticity.context_length = 1000;
    return h;
}

/// The pixel position of data (x, y) in a plot with the default frame and
/// the given domains (the mapping documented in svg.hpp).
std::pair<double, double> pixel(double x, double y, std::array<double, 2> xd, std::array<double, 2> yd,
                                double extra_right = 0) {
    rep::svg_frame const f;
    double const px = f.left + (x - xd[0]) / (xd[1] - xd[0]) * (f.width - f.left - f.right - extra_right);
    double const py = f.top + (yd[1] - y) / (yd[1] - yd[0]) * (f.height - f.top - f.bottom);
    return {px, py};
}

struct temp_dir : qkgeom_test::temp_dir {  // tests/runtime/temp_dir.hpp
    temp_dir() : qkgeom_test::temp_dir("qkgeom_svg_test_") {}
};

}  // namespace

TEST_CASE("report.svg: the XML checker rejects what it must", "[report][svg]") {
    CHECK(xml_error("<a><b/><c x=\"1\">t &amp; u</c></a>").empty());
    CHECK_FALSE(xml_error("<a><b></a></b>").empty());
    CHECK_FALSE(xml_error("<a>x & y</a>").empty());
    CHECK_FALSE(xml_error("<a x=\"1>").empty());
    CHECK_FALSE(xml_error("<a x=\"<\"/>").empty());
    CHECK_FALSE(xml_error("<a/><b/>").empty());
    CHECK_FALSE(xml_error("<a x=\"1\" x=\"2\"/>").empty());
    CHECK_FALSE(xml_error("<a>").empty());
}

TEST_CASE("report.svg: profile lines per head, planted pixel, NaN as a gap", "[report][svg]") {
    std::vector<double> const tau{100, 300, 500, 700, 900};
    std::vector<qkgeom::head_analysis> hs{make_head(0, tau, {0.9, 0.8, 0.25, 0.6, 0.5}),
                                          make_head(1, tau, {0.7, 0.6, NaN, 0.4, 0.3}),
                                          make_head(2, tau, {0.5, 0.4, 0.75, 0.2, 0.1})};
    auto const m = rep::collect_pictures("model <x> & \"y\"", hs);
    rep::picture_options opt;
    opt.y_domain = {0.0, 1.0};
    opt.x_domain = {0.0, 1000.0};
    std::string const svg = rep::profile_svg(m, opt);
    INFO(svg);
    REQUIRE(xml_error(svg).empty());
    CHECK(svg.find("viewBox=\"0 0 720 440\"") != std::string::npos);
    CHECK(svg.find("model &lt;x&gt; &amp; &quot;y&quot;") != std::string::npos);
    CHECK(svg.find("model <x>") == std::string::npos);

    auto const heads = elements(svg, "path", "head");
    REQUIRE(heads.size() == 3);
    auto const d0 = parse_d(attr(heads[0], "d")), d1 = parse_d(attr(heads[1], "d"));
    CHECK(d0.pts.size() == 5);
    CHECK(d0.subpaths == 1);
    CHECK(d1.pts.size() == 4);  // the NaN bucket is no point ...
    CHECK(d1.subpaths == 2);    // ... but a gap
    double const y_zero = pixel(0, 0, *opt.x_domain, *opt.y_domain).second;
    for (auto const& [x, y] : d1.pts) CHECK(std::abs(y - y_zero) > 1);  // never at AP = 0
    // The planted AP = 0.25 at τ = 500: half way across, 3/4 down the plot.
    auto const [px, py] = pixel(500, 0.25, *opt.x_domain, *opt.y_domain);
    CHECK(d0.pts[2].first == Approx(px).margin(0.006));
    CHECK(d0.pts[2].second == Approx(py).margin(0.006));
    CHECK(px == Approx(76 + 0.5 * (720 - 76 - 24)));
    CHECK(py == Approx(52 + 0.75 * (440 - 52 - 60)));

    // The mean: bucket 3 averages heads 0 and 2 only (0.5), not the NaN as 0.
    auto const mean = elements(svg, "path", "mean");
    REQUIRE(mean.size() == 1);
    auto const dm = parse_d(attr(mean[0], "d"));
    REQUIRE(dm.pts.size() == 5);
    CHECK(dm.pts[2].second == Approx(pixel(500, 0.5, *opt.x_domain, *opt.y_domain).second).margin(0.006));
    CHECK(dm.pts[0].second == Approx(pixel(100, 0.7, *opt.x_domain, *opt.y_domain).second).margin(0.006));

    // Automatic domains contain every finite value.
    std::string const auto_svg = rep::profile_svg(m);
    REQUIRE(xml_error(auto_svg).empty());
    auto const plot = elements(auto_svg, "g", "plot");
    REQUIRE(plot.size() == 1);
    std::istringstream yd(attr(plot[0], "data-y-domain"));
    double y0 = 0, y1 = 0;
    yd >> y0 >> y1;
    CHECK(y0 <= 0.1);
    CHECK(y1 >= 0.9);
}

TEST_CASE("report.svg: isolated and all-NaN profiles", "[report][svg]") {
    std::vector<qkgeom::head_analysis> hs{make_head(0, {100, 300, 500}, {NaN, 0.5, NaN}),
                                          make_head(1, {100, 300, 500}, {NaN, NaN, NaN})};
    auto const m = rep::collect_pictures("m", hs);
    std::string const svg = rep::profile_svg(m);
    REQUIRE(xml_error(svg).empty());
    auto const heads = elements(svg, "path", "head");
    REQUIRE(heads.size() == 2);
    auto const d0 = parse_d(attr(heads[0], "d"));
    CHECK(d0.pts.size() == 1);
    CHECK(attr(heads[0], "d").find("l0 0") != std::string::npos);  // drawn as a dot
    CHECK(parse_d(attr(heads[1], "d")).pts.empty());
    CHECK(svg.find("5 n/a buckets") != std::string::npos);
}

TEST_CASE("report.svg: heatmap cells are sum of sums over sum of counts, colours follow values", "[report][svg]") {
    auto const head = [](std::vector<double> const& sums, std::vector<std::int64_t> const& counts) {
        qkgeom::head_analysis h;
        auto& hm = h.plasticity.heatmap;
        hm.distance_edges = {0, 10, 20};
        hm.offset_edges = {-30, 0, 30, 60};
        hm.sum.resize(2, 3);
        hm.count.resize(2, 3);
        for (int k = 0; k < 6; ++k) {
            hm.sum(k / 3, k % 3) = sums[static_cast<std::size_t>(k)];
            hm.count(k / 3, k % 3) = counts[static_cast<std::size_t>(k)];
        }
        return h;
    };
    // Cell (0,0) is empty in both heads -> blank; the others get distinct means.
    std::vector<qkgeom::head_analysis> hs{head({0, 0.5, 1.2, 0.3, 2.0, 0.9}, {0, 1, 2, 1, 4, 1}),
                                          head({0, 0.4, 0.6, 0.1, 0.0, 0.8}, {0, 1, 1, 1, 0, 1})};
    qkgeom::head_analysis other = head({1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1});
    other.plasticity.heatmap.offset_edges = {-30, 0, 30, 90};  // another grid: left out, counted
    hs.push_back(other);
    auto const m = rep::collect_pictures("m", hs);
    CHECK(m.heatmap.n_heads == 2);
    CHECK(m.heatmap.n_heads_other_grid == 1);
    std::string const svg = rep::heatmap_svg(m);
    INFO(svg);
    REQUIRE(xml_error(svg).empty());
    auto const cells = elements(svg, "rect", "cell");
    REQUIRE(cells.size() == 5);
    std::map<std::pair<double, double>, double> by_pos;  // (x, y) -> value
    std::vector<std::pair<double, double>> value_lum;
    for (auto const& c : cells) {
        double const v = std::stod(attr(c, "data-value"));
        CHECK(std::isfinite(v));
        value_lum.emplace_back(v, luminance(attr(c, "fill")));
        by_pos[{std::stod(attr(c, "x")), std::stod(attr(c, "y"))}] = v;
    }
    std::vector<double> values;
    for (auto const& [v, l] : value_lum) values.push_back(v);
    std::sort(values.begin(), values.end());
    // (0.5+0.4)/2, (1.2+0.6)/3, (0.3+0.1)/2, 2.0/4, (0.9+0.8)/2
    std::vector<double> expect{0.2, 0.45, 0.5, 0.6, 0.85};
    REQUIRE(values.size() == expect.size());
    for (std::size_t k = 0; k < values.size(); ++k) CHECK(values[k] == Approx(expect[k]).epsilon(1e-12));
    std::sort(value_lum.begin(), value_lum.end());
    for (std::size_t k = 1; k < value_lum.size(); ++k) CHECK(value_lum[k].second > value_lum[k - 1].second);
    CHECK(svg.find("1 heads on another grid left out") != std::string::npos);
    // The lowest-distance, lowest-offset bin is empty: no rect at that corner.
    CHECK(svg.find("class=\"colourbar\"") != std::string::npos);
}

TEST_CASE("report.svg: the sequential colour scale is monotone in luminance", "[report][svg]") {
    double prev = -1;
    for (int k = 0; k <= 100; ++k) {
        double const l = luminance(rep::detail::sequential(k / 100.0));
        CHECK(l > prev);
        prev = l;
    }
    CHECK(rep::detail::sequential(NaN) == rep::detail::sequential(0.0));
}

TEST_CASE("report.svg: component weights mean and spread per coordinate", "[report][svg]") {
    qkgeom::head_analysis a, b;
    a.householder.component_weight = Eigen::Vector4d(0.1, 0.2, 0.3, 0.4);
    b.householder.component_weight = Eigen::Vector3d(0.3, NaN, 0.5);
    std::vector<qkgeom::head_analysis> hs{a, b};
    auto const m = rep::collect_pictures("m", hs);
    rep::picture_options opt;
    opt.y_domain = {0.0, 1.0};
    std::string const svg = rep::component_weights_svg(m, opt);
    REQUIRE(xml_error(svg).empty());
    auto const bars = elements(svg, "rect", "mean");
    REQUIRE(bars.size() == 4);
    std::vector<double> const expect{0.2, 0.2, 0.4, 0.4};  // NaN weight left out of the mean
    for (std::size_t j = 0; j < 4; ++j) {
        CHECK(std::stod(attr(bars[j], "data-value")) == Approx(expect[j]));
        // The bar's top edge sits at the mean.
        double const top = std::stod(attr(bars[j], "y"));
        CHECK(top == Approx(pixel(0, expect[j], {0, 1}, {0, 1}).second).margin(0.006));
    }
    CHECK(elements(svg, "line", "spread").size() == 4);
}

TEST_CASE("report.svg: taxonomy scatter points, classes, thresholds, NaN left out", "[report][svg]") {
    auto const head = [](double rq, double rk) {
        qkgeom::head_analysis h;
        h.pca.pc0_r_q = rq;
        h.pca.pc0_r_k = rk;
        h.pca.taxonomy = qkgeom::classify(rq, rk);
        return h;
    };
    std::vector<qkgeom::head_analysis> hs{head(0.9, 0.8), head(0.5, -0.5), head(0.1, 0.1), head(NaN, 0.2)};
    auto const m = rep::collect_pictures("m", hs);
    std::string const svg = rep::taxonomy_svg(m);
    INFO(svg);
    REQUIRE(xml_error(svg).empty());
    auto const pts = elements(svg, "circle", "head");
    REQUIRE(pts.size() == 3);
    CHECK(attr(pts[0], "data-class") == "position_dominated");
    CHECK(attr(pts[1], "data-class") == "mixed");
    CHECK(attr(pts[2], "data-class") == "content_focused");
    CHECK(attr(pts[0], "fill") != attr(pts[2], "fill"));
    CHECK(elements(svg, "line", "threshold").size() == 8);
    CHECK(svg.find("undefined: 1") != std::string::npos);
    // (0.5, −0.5) sits at 3/4 of the square's width and 3/4 of its height.
    rep::svg_frame const f;
    double const side = std::min(f.width - f.left - f.right - 190, f.height - f.top - f.bottom);
    CHECK(std::stod(attr(pts[1], "cx")) == Approx(f.left + 0.75 * side).margin(0.006));
    CHECK(std::stod(attr(pts[1], "cy")) == Approx(f.top + 0.75 * side).margin(0.006));
}

TEST_CASE("report.svg: model comparison, one line per model, NaN deciles are gaps", "[report][svg]") {
    std::vector<rep::model_entry> models(2);
    models[0].model = "steady";
    models[1].model = "a<b & \"c\"";
    for (int i = 0; i < 10; ++i) {
        models[0].summary.ap_decile[static_cast<std::size_t>(i)] = 0.8;
        models[1].summary.ap_decile[static_cast<std::size_t>(i)] = 0.9 - 0.02 * i;
    }
    models[1].summary.ap_decile[4] = NaN;
    rep::picture_options opt;
    opt.y_domain = {0.5, 1.0};
    std::string const svg = rep::model_comparison_svg(models, opt);
    REQUIRE(xml_error(svg).empty());
    auto const lines = elements(svg, "path", "model");
    REQUIRE(lines.size() == 2);
    auto const d1 = parse_d(attr(lines[1], "d"));
    CHECK(d1.pts.size() == 9);
    CHECK(d1.subpaths == 2);
    CHECK(elements(svg, "circle", "marker").size() == 19);
    CHECK(attr(lines[1], "data-model") == "a&lt;b &amp; &quot;c&quot;");
    // Decile 0 of "steady" (0.8) at x = 0.05 of the plot (legend room 150).
    auto const d0 = parse_d(attr(lines[0], "d"));
    auto const [px, py] = pixel(0.05, 0.8, {0, 1}, {0.5, 1.0}, 150);
    CHECK(d0.pts[0].first == Approx(px).margin(0.006));
    CHECK(d0.pts[0].second == Approx(py).margin(0.006));
}

TEST_CASE("report.svg: the split of AP_drop, layer means stacked by sign, totals", "[report][svg]") {
    // Layer 0: two heads, layer 2: one head, one head with a NaN part (left out).
    auto head = [](std::int64_t layer, std::int64_t q, double bias, double content, double neither) {
        qkgeom::head_analysis h;
        h.id = {layer, q, q};
        h.plasticity.split.ap_drop_bias = bias;
        h.plasticity.split.ap_drop_content = content;
        h.plasticity.split.ap_drop_neither = neither;
        h.plasticity.ap_drop = bias + content + neither;
        return h;
    };
    std::vector<qkgeom::head_analysis> hs{head(0, 0, 0.10, 0.02, -0.01), head(0, 1, 0.30, 0.06, 0.01),
                                          head(2, 0, -0.05, 0.20, 0.0), head(2, 1, NaN, 0.1, 0.1)};
    auto const m = rep::collect_pictures("m", hs);
    rep::picture_options opt;
    opt.y_domain = {-0.1, 0.4};
    std::string const svg = rep::split_svg(m, opt);
    REQUIRE(xml_error(svg).empty());
    auto const parts = elements(svg, "rect", "part");
    REQUIRE(parts.size() == 9);  // layers 0, 2 and all, three parts each
    auto const value = [&](std::size_t i) { return std::stod(attr(parts[i], "data-value")); };
    // Layer 0: means 0.2, 0.04, 0; layer 2: −0.05, 0.2, 0; all: (0.35/3, 0.28/3, 0).
    CHECK(attr(parts[0], "data-layer") == "0");
    CHECK(value(0) == Approx(0.2));
    CHECK(value(1) == Approx(0.04));
    CHECK(value(2) == Approx(0.0).margin(1e-15));
    CHECK(attr(parts[3], "data-layer") == "2");
    CHECK(value(3) == Approx(-0.05));
    CHECK(attr(parts[8], "data-layer") == "all");
    CHECK(value(6) == Approx(0.35 / 3));
    CHECK(value(7) == Approx(0.28 / 3));
    auto const totals = elements(svg, "circle", "total");
    REQUIRE(totals.size() == 3);
    for (std::size_t g = 0; g < 3; ++g)  // the parts sum to the mean AP_drop
        CHECK(std::stod(attr(totals[g], "data-value")) == Approx(value(3 * g) + value(3 * g + 1) + value(3 * g + 2)));
    // Positive parts stack up from 0, negative parts hang below it: layer 2's
    // bias bar (−0.05) spans 0 … −0.05 and its content bar 0 … 0.2.
    double const y0 = pixel(0, 0.0, {0, 1}, {-0.1, 0.4}, 150).second;
    double const yneg = pixel(0, -0.05, {0, 1}, {-0.1, 0.4}, 150).second;
    double const ypos = pixel(0, 0.2, {0, 1}, {-0.1, 0.4}, 150).second;
    CHECK(std::stod(attr(parts[3], "y")) == Approx(y0).margin(0.006));
    CHECK(std::stod(attr(parts[3], "height")) == Approx(yneg - y0).margin(0.012));
    CHECK(std::stod(attr(parts[4], "y")) == Approx(ypos).margin(0.006));
}

TEST_CASE("report.svg: RoPE bands, per-band means over heads, layouts and NaN", "[report][svg]") {
    // Three heads with two rotary bands and the unrotated one, one head
    // without RoPE settings (no bands), one with another layout (left out).
    auto head = [](std::int64_t q, std::vector<std::array<double, 3>> const& shares, bool unrotated_last = true) {
        qkgeom::head_analysis h;
        h.id = {0, q, q};
        for (std::size_t k = 0; k < shares.size(); ++k) {
            qkgeom::rope_band b;
            b.rotary = !(unrotated_last && k + 1 == shares.size());
            b.wavelength_lo = 6.28 * std::pow(10.0, double(k));
            b.wavelength_hi = 62.8 * std::pow(10.0, double(k));
            b.content_var_share = shares[k][0];
            b.v_share_first_20pct = shares[k][1];
            b.v_share_last_20pct = shares[k][2];
            h.rope.bands.push_back(b);
        }
        return h;
    };
    std::vector<qkgeom::head_analysis> hs{
        head(0, {{0.5, 0.2, 0.1}, {0.3, 0.5, 0.6}, {0.2, 0.3, 0.3}}),
        head(1, {{0.3, 0.4, NaN}, {0.3, 0.3, 0.6}, {0.4, 0.3, 0.2}}),
        head(2, {{0.1, 0.0, 0.4}, {0.6, 0.7, 0.3}, {0.3, 0.3, 0.3}}),
        head(3, {}),
        head(4, {{0.9, 0.9, 0.9}, {0.1, 0.1, 0.1}}, false)};
    auto const m = rep::collect_pictures("m", hs);
    std::string const svg = rep::rope_bands_svg(m);
    REQUIRE(xml_error(svg).empty());
    CHECK(svg.find("3 heads with RoPE bands") != std::string::npos);
    CHECK(svg.find("1 without RoPE settings") != std::string::npos);
    CHECK(svg.find("1 with another band layout left out") != std::string::npos);
    auto const bars = elements(svg, "rect", "share");
    REQUIRE(bars.size() == 9);  // 3 bands × 3 shares (a head's NaN share is skipped, the others' mean drawn)
    std::map<std::pair<std::string, std::string>, double> v;
    for (auto const& b : bars) v[{attr(b, "data-band"), attr(b, "data-share")}] = std::stod(attr(b, "data-value"));
    CHECK(v.at({"0", "content"}) == Approx(0.3));
    CHECK(v.at({"0", "v_first"}) == Approx(0.2));
    CHECK(v.at({"0", "v_last"}) == Approx(0.25));  // the NaN of head 1 is left out of the mean, not read as 0
    CHECK(v.at({"1", "v_first"}) == Approx(0.5));
    CHECK(v.at({"2", "content"}) == Approx(0.3));
    CHECK(v.count({"2", "v_last"}) == 1);
    // the band labels: wavelength ranges of rotary bands, "unrotated" for the last
    CHECK(svg.find(">6.3–63<") != std::string::npos);
    CHECK(svg.find(">63–628<") != std::string::npos);
    CHECK(rep::detail::tokens_short(6283.2) == "6.3k");
    CHECK(rep::detail::tokens_short(62832.0) == "63k");
    CHECK(rep::detail::tokens_short(1.24e6) == "1.2M");
    CHECK(svg.find(">unrotated<") != std::string::npos);
    // bar height: share 0.5 of band 1 (v_first) spans from y(0) to y(0.5) on [0, 1]
    rep::svg_frame const f;
    double const plot_h = f.height - f.top - f.bottom - 26;
    for (auto const& b : bars)
        if (attr(b, "data-band") == "1" && attr(b, "data-share") == "v_first")
            CHECK(std::stod(attr(b, "height")) == Approx(0.5 * plot_h).margin(0.012));
    // a model without RoPE settings: an empty plot that says so
    std::vector<qkgeom::head_analysis> none{head(0, {})};
    std::string const empty = rep::rope_bands_svg(rep::collect_pictures("m", none));
    REQUIRE(xml_error(empty).empty());
    CHECK(elements(empty, "rect", "share").empty());
    CHECK(empty.find("no head has RoPE settings") != std::string::npos);
}

TEST_CASE("report.svg: GQA ratios per layer and metric, log10, gaps", "[report][svg]") {
    // Layer 0: two key heads of two query heads each; the heads of a group
    // agree on ap_drop (within spread 0.01², between 0.2²) — a ratio far below 1.
    // Layer 1: one head per key head (MHA-like) — no within df: a gap.
    auto head = [](std::int64_t layer, std::int64_t q, std::int64_t k, double ap_drop, double bias) {
        qkgeom::head_analysis h;
        h.id = {layer, q, k};
        h.plasticity.ap_drop = ap_drop;
        h.rotation.bias_strength = bias;
        return h;
    };
    std::vector<qkgeom::head_analysis> hs{head(0, 0, 0, 0.30, 1.0), head(0, 1, 0, 0.31, 3.0),
                                          head(0, 2, 1, 0.10, 2.0), head(0, 3, 1, 0.11, 2.5),
                                          head(1, 0, 0, 0.2, 1.0),  head(1, 1, 1, 0.3, 1.0)};
    auto const m = rep::collect_pictures("m", hs);
    REQUIRE_FALSE(m.gqa.empty());
    std::string const svg = rep::gqa_svg(m);
    REQUIRE(xml_error(svg).empty());
    auto const dots = elements(svg, "circle", "ratio");
    // the CSV rows are the truth: every finite positive ratio with status ok is drawn, once
    std::size_t expect = 0;
    for (auto const& r : m.gqa) {
        if (r.status != "ok" || !std::isfinite(r.ratio) || !(r.ratio > 0)) continue;
        ++expect;
        std::string const layer = r.layer < 0 ? "all" : std::to_string(r.layer);
        std::size_t found = 0;
        for (auto const& d : dots)
            if (attr(d, "data-metric") == r.metric && attr(d, "data-layer") == layer) {
                ++found;
                CHECK(std::stod(attr(d, "data-value")) == Approx(r.ratio).epsilon(1e-12));
            }
        CHECK(found == 1);
    }
    CHECK(dots.size() == expect);
    // layer 0 ap_drop: groups {0.30, 0.31}, {0.10, 0.11}: MS_within = 2·0.005²·... by hand
    // SS_within = 4 · 0.005² = 1e-4 (df 2), SS_between = 4 · 0.1² = 0.04 (df 1): ratio 5e-5/0.04
    bool seen = false;
    for (auto const& d : dots)
        if (attr(d, "data-metric") == "ap_drop" && attr(d, "data-layer") == "0") {
            seen = true;
            CHECK(std::stod(attr(d, "data-value")) == Approx(0.5e-4 / 0.04).epsilon(1e-9));
        }
    CHECK(seen);
    for (auto const& d : dots) CHECK(attr(d, "data-layer") != "1");  // layer 1: no shared key heads
    auto const lines = elements(svg, "path", "metric");
    CHECK(lines.size() == qkgeom::gqa_metric_names.size());
}

TEST_CASE("report.html: self-contained page with the table, pictures and links", "[report][html]") {
    std::vector<qkgeom::head_analysis> hs{make_head(0, {100, 300}, {0.9, 0.8})};
    temp_dir tmp;
    auto const m = rep::collect_pictures("m&m <1>", hs);
    auto const files = rep::write_pictures(tmp.path, m);
    REQUIRE(files.size() == 7);
    for (auto const& f : files) {
        std::ifstream in(f.path);
        std::string const text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        INFO(f.file);
        CHECK(xml_error(text).empty());
    }
    rep::html_page page;
    page.title = "report <x>";
    rep::html_model sec;
    sec.entry.model = "m&m <1>";
    sec.entry.summary = qkgeom::summarise_model(hs).all;
    for (auto const& f : files) sec.pictures.push_back(rep::to_html(f, "sub dir/"));
    sec.files = {"sub dir/head_metrics.csv"};
    page.models.push_back(sec);
    std::string const html = rep::index_html(page);
    INFO(html);
    CHECK(html.find("<script") == std::string::npos);
    CHECK(html.find("http") == std::string::npos);  // no external URL
    CHECK(html.find("report &lt;x&gt;") != std::string::npos);
    CHECK(html.find("m&amp;m &lt;1&gt;") != std::string::npos);
    auto const imgs = elements(html, "img");
    REQUIRE(imgs.size() == 7);
    for (auto const& i : imgs) {
        CHECK(attr(i, "src").rfind("sub%20dir/", 0) == 0);
        CHECK(attr(i, "width") == "720");
        CHECK(attr(i, "height") == "440");
        CHECK_FALSE(attr(i, "alt").empty());
    }
    CHECK(html.find("href=\"sub%20dir/head_metrics.csv\"") != std::string::npos);
    CHECK(count(html, "<tr>") == 2);  // header + one model
    CHECK(html.find("<td>n/a</td>") != std::string::npos);  // NaN means show as n/a
}

}  // namespace qkgeom_tests_report_svg_test
