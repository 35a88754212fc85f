// Study pictures and page (report/study_svg.hpp, report/study_html.hpp,
// docs/study-pictures.md): the pictures whose data is present are written
// and no others, each is well-formed XML, one mark per finite value (counted
// by class), NaN never drawn as a point, the bias decomposition's stacked
// bars add up to the dot (read back from the pixels), safe and unique file
// names, and a page that lists every picture and escapes names. The study is
// built by hand (no analysis runs here).
#include "temp_dir.hpp"
#include "xml_check.hpp"

#include <qkgeom/report/study_html.hpp>
#include <qkgeom/report/study_svg.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_study_report_test {

namespace {

// The XML checker (tested in report_svg_test.cpp) and the readers of marks.
using qkgeom_test::attr, qkgeom_test::elements, qkgeom_test::xml_error;  // xml_check.hpp

namespace rep = qkgeom::report;
namespace st = qkgeom::study;
namespace fs = std::filesystem;
using strings = std::vector<std::string>;
constexpr double NaN = std::numeric_limits<double>::quiet_NaN();

double num(std::string const& tag, std::string const& a) {
    auto const v = attr(tag, a);
    return v == "n/a" ? NaN : std::stod(v);
}
std::vector<double> nums(std::string const& text) {
    std::vector<double> out;
    std::istringstream in(text);
    for (std::string t; in >> t;) out.push_back(t == "n/a" ? NaN : std::stod(t));
    return out;
}
/// Same numbers, NaN in the same places.
bool same(std::vector<double> const& a, std::vector<double> const& b, double tol = 1e-12) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (std::isnan(a[i]) != std::isnan(b[i]) || (!std::isnan(a[i]) && std::abs(a[i] - b[i]) > tol)) return false;
    return true;
}
std::size_t finite_count(std::vector<double> const& v) {
    return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [](double x) { return std::isfinite(x); }));
}
std::string slurp(fs::path const& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// --- a hand-made study ---------------------------------------------------------
std::string const evil = "<b>&\"";  // a run name that must be escaped everywhere

std::map<std::string, st::estimate> all_metrics() {
    std::map<std::string, st::estimate> m;
    for (auto n : qkgeom::head_metric_names) m[std::string(n)] = {};
    for (auto n : {"abs_mu_q_a", "abs_alpha_k", "abs_r_q_a", "abs_r_k_a", "abs_bias_strength"}) m[n] = {};
    return m;
}

st::run_summary make_run(std::string name, std::string family, std::string model, double ap, double drop) {
    st::run_summary r;
    r.spec.name = std::move(name);
    r.spec.family = std::move(family);
    r.spec.model = std::move(model);
    r.status = st::run_status::analysed;
    r.n_heads = 6;
    r.metrics = all_metrics();
    r.metrics["ap_overall"] = {ap, ap - 0.02, ap + 0.02, 6};
    r.metrics["ap_first_20pct"] = {ap + drop / 2, ap + drop / 2 - 0.03, ap + drop / 2 + 0.03, 6};
    r.metrics["ap_last_20pct"] = {ap - drop / 2, NaN, NaN, 6};
    r.metrics["ap_drop"] = {drop, drop - 0.01, drop + 0.01, 6};
    r.metrics["bias_strength"] = {0.5, 0.4, 0.6, 6};
    for (std::size_t i = 0; i < 5; ++i) r.quintile[i] = ap + drop * (0.5 - 0.25 * double(i));
    for (std::size_t i = 0; i < 10; ++i) r.decile[i] = ap + drop * (0.5 - 0.1 * double(i));
    r.token_profile = {ap + 0.1, ap, ap - 0.1};
    r.taxonomy = {{qkgeom::head_class::position_dominated, 2}, {qkgeom::head_class::mixed, 3},
                  {qkgeom::head_class::undefined, 1}};
    return r;
}

// model "A" (family alpha) 4 checkpoints, "B" (beta), "<b>&\"" (gamma), a failed run.
st::study_result make_study() {
    st::study_result r;
    r.title = "hand-made study";
    r.benchmarks = {"LBP", "Ruler v2!"};
    r.token_edges = {0, 1024, 2048, 4096};
    std::vector<double> const drop{0.10, 0.20, 0.30, 0.25};
    for (int k = 0; k < 4; ++k) {
        auto run = make_run("A-s" + std::to_string(k + 1), "alpha", "A", 0.6 - 0.05 * k, drop[std::size_t(k)]);
        run.spec.ckpt.step = 1000 * (k + 1);
        run.spec.ckpt.phase = k < 2 ? "pre-train" : "LC 4K→32K";
        run.scores["LBP"] = 40 + 2 * k;
        r.runs.push_back(run);
    }
    r.runs[2].metrics["ap_first_20pct"].value = NaN;  // a NaN point in the trajectory
    auto b = make_run("B", "beta", "B", 0.7, 0.05);
    b.quintile[2] = NaN;
    b.decile = {NaN, NaN, NaN, NaN, NaN, NaN, NaN, NaN, NaN, 0.4};
    b.token_profile[1] = NaN;
    b.scores = {{"LBP", 55}, {"Ruler v2!", 70}};
    r.runs.push_back(b);
    auto c = make_run(evil, "gamma", "", 0.5, 0.4);
    c.scores = {{"LBP", 30}, {"Ruler v2!", 60}};
    c.taxonomy = {{qkgeom::head_class::content_focused, 4}};
    r.runs.push_back(c);
    st::run_summary failed;
    failed.spec.name = "broken";
    failed.spec.family = "beta";
    failed.message = "cannot read <capture> & \"gone\"";
    failed.metrics = all_metrics();
    r.runs.push_back(failed);
    return r;
}

// The trajectory of A: |mu_Q^a| grows then falls back a little, |alpha_K|
// collapses; bias = product. The last step has both changes negative (the
// bars stack downwards).
void add_trajectory(st::study_result& r) {
    std::vector<double> const mu{1.0, 1.5, 2.0, 1.8}, al{1.0, 0.8, 0.5, 0.3};
    for (std::size_t k = 0; k < 4; ++k) {
        st::trajectory_step s;
        s.model = "A";
        s.run = k;
        s.order = double(k);
        s.gm_mu_q_a = mu[k];
        s.gm_alpha_k = al[k];
        s.gm_bias = mu[k] * al[k];
        s.n_decomposed = 6;
        if (k > 0) {
            s.from = k - 1;
            s.dlog_mu_q_a = std::log(mu[k] / mu[k - 1]);
            s.dlog_alpha_k = std::log(al[k] / al[k - 1]);
            s.dlog_bias = std::log(s.gm_bias / (mu[k - 1] * al[k - 1]));
        }
        r.trajectory.push_back(s);
    }
    st::trajectory_step lone;  // model B: one step, no trajectory picture
    lone.model = "B";
    lone.run = 4;
    r.trajectory.push_back(lone);
}

void add_rest(st::study_result& r) {
    auto corr = [](std::string m, std::string b, std::string g, std::int64_t n, double rho) {
        st::correlation_row c;
        c.metric = std::move(m);
        c.benchmark = std::move(b);
        c.group = std::move(g);
        c.n = n;
        c.pearson = rho + 0.01;
        c.spearman = rho;
        c.kendall = rho - 0.1;
        c.p_pearson = c.p_spearman = c.p_kendall = 0.0417;
        c.p_method = "exact";
        return c;
    };
    r.correlations = {corr("ap_drop", "LBP", "all", 6, 0.6543), corr("ap_drop", "LBP", "alpha", 4, 0.8),
                      corr("ap_drop", "Ruler v2!", "all", 2, 1.0)};  // 2 runs: no scatter
    r.depth_bins = 4;
    for (std::size_t run = 0; run < 6; ++run)
        for (std::int64_t bin = 0; bin < 4; ++bin) {
            if (run == 5 && bin == 3) continue;  // a missing cell
            double const v = (run == 4 && bin == 1) ? NaN : 0.1 * double(run) + 0.01 * double(bin);
            r.depth.push_back({"ap_drop", run, bin, v, std::isnan(v) ? 0 : 3});
        }
    r.depth.push_back({"ap drop", 0, 0, 0.5, 1});   // slug collides with ap_drop
    r.depth.push_back({"all_nan", 0, 0, NaN, 0});   // no finite cell: no picture
    st::length_correlation lc;
    lc.benchmark = "LBP";
    lc.model = "A";
    lc.run = 3;
    lc.points = {{0, 1024, 50, 0.6}, {1024, 2048, NaN, 0.5}, {2048, 4096, 40, 0.45}};
    lc.corr.spearman = 1.0;
    lc.corr.n = 2;
    r.length_correlations.push_back(lc);
    st::head_trajectory ht;
    ht.model = "A";
    ht.metric = "ap_drop";
    ht.runs = {0, 1, 2, 3};
    ht.heads = {{0, 0, 0}, {0, 1, 0}, {1, 0, 0}};
    ht.values = {{0.1, 0.2, 0.3, 0.2}, {0.0, NaN, 0.4, 0.3}, {0.2, 0.25, 0.2, 0.25}};
    r.head_trajectories.push_back(ht);
}

st::study_result full_study() {
    auto r = make_study();
    add_trajectory(r);
    add_rest(r);
    return r;
}

struct temp_dir : qkgeom_test::temp_dir {
    temp_dir() : qkgeom_test::temp_dir("qkgeom_study_report_test_") {}
};

std::set<std::string> listing(fs::path const& d) {
    std::set<std::string> out;
    for (auto const& e : fs::directory_iterator(d)) out.insert(e.path().filename().string());
    return out;
}

}  // namespace

TEST_CASE("study.report: slugs are safe, file names unique, tokens short", "[study][report]") {
    using rep::detail::study_slug;
    CHECK(study_slug("Ruler v2!") == "ruler_v2");
    CHECK(study_slug("../etc/passwd") == "etc_passwd");
    CHECK(study_slug("") == "x");
    CHECK(study_slug("<>&\"") == "x");
    CHECK(study_slug("SmolLM3-3B / LC 4K→32K") == "smollm3-3b_lc_4k_32k");
    CHECK(study_slug(std::string(100, 'a')).size() == 48);
    rep::detail::study_file_names names;
    CHECK(names.take("a") == "a.svg");
    CHECK(names.take("a") == "a-2.svg");
    CHECK(names.take("a-2") == "a-2-2.svg");
    CHECK(names.take("a") == "a-3.svg");
    CHECK(rep::detail::study_tokens(1024) == "1K");
    CHECK(rep::detail::study_tokens(65536) == "64K");
    CHECK(rep::detail::study_tokens(1048576) == "1M");
    CHECK(rep::detail::study_tokens(1500) == "1500");
    CHECK(rep::detail::study_tokens(0) == "0");
}

TEST_CASE("study.report: the pictures with data are written, and no others", "[study][report]") {
    temp_dir d;
    auto const r = full_study();
    auto const files = rep::write_study_pictures(d.path, r);
    std::set<std::string> got;
    for (auto const& f : files) {
        got.insert(f.file);
        CHECK(f.path == d.path / f.file);
        CHECK(f.width > 0);
        CHECK(f.height > 0);
        CHECK_FALSE(f.alt.empty());
        INFO(f.file);
        auto const svg = slurp(f.path);
        CHECK(xml_error(svg).empty());
        CHECK(svg.find("<title>") != std::string::npos);
        CHECK(svg.find(evil) == std::string::npos);
        CHECK(std::all_of(f.file.begin(), f.file.end(), [](char c) {
            return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
        }));
    }
    std::set<std::string> const want{"study_profile_quintile.svg", "study_profile_decile.svg",
                                     "study_profile_tokens.svg",   "study_trajectory_a.svg",
                                     "study_bias_a.svg",           "study_taxonomy.svg",
                                     "study_depth_ap_drop.svg",    "study_depth_ap_drop-2.svg",
                                     "study_scatter_ap_drop_lbp.svg", "study_length_lbp_a.svg",
                                     "study_heads_a_ap_drop.svg"};
    CHECK(got == want);
    CHECK(files.size() == want.size());
    CHECK(listing(d.path) == want);
    // the taxonomy grows with the runs: the entry carries the SVG's own size
    for (auto const& f : files)
        if (f.file == "study_bias_a.svg") CHECK(f.height == Approx(1.5 * 440 + 60));
}

TEST_CASE("study.report: absent data writes no file", "[study][report]") {
    temp_dir d;
    st::study_result empty;
    CHECK(rep::write_study_pictures(d.path, empty).empty());
    auto r = make_study();  // runs only: profiles and taxonomy, nothing else
    for (auto& run : r.runs) run.token_profile.clear();
    auto const files = rep::write_study_pictures(d.path, r);
    CHECK(listing(d.path) ==
          std::set<std::string>{"study_profile_quintile.svg", "study_profile_decile.svg", "study_taxonomy.svg"});
    CHECK(files.size() == 3);
    // every run NaN: not even the profiles
    for (auto& run : r.runs) {
        run.quintile.fill(NaN);
        run.decile.fill(NaN);
        run.taxonomy.clear();
    }
    CHECK_FALSE(rep::study_profile_svg(r, 5));
    CHECK_FALSE(rep::study_taxonomy_svg(r));
}

TEST_CASE("study.report: profiles draw one line per run with data, NaN never a point", "[study][report]") {
    auto const r = full_study();
    for (int bins : {5, 10}) {
        auto const svg = rep::study_profile_svg(r, bins);
        REQUIRE(svg);
        auto const lines = elements(*svg, "path", "run");
        CHECK(lines.size() == 6);  // the failed run has no finite bin
        std::size_t finite = 0;
        for (auto const& run : r.runs) {
            std::vector<double> v = bins == 5 ? std::vector<double>(run.quintile.begin(), run.quintile.end())
                                              : std::vector<double>(run.decile.begin(), run.decile.end());
            finite += finite_count(v);
            auto const it = std::find_if(lines.begin(), lines.end(), [&](std::string const& t) {
                return attr(t, "data-run") == rep::detail::xml_escape(run.spec.name);
            });
            if (finite_count(v) == 0) {
                CHECK(it == lines.end());
                continue;
            }
            REQUIRE(it != lines.end());
            CHECK(same(nums(attr(*it, "data-values")), v));
            CHECK(attr(*it, "data-family") == (run.spec.family.empty() ? run.spec.name : run.spec.family));
        }
        CHECK(elements(*svg, "circle", "marker").size() == finite);
    }
    // checkpoints of A drawn fainter when earlier; families share a colour
    auto const svg = *rep::study_profile_svg(r, 5);
    auto const lines = elements(svg, "path", "run");
    for (std::size_t k = 1; k < 4; ++k) {
        CHECK(num(lines[k], "stroke-opacity") > num(lines[k - 1], "stroke-opacity"));
        CHECK(attr(lines[k], "stroke") == attr(lines[0], "stroke"));
    }
    CHECK(attr(lines[4], "stroke") != attr(lines[0], "stroke"));
    CHECK(num(lines[4], "stroke-opacity") == 1.0);
    auto const tokens = *rep::study_token_profile_svg(r);
    CHECK(elements(tokens, "circle", "marker").size() == 6 * 3 - 1);
    CHECK(tokens.find(">1K–2K</text>") != std::string::npos);
}

TEST_CASE("study.report: trajectory points and intervals per finite value, phases marked", "[study][report]") {
    auto const r = full_study();
    auto const models = rep::detail::study_models(r);
    REQUIRE(models.size() == 2);
    REQUIRE(models[0].second.size() == 4);
    CHECK_FALSE(rep::study_trajectory_svg(r, models[1].second));  // one step
    auto const svg = *rep::study_trajectory_svg(r, models[0].second);
    std::size_t values = 0, intervals = 0;
    for (auto m : {"ap_overall", "ap_first_20pct", "ap_last_20pct", "ap_drop"})
        for (std::size_t k = 0; k < 4; ++k) {
            auto const& e = r.runs[k].metrics.at(m);
            values += std::isfinite(e.value) ? 1 : 0;
            intervals += std::isfinite(e.value) && std::isfinite(e.lo) && std::isfinite(e.hi) ? 1 : 0;
        }
    CHECK(values == 15);
    CHECK(intervals == 11);  // ap_last_20pct has none; a NaN value gets no whisker
    CHECK(elements(svg, "circle", "point").size() == values);
    CHECK(elements(svg, "line", "ci").size() == intervals);
    for (auto const& p : elements(svg, "circle", "point")) CHECK(std::isfinite(num(p, "data-value")));
    for (auto const& p : elements(svg, "path", "metric"))
        if (attr(p, "data-metric") == "ap_drop") CHECK(same(nums(attr(p, "data-values")), {0.1, 0.2, 0.3, 0.25}));
    CHECK(elements(svg, "line", "phase").size() == 1);  // pre-train → LC
    CHECK(elements(svg, "text", "phase-label").size() == 2);
}

TEST_CASE("study.report: bias decomposition bars add up to the dot", "[study][report]") {
    auto const r = full_study();
    auto const steps = rep::detail::study_models(r)[0].second;
    auto const svg = *rep::study_bias_svg(r, steps);
    // the lower panel: pixel y → value
    auto const g0 = svg.find("<g class=\"decomposition\"");
    REQUIRE(g0 != std::string::npos);
    std::string const group = svg.substr(g0, svg.find("</g>", g0) - g0);
    auto const head = group.substr(0, group.find('>') + 1);
    auto const dom = nums(attr(head, "data-y-domain")), pix = nums(attr(head, "data-y-pixels"));
    REQUIRE(dom.size() == 2);
    REQUIRE(pix.size() == 2);
    auto const value = [&](double y) { return dom[0] + (pix[0] - y) / (pix[0] - pix[1]) * (dom[1] - dom[0]); };
    std::map<std::string, double> sum, abs_sum, lowest, highest;
    std::map<std::string, int> bars;
    for (auto cls : {"dlog_mu_q_a", "dlog_alpha_k"})
        for (auto const& t : elements(group, "rect", cls)) {
            double const top = value(num(t, "y")), bottom = value(num(t, "y") + num(t, "height"));
            double const v = bottom >= -1e-3 ? top - bottom : bottom - top;  // above 0: positive
            CHECK(v == Approx(num(t, "data-value")).margin(2e-3));
            bool const last = attr(t, "data-run") == "A-s4";
            CHECK((std::string(cls) == "dlog_mu_q_a" && !last ? v > 0 : v < 0));  // μ grew, α collapsed
            auto const run = attr(t, "data-run");
            sum[run] += v;
            abs_sum[run] += std::abs(v);
            lowest[run] = std::min(bars[run] ? lowest[run] : 0.0, bottom);
            highest[run] = std::max(bars[run] ? highest[run] : 0.0, top);
            ++bars[run];
        }
    auto const dots = elements(group, "circle", "dlog_bias");
    CHECK(dots.size() == 3);  // the first step has no change
    for (auto const& d : dots) {
        auto const run = attr(d, "data-run");
        CHECK(bars[run] == 2);
        CHECK(highest[run] - lowest[run] == Approx(abs_sum[run]).margin(2e-3));  // stacked: no overlap, no gap
        CHECK(value(num(d, "cy")) == Approx(sum[attr(d, "data-run")]).margin(2e-3));
        CHECK(value(num(d, "cy")) == Approx(num(d, "data-value")).margin(2e-3));
    }
    CHECK(bars.count("A-s1") == 0);
    // the upper panel: ratios to the first step
    std::vector<double> al{1.0, 0.8, 0.5, 0.3};
    std::size_t n = 0;
    for (auto const& c : elements(svg, "circle", "ratio"))
        if (attr(c, "data-quantity") == "gm_alpha_k") {
            CHECK(num(c, "data-value") == Approx(al[static_cast<std::size_t>(num(c, "data-step"))]));
            ++n;
        }
    CHECK(n == 4);
    CHECK(elements(svg, "circle", "ratio").size() == 12);
}

TEST_CASE("study.report: a NaN change draws no bar, a NaN factor no ratio", "[study][report]") {
    auto r = full_study();
    r.trajectory[2].dlog_alpha_k = NaN;
    r.trajectory[2].dlog_bias = NaN;
    r.trajectory[0].gm_mu_q_a = NaN;  // no reference: no |μ_Q^a| ratio at all
    auto const svg = *rep::study_bias_svg(r, rep::detail::study_models(r)[0].second);
    CHECK(elements(svg, "rect", "dlog_alpha_k").size() == 2);
    CHECK(elements(svg, "rect", "dlog_mu_q_a").size() == 3);
    CHECK(elements(svg, "circle", "dlog_bias").size() == 2);
    CHECK(elements(svg, "text", "na").size() == 1);
    std::size_t mu = 0;
    for (auto const& c : elements(svg, "circle", "ratio")) mu += attr(c, "data-quantity") == "gm_mu_q_a" ? 1 : 0;
    CHECK(mu == 0);
}

TEST_CASE("study.report: taxonomy shares, depth cells, scatter points", "[study][report]") {
    auto const r = full_study();
    auto const tax = *rep::study_taxonomy_svg(r);
    auto const shares = elements(tax, "rect", "share");
    CHECK(shares.size() == 5 * 3 + 1);
    std::map<std::string, double> total, width;
    for (auto const& s : shares) {
        total[attr(s, "data-run")] += num(s, "data-share");
        width[attr(s, "data-run")] += num(s, "width");
    }
    CHECK(total.size() == 6);
    for (auto const& [run, t] : total) CHECK(t == Approx(1.0));
    for (auto const& [run, w] : width) CHECK(w == Approx(width.begin()->second).margin(0.05));  // full bars

    auto const depth = *rep::study_depth_svg(r, "ap_drop");
    CHECK(elements(depth, "rect", "cell").size() == 6 * 4 - 2);
    CHECK(elements(depth, "rect", "cell-na").size() == 2);
    for (auto const& c : elements(depth, "rect", "cell")) CHECK(std::isfinite(num(c, "data-value")));
    CHECK_FALSE(rep::study_depth_svg(r, "all_nan"));

    auto const sc = *rep::study_scatter_svg(r, "ap_drop", "LBP");
    auto const pts = elements(sc, "circle", "run");
    CHECK(pts.size() == 6);
    for (auto const& p : pts) {
        auto const& run = *std::find_if(r.runs.begin(), r.runs.end(), [&](auto const& x) {
            return rep::detail::xml_escape(x.spec.name) == attr(p, "data-run");
        });
        CHECK(num(p, "data-x") == run.scores.at("LBP"));
        CHECK(num(p, "data-y") == run.metrics.at("ap_drop").value);
    }
    CHECK(sc.find("Spearman ρ=0.654 (p=0.0417)") != std::string::npos);
    CHECK(sc.find("p exact") != std::string::npos);
    auto const fam = elements(sc, "text", "family-corr");
    REQUIRE(fam.size() == 1);
    CHECK(sc.find("alpha: n=4, ρ=0.8") != std::string::npos);
    CHECK_FALSE(rep::study_scatter_svg(r, "ap_drop", "Ruler v2!"));
}

TEST_CASE("study.report: length and per-head pictures", "[study][report]") {
    auto const r = full_study();
    auto const len = *rep::study_length_svg(r, r.length_correlations[0]);
    CHECK(elements(len, "circle", "score-point").size() == 2);
    CHECK(elements(len, "circle", "plasticity-point").size() == 3);
    auto const heads = *rep::study_heads_svg(r, r.head_trajectories[0]);
    CHECK(elements(heads, "path", "head").size() == 3);
    auto const mean = elements(heads, "path", "mean");
    REQUIRE(mean.size() == 1);
    // brute force: the mean over the finite values of each checkpoint
    auto const& v = r.head_trajectories[0].values;
    std::vector<double> want;
    for (std::size_t k = 0; k < 4; ++k) {
        double s = 0;
        int n = 0;
        for (auto const& row : v)
            if (std::isfinite(row[k])) {
                s += row[k];
                ++n;
            }
        want.push_back(s / n);
    }
    CHECK(same(nums(attr(mean[0], "data-values")), want, 1e-12));
    auto one = r.head_trajectories[0];
    one.runs.resize(1);
    CHECK_FALSE(rep::study_heads_svg(r, one));
}

TEST_CASE("study.report: the page lists every picture and escapes names", "[study][report]") {
    temp_dir d;
    auto const r = full_study();
    rep::study_page page;
    page.intro = "intro with <tags> & ampersands";
    page.run = {{"command", "qkgeom study s.toml -o <out>"}};
    page.tables = {"study_runs.csv", "correlations & more.csv"};
    page.pictures = rep::write_study_pictures(d.path, r);
    page.runs_dir = "runs";
    auto const path = d.path / "index.html";
    rep::write_study_index_html(path, r, page);
    auto const html = slurp(path);
    CHECK(html == rep::study_index_html(r, page));
    CHECK(html.find("<script") == std::string::npos);
    CHECK(html.find("http") == std::string::npos);
    CHECK(html.find(evil) == std::string::npos);
    CHECK(html.find("&lt;b&gt;&amp;&quot;") != std::string::npos);
    CHECK(html.find("<tags>") == std::string::npos);
    CHECK(html.find("failed: cannot read &lt;capture&gt; &amp; &quot;gone&quot;") != std::string::npos);
    for (auto const& p : page.pictures) CHECK(html.find("<img src=\"" + p.file + "\"") != std::string::npos);
    std::size_t imgs = 0;
    for (auto p = html.find("<img "); p != std::string::npos; p = html.find("<img ", p + 1)) ++imgs;
    CHECK(imgs == page.pictures.size());
    CHECK(html.find("href=\"correlations%20%26%20more.csv\"") != std::string::npos);
    CHECK(html.find("href=\"runs/A-s1/index.html\"") != std::string::npos);
    CHECK(html.find("href=\"runs/broken/") == std::string::npos);  // failed: no folder
    // one runs-table row per run, value [lo, hi] shown
    std::size_t rows = 0;
    for (auto p = html.find("<tr class=\"run\">"); p != std::string::npos; p = html.find("<tr class=\"run\">", p + 1))
        ++rows;
    CHECK(rows == r.runs.size());
    CHECK(html.find("<td>0.1 [0.09, 0.11]</td>") != std::string::npos);
}

}  // namespace qkgeom_tests_study_report_test
