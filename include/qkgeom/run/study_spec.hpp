// qkgeom — the study file (docs/study.md#the-study-file): a JSON document
// listing the runs of a study (name, family, model, checkpoint, and a capture
// folder, an analysis folder or model-level numbers), the benchmark score
// files and the study's settings. Every error names the file, the field (as a
// JSON path, e.g. runs[2].checkpoint.step) and the value.
#pragma once

#include <qkgeom/analysis/policy_names.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/validate.hpp>
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/io/json.hpp>
#include <qkgeom/run/study_read.hpp>
#include <qkgeom/study/metrics.hpp>  // IWYU pragma: export
#include <qkgeom/study/types.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom {
namespace study {

/// \brief Largest study file read, in bytes (1 MiB).
inline constexpr std::uintmax_t study_file_max_bytes = std::uintmax_t(1) << 20;
/// \brief Longest run, model, family or benchmark name a study file may give,
/// in bytes (names are folder names and one-line table labels).
inline constexpr std::size_t study_max_name_bytes = 200;

namespace detail {

/// The reading state: the file, for messages.
struct spec_reader {
    std::string file;

    [[noreturn]] void fail(std::string const& field, std::string const& value, std::string const& why) const {
        throw input_error(file, field, value, file + ": " + field + " = " + value + ": " + why);
    }
    static std::string shown(json::value const& v) {
        if (v.is_string()) return "\"" + escape_text(v.as_string()) + "\"";
        if (v.is_number()) return json::dump(v);
        return std::string(v.type_name());
    }
    /// The object's keys must all be in `allowed` (a typo is an error, never ignored).
    void keys(json::value const& v, std::string const& field, std::initializer_list<std::string_view> allowed) const {
        if (!v.is_object()) fail(field, shown(v), "expected an object");
        for (auto const& [k, _] : v.as_object())
            if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
                fail(field + "." + escape_text(k), "(key)", "unknown key (see docs/study.md#the-study-file)");
    }
    std::string text(json::value const& v, std::string const& field, bool nonempty = true) const {
        if (!v.is_string()) fail(field, shown(v), "expected a string");
        if (nonempty && v.as_string().empty()) fail(field, "\"\"", "must not be empty");
        return v.as_string();
    }
    /// A name shown in one-line outputs and tables (run, model, family,
    /// benchmark): no control character (a newline would break the
    /// one-line tables and messages), at most study_max_name_bytes bytes.
    std::string label(json::value const& v, std::string const& field) const {
        std::string s = text(v, field);
        if (s.size() > study_max_name_bytes)
            fail(field, "\"" + escape_text(s.substr(0, 40)) + "...\" (" + std::to_string(s.size()) + " bytes)",
                 "longer than " + std::to_string(study_max_name_bytes) + " bytes");
        for (std::size_t i = 0; i < s.size(); ++i)
            if (auto const c = static_cast<unsigned char>(s[i]); c < 0x20 || c == 0x7f)
                fail(field, "\"" + escape_text(s) + "\"",
                     "holds a control character (byte " + std::to_string(i) + "); names are shown on one line");
        return s;
    }
    double number(json::value const& v, std::string const& field) const {
        if (!v.is_number()) fail(field, shown(v), "expected a number");
        double const x = v.as_double();
        if (!std::isfinite(x)) fail(field, shown(v), "must be finite");
        return x;
    }
    std::int64_t integer(json::value const& v, std::string const& field, option_range const& r) const {
        return integer(v, field, r.lo, r.hi);
    }
    std::int64_t integer(json::value const& v, std::string const& field, std::int64_t lo, std::int64_t hi) const {
        if (!v.is_int()) fail(field, shown(v), "expected an integer");
        if (v.as_int() < lo || v.as_int() > hi)
            fail(field, shown(v), "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return v.as_int();
    }
    std::vector<std::string> metrics(json::value const& v, std::string const& field) const {
        if (!v.is_array()) fail(field, shown(v), "expected an array of metric names");
        std::vector<std::string> out;
        for (std::size_t i = 0; i < v.as_array().size(); ++i) {
            auto const f = field + "[" + std::to_string(i) + "]";
            auto s = text(v.as_array()[i], f);
            if (!is_study_metric(s)) fail(f, shown(v.as_array()[i]), "not a metric of docs/study.md#metrics");
            out.push_back(std::move(s));
        }
        return out;
    }
    std::filesystem::path path(json::value const& v, std::string const& field, std::filesystem::path const& base) const {
        std::filesystem::path p(text(v, field));
        return p.is_absolute() ? p : base / p;
    }

    checkpoint read_checkpoint(json::value const& v, std::string const& f) const {
        keys(v, f, {"step", "tokens", "phase", "order"});
        checkpoint c;
        if (auto const* s = v.find("step")) c.step = integer(*s, f + ".step", 0, INT64_MAX);
        if (auto const* t = v.find("tokens")) c.tokens = number(*t, f + ".tokens");
        if (auto const* p = v.find("phase")) c.phase = text(*p, f + ".phase", false);
        if (auto const* o = v.find("order")) c.order = number(*o, f + ".order");
        return c;
    }

    run_spec read_run(json::value const& v, std::size_t i, std::filesystem::path const& base) const {
        std::string const f = "runs[" + std::to_string(i) + "]";
        keys(v, f, {"name", "family", "model", "checkpoint", "capture", "analysis", "metrics"});
        run_spec r;
        r.index = i;
        auto const* name = v.find("name");
        if (name == nullptr) fail(f + ".name", "(absent)", "every run needs a name");
        r.name = label(*name, f + ".name");
        if (auto const* m = v.find("model")) r.model = label(*m, f + ".model");
        if (r.model.empty()) r.model = r.name;
        if (auto const* fam = v.find("family")) r.family = label(*fam, f + ".family");
        if (r.family.empty()) r.family = r.model;
        if (auto const* c = v.find("checkpoint")) r.ckpt = read_checkpoint(*c, f + ".checkpoint");
        int sources = 0;
        if (auto const* c = v.find("capture")) r.capture = path(*c, f + ".capture", base), ++sources;
        if (auto const* a = v.find("analysis")) r.analysis = path(*a, f + ".analysis", base), ++sources;
        if (v.find("metrics") != nullptr) ++sources;  // read by read_given_metrics
        if (sources != 1)
            fail(f, "\"" + escape_text(r.name) + "\"",
                 "a run has exactly one of capture, analysis or metrics (it has " + std::to_string(sources) + ")");
        return r;
    }
};

/// A run's model-level numbers: every key a study metric, every value finite.
inline void read_given_metrics(spec_reader const& rd, json::value const& v, std::string const& f, run_spec& r) {
    if (!v.is_object()) rd.fail(f, spec_reader::shown(v), "expected an object of metric: number");
    for (auto const& [k, x] : v.as_object()) {
        if (!is_study_metric(k)) rd.fail(f + "." + escape_text(k), "(key)", "not a metric of docs/study.md#metrics");
        r.metrics[k] = rd.number(x, f + "." + k);
        if (auto const problem = metric_value_problem(k, r.metrics[k]); !problem.empty())
            rd.fail(f + "." + k, spec_reader::shown(x), problem + " (docs/study.md#metrics)");
    }
    if (r.metrics.empty()) rd.fail(f, "{}", "a run given by its metrics needs at least one");
}

/// A model name as compared for a did-you-mean: ASCII spaces trimmed, lower case.
inline std::string folded(std::string_view s) {
    auto const sp = [](char c) { return c == ' ' || c == '\t'; };
    while (!s.empty() && sp(s.front())) s.remove_prefix(1);
    while (!s.empty() && sp(s.back())) s.remove_suffix(1);
    std::string out(s);
    for (auto& c : out) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    return out;
}

/// The runs' models, for the score files' join (docs/study.md#the-study-file).
using run_models = std::set<std::string>;

/// A score row's model: fine when it is a run's model or like none; an
/// error with a did-you-mean when it equals one only after trimming spaces
/// or ignoring case (a join that would silently miss).
inline void check_model(csv_table const& t, std::size_t row, std::size_t col, run_models const& models) {
    auto const& m = t.rows[row][col];
    if (models.empty() || models.count(m)) return;
    for (auto const& r : models)
        if (folded(r) == folded(m))
            t.bad_field(row, col, "no run has this model; did you mean '" + escape_text(r) +
                                      "' (a run's model; names must match exactly, spaces and case included)?");
}

/// A score: a finite number.
inline double score_of(csv_table const& t, std::size_t row, std::size_t col) {
    double const x = t.number(row, col);
    if (!std::isfinite(x)) t.bad_field(row, col, "a score must be a finite number");
    return x;
}

/// A score file with a header and no row is an error (it would give every run NaN).
inline void need_rows(csv_table const& t) {
    if (t.rows.empty())
        qkgeom::detail::fail_input(t.file.string(), "rows", 0, "no score rows (a header only): every run's score would be NaN");
}

/// A benchmark's overall file: columns model, score.
inline void read_overall(benchmark& b, run_models const& models) {
    auto const t = read_csv(b.overall_file);
    auto const cm = t.column("model"), cs = t.column("score");
    need_rows(t);
    for (std::size_t i = 0; i < t.rows.size(); ++i) {
        auto const& model = t.rows[i][cm];
        check_model(t, i, cm, models);
        double const s = score_of(t, i, cs);
        if (!b.overall.emplace(model, s).second)
            throw input_error(b.overall_file.string(), "model", escape_text(model),
                              b.overall_file.string() + ": line " + std::to_string(t.lines[i]) + ": model '" +
                                  escape_text(model) + "' is listed twice");
    }
}

/// A benchmark's per-length file: columns model, lo, hi, score; a model's
/// bins must not overlap.
inline void read_by_length(benchmark& b, run_models const& models) {
    auto const t = read_csv(b.by_length_file);
    auto const cm = t.column("model"), cl = t.column("lo"), ch = t.column("hi"), cs = t.column("score");
    need_rows(t);
    std::map<std::string, std::vector<std::pair<length_score, std::int64_t>>> bins;  // model → (bin, line)
    for (std::size_t i = 0; i < t.rows.size(); ++i) {
        check_model(t, i, cm, models);
        length_score s{t.rows[i][cm], t.number(i, cl), t.number(i, ch), score_of(t, i, cs)};
        if (!(s.lo >= 0 && s.hi > s.lo && std::isfinite(s.hi)))
            throw input_error(b.by_length_file.string(), "lo, hi", t.rows[i][cl] + ", " + t.rows[i][ch],
                              b.by_length_file.string() + ": line " + std::to_string(t.lines[i]) +
                                  ": a length bin needs 0 <= lo < hi < inf (a token range [lo, hi))");
        bins[s.model].emplace_back(s, t.lines[i]);
        b.by_length.push_back(std::move(s));
    }
    for (auto& [model, v] : bins) {
        std::sort(v.begin(), v.end(), [](auto const& x, auto const& y) { return x.first.lo < y.first.lo; });
        for (std::size_t k = 1; k < v.size(); ++k)
            if (v[k].first.lo < v[k - 1].first.hi) {
                auto const range = [](length_score const& x) {
                    return "[" + json::dump(json::value(x.lo)) + ", " + json::dump(json::value(x.hi)) + ")";
                };
                throw input_error(b.by_length_file.string(), "lo, hi", range(v[k].first),
                                  b.by_length_file.string() + ": line " + std::to_string(v[k].second) + ": model '" +
                                      escape_text(model) + "': length bin " + range(v[k].first) +
                                      " overlaps the bin " + range(v[k - 1].first) + " of line " +
                                      std::to_string(v[k - 1].second) + " (a model's bins must not overlap)");
            }
    }
}

inline benchmark read_benchmark(spec_reader const& rd, json::value const& v, std::size_t i,
                                std::filesystem::path const& base, run_models const& models) {
    std::string const f = "benchmarks[" + std::to_string(i) + "]";
    rd.keys(v, f, {"name", "overall", "by_length"});
    benchmark b;
    auto const* name = v.find("name");
    if (name == nullptr) rd.fail(f + ".name", "(absent)", "every benchmark needs a name");
    b.name = rd.label(*name, f + ".name");
    if (auto const* o = v.find("overall")) b.overall_file = rd.path(*o, f + ".overall", base);
    if (auto const* l = v.find("by_length")) b.by_length_file = rd.path(*l, f + ".by_length", base);
    if (b.overall_file.empty() && b.by_length_file.empty())
        rd.fail(f, "\"" + escape_text(b.name) + "\"", "a benchmark needs an overall or a by_length file");
    if (!b.overall_file.empty()) read_overall(b, models);
    if (!b.by_length_file.empty()) read_by_length(b, models);
    return b;
}

/// A policy option by name (the program's spelling), as input_error naming the field.
template <class E>
E policy_option(spec_reader const& rd, json::value const& v, std::string const& field) {
    auto const name = rd.text(v, field);
    if (auto const e = policy_from_name<E>(name)) return *e;
    rd.fail(field, spec_reader::shown(v), "not one of " + policy_choices_text<E>());
}

/// The "options" object over `o`, `context` and `window` (checked as the program checks its options).
inline void apply_options(spec_reader const& rd, json::value const& v, analysis_options& o, std::int64_t& context,
                          std::int64_t& window) {
    rd.keys(v, "options",
            {"components", "sign", "low", "high", "separation", "semantic", "diagnostics", "ks_alpha", "pairs",
             "weighting", "enumeration", "max_exact_pairs", "samples", "seed", "empirical_check", "empirical_budget",
             "empirical_max_exact", "empirical_pairs", "window", "context", "split", "ranks",
             "rank_keys", "rank_sets", "rank_draw", "rope_bands"});
    auto const f = [](char const* k) { return std::string("options.") + k; };
    auto const boolean = [&](json::value const& x, char const* k) {
        if (!x.is_bool()) rd.fail(f(k), spec_reader::shown(x), "expected true or false");
        return x.as_bool();
    };
    auto& p = o.plasticity;
    namespace R = option_ranges;  // the ranges of the program and Python (core/validate.hpp)
    for (auto const& [k, x] : v.as_object()) {
        if (k == "components") o.pca.n_components = rd.integer(x, f("components"), R::components);
        else if (k == "sign") o.pca.sign = policy_option<sign_policy>(rd, x, f("sign"));
        else if (k == "low") o.pca.thresholds.low = rd.number(x, f("low"));
        else if (k == "high") o.pca.thresholds.high = rd.number(x, f("high"));
        else if (k == "separation") o.rotation.separation = policy_option<separation_policy>(rd, x, f("separation"));
        else if (k == "semantic") o.householder.model = policy_option<semantic_model>(rd, x, f("semantic"));
        else if (k == "diagnostics") o.diagnostics = boolean(x, "diagnostics");
        else if (k == "ks_alpha") o.ks_alpha = rd.number(x, f("ks_alpha"));
        else if (k == "pairs") p.pairs = policy_option<pair_policy>(rd, x, f("pairs"));
        else if (k == "weighting") p.weighting = policy_option<ap_weighting>(rd, x, f("weighting"));
        else if (k == "enumeration") p.enumeration = policy_option<enumeration_policy>(rd, x, f("enumeration"));
        else if (k == "max_exact_pairs") p.max_exact_pairs = rd.integer(x, f("max_exact_pairs"), R::max_exact_pairs);
        else if (k == "samples") p.samples_per_cell = rd.integer(x, f("samples"), R::samples);
        else if (k == "seed") p.seed = static_cast<std::uint64_t>(rd.integer(x, f("seed"), R::seed));
        else if (k == "empirical_check") p.empirical_check = policy_option<empirical_policy>(rd, x, f("empirical_check"));
        else if (k == "empirical_budget") p.empirical_budget = rd.integer(x, f("empirical_budget"), R::empirical_budget);
        else if (k == "empirical_max_exact")
            p.empirical_max_exact = rd.integer(x, f("empirical_max_exact"), R::empirical_max_exact);
        else if (k == "empirical_pairs") p.empirical_pairs = rd.integer(x, f("empirical_pairs"), R::empirical_pairs);
        else if (k == "split") p.split_profile = boolean(x, "split");
        else if (k == "ranks") o.ranks_on = boolean(x, "ranks");
        else if (k == "rank_keys") o.ranks.keys_per_set = rd.integer(x, f("rank_keys"), R::rank_keys);
        else if (k == "rank_sets") o.ranks.sets_per_bucket = rd.integer(x, f("rank_sets"), R::rank_sets);
        else if (k == "rank_draw") o.ranks.keys = policy_option<rank_key_policy>(rd, x, f("rank_draw"));
        else if (k == "rope_bands") o.rope.n_bands = rd.integer(x, f("rope_bands"), R::rope_bands);
        else if (k == "window") window = rd.integer(x, f("window"), R::window);
        else context = rd.integer(x, f("context"), R::context);
    }
    auto const& t = o.pca.thresholds;
    if (auto const q = thresholds_problem(t.low, t.high))
        rd.fail("options.low, options.high", q->value, "need " + q->expected);
    if (auto const q = ks_alpha_problem(o.ks_alpha)) rd.fail("options.ks_alpha", q->value, "need " + q->expected);
}

inline void read_settings(spec_reader const& rd, json::value const& root, study_spec& s) {
    if (auto const* t = root.find("title")) s.title = rd.text(*t, "title", false);
    if (auto const* p = root.find("token_edges")) {
        if (!p->is_array()) rd.fail("token_edges", spec_reader::shown(*p), "expected an array of token positions");
        for (std::size_t i = 0; i < p->as_array().size(); ++i) {
            auto const f = "token_edges[" + std::to_string(i) + "]";
            double const e = rd.number(p->as_array()[i], f);
            if (e < 0 || (!s.token_edges.empty() && e <= s.token_edges.back()))
                rd.fail(f, json::dump(p->as_array()[i]), "edges must be >= 0 and strictly increasing");
            s.token_edges.push_back(e);
        }
        if (s.token_edges.size() == 1) rd.fail("token_edges", "[1 edge]", "needs at least two edges (one range)");
    }
    if (auto const* c = root.find("correlate")) s.correlate = rd.metrics(*c, "correlate");
    if (auto const* h = root.find("heatmap")) s.heatmap = rd.metrics(*h, "heatmap");
    if (auto const* h = root.find("head_trajectories")) s.trajectory = rd.metrics(*h, "head_trajectories");
    if (auto const* b = root.find("bootstrap")) {
        rd.keys(*b, "bootstrap", {"resamples", "level", "seed"});
        if (auto const* r = b->find("resamples")) s.bootstrap_resamples = rd.integer(*r, "bootstrap.resamples", 1, 1000000);
        if (auto const* l = b->find("level")) {
            s.bootstrap_level = rd.number(*l, "bootstrap.level");
            if (!(s.bootstrap_level > 0 && s.bootstrap_level < 1))
                rd.fail("bootstrap.level", json::dump(*l), "must be in (0, 1)");
        }
        if (auto const* sd = b->find("seed")) s.seed = static_cast<std::uint64_t>(rd.integer(*sd, "bootstrap.seed", 0, INT64_MAX));
    }
    if (auto const* d = root.find("depth_bins")) s.depth_bins = rd.integer(*d, "depth_bins", 1, 1000);
    if (auto const* o = root.find("options")) {
        analysis_options check;
        std::int64_t context = 0, window = -1;
        apply_options(rd, *o, check, context, window);  // every error now, at parse time
        s.options = *o;
    }
}

}  // namespace detail

/// \brief Parses a study file's text.
/// \param[in] text the JSON text.
/// \param[in] file the study file's path (messages; relative paths in the
///            file resolve against its folder).
/// \returns the study.
/// \throws qkgeom::input_error naming the file, the field (a JSON path) and
///         the value: a JSON syntax error, an unknown key, a wrong type, a
///         run without a name or with a duplicate name, a run with not
///         exactly one of capture / analysis / metrics, an unknown metric,
///         no runs, a given metric outside its range (metric_value_problem),
///         a bad score file (as read_csv, plus no score rows, a score that is
///         not finite, a model listed twice, a model that equals a run's
///         model only after trimming spaces or ignoring case (did you mean),
///         a bad length bin or two overlapping bins of one model).
[[nodiscard]] inline study_spec parse_study(std::string_view text, std::filesystem::path const& file) {
    detail::spec_reader const rd{file.string()};
    auto const root = json::parse(text, rd.file);
    rd.keys(root, "(top level)",
            {"title", "runs", "benchmarks", "token_edges", "correlate", "heatmap", "head_trajectories", "bootstrap",
             "depth_bins", "options"});
    study_spec s;
    s.file = file;
    auto const base = file.parent_path();
    detail::read_settings(rd, root, s);
    auto const* runs = root.find("runs");
    if (runs == nullptr || !runs->is_array() || runs->as_array().empty())
        rd.fail("runs", runs == nullptr ? "(absent)" : detail::spec_reader::shown(*runs),
                "a study needs a non-empty array of runs");
    std::set<std::string> names;
    for (std::size_t i = 0; i < runs->as_array().size(); ++i) {
        auto const& v = runs->as_array()[i];
        auto r = rd.read_run(v, i, base);
        if (auto const* m = v.find("metrics")) detail::read_given_metrics(rd, *m, "runs[" + std::to_string(i) + "].metrics", r);
        if (!names.insert(r.name).second)
            rd.fail("runs[" + std::to_string(i) + "].name", "\"" + escape_text(r.name) + "\"", "two runs have this name");
        s.runs.push_back(std::move(r));
    }
    if (auto const* b = root.find("benchmarks")) {
        if (!b->is_array()) rd.fail("benchmarks", detail::spec_reader::shown(*b), "expected an array");
        std::set<std::string> bn;
        detail::run_models models;
        for (auto const& r : s.runs) models.insert(r.model);
        for (std::size_t i = 0; i < b->as_array().size(); ++i) {
            auto bm = detail::read_benchmark(rd, b->as_array()[i], i, base, models);
            if (!bn.insert(bm.name).second)
                rd.fail("benchmarks[" + std::to_string(i) + "].name", "\"" + escape_text(bm.name) + "\"",
                        "two benchmarks have this name");
            s.benchmarks.push_back(std::move(bm));
        }
    }
    return s;
}

/// \brief Reads and parses a study file (at most study_file_max_bytes).
/// \param[in] file the study file.
/// \returns the study.
/// \throws qkgeom::input_error as parse_study, and naming the file when it
///         cannot be read or is too large.
[[nodiscard]] inline study_spec read_study(std::filesystem::path const& file) {
    auto const bytes = io::detail::read_file_bytes(file, study_file_max_bytes, "file size");
    return parse_study(std::string_view(reinterpret_cast<char const*>(bytes.data()), bytes.size()), file);
}

/// \brief The study file's "options" over the caller's analysis options:
/// every option the file names replaces the caller's; the others stay.
/// \param[in] spec the study (its `options`, null when the file has none).
/// \param[in,out] o the analysis options.
/// \param[in,out] context the context length override (0 = none).
/// \param[in,out] window the sliding window for heads whose capture records none (-1 = none).
/// \throws qkgeom::input_error as parse_study (the options were checked there).
inline void apply_study_options(study_spec const& spec, analysis_options& o, std::int64_t& context,
                                std::int64_t& window) {
    if (spec.options.is_null()) return;
    detail::apply_options(detail::spec_reader{spec.file.string()}, spec.options, o, context, window);
}

}  // namespace study
}  // namespace qkgeom
