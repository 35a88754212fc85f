// The head-metric registry (qkgeom::head_metrics, issue 30) against everything
// that lists the head metrics: head_metric_names, head_metric_values, the
// head_metrics.csv columns, and the column tables of docs/outputs.md and
// docs/analyze.md; the per-bucket registry (qkgeom::profile_metrics) against
// profile_beyond_names/values, the head_profile.csv columns and docs/outputs.md.
// A name changed, added or moved in one place only fails here.
#include <qkgeom/report/csv.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_metric_registry_test {

namespace {

std::string read_doc(char const* name) {
    std::string const path = std::string(QKGEOM_TEST_DATA_DIR) + "/../../docs/" + name;
    std::ifstream in(path);
    INFO("reading " << path);
    REQUIRE(in.good());
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<std::string> lines_of(std::string const& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

/// The lines of the section that starts with the line `heading`, up to the next
/// heading of the same level.
std::vector<std::string> section(std::string const& text, std::string_view heading) {
    auto const all = lines_of(text);
    std::vector<std::string> out;
    bool in = false;
    for (auto const& l : all) {
        if (l == heading) {
            in = true;
            continue;
        }
        if (in && l.starts_with("## ")) break;
        if (in) out.push_back(l);
    }
    INFO("section " << heading);
    REQUIRE(!out.empty());
    return out;
}

/// The cells of a markdown table row (`| a | b |`), trimmed.
std::vector<std::string> cells(std::string const& row) {
    std::vector<std::string> out;
    std::size_t i = 1;
    while (i < row.size()) {
        auto j = row.find('|', i);
        while (j != std::string::npos && row[j - 1] == '\\') j = row.find('|', j + 1);
        if (j == std::string::npos) break;
        auto c = row.substr(i, j - i);
        auto const b = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
        out.push_back(b == std::string::npos ? std::string() : c.substr(b, e - b + 1));
        i = j + 1;
    }
    return out;
}

/// Every `backticked` word of a cell, in order.
std::vector<std::string> backticked(std::string const& cell) {
    std::vector<std::string> out;
    for (std::size_t i = cell.find('`'); i != std::string::npos; i = cell.find('`', i)) {
        auto const j = cell.find('`', i + 1);
        if (j == std::string::npos) break;
        out.push_back(cell.substr(i + 1, j - i - 1));
        i = j + 1;
    }
    return out;
}

/// The rows of the first table of `lines` (header and separator rows skipped).
std::vector<std::vector<std::string>> first_table(std::vector<std::string> const& lines) {
    std::vector<std::vector<std::string>> rows;
    bool started = false;
    for (auto const& l : lines) {
        if (l.starts_with("|")) {
            if (started && !l.starts_with("|---")) rows.push_back(cells(l));
            started = true;
        } else if (started) {
            break;
        }
    }
    return rows;
}

std::vector<std::string> registry_names() {
    std::vector<std::string> out;
    for (auto const& m : qkgeom::head_metrics) out.emplace_back(m.name);
    return out;
}

}  // namespace

TEST_CASE("head_metric_names and head_metric_values come from the registry", "[metrics][registry]") {
    using namespace qkgeom;
    STATIC_REQUIRE(head_metric_names.size() == head_metrics.size());
    std::set<std::string_view> seen;
    for (std::size_t i = 0; i < head_metrics.size(); ++i) {
        INFO("metric " << i);
        CHECK(head_metric_names[i] == head_metrics[i].name);
        CHECK(!head_metrics[i].meaning.empty());
        CHECK(head_metrics[i].value != nullptr);
        CHECK(seen.insert(head_metrics[i].name).second);  // names are unique
    }
    // The counts are the integer columns of head_metrics.csv (and the Python tables).
    std::vector<std::string_view> counts;
    for (auto const& m : head_metrics)
        if (m.kind == metric_kind::count) counts.push_back(m.name);
    CHECK(counts == std::vector<std::string_view>{"n_q_tokens", "n_k_tokens", "d_model"});
    // The first metric of issue 17 (study_read reads the ones from it on as optional).
    CHECK(head_metric_names[39] == "ap_drop_bias");

    head_analysis h;
    h.n_q_tokens = 7;
    h.n_k_tokens = 5;
    h.d_model = 4;
    h.householder.q_R2_pos = 0.25;
    h.rotation.residual_pos_cov = 1e-16;
    h.rope.coherence_raw = 0.5;
    auto const v = head_metric_values(h);
    for (std::size_t i = 0; i < head_metrics.size(); ++i) {
        INFO("metric " << head_metrics[i].name);
        double const r = head_metrics[i].value(h);
        CHECK(((std::isnan(v[i]) && std::isnan(r)) || v[i] == r));
    }
    CHECK(v[0] == 7.0);
    CHECK(v[1] == 5.0);
    CHECK(v[2] == 4.0);
    CHECK(v[3] == 0.25);
    CHECK(v[34] == 1e-16);
    CHECK(v[53] == 0.5);
}

TEST_CASE("head_metrics.csv columns are the registry between the id and the text columns", "[metrics][registry]") {
    auto const cols = qkgeom::report::head_metrics_columns();
    std::vector<std::string> expected{"layer", "q_head", "k_head"};
    for (auto const& n : registry_names()) expected.push_back(n);
    expected.insert(expected.end(), {"taxonomy", "flags", "rope_status"});
    CHECK(cols == expected);
}

TEST_CASE("docs/outputs.md's head_metrics.csv table and header list the registry", "[metrics][registry][docs]") {
    auto const sec = section(read_doc("outputs.md"), "## `head_metrics.csv`");
    auto const cols = qkgeom::report::head_metrics_columns();

    // The column table: the backticked names of the first cells, in order.
    std::vector<std::string> listed;
    for (auto const& row : first_table(sec)) {
        REQUIRE(!row.empty());
        for (auto& n : backticked(row[0])) listed.push_back(std::move(n));
    }
    CHECK(listed == cols);

    // The full header, in the code block after "The full header:".
    std::string joined;
    for (auto const& c : cols) joined += (joined.empty() ? "" : ",") + c;
    bool found = false;
    for (std::size_t i = 0; i + 3 < sec.size(); ++i)
        if (sec[i] == "The full header:") {
            found = true;
            CHECK(sec[i + 2] == "```");
            CHECK(sec[i + 3] == joined);
            break;
        }
    CHECK(found);
}

TEST_CASE("docs/analyze.md's head metric table has the registry's index and name", "[metrics][registry][docs]") {
    auto const sec =
        section(read_doc("analyze.md"), "## Head metrics: `head_metrics`, `head_metric_names`, `head_metric_values`");
    // Every row "| i | `name` | `kind` | source |" of the table is metric i.
    std::size_t n_rows = 0;
    for (auto const& row : first_table(sec)) {
        REQUIRE(row.size() >= 2);
        std::size_t const i = std::stoul(row[0]);
        REQUIRE(i < qkgeom::head_metrics.size());
        INFO("row " << i);
        REQUIRE(row.size() >= 3);
        CHECK(backticked(row[1]) == std::vector<std::string>{std::string(qkgeom::head_metrics[i].name)});
        CHECK(backticked(row[2]) ==
              std::vector<std::string>{std::string(qkgeom::metric_kind_name(qkgeom::head_metrics[i].kind))});
        CHECK(i == n_rows);
        ++n_rows;
    }
    CHECK(n_rows == qkgeom::head_metrics.size());
}

TEST_CASE("profile_beyond_names and profile_beyond_values come from the per-bucket registry", "[metrics][registry]") {
    using namespace qkgeom;
    STATIC_REQUIRE(profile_beyond_names.size() == profile_metrics.size());
    std::set<std::string_view> seen{"layer",     "q_head",   "k_head",  "q_bucket", "tau",   "n_queries",
                                    "plasticity", "std_error", "empirical", "quintile", "decile"};
    for (std::size_t k = 0; k < profile_metrics.size(); ++k) {
        INFO("profile value " << k);
        CHECK(profile_beyond_names[k] == profile_metrics[k].name);
        CHECK(!profile_metrics[k].meaning.empty());
        CHECK(seen.insert(profile_metrics[k].name).second);  // unique among head_profile.csv's columns
    }

    // Planted: two profile entries (q_bucket 3 and 5), split entries with
    // distinct values, a rank bucket for q_bucket 5 only (and one for 4, which
    // no profile entry has).
    head_analysis h;
    h.plasticity.profile.resize(2);
    h.plasticity.profile[0].q_bucket = 3;
    h.plasticity.profile[1].q_bucket = 5;
    h.plasticity.split.profile.resize(2);
    for (int i = 0; i < 2; ++i) {
        auto& s = h.plasticity.split.profile[std::size_t(i)];
        double const o = 10.0 * i;
        s.pos_mean_rms = o + 1, s.content_mean_rms = o + 2, s.pos_var = o + 3, s.content_var = o + 4;
        s.ap_no_drift = o + 5, s.ap_frozen_content = o + 6, s.ap_neither = o + 7;
    }
    h.ranks.profile.resize(2);
    h.ranks.profile[0].q_bucket = 4;
    h.ranks.profile[0].top1_flip = 0.9;
    h.ranks.profile[1].q_bucket = 5;
    h.ranks.profile[1].top1_flip = 0.25, h.ranks.profile[1].top1_flip_se = 0.5;
    h.ranks.profile[1].kendall = 0.75, h.ranks.profile[1].kendall_se = 0.125;

    auto const v0 = profile_beyond_values(h, 0), v1 = profile_beyond_values(h, 1), v2 = profile_beyond_values(h, 2);
    for (std::size_t k = 0; k < 7; ++k) {
        CHECK(v0[k] == double(k + 1));
        CHECK(v1[k] == double(k + 11));
    }
    for (std::size_t k = 7; k < 11; ++k) CHECK(std::isnan(v0[k]));  // no rank bucket 3 (4 is not 3)
    CHECK(v1[7] == 0.25);
    CHECK(v1[8] == 0.5);
    CHECK(v1[9] == 0.75);
    CHECK(v1[10] == 0.125);
    for (double x : v2) CHECK(std::isnan(x));  // beyond the profile
}

TEST_CASE("head_profile.csv columns and docs/outputs.md's table list the per-bucket registry", "[metrics][registry][docs]") {
    auto const cols = qkgeom::report::head_profile_columns();
    std::vector<std::string> expected{"layer",      "q_head",    "k_head",    "q_bucket", "tau",   "n_queries",
                                      "plasticity", "std_error", "empirical", "quintile", "decile"};
    for (auto const& m : qkgeom::profile_metrics) expected.emplace_back(m.name);
    CHECK(cols == expected);

    auto const sec = section(read_doc("outputs.md"), "## `head_profile.csv`");
    std::vector<std::string> listed;
    std::size_t n_registry_rows = 0;
    for (auto const& row : first_table(sec)) {
        REQUIRE(row.size() >= 2);
        auto names = backticked(row[0]);
        if (names.size() == 1)
            for (auto const& m : qkgeom::profile_metrics)
                if (names[0] == m.name) {  // the registry's meaning is the table's
                    INFO("column " << m.name);
                    CHECK(row[1] == m.meaning);
                    ++n_registry_rows;
                }
        for (auto& n : names) listed.push_back(std::move(n));
    }
    CHECK(listed == cols);
    CHECK(n_registry_rows == qkgeom::profile_metrics.size());
}

}  // namespace qkgeom_tests_metric_registry_test
