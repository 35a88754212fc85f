// CSV outputs (method §7, docs/outputs.md): the documented column lists, one
// row per record (read back with study::parse_csv), bit-exact round trip of every number (NaN as `nan`),
// quoting of the model name, write_reports and its errors.
#include "report_heads.hpp"
#include "temp_dir.hpp"

#include <qkgeom/capture/synthetic.hpp>
#include <qkgeom/report/csv.hpp>
#include <qkgeom/run/study_read.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_csv_test {

namespace {

namespace syn = qkgeom::synthetic;
namespace rep = qkgeom::report;
namespace fs = std::filesystem;
using strings = std::vector<std::string>;

// --- the CSV reader of the studies (run/study_read.hpp: RFC 4180, quoted fields,
// doubled quotes; a row with another field count than the header's throws).
struct table {
    strings header;
    std::vector<strings> rows;
};

table parse_csv(std::string const& text) {
    REQUIRE_FALSE(text.empty());
    REQUIRE(text.back() == '\n');  // every row ends with '\n'
    auto t = qkgeom::study::parse_csv(text, "<written>");
    for (auto const& r : t.rows) REQUIRE(r.size() == t.columns.size());
    return {std::move(t.columns), std::move(t.rows)};
}

double to_double(std::string const& s) {
    double x = 0;
    auto const r = std::from_chars(s.data(), s.data() + s.size(), x);
    INFO("field '" << s << "'");
    REQUIRE(r.ec == std::errc{});
    REQUIRE(r.ptr == s.data() + s.size());
    return x;
}

std::int64_t to_int(std::string const& s) {
    std::int64_t x = 0;
    auto const r = std::from_chars(s.data(), s.data() + s.size(), x);
    INFO("field '" << s << "'");
    REQUIRE(r.ec == std::errc{});
    REQUIRE(r.ptr == s.data() + s.size());
    return x;
}

/// Same double bit for bit, or both NaN (then written exactly `nan`).
bool same(std::string const& field, double expected) {
    if (std::isnan(expected)) return field == "nan";
    double const x = to_double(field);
    return std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(expected);
}

template <class F>
table written(F&& write) {
    std::ostringstream os;
    write(os);
    return parse_csv(os.str());
}

std::string slurp(fs::path const& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

std::string error_of(auto&& f) {
    try {
        f();
    } catch (std::exception const& e) {
        return e.what();
    }
    return "<no exception>";
}

struct temp_dir : qkgeom_test::temp_dir {  // tests/runtime/temp_dir.hpp
    temp_dir() : qkgeom_test::temp_dir("qkgeom_csv_test_") {}
};

// --- the heads: two layers of a small GQA model (report_heads.hpp) ----------
std::vector<qkgeom::head_analysis> const& heads() {
    static std::vector<qkgeom::head_analysis> const hs = qkgeom_test::report_heads(7, 3);
    return hs;
}

std::span<qkgeom::head_analysis const> span() { return heads(); }

// The documented columns (docs/outputs.md), written out literally.
strings const head_metrics_cols{
    "layer",          "q_head",          "k_head",           "n_q_tokens",        "n_k_tokens",
    "d_model",        "q_R2_pos",        "q_beta_norm",      "alpha_pos",         "sigma2_pos",
    "pos_skew",       "pos_excess_kurtosis", "pos_ks_p",     "sem_median_abs_skew", "sem_median_abs_kurtosis",
    "sem_median_ks_p", "sem_frac_ks_reject", "ap_overall",   "ap_first_20pct",    "ap_last_20pct",
    "ap_drop",        "gaussian_gap",    "mu_q_a",           "mu_k_a",            "mu_q_b",
    "mu_k_b",         "alpha_q",         "alpha_k",          "r_q_a",             "r_k_a",
    "position_r",     "bias_strength",   "separation_strength", "var_frac_a",     "var_frac_b",
    "plane_var_fraction", "content_var_b", "residual_pos_cov", "pc0_r_q",         "pc0_r_k",
    "q_pos_var_frac", "k_pos_var_frac",
    "ap_drop_bias",   "ap_drop_content", "ap_drop_neither",  "ap_drop_no_drift",  "ap_drop_frozen_content",
    "top1_flip",      "top1_flip_first_20pct", "top1_flip_last_20pct", "top1_flip_drop", "rank_kendall",
    "rank_kendall_first_20pct", "rank_kendall_last_20pct", "rank_kendall_drop", "rope_coherence",
    "rope_coherence_raw", "gaussian_gap_se", "taxonomy",    "flags",            "rope_status"};

strings const summary_tail{
    "n_heads",
    "mean_n_q_tokens", "mean_n_k_tokens", "mean_d_model", "mean_q_R2_pos", "mean_q_beta_norm", "mean_alpha_pos",
    "mean_sigma2_pos", "mean_pos_skew", "mean_pos_excess_kurtosis", "mean_pos_ks_p", "mean_sem_median_abs_skew",
    "mean_sem_median_abs_kurtosis", "mean_sem_median_ks_p", "mean_sem_frac_ks_reject", "mean_ap_overall",
    "mean_ap_first_20pct", "mean_ap_last_20pct", "mean_ap_drop", "mean_gaussian_gap", "mean_mu_q_a",
    "mean_mu_k_a", "mean_mu_q_b", "mean_mu_k_b", "mean_alpha_q", "mean_alpha_k", "mean_r_q_a", "mean_r_k_a",
    "mean_position_r", "mean_bias_strength", "mean_separation_strength", "mean_var_frac_a", "mean_var_frac_b",
    "mean_plane_var_fraction", "mean_content_var_b", "mean_residual_pos_cov", "mean_pc0_r_q", "mean_pc0_r_k",
    "mean_q_pos_var_frac", "mean_k_pos_var_frac",
    "mean_ap_drop_bias", "mean_ap_drop_content", "mean_ap_drop_neither", "mean_ap_drop_no_drift",
    "mean_ap_drop_frozen_content", "mean_top1_flip", "mean_top1_flip_first_20pct", "mean_top1_flip_last_20pct",
    "mean_top1_flip_drop", "mean_rank_kendall", "mean_rank_kendall_first_20pct", "mean_rank_kendall_last_20pct",
    "mean_rank_kendall_drop", "mean_rope_coherence", "mean_rope_coherence_raw", "mean_gaussian_gap_se",
    "ap_quintile_0", "ap_quintile_1", "ap_quintile_2", "ap_quintile_3", "ap_quintile_4",
    "ap_decile_0", "ap_decile_1", "ap_decile_2", "ap_decile_3", "ap_decile_4",
    "ap_decile_5", "ap_decile_6", "ap_decile_7", "ap_decile_8", "ap_decile_9",
    "n_position_dominated", "n_q_positional", "n_k_positional", "n_content_focused", "n_mixed", "n_undefined"};

strings with_key(std::string key) {
    strings c{std::move(key)};
    c.insert(c.end(), summary_tail.begin(), summary_tail.end());
    return c;
}

void check_id(strings const& row, qkgeom::head_id const& id) {
    CHECK(to_int(row[0]) == id.layer);
    CHECK(to_int(row[1]) == id.q_head);
    CHECK(to_int(row[2]) == id.k_head);
}

/// Compare a summary row (from column 1 on) with a head_set_summary.
void check_summary(strings const& row, qkgeom::head_set_summary const& s) {
    std::size_t c = 1;
    CHECK(to_int(row[c++]) == s.n_heads);
    for (double m : s.mean) CHECK(same(row[c++], m));
    for (double q : s.ap_quintile) CHECK(same(row[c++], q));
    for (double q : s.ap_decile) CHECK(same(row[c++], q));
    std::int64_t total = 0;
    for (auto k : rep::taxonomy_classes) {
        auto const it = s.taxonomy_counts.find(k);
        std::int64_t const n = to_int(row[c++]);
        CHECK(n == (it == s.taxonomy_counts.end() ? 0 : it->second));
        total += n;
    }
    CHECK(total == s.n_heads);
    CHECK(c == row.size());
}

}  // namespace

TEST_CASE("csv: number formatting and quoting", "[csv]") {
    CHECK(rep::format_double(std::numeric_limits<double>::quiet_NaN()) == "nan");
    CHECK(rep::format_double(-std::numeric_limits<double>::quiet_NaN()) == "nan");
    CHECK(rep::format_double(std::numeric_limits<double>::infinity()) == "inf");
    CHECK(rep::format_double(-std::numeric_limits<double>::infinity()) == "-inf");
    CHECK(rep::format_double(0.1) == "0.1");
    CHECK(rep::format_double(3.0) == "3");
    CHECK(rep::format_int(-12) == "-12");
    for (double x : {0.1 + 0.2, 1.0 / 3.0, -2.5e-310, 1.7976931348623157e308, 5e-324, -0.0, 123456789.0125})
        CHECK(same(rep::format_double(x), x));
    CHECK(rep::csv_quote("llama-3") == "llama-3");
    CHECK(rep::csv_quote("a,b") == "\"a,b\"");
    CHECK(rep::csv_quote("say \"hi\"") == "\"say \"\"hi\"\"\"");
    CHECK(rep::csv_quote("two\nlines") == "\"two\nlines\"");
    CHECK(rep::csv_quote(" padded") == "\" padded\"");
}

TEST_CASE("csv: head_metrics.csv has the documented columns and one exact row per head", "[csv]") {
    auto const t = written([](std::ostream& os) { rep::write_head_metrics(os, span()); });
    CHECK(t.header == head_metrics_cols);
    CHECK(rep::head_metrics_columns() == head_metrics_cols);
    REQUIRE(t.rows.size() == heads().size());
    std::set<std::string> const classes{"position_dominated", "q_positional", "k_positional",
                                        "content_focused",    "mixed",        "undefined"};
    bool saw_nan = false;
    for (std::size_t i = 0; i < heads().size(); ++i) {
        auto const& h = heads()[i];
        auto const& row = t.rows[i];
        check_id(row, h.id);
        // Counts are written as integers.
        CHECK(row[3] == std::to_string(h.n_q_tokens));
        CHECK(row[4] == std::to_string(h.n_k_tokens));
        CHECK(row[5] == std::to_string(h.d_model));
        auto const v = qkgeom::head_metric_values(h);
        for (std::size_t j = 0; j < v.size(); ++j) {
            INFO("head " << i << " column " << t.header[3 + j] << " = " << row[3 + j]);
            CHECK(same(row[3 + j], v[j]));
            saw_nan = saw_nan || row[3 + j] == "nan";
        }
        auto const& taxonomy = row[row.size() - 3];
        CHECK(classes.count(taxonomy) == 1);
        CHECK(taxonomy == qkgeom::to_string(h.pca.taxonomy));
        CHECK(row[row.size() - 2] == qkgeom::head_flags_text(h));
        CHECK(row.back() == qkgeom::rope_status_name(h.rope.status));
    }
    CHECK(saw_nan);  // layer 1 has no diagnostics
    CHECK(std::isfinite(heads()[0].householder.q_R2_pos));
}

TEST_CASE("csv: the flags column lists a degenerate head's flags, semicolon-separated, in bit order", "[csv]") {
    syn::layer_spec L;
    L.d = 8;
    L.rotary_dims = 4;
    L.n_q_heads = 1;
    L.n_kv_heads = 1;
    syn::capture_spec cap;
    cap.n_examples = 6;
    cap.context_length = 512;
    cap.buckets = {qkgeom::bucket_scheme::uniform, 64, 4.0};
    auto hc = syn::generate_head(L, cap, 0);
    Eigen::RowVectorXd const v = hc.queries.vectors.row(0);
    hc.queries.vectors.rowwise() = v;  // every query row the same vector (method §9.17)
    std::vector<qkgeom::head_analysis> const hs{qkgeom::analyze_head(hc),
                                                heads()[0]};
    auto const t = written([&](std::ostream& os) { rep::write_head_metrics(os, hs); });
    REQUIRE(t.rows.size() == 2);
    auto const column = [&](char const* name) {  // by name: columns may be added after it
        auto const it = std::find(t.header.begin(), t.header.end(), name);
        REQUIRE(it != t.header.end());
        return static_cast<std::size_t>(it - t.header.begin());
    };
    std::size_t const fc = column("flags");
    std::string const flags = t.rows[0][fc];
    INFO(flags);
    // Split on ';': every word is a documented flag, in bit order, and the
    // causes planted here are among them.
    strings words;
    for (std::size_t a = 0; a <= flags.size();) {
        auto const b = std::min(flags.find(';', a), flags.size());
        words.push_back(flags.substr(a, b - a));
        a = b + 1;
    }
    std::size_t last = 0;
    for (auto const& w : words) {
        auto const it = std::find(qkgeom::head_flag_names.begin(), qkgeom::head_flag_names.end(), w);
        REQUIRE(it != qkgeom::head_flag_names.end());
        auto const bit = static_cast<std::size_t>(it - qkgeom::head_flag_names.begin());
        CHECK((bit >= last));
        last = bit;
    }
    for (std::string w : {"q_constant", "pc0_q_flat", "pos_residual_degenerate", "sem_degenerate",
                          "no_plasticity_pairs"})
        CHECK(std::find(words.begin(), words.end(), w) != words.end());
    CHECK(std::find(words.begin(), words.end(), "k_constant") == words.end());
    CHECK(t.rows[0][column("taxonomy")] == "undefined");
    CHECK(t.rows[1][fc] == qkgeom::head_flags_text(heads()[0]));  // healthy head: "" (no flag)
    CHECK(heads()[0].flags == 0);
}

TEST_CASE("csv: head_bucket_plasticity.csv: one row per cell", "[csv]") {
    auto const t = written([](std::ostream& os) { rep::write_head_bucket_plasticity(os, span()); });
    CHECK(t.header == strings{"layer", "q_head", "k_head", "q_bucket", "k_bucket", "plasticity", "n_pairs",
                              "std_error", "empirical"});
    std::size_t r = 0, nonempty = 0;
    for (auto const& h : heads())
        for (auto const& c : h.plasticity.cells) {
            REQUIRE(r < t.rows.size());
            auto const& row = t.rows[r++];
            check_id(row, h.id);
            CHECK(to_int(row[3]) == c.q_bucket);
            CHECK(to_int(row[4]) == c.k_bucket);
            CHECK(same(row[5], c.plasticity));
            CHECK(to_int(row[6]) == c.n_pairs);
            CHECK(same(row[7], c.std_error));
            CHECK(same(row[8], c.empirical));
            nonempty += c.n_pairs > 0;
        }
    CHECK(r == t.rows.size());
    CHECK(nonempty > 0);
}

TEST_CASE("csv: head_profile.csv: one row per profile bucket", "[csv]") {
    auto const t = written([](std::ostream& os) { rep::write_head_profile(os, span()); });
    strings const cols{"layer",      "q_head",    "k_head",    "q_bucket", "tau",   "n_queries",
                       "plasticity", "std_error", "empirical", "quintile", "decile",
                       "pos_mean_rms", "content_mean_rms", "pos_var", "content_var", "ap_no_drift",
                       "ap_frozen_content", "ap_neither", "top1_flip", "top1_flip_se", "rank_kendall",
                       "rank_kendall_se"};
    CHECK(t.header == cols);
    CHECK(rep::head_profile_columns() == cols);
    std::size_t r = 0, finite = 0;
    for (auto const& h : heads()) {
        REQUIRE_FALSE(h.plasticity.profile.empty());
        for (auto const& b : h.plasticity.profile) {
            REQUIRE(r < t.rows.size());
            auto const& row = t.rows[r++];
            check_id(row, h.id);
            CHECK(to_int(row[3]) == b.q_bucket);
            CHECK(same(row[4], b.tau));
            CHECK(to_int(row[5]) == b.n_queries);
            CHECK(same(row[6], b.ap));
            CHECK(same(row[7], b.std_error));
            CHECK(same(row[8], b.ap_empirical));
            CHECK(to_int(row[9]) == b.quintile);
            CHECK(to_int(row[10]) == b.decile);
            // The split entry of the same index, the rank entry of the same bucket.
            auto const i = std::size_t(&b - h.plasticity.profile.data());
            REQUIRE(i < h.plasticity.split.profile.size());
            auto const& sp = h.plasticity.split.profile[i];
            CHECK(same(row[11], sp.pos_mean_rms));
            CHECK(same(row[14], sp.content_var));
            CHECK(same(row[17], sp.ap_neither));
            for (auto const& rb : h.ranks.profile)
                if (rb.q_bucket == b.q_bucket) {
                    CHECK(same(row[18], rb.top1_flip));
                    CHECK(same(row[21], rb.kendall_se));
                }
            finite += std::isfinite(b.ap);
        }
    }
    CHECK(r == t.rows.size());
    CHECK(finite > 0);
}

TEST_CASE("csv: head_component_weights.csv: one row per coordinate", "[csv]") {
    auto const t = written([](std::ostream& os) { rep::write_head_component_weights(os, span()); });
    CHECK(t.header == strings{"layer", "q_head", "k_head", "component", "component_r2", "component_weight"});
    REQUIRE(t.rows.size() == heads().size() * 8);
    std::size_t r = 0;
    for (auto const& h : heads()) {
        double wsum = 0;
        for (qkgeom::index_t j = 0; j < h.householder.component_r2.size(); ++j) {
            auto const& row = t.rows[r++];
            check_id(row, h.id);
            CHECK(to_int(row[3]) == j);
            CHECK(same(row[4], h.householder.component_r2(j)));
            CHECK(same(row[5], h.householder.component_weight(j)));
            wsum += to_double(row[5]);
        }
        CHECK(wsum == Approx(1.0).epsilon(1e-12));
    }
}

TEST_CASE("csv: qk_pca.csv: one row per reported component", "[csv]") {
    auto const t = written([](std::ostream& os) { rep::write_qk_pca(os, span()); });
    CHECK(t.header == strings{"layer", "q_head", "k_head", "component", "explained_variance_ratio", "r_q", "r_k"});
    std::size_t r = 0;
    for (auto const& h : heads()) {
        REQUIRE(h.pca.components.size() == 8);  // 10 clipped to d
        for (auto const& c : h.pca.components) {
            REQUIRE(r < t.rows.size());
            auto const& row = t.rows[r++];
            check_id(row, h.id);
            CHECK(to_int(row[3]) == c.component);
            CHECK(same(row[4], c.explained_variance_ratio));
            CHECK(same(row[5], c.r_q));
            CHECK(same(row[6], c.r_k));
        }
    }
    CHECK(r == t.rows.size());
}

TEST_CASE("csv: model_report.csv and layer_report.csv equal summarise_model, the name is quoted", "[csv]") {
    auto const m = qkgeom::summarise_model(span());
    std::string const name = "org/model,v2 \"base\"";
    std::ostringstream os;
    rep::write_model_report(os, name, span());
    std::string const text = os.str();
    // The raw line: the name quoted with its inner quotes doubled.
    CHECK(text.find("\n\"org/model,v2 \"\"base\"\"\",4,") != std::string::npos);
    auto const t = parse_csv(text);
    CHECK(t.header == with_key("model"));
    CHECK(rep::model_report_columns() == with_key("model"));
    REQUIRE(t.rows.size() == 1);
    CHECK(t.rows[0][0] == name);
    check_summary(t.rows[0], m.all);

    // Several models, one row each.
    std::vector<rep::model_entry> const models{{"a", m.all}, {"b", m.per_layer.at(1)}};
    auto const t2 = written([&](std::ostream& o) { rep::write_model_report(o, models); });
    REQUIRE(t2.rows.size() == 2);
    CHECK(t2.rows[1][0] == "b");
    check_summary(t2.rows[1], m.per_layer.at(1));

    auto const l = written([&](std::ostream& o) { rep::write_layer_report(o, span()); });
    CHECK(l.header == with_key("layer"));
    REQUIRE(l.rows.size() == 2);
    for (std::int64_t layer = 0; layer < 2; ++layer) {
        auto const& row = l.rows[static_cast<std::size_t>(layer)];
        CHECK(to_int(row[0]) == layer);
        check_summary(row, m.per_layer.at(layer));
    }
}

TEST_CASE("csv: write_reports writes every file, unwritable paths throw naming the path", "[csv]") {
    temp_dir tmp;
    fs::path const out = tmp.path / "nested" / "run1";
    auto const paths = rep::write_reports(out, "model,x", span());
    strings names;
    for (auto const& p : paths) {
        CHECK(fs::is_regular_file(p));
        CHECK(p.parent_path() == out);
        names.push_back(p.filename().string());
    }
    CHECK(names == strings{"head_metrics.csv", "head_bucket_plasticity.csv", "head_profile.csv",
                           "head_component_weights.csv", "qk_pca.csv", "model_report.csv", "layer_report.csv",
                           "head_rope_bands.csv", "head_rope_bucket_bands.csv", "gqa_groups.csv"});
    // The files hold exactly what the stream writers write.
    auto const same_text = [&](std::string const& file, auto&& write) {
        std::ostringstream os;
        write(os);
        CHECK(slurp(out / file) == os.str());
    };
    same_text("head_metrics.csv", [](std::ostream& os) { rep::write_head_metrics(os, span()); });
    same_text("head_bucket_plasticity.csv", [](std::ostream& os) { rep::write_head_bucket_plasticity(os, span()); });
    same_text("head_profile.csv", [](std::ostream& os) { rep::write_head_profile(os, span()); });
    same_text("head_component_weights.csv", [](std::ostream& os) { rep::write_head_component_weights(os, span()); });
    same_text("qk_pca.csv", [](std::ostream& os) { rep::write_qk_pca(os, span()); });
    same_text("model_report.csv", [](std::ostream& os) { rep::write_model_report(os, "model,x", span()); });
    same_text("layer_report.csv", [](std::ostream& os) { rep::write_layer_report(os, span()); });
    same_text("gqa_groups.csv", [](std::ostream& os) { rep::write_gqa_groups(os, qkgeom::gqa_groups(span())); });
    CHECK(parse_csv(slurp(out / "model_report.csv")).rows.at(0).at(0) == "model,x");

    // A regular file where a directory is needed: fails even as root.
    fs::path const blocker = tmp.path / "not_a_dir";
    std::ofstream(blocker) << "x";
    fs::path const bad_file = blocker / "head_metrics.csv";
    CHECK_THAT(error_of([&] { rep::write_head_metrics(bad_file, span()); }),
               Catch::Matchers::Contains(bad_file.string()));
    CHECK_THAT(error_of([&] { rep::write_layer_report(bad_file, span()); }),
               Catch::Matchers::Contains(bad_file.string()));
    fs::path const bad_dir = blocker / "out";
    CHECK_THAT(error_of([&] { rep::write_reports(bad_dir, "m", span()); }),
               Catch::Matchers::Contains(bad_dir.string()));
    CHECK_THROWS_AS(rep::write_qk_pca(bad_file, span()), std::runtime_error);
    CHECK_THAT(error_of([&] { rep::write_head_profile(bad_file, span()); }),
               Catch::Matchers::Contains(bad_file.string()));
}

}  // namespace qkgeom_tests_csv_test
