// Studies, reading an analysis folder back (include/qkgeom/run/study_read.hpp,
// docs/study.md): synthetic heads analysed and written by write_reports come
// back bit for bit (metrics, taxonomy, profiles); the quantile means recomputed
// from head_profile.csv equal the library's ap_quintile / ap_decile; the token
// range profile equals a weighted mean computed here; and hostile files
// (ragged rows, bad numbers, missing columns, duplicated heads, unknown
// classes, quoting, size limit) fail with the file, field and value named.
#include "report_heads.hpp"
#include "temp_dir.hpp"

#include <qkgeom/report/csv.hpp>
#include <qkgeom/run/study_read.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_study_read_test {

namespace {

namespace rep = qkgeom::report;
namespace st = qkgeom::study;
namespace fs = std::filesystem;
using strings = std::vector<std::string>;
double const inf = std::numeric_limits<double>::infinity();

struct temp_dir : qkgeom_test::temp_dir {  // tests/runtime/temp_dir.hpp
    temp_dir() : qkgeom_test::temp_dir("qkgeom_study_read_test_") {}
};

// Two layers of a small GQA model (report_heads.hpp).
std::vector<qkgeom::head_analysis> const& heads() {
    static std::vector<qkgeom::head_analysis> const hs = qkgeom_test::report_heads(11, 5);
    return hs;
}

bool same_bits(double a, double b) {
    return std::isnan(a) ? std::isnan(b) : std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

bool close_or_nan(double got, double want) {
    return std::isnan(want) ? std::isnan(got) : std::abs(got - want) <= 1e-12 * std::max(1.0, std::abs(want));
}

void write_text(fs::path const& p, std::string const& text) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << text;
    REQUIRE(f.good());
}

std::string slurp(fs::path const& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

/// Write a table back as CSV (every field quoted when needed).
void write_table(fs::path const& p, strings const& columns, std::vector<strings> const& rows) {
    std::string text;
    auto const line = [&](strings const& r) {
        for (std::size_t i = 0; i < r.size(); ++i) text += (i ? "," : "") + rep::csv_quote(r[i]);
        text += '\n';
    };
    line(columns);
    for (auto const& r : rows) line(r);
    write_text(p, text);
}

/// The input_error `f` throws (FAIL when it throws none or another type).
qkgeom::input_error error_of(std::function<void()> const& f) {
    try {
        f();
    } catch (qkgeom::input_error const& e) {
        return e;
    }
    FAIL("no input_error thrown");
    return qkgeom::input_error("", "", "", "");
}

bool contains(std::string const& s, std::string const& part) { return s.find(part) != std::string::npos; }

/// An analysis folder of heads() in a fresh temp dir.
struct analysis_dir {
    temp_dir tmp;
    fs::path dir = tmp.path / "run";
    analysis_dir() { rep::write_reports(dir, "synthetic", heads()); }
    fs::path file(std::string_view name) const { return dir / std::string(name); }
};

}  // namespace

TEST_CASE("study read: write_reports then read_analysis gives the heads back bit for bit", "[study][read]") {
    analysis_dir a;
    st::run_heads const r = st::read_analysis(a.dir);
    REQUIRE(r.heads.size() == heads().size());
    CHECK(r.has_profiles);
    CHECK(r.n_layers == 2);
    CHECK(r.context_length == 0);  // not recorded in any CSV file
    bool saw_nan_metric = false, saw_nan_ap = false;
    std::size_t finite_quintiles = 0;
    for (std::size_t i = 0; i < heads().size(); ++i) {
        auto const& h = heads()[i];
        auto const& g = r.heads[i];
        INFO("head " << i);
        CHECK(g.id == h.id);
        auto const v = qkgeom::head_metric_values(h);
        for (std::size_t m = 0; m < v.size(); ++m) {
            INFO(qkgeom::head_metric_names[m] << ": read " << g.metrics[m] << ", analysed " << v[m]);
            CHECK(same_bits(g.metrics[m], v[m]));
            saw_nan_metric = saw_nan_metric || std::isnan(v[m]);
        }
        CHECK(g.taxonomy == h.pca.taxonomy);
        auto const& prof = h.plasticity.profile;
        REQUIRE(g.profile.size() == prof.size());
        REQUIRE_FALSE(prof.empty());
        for (std::size_t b = 0; b < prof.size(); ++b) {
            CHECK(g.profile[b].q_bucket == prof[b].q_bucket);
            CHECK(same_bits(g.profile[b].tau, prof[b].tau));
            CHECK(g.profile[b].n_queries == prof[b].n_queries);
            CHECK(same_bits(g.profile[b].ap, prof[b].ap));
            CHECK(g.profile[b].quintile == prof[b].quintile);
            CHECK(g.profile[b].decile == prof[b].decile);
            saw_nan_ap = saw_nan_ap || std::isnan(prof[b].ap);
        }
        // The quantile means recomputed from the rows equal the library's.
        auto const q = st::head_quintiles(g);
        auto const d = st::head_deciles(g);
        for (std::size_t k = 0; k < 5; ++k) {
            INFO("quintile " << k << ": " << q[k] << " vs " << h.plasticity.ap_quintile[k]);
            CHECK(close_or_nan(q[k], h.plasticity.ap_quintile[k]));
            finite_quintiles += std::isfinite(q[k]);
        }
        for (std::size_t k = 0; k < 10; ++k) {
            INFO("decile " << k << ": " << d[k] << " vs " << h.plasticity.ap_decile[k]);
            CHECK(close_or_nan(d[k], h.plasticity.ap_decile[k]));
        }
        // Token ranges: [0, inf) is the weighted mean over every finite bucket;
        // a split at a bucket's tau recombines; an empty range is NaN.
        double num = 0, den = 0, num_lo = 0, den_lo = 0;
        double const split = prof[prof.size() / 2].tau;
        for (auto const& b : prof)
            if (std::isfinite(b.ap)) {
                num += static_cast<double>(b.n_queries) * b.ap;
                den += static_cast<double>(b.n_queries);
                if (b.tau < split) {
                    num_lo += static_cast<double>(b.n_queries) * b.ap;
                    den_lo += static_cast<double>(b.n_queries);
                }
            }
        REQUIRE(den > 0);
        CHECK(st::token_range_profile(g, 0, inf) == Approx(num / den).epsilon(1e-12));
        CHECK(st::token_range_profile(g, 0, inf) == Approx(h.plasticity.ap_overall).epsilon(1e-12));
        CHECK(close_or_nan(st::token_range_profile(g, 0, split), den_lo > 0 ? num_lo / den_lo : st::nan));
        CHECK(close_or_nan(st::token_range_profile(g, split, inf), (num - num_lo) / (den - den_lo)));
        CHECK(std::isnan(st::token_range_profile(g, 1e9, inf)));
    }
    CHECK(saw_nan_metric);  // layer 1 has no diagnostics: NaN read back as NaN
    CHECK(saw_nan_ap);      // bucket 0 has no earlier key bucket
    CHECK(finite_quintiles >= 4 * heads().size());
}

TEST_CASE("study read: without head_profile.csv the model report's quantiles are read", "[study][read]") {
    analysis_dir a;
    fs::remove(a.file(rep::head_profile_file));
    auto const r = st::read_analysis(a.dir);
    CHECK_FALSE(r.has_profiles);
    REQUIRE(r.heads.size() == heads().size());
    for (auto const& h : r.heads) CHECK(h.profile.empty());
    auto const s = qkgeom::summarise_model(heads()).all;
    std::size_t finite = 0;
    for (std::size_t k = 0; k < 5; ++k) {
        CHECK(same_bits(r.report_quintile[k], s.ap_quintile[k]));
        finite += std::isfinite(s.ap_quintile[k]);
    }
    for (std::size_t k = 0; k < 10; ++k) CHECK(same_bits(r.report_decile[k], s.ap_decile[k]));
    CHECK(finite == 5);
    // No profile, no model report: the quantiles stay NaN.
    fs::remove(a.file(rep::model_report_file));
    auto const r2 = st::read_analysis(a.dir);
    for (double q : r2.report_quintile) CHECK(std::isnan(q));
    CHECK(r2.heads.size() == heads().size());
}

TEST_CASE("study read: a folder without head_metrics.csv is not an analysis folder", "[study][read]") {
    temp_dir tmp;
    auto const e = error_of([&] { (void)st::read_analysis(tmp.path); });
    CHECK(e.source() == tmp.path.string());
    CHECK(e.field() == "head_metrics.csv");
    CHECK(contains(e.what(), "not an analysis folder: no head_metrics.csv"));
}

TEST_CASE("study read: hostile analysis folders name the file, field and value", "[study][read]") {
    analysis_dir a;
    fs::path const metrics = a.file(rep::head_metrics_file), profile = a.file(rep::head_profile_file);
    st::csv_table const m = st::read_csv(metrics), p = st::read_csv(profile);
    REQUIRE(m.rows.size() == heads().size());
    write_table(metrics, m.columns, m.rows);
    write_table(profile, p.columns, p.rows);
    REQUIRE(st::read_analysis(a.dir).heads.size() == heads().size());  // the rewritten files read

    SECTION("missing column") {
        auto cols = m.columns;
        cols[m.column("ap_drop")] = "ap_drop_renamed";
        write_table(metrics, cols, m.rows);
        auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
        CHECK(e.source() == metrics.string());
        CHECK(e.field() == "ap_drop");
        CHECK(contains(e.what(), "no such column"));
    }
    SECTION("columns are found by name: reordered columns read the same") {
        auto cols = m.columns;
        auto rows = m.rows;
        std::swap(cols[3], cols[20]);
        for (auto& r : rows) std::swap(r[3], r[20]);
        write_table(metrics, cols, rows);
        auto const r = st::read_analysis(a.dir);
        for (std::size_t i = 0; i < heads().size(); ++i)
            for (std::size_t k = 0; k < qkgeom::head_metric_names.size(); ++k)
                CHECK(same_bits(r.heads[i].metrics[k], qkgeom::head_metric_values(heads()[i])[k]));
    }
    SECTION("duplicated head") {
        auto rows = m.rows;
        rows.push_back(rows[1]);
        write_table(metrics, m.columns, rows);
        auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
        CHECK(e.source() == metrics.string());
        CHECK(e.field() == "line " + std::to_string(rows.size() + 1));
        auto const& id = heads()[1].id;
        CHECK(e.value() == std::to_string(id.layer) + "," + std::to_string(id.q_head) + "," + std::to_string(id.k_head));
        CHECK(contains(e.what(), "listed twice"));
    }
    SECTION("unknown taxonomy") {
        auto rows = m.rows;
        rows[2][m.column("taxonomy")] = "wobbly";
        write_table(metrics, m.columns, rows);
        auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
        CHECK(e.source() == metrics.string());
        CHECK(e.field() == "taxonomy");
        CHECK(e.value() == "wobbly");
        CHECK(contains(e.what(), "line 4"));
    }
    SECTION("bad number in a metric") {
        auto rows = m.rows;
        rows[0][m.column("alpha_k")] = "0.5x";
        write_table(metrics, m.columns, rows);
        auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
        CHECK(e.source() == metrics.string());
        CHECK(e.field() == "alpha_k");
        CHECK(e.value() == "0.5x");
        CHECK(contains(e.what(), "line 2"));
    }
    SECTION("negative head index") {
        auto rows = m.rows;
        rows[0][m.column("q_head")] = "-1";
        write_table(metrics, m.columns, rows);
        auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
        CHECK(e.field() == "q_head");
        CHECK(e.value() == "-1");
    }
    SECTION("a profile row of a head not in head_metrics.csv") {
        auto rows = p.rows;
        rows[3][p.column("layer")] = "9";
        write_table(profile, p.columns, rows);
        auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
        CHECK(e.source() == profile.string());
        CHECK(e.field() == "line 5");
        CHECK(contains(e.value(), "9,"));
        CHECK(contains(e.what(), "not in head_metrics.csv"));
    }
    SECTION("quintile outside 0..4, decile outside 0..9, plasticity outside [0, 1], a negative tau") {
        for (auto const& [col, val] : {std::pair<std::string, std::string>{"quintile", "5"},
                                       {"decile", "-1"},
                                       {"plasticity", "1.5"},
                                       {"tau", "-4"}}) {
            auto rows = p.rows;
            rows[1][p.column(col)] = val;
            write_table(profile, p.columns, rows);
            auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
            CHECK(e.source() == profile.string());
            CHECK(e.field() == col);
            CHECK(e.value() == val);
        }
    }
    SECTION("a metric outside its range (from the registry's kind)") {
        for (auto const& [col, val, said] : std::vector<std::array<std::string, 3>>{
                 {"ap_overall", "7.5", "outside [0, 1]"},
                 {"n_q_tokens", "-3", "integer >= 0"},
                 {"n_k_tokens", "2.5", "integer >= 0"},
                 {"r_k_a", "-1.25", "outside [-1, 1]"},
                 {"alpha_k", "inf", "finite"},
                 {"pos_ks_p", "-0.5", "outside [0, 1]"},
                 {"n_q_tokens", "nan", "nan"}}) {
            auto rows = m.rows;
            rows[1][m.column(col)] = val;
            write_table(metrics, m.columns, rows);
            auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
            INFO(col << " = " << val << ": " << e.what());
            CHECK(e.source() == metrics.string());
            CHECK(e.field() == col);
            CHECK(e.value() == val);
            CHECK(contains(e.what(), "line 3"));
            CHECK(contains(e.what(), said));
        }
        auto rows = m.rows;  // NaN is a metric's documented "undefined"; a real may be any finite value
        rows[1][m.column("ap_overall")] = "nan";
        rows[1][m.column("alpha_k")] = "-12345.5";
        write_table(metrics, m.columns, rows);
        auto const& names = qkgeom::head_metric_names;
        auto const ap = static_cast<std::size_t>(std::find(names.begin(), names.end(), "ap_overall") - names.begin());
        CHECK(std::isnan(st::read_analysis(a.dir).heads[1].metrics[ap]));
    }
    SECTION("an analysis in which some heads failed (failures.txt) is not read as complete") {
        std::ofstream(a.dir / "failures.txt") << "l00h01q: vectors.npy: truncated\n";
        auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
        CHECK(e.source() == a.dir.string());
        CHECK(e.field() == "failures.txt");
        CHECK(contains(e.what(), "incomplete analysis"));
    }
    SECTION("a duplicated profile bucket") {
        auto rows = p.rows;
        rows.insert(rows.begin() + 2, rows[1]);
        write_table(profile, p.columns, rows);
        auto const e = error_of([&] { (void)st::read_analysis(a.dir); });
        CHECK(e.field() == "q_bucket");
        CHECK(contains(e.what(), "line 4"));
    }
}

TEST_CASE("study read: read_csv parses RFC 4180 and numbers strictly", "[study][read]") {
    temp_dir tmp;
    fs::path const f = tmp.path / "t.csv";

    SECTION("quoted fields with commas, line ends and quotes; CRLF; no final line end") {
        write_text(f, "name,v\r\n\"a,b\nc \"\"q\"\"\",1\r\n\"\",2\r\nplain,3");
        auto const t = st::read_csv(f);
        CHECK(t.columns == strings{"name", "v"});
        REQUIRE(t.rows.size() == 3);
        CHECK(t.rows[0] == strings{"a,b\nc \"q\"", "1"});
        CHECK(t.rows[1] == strings{"", "2"});
        CHECK(t.rows[2] == strings{"plain", "3"});
        CHECK(t.lines == std::vector<std::int64_t>{2, 4, 5});
        CHECK(t.integer(2, t.column("v")) == 3);
    }
    SECTION("numbers: what format_double writes reads back; anything else is an error") {
        strings const good{"nan", "inf", "-inf", "0.1", "-2.5e-310", "5e-324", "1.7976931348623157e+308", "3", "-0"};
        strings const bad{"0.5x", "", "1e999", "-nan", "NaN", "infinity", " 1", "1 ", "+1", "0x10", "-", "."};
        std::string text = "x\n";
        for (auto const& s : good) text += s + "\n";
        for (auto const& s : bad) text += rep::csv_quote(s) + "\n";
        write_text(f, text);
        auto const t = st::read_csv(f);
        REQUIRE(t.rows.size() == good.size() + bad.size());
        for (std::size_t i = 0; i < good.size(); ++i) {
            INFO(good[i]);
            double const x = t.number(i, 0);
            CHECK(rep::format_double(x) == good[i]);
        }
        for (std::size_t i = 0; i < bad.size(); ++i) {
            std::size_t const row = good.size() + i;
            auto const e = error_of([&] { (void)t.number(row, 0); });
            INFO("'" << bad[i] << "': " << e.what());
            CHECK(e.source() == f.string());
            CHECK(e.field() == "x");
            CHECK(e.value() == bad[i]);
            CHECK(contains(e.what(), "line " + std::to_string(row + 2)));
        }
        CHECK(contains(error_of([&] { (void)t.number(good.size() + 2, 0); }).what(), "out of range"));
        // integers: no fraction, no overflow
        for (std::size_t row : {std::size_t(3), good.size() + 1}) CHECK_THROWS_AS(t.integer(row, 0), qkgeom::input_error);
        CHECK(t.integer(7, 0) == 3);
        write_text(f, "n\n9223372036854775807\n9223372036854775808\n");
        auto const n = st::read_csv(f);
        CHECK(n.integer(0, 0) == std::numeric_limits<std::int64_t>::max());
        auto const e = error_of([&] { (void)n.integer(1, 0); });
        CHECK(e.value() == "9223372036854775808");
        CHECK(contains(e.what(), "line 3"));
    }
    SECTION("ragged row") {
        write_text(f, "a,b,c\n1,2,3\n4,5\n");
        auto const e = error_of([&] { (void)st::read_csv(f); });
        CHECK(e.source() == f.string());
        CHECK(e.field() == "line 3");
        CHECK(e.value() == "2");
        CHECK(contains(e.what(), "header's 3"));
        write_text(f, "a,b\n1,2\n\n3,4\n");  // a blank line is a one-field row, not skipped
        CHECK(error_of([&] { (void)st::read_csv(f); }).field() == "line 3");
        write_text(f, "a,b\n1,2\n\"x\ny\",2,3,4\n");  // too many fields: fails at the third, names the row's line
        auto const more = error_of([&] { (void)st::read_csv(f); });
        CHECK(more.field() == "line 3");
        CHECK(more.value() == "more than 2");
    }
    SECTION("malformed quoting, bare CR, duplicated or missing header") {
        struct bad_case {
            std::string text, field, value;
        };
        for (auto const& c : {bad_case{"a,b\n1,\"2\n", "line 2", "2\n"},
                              bad_case{"a\n\"" + std::string(100, 'z'), "line 2", std::string(64, 'z') + "..."}, bad_case{"a\nab\"c\n", "line 2", "ab\""},
                              bad_case{"a\n\"x\"y\n", "line 2", "y"}, bad_case{"a\n1\r2\n", "line 2", "\r"},
                              bad_case{"a,b,a\n", "line 1", "a"}, bad_case{"", "line 1", ""}}) {
            write_text(f, c.text);
            auto const e = error_of([&] { (void)st::read_csv(f); });
            INFO(e.what());
            CHECK(e.source() == f.string());
            CHECK(e.field() == c.field);
            CHECK(e.value() == c.value);
        }
        write_text(f, "a,b\n");
        auto const t = st::read_csv(f);  // a header alone: no rows
        CHECK(t.rows.empty());
        CHECK(t.column("b") == 1);
        CHECK_FALSE(t.find("c"));
        auto const e = error_of([&] { (void)t.column("c"); });
        CHECK(e.source() == f.string());
        CHECK(e.field() == "c");
    }
    SECTION("size limit and unreadable files") {
        write_text(f, "a\n12345\n");
        CHECK(st::read_csv(f, 8).rows.size() == 1);
        auto const e = error_of([&] { (void)st::read_csv(f, 7); });
        CHECK(e.source() == f.string());
        CHECK(e.field() == "file size");
        CHECK(e.value() == "8");
        auto const missing = tmp.path / "missing.csv";
        auto const m = error_of([&] { (void)st::read_csv(missing); });
        CHECK(m.source() == missing.string());
        CHECK(contains(m.what(), "No such file or directory"));
        auto const d = error_of([&] { (void)st::read_csv(tmp.path); });
        CHECK(d.source() == tmp.path.string());
        CHECK(contains(d.what(), "cannot read"));
    }
    CHECK(slurp(f).size() < 1000);
}

}  // namespace qkgeom_tests_study_read_test
