// Studies (docs/study.md): a synthetic study with planted trends (drift that
// grows then collapses over checkpoints, three families with separated
// AP_drop) is recovered — the trajectory, the family order and the sign of
// each factor of the bias decomposition; the benchmark join reproduces the
// rank correlations computed by hand from the thesis' Table 6.3 (seed file
// 001, Table 1); the cache analyses each capture once and again only when its
// bytes or the options change; a broken run is reported and the rest go on;
// the study file's errors name the file, field and value.
#include "temp_dir.hpp"

#include <qkgeom/capture/synthetic.hpp>
#include <qkgeom/core/bytes.hpp>
#include <qkgeom/core/cancel.hpp>
#include <qkgeom/io/moments_io.hpp>
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/report/csv.hpp>
#include <qkgeom/report/study_tables.hpp>
#include <qkgeom/run/study_run.hpp>
#include <qkgeom/run/study_spec.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_study_test {

namespace {

namespace st = qkgeom::study;
namespace syn = qkgeom::synthetic;
namespace fs = std::filesystem;

struct temp_dir : qkgeom_test::temp_dir {
    temp_dir() : qkgeom_test::temp_dir("qkgeom_study_test_") {}
};

void write_file(fs::path const& p, std::string const& text) {
    std::ofstream(p, std::ios::binary) << text;
}

// --- planted heads ------------------------------------------------------------
struct planted {
    double q_slope, k_slope, content;  // family
    double k_factor, q_intercept;      // checkpoint
};

syn::layer_spec planted_layer(planted const& p, std::int64_t layer) {
    syn::layer_spec L;
    L.d = 16;
    L.rotary_dims = 8;
    L.n_q_heads = 4;
    L.n_kv_heads = 2;
    L.layer = layer;
    L.model_seed = 100 + static_cast<std::uint64_t>(layer);
    for (int h = 0; h < 4; ++h) {
        syn::q_head_params q;
        q.query.intercept = p.q_intercept;
        q.query.slope = p.q_slope;
        q.query.bucket_mean_scale = p.content;
        L.q_heads.push_back(q);
    }
    for (int g = 0; g < 2; ++g) {
        syn::kv_head_params kv;
        kv.key.intercept = -1.0;
        kv.key.slope = p.k_slope * p.k_factor * (1.0 + 0.2 * g);
        kv.key.bucket_mean_scale = p.content;
        L.kv_heads.push_back(kv);
    }
    return L;
}

syn::capture_spec planted_capture() {
    syn::capture_spec cap;
    cap.n_examples = 24;
    cap.context_length = 2048;
    cap.buckets = {qkgeom::bucket_scheme::uniform, 128, 1.0};
    cap.seed = 5;
    return cap;
}

/// Two layers of 4 query heads, analysed and written as an analysis folder.
void write_planted_run(fs::path const& dir, planted const& p) {
    std::vector<qkgeom::head_analysis> heads;
    for (std::int64_t layer = 0; layer < 2; ++layer)
        for (auto const& hc : syn::generate_layer(planted_layer(p, layer), planted_capture()))
            heads.push_back(qkgeom::analyze_head(hc));
    qkgeom::report::write_reports(dir, "planted", heads);
}

double metric(st::run_summary const& r, std::string const& m) { return r.metrics.at(m).value; }

}  // namespace

TEST_CASE("a planted study: trajectory, family order and the bias decomposition are recovered", "[study]") {
    temp_dir tmp;
    // Families: rising drift, falling content (AP_drop rises steady < moderate < steep).
    struct fam {
        char const* name;
        double q_slope, k_slope, content;
    };
    fam const families[] = {{"steady", 5e-4, 1e-3, 1.0}, {"moderate", 8e-4, 1.6e-3, 0.5}, {"steep", 2e-3, 4e-3, 0.2}};
    // Checkpoints: the key drift grows, then collapses; the query's mean on the drift axis rises.
    double const k_factor[] = {0.5, 1.0, 1.6, 0.15};
    double const q_intercept[] = {1.5, 2.0, 2.5, 3.5};
    st::study_spec spec;
    for (auto const& f : families)
        for (int k = 0; k < 4; ++k) {
            st::run_spec r;
            r.name = std::string(f.name) + "@" + std::to_string(k);
            r.family = r.model = f.name;
            r.ckpt.step = 1000 * (4 - k);  // steps descending in the file: the order comes from `order`
            r.ckpt.order = k;
            r.analysis = tmp.path / r.name;
            r.index = spec.runs.size();
            write_planted_run(r.analysis, {f.q_slope, f.k_slope, f.content, k_factor[k], q_intercept[k]});
            spec.runs.push_back(r);
        }
    auto const result = st::run_study(spec, {});
    REQUIRE(result.runs.size() == 12);
    for (auto const& r : result.runs) {
        REQUIRE(r.status == st::run_status::read);
        REQUIRE(r.n_heads == 8);
    }
    // The trajectory: 4 steps per model, in `order`, never in file (step) order.
    REQUIRE(result.trajectory.size() == 12);
    std::map<std::string, std::vector<st::trajectory_step>> by_model;
    for (auto const& s : result.trajectory) by_model[s.model].push_back(s);
    for (auto const& f : families) {
        auto const& steps = by_model.at(f.name);
        REQUIRE(steps.size() == 4);
        for (int k = 0; k < 4; ++k) REQUIRE(result.runs[steps[k].run].spec.ckpt.order == double(k));
        // bias_strength (mu_q_a · alpha_k) grows over the first three checkpoints, then collapses.
        double const b0 = steps[0].gm_bias, b1 = steps[1].gm_bias, b2 = steps[2].gm_bias, b3 = steps[3].gm_bias;
        CHECK(b0 < b1);
        CHECK(b1 < b2);
        CHECK(b3 < b0);
        for (int k = 1; k < 4; ++k) {
            auto const& s = steps[k];
            // The decomposition is exact (one head set, one identity).
            CHECK(s.dlog_bias == Approx(s.dlog_mu_q_a + s.dlog_alpha_k).margin(1e-12));
            // Each factor moves the planted way: |mu_q_a| rises at every step,
            // |alpha_k| rises twice, then collapses.
            CHECK(s.dlog_mu_q_a > 0);
            if (k < 3) CHECK(s.dlog_alpha_k > 0);
            else CHECK(s.dlog_alpha_k < std::log(0.3));  // planted 0.15 / 1.6
            CHECK(s.n_decomposed == 8);
        }
    }
    // The family order of AP_drop holds at every checkpoint with drift.
    for (int k = 0; k < 3; ++k) {
        double const a = metric(result.runs[0 * 4 + k], "ap_drop"), b = metric(result.runs[1 * 4 + k], "ap_drop"),
                     c = metric(result.runs[2 * 4 + k], "ap_drop");
        CHECK(a < b);
        CHECK(b < c);
    }
    // Bootstrap intervals bracket the mean; per-head trajectories pair the 8 heads.
    for (auto const& r : result.runs) {
        auto const& e = r.metrics.at("ap_drop");
        CHECK(e.lo <= e.value);
        CHECK(e.value <= e.hi);
        CHECK(e.n == 8);
    }
    REQUIRE(result.head_trajectories.size() == 3);
    for (auto const& h : result.head_trajectories) {
        CHECK(h.heads.size() == 8);
        CHECK(h.runs.size() == 4);
    }
    // Tables: one model row per run, a taxonomy row per run and class.
    auto const tables = st::study_tables(result);
    REQUIRE(tables[0].file == "study_models.csv");
    CHECK(tables[0].rows.size() == 12);
    CHECK(tables[3].rows.size() == 12 * qkgeom::report::taxonomy_classes.size());
}

namespace {

/// The thesis' Table 6.3 (seed file 001, Table 1): model, family, LBP, ap_drop, bias_strength.
struct table1_row {
    char const* model;
    char const* family;
    double lbp, ap_drop, bias;
};
table1_row const table1[] = {
    {"ministral3-14b", "ministral", 40.14, 0.068, 3.00e-4}, {"ministral3-8b", "ministral", 37.80, 0.082, 3.00e-4},
    {"qwen3-14b", "qwen", 37.11, 0.161, 8.00e-4},           {"qwen3-8b", "qwen", 33.41, 0.178, 9.00e-4},
    {"qwen3-4b", "qwen", 31.26, 0.186, 1.00e-3},            {"ministral3-3b", "ministral", 30.18, 0.072, 3.00e-4},
    {"llama3.2-3b", "llama", 15.71, 0.230, 6.00e-4}};

st::correlation_row const& find_row(st::study_result const& r, std::string const& metric, std::string const& group) {
    for (auto const& c : r.correlations)
        if (c.metric == metric && c.group == group) return c;
    FAIL("no correlation row " << metric << " / " << group);
    return r.correlations.front();
}

}  // namespace

TEST_CASE("the benchmark join reproduces the rank correlations of the thesis' Table 6.3 by hand", "[study]") {
    temp_dir tmp;
    std::string csv = "model,score\n", runs;
    for (auto const& t : table1) {
        csv += std::string(t.model) + "," + std::to_string(t.lbp) + "\n";
        runs += std::string(runs.empty() ? "" : ",\n") + "{\"name\": \"" + t.model + "\", \"family\": \"" + t.family +
                "\", \"metrics\": {\"ap_drop\": " + std::to_string(t.ap_drop) +
                ", \"bias_strength\": " + std::to_string(t.bias) + "}}";
    }
    write_file(tmp.path / "lbp.csv", csv);
    write_file(tmp.path / "study.json",
               "{\"title\": \"Table 6.3\", \"correlate\": [\"ap_drop\", \"bias_strength\"],\n"
               " \"benchmarks\": [{\"name\": \"LBP\", \"overall\": \"lbp.csv\"}],\n \"runs\": [\n" + runs + "]}\n");
    auto const spec = st::read_study(tmp.path / "study.json");
    auto const r = st::run_study(spec, {});
    for (auto const& run : r.runs) REQUIRE(run.status == st::run_status::given);

    // ap_drop vs LBP. Ranks (ascending) — LBP: llama 1, m3b 2, q4b 3, q8b 4,
    // q14b 5, m8b 6, m14b 7; ap_drop: m14b 1, m3b 2, m8b 3, q14b 4, q8b 5,
    // q4b 6, llama 7. d = 6, 3, 1, −1, −3, 0, −6: Σd² = 92, so
    // ρ = 1 − 6·92/(7·48) = −9/14. Ordered by LBP descending, ap_drop reads
    // .068 .082 .161 .178 .186 .072 .230: 4 pairs fall with LBP (concordant),
    // 17 rise: τ = (4 − 17)/21 = −13/21. Exact two-sided p of Kendall: the
    // permutations of 7 with ≤ 4 or ≥ 17 inversions, 2·(1 + 6 + 20 + 49 + 98)
    // = 348 of 5040.
    auto const& all = find_row(r, "ap_drop", "all");
    CHECK(all.n == 7);
    CHECK(all.spearman == Approx(-9.0 / 14.0).margin(1e-12));
    CHECK(all.kendall == Approx(-13.0 / 21.0).margin(1e-12));
    CHECK(all.p_kendall == Approx(348.0 / 5040.0).margin(1e-12));
    CHECK(all.p_method == "exact");
    // bias_strength has a three-way tie (3e-4): average ranks 2, 2, 2; then
    // llama 4, q14b 5, q8b 6, q4b 7. Centred: (−2, −2, 1, 2, 3, −2, 0) against
    // LBP's (3, 2, 1, 0, −1, −2, −3): ρ = −8/√(26·28).
    CHECK(find_row(r, "bias_strength", "all").spearman == Approx(-8.0 / std::sqrt(26.0 * 28.0)).margin(1e-12));
    // Within Qwen, ap_drop falls as LBP rises: ρ = τ = −1, exact p = 2/3! .
    auto const& qwen = find_row(r, "ap_drop", "qwen");
    CHECK(qwen.n == 3);
    CHECK(qwen.spearman == Approx(-1.0).margin(1e-12));
    CHECK(qwen.kendall == Approx(-1.0).margin(1e-12));
    CHECK(qwen.p_kendall == Approx(2.0 / 6.0).margin(1e-12));
    // Within Ministral: LBP ranks m3b 1, m8b 2, m14b 3; ap_drop m14b 1, m3b 2,
    // m8b 3: Σd² = 4 + 1 + 1 = 6, ρ = 1 − 36/24 = −1/2.
    CHECK(find_row(r, "ap_drop", "ministral").spearman == Approx(-0.5).margin(1e-12));
    // Llama has one model: no within-family row.
    for (auto const& c : r.correlations) CHECK(c.group != "llama");
    // The model table carries the score beside the given metric (no interval: no heads).
    for (auto const& run : r.runs) {
        CHECK(run.scores.at("LBP") > 15);
        CHECK(std::isnan(run.metrics.at("ap_drop").lo));
    }
}

namespace {

/// A small capture in the dataset layout (one layer, 2 query heads, 1 kv head).
void write_capture(fs::path const& dir, std::uint64_t seed) {
    syn::layer_spec L;
    L.d = 8;
    L.rotary_dims = 4;
    L.n_q_heads = 2;
    L.n_kv_heads = 1;
    L.model_seed = seed;
    syn::capture_spec cap;
    cap.n_examples = 8;
    cap.context_length = 512;
    cap.buckets = {qkgeom::bucket_scheme::uniform, 64, 1.0};
    cap.seed = seed;
    qkgeom::io::manifest m;
    m.model = "cap" + std::to_string(seed);
    m.n_layers = 1;
    m.n_q_heads = {2};
    m.n_kv_heads = {1};
    m.head_dim = 8;
    m.buckets = cap.buckets;
    m.context_length = cap.context_length;
    m.seed = seed;
    fs::create_directories(dir);
    qkgeom::io::write_manifest(dir, m);
    for (auto const& hc : syn::generate_layer(L, cap)) {
        auto put = [&](qkgeom::kind k, auto const& rows, std::int64_t head) {
            qkgeom::io::head_entry e;
            e.layer = 0;
            e.head = head;
            e.k = k;
            e.vectors = rows.vectors;
            e.position = rows.position;
            e.bucket = rows.bucket;
            e.example_id = rows.example_id;
            qkgeom::io::write_head(dir, m, e, qkgeom::io::storage_format::npy, "f32");
        };
        put(qkgeom::kind::query, hc.queries, hc.id.q_head);
        if (hc.id.q_head == 0) put(qkgeom::kind::key, hc.keys, hc.id.k_head);
    }
}

/// A study of n runs "run<i>", each a capture written to dir/cap<i> with seed seed0 + i.
st::study_spec captures_in(fs::path const& dir, int n, std::uint64_t seed0) {
    st::study_spec spec;
    for (int i = 0; i < n; ++i) {
        st::run_spec r;
        r.name = r.model = r.family = "run" + std::to_string(i);
        r.capture = dir / ("cap" + std::to_string(i));
        r.index = spec.runs.size();
        write_capture(r.capture, seed0 + static_cast<std::uint64_t>(i));
        spec.runs.push_back(r);
    }
    return spec;
}

std::vector<st::run_status> statuses(std::vector<st::run_outcome> const& o) {
    std::vector<st::run_status> s;
    for (auto const& x : o) s.push_back(x.status);
    return s;
}

}  // namespace

TEST_CASE("study analyzers: f32 captures go to analyzer_f32 when it is given, with the same numbers", "[study]") {
    temp_dir tmp;
    st::study_spec spec = captures_in(tmp.path, 2, 30);  // stored as f32
    std::atomic<int> f64_calls{0}, f32_calls{0};
    auto const doubles = [&](qkgeom::head_capture<qkgeom::row_matrix> const& h, qkgeom::analysis_options const& o) {
        ++f64_calls;
        return qkgeom::analyze_head(h, o);
    };
    auto const floats = [&](qkgeom::head_capture<qkgeom::io::row_matrix_f32> const& h,
                            qkgeom::analysis_options const& o) {
        ++f32_calls;
        return qkgeom::analyze_head(h, o);
    };
    std::vector<std::vector<st::run_outcome>> runs;
    for (int setup = 0; setup < 3; ++setup) {  // none; analyzer alone; analyzer + analyzer_f32
        st::study_run_options o;
        o.jobs = 1;
        o.cache = tmp.path / ("cache" + std::to_string(setup));
        if (setup >= 1) o.analyzer = doubles;
        if (setup == 2) o.analyzer_f32 = floats;
        f64_calls = f32_calls = 0;
        runs.push_back(st::run_all(spec, o));
        INFO("setup " << setup);
        CHECK(f64_calls == (setup == 1 ? 4 : 0));  // 2 runs x 2 query heads
        CHECK(f32_calls == (setup == 2 ? 4 : 0));
    }
    for (int setup = 1; setup < 3; ++setup)
        for (std::size_t r = 0; r < 2; ++r) {
            REQUIRE(runs[std::size_t(setup)][r].heads.heads.size() == 2);
            for (std::size_t h = 0; h < 2; ++h)
                for (std::size_t m = 0; m < qkgeom::head_metric_names.size(); ++m) {
                    double const a = runs[0][r].heads.heads[h].metrics[m];
                    double const b = runs[std::size_t(setup)][r].heads.heads[h].metrics[m];
                    INFO("setup " << setup << ", run " << r << ", head " << h << ", " << qkgeom::head_metric_names[m]);
                    CHECK(((std::isnan(a) && std::isnan(b)) || a == b));
                }
        }
}

TEST_CASE("the cache: analysed once, again only for changed bytes or options, a broken run is reported", "[study]") {
    temp_dir tmp;
    st::study_spec spec = captures_in(tmp.path, 3, 10);
    st::study_run_options o;
    o.jobs = 2;
    o.cache = tmp.path / "cache";
    using S = st::run_status;
    auto const first = st::run_all(spec, o);
    CHECK(statuses(first) == std::vector<S>{S::analysed, S::analysed, S::analysed});
    // A second run analyses nothing, and reads back the same numbers.
    auto const second = st::run_all(spec, o);
    CHECK(statuses(second) == std::vector<S>{S::cached, S::cached, S::cached});
    REQUIRE(second[1].heads.heads.size() == 2);
    for (std::size_t m = 0; m < qkgeom::head_metric_names.size(); ++m) {
        double const a = first[1].heads.heads[0].metrics[m], b = second[1].heads.heads[0].metrics[m];
        CHECK(((std::isnan(a) && std::isnan(b)) || a == b));
    }
    // Adding a run analyses only it.
    st::run_spec extra = spec.runs[0];
    extra.name = "run3";
    extra.capture = tmp.path / "cap3";
    extra.index = 3;
    write_capture(extra.capture, 20);
    spec.runs.push_back(extra);
    CHECK(statuses(st::run_all(spec, o)) == std::vector<S>{S::cached, S::cached, S::cached, S::analysed});
    // Changing the bytes of one capture re-analyses only it; touching alone does not
    // (the key is the content).
    write_capture(spec.runs[1].capture, 99);
    fs::last_write_time(spec.runs[2].capture / "manifest.json", fs::file_time_type::clock::now());
    CHECK(statuses(st::run_all(spec, o)) == std::vector<S>{S::cached, S::analysed, S::cached, S::cached});
    // Changing an option analyses every capture again; so does the same
    // option given in the study file ("options" win over the caller's), and
    // then the entries made with it are found again.
    auto o2 = o;
    o2.analysis.plasticity.pairs = qkgeom::pair_policy::prefix;
    CHECK(statuses(st::run_all(spec, o2)) == std::vector<S>{S::analysed, S::analysed, S::analysed, S::analysed});
    auto with_file_options = spec;
    with_file_options.options = qkgeom::json::parse(R"({"pairs": "prefix"})");
    CHECK(statuses(st::run_all(with_file_options, o)) == std::vector<S>{S::cached, S::cached, S::cached, S::cached});
    with_file_options.options = qkgeom::json::parse(R"({"pairs": "prefix", "samples": 10, "enumeration": "sampled"})");
    CHECK(statuses(st::run_all(with_file_options, o)) ==
          std::vector<S>{S::analysed, S::analysed, S::analysed, S::analysed});
    // The options of the analyses beyond the thesis are part of the key too:
    // given in the file they re-analyse; the same from the caller finds them.
    with_file_options.options = qkgeom::json::parse(R"({"rank_keys": 4, "split": false})");
    CHECK(statuses(st::run_all(with_file_options, o)) ==
          std::vector<S>{S::analysed, S::analysed, S::analysed, S::analysed});
    auto o4 = o;
    o4.analysis.ranks.keys_per_set = 4;
    o4.analysis.plasticity.split_profile = false;
    CHECK(statuses(st::run_all(spec, o4)) == std::vector<S>{S::cached, S::cached, S::cached, S::cached});
    // A fresh cache with the old one as previous: every entry is copied, none analysed.
    auto o3 = o;
    o3.cache = tmp.path / "cache2";
    o3.previous_caches = {o.cache};
    CHECK(statuses(st::run_all(spec, o3)) == std::vector<S>{S::cached, S::cached, S::cached, S::cached});
    // A broken run (its capture lost its manifest) fails with a message; the others go on.
    fs::remove(spec.runs[2].capture / "manifest.json");
    auto const broken = st::run_all(spec, o);
    CHECK(statuses(broken) == std::vector<S>{S::cached, S::cached, S::failed, S::cached});
    CHECK(broken[2].message.find("manifest.json") != std::string::npos);
    auto const r = st::compute_study(spec, broken);
    CHECK(r.runs[2].status == S::failed);
    CHECK(r.runs[3].n_heads == 2);
}

TEST_CASE("study file errors name the file, the field and the value", "[study]") {
    auto error_of = [](std::string const& text) -> qkgeom::input_error {
        try {
            (void)st::parse_study(text, "s.json");
        } catch (qkgeom::input_error const& e) {
            return e;
        }
        FAIL("no error for " << text);
        return qkgeom::input_error("", "", "", "");
    };
    auto e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}}], "bootsrap": {}})");
    CHECK(e.source() == "s.json");
    CHECK(e.field() == "(top level).bootsrap");
    e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}}, {"name": "a", "metrics": {"ap_drop": 0.2}}]})");
    CHECK(e.field() == "runs[1].name");
    CHECK(e.value() == "\"a\"");
    e = error_of(R"({"runs": [{"name": "a", "capture": "x", "analysis": "y"}]})");
    CHECK(e.field() == "runs[0]");
    e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_dorp": 0.1}}]})");
    CHECK(e.field() == "runs[0].metrics.ap_dorp");
    e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}, "checkpoint": {"step": -3}}]})");
    CHECK(e.field() == "runs[0].checkpoint.step");
    CHECK(e.value() == "-3");
    e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}}], "options": {"pairs": "pairwise"}})");
    CHECK(e.field() == "options.pairs");
    CHECK(e.value() == "\"pairwise\"");
    e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}}], "options": {"low": 0.8, "high": 0.2}})");
    CHECK(e.field() == "options.low, options.high");
    // Integer options take the program's ranges (core/validate.hpp): work stays bounded.
    e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}}], "options": {"rank_sets": 1000000000000}})");
    CHECK(e.field() == "options.rank_sets");
    CHECK(std::string(e.what()).find("[1, 1000000]") != std::string::npos);
    e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}}], "options": {"samples": 1000000000001}})");
    CHECK(e.field() == "options.samples");
    e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}}], "options": {"components": 4097}})");
    CHECK(e.field() == "options.components");
    e = error_of(R"({"runs": []})");
    CHECK(e.field() == "runs");
    e = error_of(R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}}], "token_edges": [0, 10, 10]})");
    CHECK(e.field() == "token_edges[2]");
    // Names are one-line labels: no control character, at most 200 bytes.
    e = error_of(R"({"runs": [{"name": "a\nb", "metrics": {"ap_drop": 0.1}}]})");
    CHECK(e.field() == "runs[0].name");
    CHECK(std::string(e.what()).find("control character") != std::string::npos);
    e = error_of(R"({"runs": [{"name": "a", "family": "f\tg", "metrics": {"ap_drop": 0.1}}]})");
    CHECK(e.field() == "runs[0].family");
    std::string const long_name(st::study_max_name_bytes + 1, 'x');
    e = error_of(R"({"runs": [{"name": "a", "model": ")" + long_name + R"(", "metrics": {"ap_drop": 0.1}}]})");
    CHECK(e.field() == "runs[0].model");
    CHECK(std::string(e.what()).find("longer than 200 bytes") != std::string::npos);
    CHECK(st::parse_study(R"({"runs": [{"name": ")" + long_name.substr(1) + R"(", "metrics": {"ap_drop": 0.1}}]})",
                          "s.json")
              .runs[0]
              .name.size() == st::study_max_name_bytes);
    // A byte-order mark is named as such.
    e = error_of("\xEF\xBB\xBF" R"({"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}}]})");
    CHECK(e.field() == "json");
    CHECK(std::string(e.what()).find("byte-order mark") != std::string::npos);
    // Relative paths resolve against the study file's folder.
    auto const s = st::parse_study(R"({"runs": [{"name": "a", "capture": "caps/a"}]})", "/data/studies/s.json");
    CHECK(s.runs[0].capture == fs::path("/data/studies/caps/a"));
    CHECK(s.runs[0].model == "a");
    CHECK(s.runs[0].family == "a");
}

}  // namespace qkgeom_tests_study_test

namespace qkgeom_tests_study_test {

namespace {

/// Every file of a tree (relative path → bytes), links followed.
std::map<std::string, std::string> tree_bytes(fs::path const& dir) {
    std::map<std::string, std::string> out;
    for (auto const& e : fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink))
        if (e.is_regular_file()) {
            std::ifstream in(e.path(), std::ios::binary);
            out[fs::relative(e.path(), dir).generic_string()] = std::string(std::istreambuf_iterator<char>(in), {});
        }
    return out;
}

/// The same numbers (NaN equal to NaN) in every head metric of two outcomes.
bool same_numbers(st::run_outcome const& a, st::run_outcome const& b) {
    if (a.heads.heads.size() != b.heads.heads.size()) return false;
    for (std::size_t h = 0; h < a.heads.heads.size(); ++h)
        for (std::size_t m = 0; m < qkgeom::head_metric_names.size(); ++m) {
            double const x = a.heads.heads[h].metrics[m], y = b.heads.heads[h].metrics[m];
            if (!((std::isnan(x) && std::isnan(y)) || x == y)) return false;
        }
    return true;
}

/// Changes one digit of a file, keeping its size (a hand edit).
void flip_a_digit(fs::path const& p) {
    std::string s;
    {
        std::ifstream in(p, std::ios::binary);
        s.assign(std::istreambuf_iterator<char>(in), {});
    }
    auto const at = s.find_first_of("123456789", s.find('\n'));
    REQUIRE(at != std::string::npos);
    s[at] = s[at] == '9' ? '8' : static_cast<char>(s[at] + 1);
    write_file(p, s);
}

}  // namespace

TEST_CASE("the cache is verified: a damaged entry is analysed again and said", "[study][cache]") {
    temp_dir tmp;
    st::study_spec spec = captures_in(tmp.path, 1, 40);
    st::study_run_options o;
    o.jobs = 1;
    o.cache = tmp.path / "cache";
    using S = st::run_status;
    auto const first = st::run_all(spec, o);
    REQUIRE(first[0].status == S::analysed);
    auto const entry = first[0].folder;
    auto const caps = tree_bytes(tmp.path / "cap0");
    // Each way of damaging the entry: served never, analysed again, said in the note.
    struct damage {
        char const* what;
        std::function<void()> make;
        char const* said;
    };
    std::vector<damage> const damages{
        {"a hand-edited head_metrics.csv (same size)", [&] { flip_a_digit(entry / "head_metrics.csv"); },
         "head_metrics.csv differs from its recorded checksum"},
        {"a deleted head_profile.csv", [&] { fs::remove(entry / "head_profile.csv"); }, "head_profile.csv is missing"},
        {"a file added", [&] { write_file(entry / "head_extra.csv", "x\n"); }, "head_extra.csv is not listed"},
        {"a lost key file", [&] { fs::remove(entry / std::string(st::cache_key_file)); }, "missing or unreadable"}};
    for (auto const& d : damages) {
        INFO(d.what);
        d.make();
        auto const again = st::run_all(spec, o);
        CHECK(again[0].status == S::analysed);
        CHECK(again[0].note.find(d.said) != std::string::npos);
        CHECK(same_numbers(first[0], again[0]));
        auto const third = st::run_all(spec, o);  // healed
        CHECK(third[0].status == S::cached);
        CHECK(third[0].note.empty());
    }
    // A damaged entry of a previous cache is not copied: analysed, and said.
    auto o2 = o;
    o2.cache = tmp.path / "cache2";
    o2.previous_caches = {o.cache};
    flip_a_digit(entry / "head_profile.csv");
    auto const from_previous = st::run_all(spec, o2);
    CHECK(from_previous[0].status == S::analysed);
    CHECK(from_previous[0].note.find("earlier cache") != std::string::npos);
    CHECK(same_numbers(first[0], from_previous[0]));
    CHECK(tree_bytes(tmp.path / "cap0") == caps);  // the capture is only read
}

TEST_CASE("a killed writer's partial and stale folders are removed once a day old, never a live one's",
          "[study][cache]") {
    temp_dir tmp;
    st::study_spec spec = captures_in(tmp.path, 1, 40);
    st::study_run_options o;
    o.jobs = 1;
    o.cache = tmp.path / "cache";
    fs::create_directories(o.cache);
    auto const old_time = fs::file_time_type::clock::now() - st::cache_debris_age - std::chrono::hours(1);
    for (auto const* name : {"k1.partial-dead", "k2.stale-dead"}) {
        fs::create_directories(o.cache / name);
        write_file(o.cache / name / "head_metrics.csv", "x\n");
        fs::last_write_time(o.cache / name, old_time);
    }
    fs::create_directories(o.cache / "k3.partial-live");  // a concurrent writer's, just made
    fs::create_directories(o.cache / "k4-not-debris");    // not named as debris, however old
    fs::last_write_time(o.cache / "k4-not-debris", old_time);
    auto const out = st::run_all(spec, o);
    CHECK(out[0].status == st::run_status::analysed);
    CHECK(!fs::exists(o.cache / "k1.partial-dead"));
    CHECK(!fs::exists(o.cache / "k2.stale-dead"));
    CHECK(fs::exists(o.cache / "k3.partial-live"));
    CHECK(fs::exists(o.cache / "k4-not-debris"));
}

TEST_CASE("the cache follows links, reads only what the analysis reads, and sees writes during a run",
          "[study][cache]") {
    temp_dir tmp;
    using S = st::run_status;
    // An entry folder that is a symbolic link: its target's bytes are the key.
    write_capture(tmp.path / "real", 50);
    write_capture(tmp.path / "other", 51);
    fs::create_directories(tmp.path / "cap");
    fs::copy(tmp.path / "real" / "manifest.json", tmp.path / "cap" / "manifest.json");
    for (auto const& e : fs::directory_iterator(tmp.path / "real"))
        if (e.path().filename() != "manifest.json")
            fs::create_directory_symlink(e.path(), tmp.path / "cap" / e.path().filename());
    st::study_spec spec;
    st::run_spec r;
    r.name = r.model = r.family = "linked";
    r.capture = tmp.path / "cap";
    spec.runs.push_back(r);
    st::study_run_options o;
    o.jobs = 1;
    o.cache = tmp.path / "cache";
    auto const first = st::run_all(spec, o);
    REQUIRE(first[0].status == S::analysed);
    std::string const fp = st::capture_fingerprint(r.capture);
    // The entry behind the link gets another seed's rows.
    auto const q = qkgeom::io::head_entry_name(0, 0, qkgeom::kind::query);
    for (auto const& f : fs::directory_iterator(tmp.path / "other" / q))
        fs::copy(f.path(), tmp.path / "real" / q / f.path().filename(), fs::copy_options::overwrite_existing);
    CHECK(st::capture_fingerprint(r.capture) != fp);
    auto const second = st::run_all(spec, o);
    INFO(second[0].message);
    CHECK(second[0].status == S::analysed);
    CHECK(!same_numbers(first[0], second[0]));
    // A file the analysis does not read changes nothing (and is not read).
    std::string const fp2 = st::capture_fingerprint(r.capture);
    write_file(tmp.path / "cap" / "notes.txt", "not part of the capture\n");
    CHECK(st::capture_fingerprint(r.capture) == fp2);
    CHECK(st::run_all(spec, o)[0].status == S::cached);
    // A file over fingerprint_max_file_bytes counts by its metadata: a sparse
    // stray entry is never read whole, and touching it changes the key.
    auto const big = tmp.path / "cap" / (qkgeom::io::head_entry_name(5, 0, qkgeom::kind::query) + ".npz");
    {
        std::ofstream f(big, std::ios::binary);
        f.seekp(static_cast<std::streamoff>(st::fingerprint_max_file_bytes) + 1);
        f.put('\0');
    }
    std::string const fp3 = st::capture_fingerprint(r.capture);
    fs::last_write_time(big, fs::last_write_time(big) - std::chrono::hours(1));
    CHECK(st::capture_fingerprint(r.capture) != fp3);
    fs::remove(big);
    // A write that puts the same bytes back is seen by capture_state (on
    // POSIX the status-change time cannot be set back); the program refuses
    // to cache an analysis across such a change.
    auto const before = st::capture_state(r.capture);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past the file system's time granularity
    auto const vec = tmp.path / "real" / q / "vectors.npy";
    auto const bytes = tree_bytes(tmp.path / "real" / q).at("vectors.npy");
    write_file(vec, bytes);
    CHECK(st::capture_state(r.capture) != before);
    CHECK(st::capture_fingerprint(r.capture) == fp2);
}

TEST_CASE("studies sharing a cache at once all succeed, with one entry and no debris", "[study][cache]") {
    temp_dir tmp;
    st::study_spec spec = captures_in(tmp.path, 2, 60);
    st::study_run_options o;
    o.jobs = 1;
    o.cache = tmp.path / "cache";
    std::vector<std::vector<st::run_outcome>> got(4);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < got.size(); ++t) threads.emplace_back([&, t] { got[t] = st::run_all(spec, o); });
    for (auto& t : threads) t.join();
    for (std::size_t t = 0; t < got.size(); ++t)
        for (std::size_t i = 0; i < 2; ++i) {
            INFO("thread " << t << ", run " << i << ": " << got[t][i].message);
            CHECK((got[t][i].status == st::run_status::analysed || got[t][i].status == st::run_status::cached));
            CHECK(same_numbers(got[0][i], got[t][i]));
        }
    std::vector<std::string> names;
    for (auto const& e : fs::directory_iterator(o.cache)) names.push_back(e.path().filename().string());
    CHECK(names.size() == 2);  // two entries, no KEY.partial-* or KEY.stale-* left
    for (auto const& n : names) CHECK(n.find('.') == std::string::npos);
}

TEST_CASE("study numbers: scores, model names, bins and given metrics are checked when the file is read",
          "[study]") {
    temp_dir tmp;
    auto const study = tmp.path / "s.json";
    auto error_of = [&](std::string const& overall, std::string const& by_length,
                        std::string const& runs = R"([{"name": "a", "model": "qwen3-8b", "metrics": {"ap_drop": 0.1}}])")
        -> qkgeom::input_error {
        write_file(tmp.path / "o.csv", overall);
        write_file(tmp.path / "l.csv", by_length);
        write_file(study, R"({"runs": )" + runs +
                              R"(, "benchmarks": [{"name": "LBP", "overall": "o.csv", "by_length": "l.csv"}]})");
        try {
            (void)st::read_study(study);
        } catch (qkgeom::input_error const& e) {
            return e;
        }
        FAIL("no error for " << overall << " / " << by_length << " / " << runs);
        return qkgeom::input_error("", "", "", "");
    };
    std::string const good_o = "model,score\nqwen3-8b,41.5\nother-model,30\n";
    std::string const good_l = "model,lo,hi,score\nqwen3-8b,0,1024,40\nqwen3-8b,1024,4096,38\n";
    write_file(tmp.path / "o.csv", good_o);
    write_file(tmp.path / "l.csv", good_l);
    write_file(study, R"({"runs": [{"name": "a", "model": "qwen3-8b", "metrics": {"ap_drop": 0.1}}],
                          "benchmarks": [{"name": "LBP", "overall": "o.csv", "by_length": "l.csv"}]})");
    REQUIRE(st::read_study(study).benchmarks[0].overall.size() == 2);  // a model of no run is fine
    {  // a score file saved with a byte-order mark
        auto const e = error_of("\xEF\xBB\xBF" + good_o, good_l);
        CHECK(e.source() == (tmp.path / "o.csv").string());
        CHECK(std::string(e.what()).find("byte-order mark") != std::string::npos);
    }
    for (auto const& bad : {"nan", "inf", "-inf"}) {
        auto const e = error_of("model,score\nqwen3-8b," + std::string(bad) + "\n", good_l);
        CHECK(e.source() == (tmp.path / "o.csv").string());
        CHECK(e.field() == "score");
        CHECK(e.value() == bad);
        CHECK(std::string(e.what()).find("line 2") != std::string::npos);
    }
    auto e = error_of(good_o, "model,lo,hi,score\nqwen3-8b,0,1024,nan\n");
    CHECK(e.field() == "score");
    e = error_of("model,score\n", good_l);
    CHECK(e.field() == "rows");
    CHECK(std::string(e.what()).find("no score rows") != std::string::npos);
    e = error_of(good_o, "model,lo,hi,score\n");
    CHECK(e.source() == (tmp.path / "l.csv").string());
    for (auto const& near : {"qwen3-8b ", "Qwen3-8B", " QWEN3-8b"}) {
        e = error_of("model,score\n" + std::string(near) + ",41.5\n", good_l);
        CHECK(e.field() == "model");
        CHECK(e.value() == near);
        CHECK(std::string(e.what()).find("did you mean 'qwen3-8b'") != std::string::npos);
    }
    e = error_of(good_o, good_l, R"([{"name": "a", "model": "qwen3-8b ", "metrics": {"ap_drop": 0.1}}])");
    CHECK(e.value() == "qwen3-8b");
    CHECK(std::string(e.what()).find("did you mean 'qwen3-8b '") != std::string::npos);
    e = error_of(good_o, "model,lo,hi,score\nqwen3-8b,0,2048,40\nqwen3-8b,1024,4096,38\n");
    CHECK(e.field() == "lo, hi");
    CHECK(std::string(e.what()).find("overlaps") != std::string::npos);
    CHECK(std::string(e.what()).find("line 2") != std::string::npos);
    e = error_of(good_o, "model,lo,hi,score\nqwen3-8b,0,1024,40\nqwen3-8b,0,1024,41\n");  // the same bin twice
    CHECK(std::string(e.what()).find("overlaps") != std::string::npos);
    // Bins that touch do not overlap; other models' bins are apart.
    write_file(tmp.path / "l.csv", "model,lo,hi,score\nqwen3-8b,0,1024,40\nother,0,4096,1\nqwen3-8b,1024,2048,3\n");
    CHECK(st::read_study(study).benchmarks[0].by_length.size() == 3);
    // Given metrics out of their range (from the registry's kinds).
    for (auto const& [metric, value] : std::vector<std::pair<std::string, std::string>>{
             {"ap_overall", "7.5"}, {"n_q_tokens", "-3"}, {"n_q_tokens", "2.5"}, {"r_q_a", "-1.5"},
             {"abs_alpha_k", "-0.1"}, {"abs_r_k_a", "1.2"}}) {
        try {
            (void)st::parse_study(R"({"runs": [{"name": "a", "metrics": {")" + metric + "\": " + value + "}}]}",
                                  "s.json");
            FAIL("accepted " << metric << " = " << value);
        } catch (qkgeom::input_error const& x) {
            CHECK(x.field() == "runs[0].metrics." + metric);
            CHECK(x.value() == value);
        }
    }
    CHECK(st::parse_study(R"({"runs": [{"name": "a", "metrics": {"ap_drop": -0.4, "n_q_tokens": 4096,
          "bias_strength": -3e5, "ap_overall": 1.0}}]})", "s.json").runs[0].metrics.size() == 4);
}

// --- results as bytes (core/bytes.hpp), the wire of the program under mpirun --

TEST_CASE("a head's analysis travels as bytes bit for bit", "[bytes][scale]") {
    planted const p{0.002, 0.004, 0.5, 1.0, 0.5};
    auto const heads = syn::generate_layer(planted_layer(p, 0), planted_capture());
    for (auto const& hc : heads) {
        auto const h = qkgeom::analyze_head(hc);
        std::string const b = qkgeom::to_bytes(h);
        auto const back = qkgeom::from_bytes<qkgeom::head_analysis>(b);
        CHECK(qkgeom::to_bytes(back) == b);  // every field, NaN payloads included
        // the report a process writes from it: every head_metrics column
        CHECK(back.id == h.id);
        CHECK(back.plasticity.cells.size() == h.plasticity.cells.size());
        REQUIRE(!h.plasticity.cells.empty());
        CHECK(std::memcmp(&back.plasticity.ap_drop, &h.plasticity.ap_drop, sizeof(double)) == 0);
        CHECK(back.plasticity.cells.back().empirical_se == h.plasticity.cells.back().empirical_se);
        CHECK(back.householder.buckets.at(1).cov == h.householder.buckets.at(1).cov);
        CHECK(back.rotation.a == h.rotation.a);
        CHECK(back.rope.bands.size() == h.rope.bands.size());
        CHECK(back.ranks.sets.size() == h.ranks.sets.size());
        CHECK(back.flags == h.flags);
        // a field changed after writing is not what comes back: the bytes carry it
        auto changed = h;
        changed.pca.q_pos_var_frac += 1.0;
        CHECK(qkgeom::to_bytes(changed) != b);
    }
    auto const b = qkgeom::to_bytes(qkgeom::analyze_head(heads.front()));
    // short, long and foreign bytes are errors naming the offset, never a value
    for (std::size_t cut : {std::size_t{0}, std::size_t{7}, b.size() / 2, b.size() - 1})
        CHECK_THROWS_AS(qkgeom::from_bytes<qkgeom::head_analysis>(std::string_view(b).substr(0, cut)),
                        qkgeom::input_error);
    CHECK_THROWS_WITH(qkgeom::from_bytes<qkgeom::head_analysis>(b + "x"), Catch::Contains("left over"));
    std::string huge = qkgeom::to_bytes(std::vector<double>{1.0});
    huge[3] = '\x7f';  // a count of ~2^31 elements in 16 bytes
    CHECK_THROWS_WITH(qkgeom::from_bytes<std::vector<double>>(huge), Catch::Contains("needed at offset 8"));
}

TEST_CASE("shards merged per head under any head-to-process assignment give the same bits", "[bytes][scale][merge]") {
    // Each head's shards are merged by one process in shard order; which
    // process gets which head must not change a bit of what rank 0 gathers.
    temp_dir tmp;
    std::mt19937_64 rng(11);
    std::normal_distribution<double> z;
    int const n_heads = 5, n_shards = 4, d = 6;
    std::vector<std::vector<fs::path>> files(n_heads);
    for (int h = 0; h < n_heads; ++h)
        for (int s = 0; s < n_shards; ++s) {
            qkgeom::head_moments m(d, {0, h, h / 2});
            int const n = 20 + 7 * s;
            Eigen::MatrixXd q(n, d), k(n, d);
            std::vector<std::int64_t> t(n), b(n);
            for (int i = 0; i < n; ++i) {
                t[i] = 64 * s + i;
                b[i] = t[i] / 32;
                for (int c = 0; c < d; ++c) q(i, c) = 1e3 + z(rng) + 1e-3 * t[i], k(i, c) = z(rng) * 1e-2;
            }
            m.add(qkgeom::kind::query, q, t, b);
            m.add(qkgeom::kind::key, k, t, b);
            files[h].push_back(tmp.path / ("h" + std::to_string(h) + "s" + std::to_string(s) + ".qkm"));
            qkgeom::save_moments(files[h].back(), m);
        }
    auto merged_bytes = [&](int h) {  // the merged moments' shard bytes (every double of every bucket)
        std::ostringstream os;
        qkgeom::write_moments(os, qkgeom::merge_moment_files(files[h]), std::nullopt);
        return os.str();
    };
    std::vector<std::string> one_process;
    for (int h = 0; h < n_heads; ++h) one_process.push_back(merged_bytes(h));
    for (int trial = 0; trial < 6; ++trial) {
        int const processes = 1 + trial % 4;
        std::vector<std::vector<int>> owned(processes);
        for (int h = 0; h < n_heads; ++h) owned[rng() % static_cast<unsigned>(processes)].push_back(h);
        std::vector<std::string> gathered(n_heads);
        struct merged_head {
            std::int64_t head;
            std::string bytes;
        };
        for (auto const& heads : owned) {  // one process: its heads, then its bytes to rank 0
            std::vector<merged_head> mine;
            for (int h : heads) mine.push_back({h, merged_bytes(h)});
            for (auto& m : qkgeom::from_bytes<std::vector<merged_head>>(qkgeom::to_bytes(mine)))
                gathered[static_cast<std::size_t>(m.head)] = m.bytes;
        }
        CHECK(gathered == one_process);
    }
}

TEST_CASE("an analysis stops at a safe point once its thread's stop flag is set", "[cancel]") {
    planted const p{0.002, 0.004, 0.5, 1.0, 0.5};
    auto const hc = syn::generate_layer(planted_layer(p, 0), planted_capture()).front();
    auto const clean = qkgeom::to_bytes(qkgeom::analyze_head(hc));
    std::atomic<bool> stop{true}, idle{false};
    {
        qkgeom::scoped_cancel const guard(stop);
        CHECK_THROWS_AS(qkgeom::analyze_head(hc), qkgeom::cancelled);
        {
            qkgeom::scoped_cancel const inner(idle);  // the innermost scope wins
            CHECK(qkgeom::to_bytes(qkgeom::analyze_head(hc)) == clean);
        }
        CHECK_THROWS_AS(qkgeom::analyze_head(hc), qkgeom::cancelled);
        // another thread watches nothing: the flag is per thread
        std::string other;
        std::thread([&] { other = qkgeom::to_bytes(qkgeom::analyze_head(hc)); }).join();
        CHECK(other == clean);
    }
    CHECK(qkgeom::to_bytes(qkgeom::analyze_head(hc)) == clean);  // the scope ended: nothing watched
}

}  // namespace qkgeom_tests_study_test
