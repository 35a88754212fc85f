// qkgeom — the command-line program.
//
//   qkgeom demo -o OUT [options]   analyse the embedded synthetic study (three
//                                  model families with different drift and
//                                  content strength) and write its reports
//   qkgeom synth DIR [options]     write one synthetic family as a capture in
//                                  the dataset layout (docs/dataset.md)
//   qkgeom analyze DIR -o OUT      analyse every head of a capture directory
//   qkgeom study FILE -o OUT       a study: many runs, tables and pictures
//   qkgeom --help
//
// Heads are analysed in parallel (--jobs, default: all cores); each worker
// holds one head at a time. Progress goes to stderr: a bar with rate and ETA
// on a terminal, plain lines otherwise. Errors: one line on stderr, exit 1
// (usage errors exit 2).
//
// Translation units (each compiles in well under 20 s of CPU):
//   main.cpp                  command line, usage, main
//   study.cpp                 the embedded synthetic study: demo and synth
//   generate.cpp              the synthetic generator (qkgeom/capture/synthetic.hpp)
//   generate_parts.cpp        its rows and ground truth, instantiated once
//   analyze.cpp               qkgeom analyze: a capture directory
//   study_command.cpp         qkgeom study, and the study report the demo shares
//   reports.cpp               the model table, pictures and index.html
//   analysis.cpp              analyze_head for the program's two row types
//   (the analysis engines come from the compiled part, qkgeom::compiled)
#include "program.hpp"
#include "ranks.hpp"

#include <qkgeom/analysis/policy_names.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/validate.hpp>
#include <qkgeom/run/dataset_analysis.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <fstream>
#endif

namespace qkgeom_app {

namespace {

constexpr char const* usage_text = R"(qkgeom — how position and content compete inside attention heads

Usage:
  qkgeom demo -o OUT [options]   analyse the embedded synthetic study (three
                                 families x four checkpoints) and write it as a
                                 study to OUT/ (no input needed)
  qkgeom synth DIR [options]     write one family of the study as a capture in
                                 the dataset layout of docs/dataset.md
  qkgeom analyze DIR -o OUT      analyse every query head of the capture in DIR
                                 (the manifest's head sample when it records one:
                                 capture.head_count; manifest.json + lLLhHHq/k
                                 entries) and write
                                 the reports to OUT/; a head that fails to read
                                 is listed in OUT/failures.txt and the others go
                                 on (exit status 3), unless --strict
  qkgeom study FILE -o OUT       analyse every run of a study file (docs/study.md:
                                 models, checkpoints, benchmark scores) once,
                                 cached in OUT/cache by capture content and
                                 options, and write the study's tables, pictures
                                 and index.html to OUT/; a run that fails is
                                 listed in OUT/failures.txt and the others go on
                                 (exit status 3)
  qkgeom merge SHARD... -o FILE  merge moments shards of one head (written by
                                 qkgeom::save_moments, docs/moments.md) into one
                                 shard FILE, validating each; prints the counts
  qkgeom --help                  this text

Output folders (-o OUT of demo, analyze and study, DIR of synth) must be
absent, empty, or a folder an earlier qkgeom run wrote (it holds .qkgeom-report
or .qkgeom-capture), and never an input, inside one or around one (canonical
paths: symbolic links resolved); they are checked before any analysis, written
next to the target and swapped in at the end, so a folder never mixes two runs.
What a killed run left next to OUT is removed by the next run into OUT.
summary.txt and index.html record the command line, the input and the options.
Exit status: 0 success; 1 the run failed (one line on stderr naming the file,
field and value; the old OUT is left as it was), or stdout could not be written
(EPIPE, ENOSPC; after the reports were written); 2 usage error; 3 some heads
(analyze) or runs (study) failed (each listed in OUT/failures.txt, the others
reported); 130 / 143 stopped by SIGINT / SIGTERM (at the next head; nothing
written, the old OUT left as it was; a second signal stops at once).

The demo study: three synthetic model families (steady, moderate, steep), each
through four checkpoints (steps 1000..4000: pre-train, pre-train, anneal,
long-context) whose key drift grows, then collapses; 4 layers x 8 query heads
(GQA, 2 kv heads) per run, d = 64 (32 rotary coordinates, RoPE theta 10000), 96
sequences of 4096 tokens, uniform buckets of 256 tokens, about one kept token
per bucket per sequence (method §0.1). Its benchmark 'demo_score' is made up.

Reports of analyze, and of each demo run in OUT/runs/<run>/ (docs/outputs.md):
head_metrics.csv, head_bucket_plasticity.csv, head_profile.csv,
head_component_weights.csv, qk_pca.csv, model_report.csv, layer_report.csv,
head_rope_bands.csv, head_rope_bucket_bands.csv, gqa_groups.csv.
Pictures (docs/pictures.md) next to the CSVs: plasticity_profile.svg,
plasticity_heatmap.svg, component_weights.svg, taxonomy_scatter.svg,
plasticity_split.svg, rope_bands.svg, gqa_groups.svg; analyze also writes
OUT/model_comparison.svg and OUT/index.html.
Study reports (study, demo; docs/study.md): OUT/study_*.csv (models with
bootstrap intervals, profiles, trajectory and bias decomposition, taxonomy,
layer depth, correlations with exact permutation p-values, per length, per-head
trajectories), the study pictures (docs/study-pictures.md) and OUT/index.html.
OUT/summary.txt holds the table printed at the end. --no-pictures skips the
pictures and index.html.

Options (defaults are the thesis'; method section in brackets, docs/method.md).
Each command takes only its own options (another command's is refused), each
value option at most once, and a value that starts with '-' is refused (a path
starting with '-': write ./-name). Integers must lie in the range shown.
demo, analyze and study:
  -o, --out DIR              output directory (required; merge: the shard FILE)
  -j, --jobs N               worker threads, 1..4096 (default: all cores)
      --components K         PCA components reported, 1..4096 (10) [§2]
      --sign POLICY          dominant | query_anchor (dominant) [§2]
      --low X, --high X      taxonomy thresholds, 0 <= low <= high <= 1 (0.3, 0.7) [§2]
      --separation POLICY    centroid | max_separation (centroid) [§3]
      --semantic MODEL       diag | full | global_linear (diag) [§4]
      --no-diagnostics       skip the row-based normality diagnostics [§4]
      --ks-alpha X           level of the KS rejection fraction, 0 < X < 1 (0.05) [§4]
      --pairs POLICY         same_bucket | prefix (same_bucket) [§6]
      --weighting POLICY     query_count | cell_mean (query_count) [§6]
      --enumeration MODE     auto | exact | sampled (auto) [§6]
      --max-exact-pairs N    auto: exact up to N evaluations per head, 0..2^62 (4000000) [§6]
      --samples N            sampled: pairs per cell, 1..10^9 (2000) [§6]
      --seed N               sampled: seed, 0..2^63-1 (0) [§6]
      --empirical-check MODE gaussian_gap check: sampled | exact (sampled) [§6]
      --empirical-budget N   sampled: evaluations of a drawn cell, 4..10^9 (4096) [§6]
      --empirical-max-exact N  sampled: cells up to N evaluations counted exactly, 0..2^62 (16384) [§6]
      --empirical-pairs N    sampled: pairs of a pair-sampled cell, 0..10^6 (32; < 2: draws only) [§6]
      --no-split             skip the split of AP_drop into bias and content parts [§10.1]
      --no-ranks             skip top-1 flip and Kendall of m keys [§10.4]
      --rank-keys M          keys per set of the top-1/Kendall analysis, 2..64 (8) [§10.4]
      --rank-sets N          key sets drawn per query bucket, 1..10^6 (16) [§10.4]
      --rank-draw POLICY     prefix | same_bucket: how a key set is drawn (prefix) [§10.4]
      --rope-bands N         frequency bands of the RoPE analysis, 1..2048 (8) [§10.2]
      --window W             sliding window in tokens for heads whose capture records
                             none (the capture's own window wins), 0..2^62 [§6]
      --context L            context length for the quantiles and the heatmap grid,
                             replacing the capture's (the manifest's context_length;
                             the demo: 4096), 0..2^62; 0 = not given. A head with a
                             position >= L fails [§6, §9.12]
      --no-pictures          write no SVG pictures and no index.html
      --quiet                no progress output (synth too)
analyze only:
      --strict               stop at the first head that fails
study only:
      --cache DIR            keep the capture runs' analyses in DIR, outside OUT (default:
                             OUT/cache): shared by studies, and kept when a study fails, is
                             killed or loses a node, so the next study skips them
demo and synth:
      --layers N             layers per demo/synth model, 1..1024 (4)
synth only:
      --family NAME          steady | moderate | steep (steep)
      --format F             npy | safetensors | npz | npz_deflate (npy) [docs/dataset.md]
      --heads N              write N query heads sampled uniformly without replacement
                             (and the key heads they read), 0..8 x layers; 0 = all (0) [§0.1]
      --head-seed N          seed of the head sample, 0..2^63-1 (0) [§0.1]
      --dtype T              f32 | f16 | bf16 | f64 (f32)
merge: -o FILE only.
)";

/// `a` as a POSIX shell word (quoted only when it needs to be).
std::string shell_quoted(std::string const& a) {
    bool plain = !a.empty();
    for (char ch : a)
        if (!(std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("-_./=:,+@%", ch) != nullptr)) plain = false;
    if (plain) return a;
    std::string q = "'";
    for (char ch : a) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
}

[[noreturn]] void usage_error(std::string const& msg) {
    std::cerr << "qkgeom: " << msg << " (see qkgeom --help)\n";
    std::exit(2);
}

[[noreturn]] void print_help() {
    std::cout << usage_text;
    std::string const bad = finish_stdout();
    if (!bad.empty()) std::cerr << "qkgeom: error: cannot write the help text to standard output: " << bad << "\n";
    std::exit(bad.empty() ? 0 : 1);
}

}  // namespace

namespace cli_impl {  // named: the program may be compiled as one unity translation unit

std::string range_text(std::int64_t lo, std::int64_t hi) { return std::to_string(lo) + ".." + std::to_string(hi); }

/// A whole decimal integer in [lo, hi] (no sign other than '-', no spaces,
/// no suffix); anything else is a usage error naming the option and value.
std::int64_t parse_int(std::string const& flag, std::string const& v, std::int64_t lo, std::int64_t hi) {
    std::int64_t x = 0;
    auto const [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    bool const whole = !v.empty() && end == v.data() + v.size();
    if (whole && (ec == std::errc::result_out_of_range || (ec == std::errc() && (x < lo || x > hi))))
        usage_error(flag + ": '" + v + "' is out of range: expected an integer in " + range_text(lo, hi));
    if (!whole || ec != std::errc())
        usage_error(flag + ": expected an integer in " + range_text(lo, hi) + ", got '" + v + "'");
    return x;
}

double parse_double(std::string const& flag, std::string const& v) {
    double x = 0;
    auto const [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x))
        usage_error(flag + ": not a finite number: '" + v + "'");
    return x;
}

template <class E>
E parse_choice(std::string const& flag, std::string const& v, std::map<std::string, E> const& choices) {
    auto const it = choices.find(v);
    if (it == choices.end()) {
        std::string all;
        for (auto const& [k, e] : choices) all += (all.empty() ? "" : " | ") + k;
        usage_error(flag + ": '" + v + "' is not one of " + all);
    }
    return it->second;
}

/// A policy option's value (the names: qkgeom/analysis/policy_names.hpp).
template <class E>
E parse_policy(std::string const& flag, std::string const& v) {
    if (auto const e = qkgeom::policy_from_name<E>(v)) return *e;
    usage_error(flag + ": '" + v + "' is not one of " + qkgeom::policy_choices_text<E>());
}

enum command_bit : unsigned { demo_cmd = 1, synth_cmd = 2, analyze_cmd = 4, study_cmd = 8, merge_cmd = 16 };
constexpr unsigned report_cmds = demo_cmd | analyze_cmd | study_cmd;
constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();
namespace R = qkgeom::option_ranges;  // the documented ranges, shared with study files and Python

/// One option: its names, the commands that take it and whether it takes a
/// value (a path value never starts with '-'); apply_option sets it.
struct option {
    char const* name;
    char const* alias;
    unsigned commands;
    enum class takes { nothing, value, path } arg;
};
using T = option::takes;

/// Every option of every command (the reference: usage_text, docs/cli.md).
std::vector<option> const& options() {
    static std::vector<option> const table{
        {"--out", "-o", report_cmds | merge_cmd, T::path},   {"--jobs", "-j", report_cmds, T::value},
        {"--quiet", "", report_cmds | synth_cmd, T::nothing}, {"--no-pictures", "", report_cmds, T::nothing},
        {"--strict", "", analyze_cmd, T::nothing},            {"--layers", "", demo_cmd | synth_cmd, T::value},
        {"--family", "", synth_cmd, T::value},                {"--format", "", synth_cmd, T::value},
        {"--heads", "", synth_cmd, T::value},                 {"--head-seed", "", synth_cmd, T::value},
        {"--dtype", "", synth_cmd, T::value},                 {"--components", "", report_cmds, T::value},
        {"--sign", "", report_cmds, T::value},                {"--low", "", report_cmds, T::value},
        {"--high", "", report_cmds, T::value},                {"--separation", "", report_cmds, T::value},
        {"--semantic", "", report_cmds, T::value},            {"--no-diagnostics", "", report_cmds, T::nothing},
        {"--ks-alpha", "", report_cmds, T::value},            {"--pairs", "", report_cmds, T::value},
        {"--weighting", "", report_cmds, T::value},           {"--enumeration", "", report_cmds, T::value},
        {"--max-exact-pairs", "", report_cmds, T::value},     {"--samples", "", report_cmds, T::value},
        {"--seed", "", report_cmds, T::value},                {"--no-split", "", report_cmds, T::nothing},
        {"--empirical-check", "", report_cmds, T::value},     {"--empirical-budget", "", report_cmds, T::value},
        {"--empirical-max-exact", "", report_cmds, T::value},     {"--empirical-pairs", "", report_cmds, T::value},
        {"--no-ranks", "", report_cmds, T::nothing},          {"--rank-keys", "", report_cmds, T::value},
        {"--rank-sets", "", report_cmds, T::value},           {"--rank-draw", "", report_cmds, T::value},
        {"--rope-bands", "", report_cmds, T::value},          {"--window", "", report_cmds, T::value},
        {"--context", "", report_cmds, T::value},             {"--cache", "", study_cmd, T::path},
    };
    return table;
}

void set_format(cli& c, std::string const& a, std::string const& v) {
    std::string const f = parse_choice<std::string>(
        a, v, {{"npy", "npy"}, {"safetensors", "safetensors"}, {"npz", "npz"}, {"npz_deflate", "npz_deflate"}});
    c.format = f == "npy"           ? qkgeom::io::storage_format::npy
               : f == "safetensors" ? qkgeom::io::storage_format::safetensors
                                    : qkgeom::io::storage_format::npz;
    c.npz = f == "npz_deflate" ? qkgeom::io::npz_compression::deflate : qkgeom::io::npz_compression::stored;
    if (f == "npz_deflate" && !qkgeom::io::npz_deflate_available())
        usage_error("--format npz_deflate: this qkgeom was built without zlib");
}

/// An integer option in its documented range (qkgeom/core/validate.hpp,
/// shared with study files and the Python package).
std::int64_t in_range(std::string const& flag, std::string const& v, qkgeom::option_range const& r) {
    return parse_int(flag, v, r.lo, r.hi);
}

/// Sets the option `name` (its long name) given as `a` with the value `v`
/// (empty for a flag): each value parsed whole and range-checked.
void apply_option(cli& c, std::string const& name, std::string const& a, std::string const& v) {
    auto& o = c.opt;
    if (name == "--out") c.out = v;
    else if (name == "--jobs") c.jobs = static_cast<unsigned>(in_range(a, v, R::jobs));
    else if (name == "--quiet") c.quiet = true;
    else if (name == "--no-pictures") c.pictures = false;
    else if (name == "--strict") c.strict = true;
    else if (name == "--cache") c.cache = v;
    else if (name == "--layers") c.layers = parse_int(a, v, 1, 1024);
    else if (name == "--family")
        c.family = parse_choice<std::string>(a, v, {{"steady", "steady"}, {"moderate", "moderate"}, {"steep", "steep"}});
    else if (name == "--format") set_format(c, a, v);
    else if (name == "--heads") c.heads = parse_int(a, v, 0, 8 * 1024);
    else if (name == "--head-seed") c.head_seed = static_cast<std::uint64_t>(parse_int(a, v, 0, int64_max));
    else if (name == "--dtype")
        c.dtype = parse_choice<std::string>(a, v, {{"f32", "f32"}, {"f16", "f16"}, {"bf16", "bf16"}, {"f64", "f64"}});
    else if (name == "--components") o.pca.n_components = in_range(a, v, R::components);
    else if (name == "--sign") o.pca.sign = parse_policy<qkgeom::sign_policy>(a, v);
    else if (name == "--low") o.pca.thresholds.low = parse_double(a, v);
    else if (name == "--high") o.pca.thresholds.high = parse_double(a, v);
    else if (name == "--separation") o.rotation.separation = parse_policy<qkgeom::separation_policy>(a, v);
    else if (name == "--semantic") o.householder.model = parse_policy<qkgeom::semantic_model>(a, v);
    else if (name == "--no-diagnostics") o.diagnostics = false;
    else if (name == "--ks-alpha") o.ks_alpha = parse_double(a, v);
    else if (name == "--pairs") o.plasticity.pairs = parse_policy<qkgeom::pair_policy>(a, v);
    else if (name == "--weighting") o.plasticity.weighting = parse_policy<qkgeom::ap_weighting>(a, v);
    else if (name == "--enumeration") o.plasticity.enumeration = parse_policy<qkgeom::enumeration_policy>(a, v);
    else if (name == "--max-exact-pairs") o.plasticity.max_exact_pairs = in_range(a, v, R::max_exact_pairs);
    else if (name == "--samples") o.plasticity.samples_per_cell = in_range(a, v, R::samples);
    else if (name == "--seed") o.plasticity.seed = static_cast<std::uint64_t>(in_range(a, v, R::seed));
    else if (name == "--empirical-check") o.plasticity.empirical_check = parse_policy<qkgeom::empirical_policy>(a, v);
    else if (name == "--empirical-budget") o.plasticity.empirical_budget = in_range(a, v, R::empirical_budget);
    else if (name == "--empirical-max-exact") o.plasticity.empirical_max_exact = in_range(a, v, R::empirical_max_exact);
    else if (name == "--empirical-pairs") o.plasticity.empirical_pairs = in_range(a, v, R::empirical_pairs);
    else if (name == "--no-split") o.plasticity.split_profile = false;
    else if (name == "--no-ranks") o.ranks_on = false;
    else if (name == "--rank-keys") o.ranks.keys_per_set = in_range(a, v, R::rank_keys);
    else if (name == "--rank-sets") o.ranks.sets_per_bucket = in_range(a, v, R::rank_sets);
    else if (name == "--rank-draw") o.ranks.keys = parse_policy<qkgeom::rank_key_policy>(a, v);
    else if (name == "--rope-bands") o.rope.n_bands = in_range(a, v, R::rope_bands);
    else if (name == "--window") c.window = in_range(a, v, R::window);
    else if (name == "--context") c.context = in_range(a, v, R::context);
}

unsigned command_of(std::string const& name) {
    if (name == "demo") return demo_cmd;
    if (name == "synth") return synth_cmd;
    if (name == "analyze") return analyze_cmd;
    if (name == "study") return study_cmd;
    if (name == "merge") return merge_cmd;
    return 0;
}

std::string commands_text(unsigned mask) {
    std::vector<std::string> names;
    for (auto const* n : {"analyze", "demo", "merge", "study", "synth"})
        if ((mask & command_of(n)) != 0) names.emplace_back(n);
    std::string s;
    for (std::size_t i = 0; i < names.size(); ++i)
        s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
    return s;
}

/// Whether a value is taken for an option: it starts with '-' (a path value
/// always; other values unless they are a negative number, which the
/// number's own range check then reports).
bool looks_like_option(std::string const& v, bool path) {
    if (v.size() < 2 || v[0] != '-') return false;
    return path || !(std::isdigit(static_cast<unsigned char>(v[1])) || v[1] == '.');
}

/// A word that is not an option: merge's shards, else the one DIR / FILE.
void positional(cli& c, std::string const& a) {
    if (c.command == "merge") return c.inputs.emplace_back(a), void();
    std::string const what = c.command == "study" ? "STUDY_FILE" : "DIR";
    if (c.command == "demo") usage_error("unexpected argument '" + a + "': demo takes no input (only -o OUT and options)");
    if (a.empty()) usage_error(c.command + ": the " + what + " argument is empty");
    if (!c.dir.empty())
        usage_error("unexpected argument '" + a + "': " + c.command + " takes one " + what + " ('" + c.dir.string() +
                    "' given first)");
    c.dir = a;
}

/// The checks across options, after every option is read.
void check_combination(cli& c) {
    auto const& o = c.opt;
    if (c.command == "merge" && c.inputs.empty()) usage_error("merge needs at least one SHARD");
    if (c.command != "demo" && c.command != "merge" && c.dir.empty())
        usage_error(c.command + (c.command == "study" ? " needs STUDY_FILE" : " needs DIR"));
    if (c.command != "synth" && c.out.empty()) usage_error(c.command + " needs -o " + (c.command == "merge" ? "FILE" : "OUT"));
    // The checks every front end shares (qkgeom/core/validate.hpp: study files, Python).
    if (qkgeom::thresholds_problem(o.pca.thresholds.low, o.pca.thresholds.high))
        usage_error("--low/--high: need 0 <= low <= high <= 1 (low " + qkgeom::detail::to_text(o.pca.thresholds.low) +
                    ", high " + qkgeom::detail::to_text(o.pca.thresholds.high) + ")");
    if (qkgeom::ks_alpha_problem(o.ks_alpha)) usage_error("--ks-alpha: need 0 < alpha < 1, got " + qkgeom::detail::to_text(o.ks_alpha));
    if (c.command == "synth" && c.heads > 8 * c.layers)
        usage_error("--heads: " + std::to_string(c.heads) + " is more than the " + std::to_string(8 * c.layers) +
                    " query heads of the capture (--layers " + std::to_string(c.layers) +
                    " x 8): give at most that many, or 0 for all");
    if (c.jobs == 0) c.jobs = std::max(1u, std::min(4096u, std::thread::hardware_concurrency()));
}

}  // namespace cli_impl

cli parse(int argc, char** argv) {
    using namespace cli_impl;
    cli c;
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) usage_error("no command given");
    if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") print_help();
    c.command = args[0];
    unsigned const cmd = command_of(c.command);
    if (cmd == 0) usage_error("unknown command '" + c.command + "'");
    c.command_line = "qkgeom";
    for (auto const& a : args) c.command_line += " " + shell_quoted(a);
    std::map<std::string, std::string> given;  // value options given: name -> value
    for (std::size_t i = 1; i < args.size(); ++i) {
        std::string const& a = args[i];
        if (a == "--help" || a == "-h") print_help();
        if (a.size() < 2 || a[0] != '-') {
            positional(c, a);
            continue;
        }
        auto const& table = options();
        auto const it = std::find_if(table.begin(), table.end(), [&](option const& o) { return a == o.name || a == o.alias; });
        if (it == table.end()) usage_error("unknown option '" + a + "'");
        if ((it->commands & cmd) == 0)
            usage_error("qkgeom " + c.command + " does not take the option " + a + " (an option of " +
                        commands_text(it->commands) + ")");
        if (it->arg == T::nothing) {
            apply_option(c, it->name, a, "");
            continue;
        }
        if (i + 1 >= args.size()) usage_error(a + " needs a value");
        std::string const& v = args[++i];
        if (looks_like_option(v, it->arg == T::path))
            usage_error(a + " needs a value, got '" + v + "', which looks like an option (a path that starts with '-': " +
                        "write ./" + v + ")");
        if (auto const [prev, fresh] = given.emplace(it->name, v); !fresh)
            usage_error(a + " given twice ('" + prev->second + "' and '" + v + "'): give it once");
        apply_option(c, it->name, a, v);
    }
    check_combination(c);
    return c;
}

std::vector<std::pair<std::string, std::string>> run_record(cli const& c) {
    std::string opts = qkgeom::options_text(c.opt) +
                       " window=" + (c.window >= 0 ? std::to_string(c.window) : std::string("capture")) +
                       " context=" + (c.context > 0 ? std::to_string(c.context) : std::string("capture")) +
                       " pictures=" + (c.pictures ? "on" : "off") + " strict=" + (c.strict ? "on" : "off");
    std::error_code ec;
    std::string input = "the embedded synthetic study";
    if (!c.dir.empty()) {
        auto const abs = std::filesystem::absolute(c.dir, ec);
        input = (ec ? c.dir : abs).lexically_normal().string();
    }
    return {{"qkgeom", QKGEOM_VERSION_STRING},
            {"command line", c.command_line},
            {"input", input},
            {"options", opts}};
}

std::string run_record_text(std::vector<std::pair<std::string, std::string>> const& record) {
    std::string s;
    for (auto const& [what, value] : record) s += "# " + what + ": " + value + "\n";
    return s;
}

void apply_overrides(cli const& c, qkgeom::capture_facts& facts) {
    qkgeom::io::apply_overrides(facts, c.context, c.window);
}

int run_command(cli const& c) {
    // Under mpirun, analyze and study share their work across the ranks; the
    // other commands run on rank 0 alone (docs/scale.md).
    if (ranks::rank() != 0 && c.command != "analyze" && c.command != "study") return 0;
    int rc = 1;
    try {
        if (c.command == "synth") rc = run_synth(c);
        else if (c.command == "analyze") rc = run_analyze(c);
        else if (c.command == "merge") rc = run_merge(c);
        else if (c.command == "study") rc = run_study_command(c);
        else rc = run_demo(c);
    } catch (ranks::quiet_stop const& q) {
        return q.status;  // rank 0 says why
    } catch (interrupted const& i) {
        std::cerr << "qkgeom: interrupted by " << signal_name(i.signal)
                  << ": stopped before writing; nothing was written and an earlier output was left as it was (exit "
                  << "status " << 128 + i.signal << ")\n";
        return 128 + i.signal;
    } catch (std::exception const& e) {
        std::cerr << "qkgeom: error: " << one_line(public_paths(e.what())) << "\n";
        rc = 1;
    }
    if (std::string const bad = finish_stdout(); !bad.empty()) {
        std::cerr << "qkgeom: error: cannot write to standard output: " << bad
                  << (rc == 0 || rc == 3 ? " (the output was written: only the printed summary was lost)" : "") << "\n";
        if (rc != 2) rc = 1;
    }
    if (int const sig = received_signal(); sig != 0 && rc != 1) {
        std::cerr << "qkgeom: " << signal_name(sig) << " arrived after the output was written (exit status "
                  << 128 + sig << ")\n";
        return 128 + sig;
    }
    return rc;
}

/// glibc's allocator returns a freed block of 128 kB or more to the system at
/// once (munmap) and trims the heap top beyond 128 kB, so each head's buffers
/// (rows, rotated keys, score panels: a few MB) were faulted in afresh, page
/// by page, for every head: a quarter of a run's CPU was the kernel's. Blocks
/// up to 32 MB (glibc's largest mmap threshold) now come from the heap, and
/// the heap is not trimmed below 1 GiB of free top: the next head reuses the
/// pages. The peak resident size is unchanged (the pages are those the
/// largest head needed); docs/performance.md, "Whole process".
void keep_freed_pages() {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

/// A sanitizer's allocator replaces glibc's malloc (AddressSanitizer,
/// ThreadSanitizer, MemorySanitizer): the tunable would change nothing.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
[[maybe_unused]] constexpr bool sanitizer_allocator = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
[[maybe_unused]] constexpr bool sanitizer_allocator = true;
#else
[[maybe_unused]] constexpr bool sanitizer_allocator = false;
#endif
#else
[[maybe_unused]] constexpr bool sanitizer_allocator = false;
#endif

/// The heap in transparent huge pages. Where the kernel gives huge pages only
/// to memory that asks for them (`[madvise]` in
/// /sys/kernel/mm/transparent_hugepage/enabled, Debian's default), every
/// 4 kB page of a head's buffers costs a page fault: ≈ 10,000 faults and a
/// fifth of a run's CPU on a virtual machine. glibc (≥ 2.35) asks for huge
/// pages for its heap and its mapped blocks under the tunable
/// `glibc.malloc.hugetlb=1`, which it reads at start only, so the program sets
/// it and executes itself again, once, before anything else happens (same
/// process id, arguments, descriptors and environment otherwise; the marker
/// QKGEOM_REEXEC, removed on the second start, ends the loop whatever glibc
/// does with the tunable). Nothing changes when the tunable is already named
/// in GLIBC_TUNABLES (the user's choice), when QKGEOM_NO_HUGE_PAGES is set,
/// when the kernel's mode is `always` or `never`, under a sanitizer's
/// allocator, for a set-user-id start (glibc ignores tunables there), or when
/// the program was not started from its own file (through the dynamic
/// loader: /proc/self/exe is the loader).
/// Peak resident size grows by at most a few MB; docs/performance.md,
/// "Whole process".
void use_huge_pages([[maybe_unused]] char** argv) {
#if defined(__GLIBC__) && defined(__linux__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
    if (std::getenv("QKGEOM_REEXEC") != nullptr) {  // the second start
        unsetenv("QKGEOM_REEXEC");
        return;
    }
    if (sanitizer_allocator) return;  // glibc's malloc is not the one in use: nothing to gain, a second start to pay
    char const* tunables = std::getenv("GLIBC_TUNABLES");
    std::string const before = tunables != nullptr ? tunables : "";
    if (std::getenv("QKGEOM_NO_HUGE_PAGES") != nullptr || before.find("glibc.malloc.hugetlb") != std::string::npos ||
        getauxval(AT_SECURE) != 0)
        return;
    std::string mode;
    std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), mode);
    if (mode.find("[madvise]") == std::string::npos) return;
    // the file the kernel started (AT_EXECFN) must be the running executable
    std::array<char, 4096> self{};
    auto const len = readlink("/proc/self/exe", self.data(), self.size() - 1);
    auto const* execfn = reinterpret_cast<char const*>(getauxval(AT_EXECFN));
    struct stat started {}, running {};
    if (len <= 0 || execfn == nullptr || stat(execfn, &started) != 0 || stat(self.data(), &running) != 0 ||
        started.st_dev != running.st_dev || started.st_ino != running.st_ino)
        return;
    std::string const after = before.empty() ? "glibc.malloc.hugetlb=1" : before + ":glibc.malloc.hugetlb=1";
    if (setenv("GLIBC_TUNABLES", after.c_str(), 1) != 0 || setenv("QKGEOM_REEXEC", "1", 1) != 0) return;
    execv(self.data(), argv);  // by its real path (the process keeps its name); returns only on failure
    unsetenv("QKGEOM_REEXEC");
    if (tunables != nullptr) setenv("GLIBC_TUNABLES", before.c_str(), 1);
    else unsetenv("GLIBC_TUNABLES");
#endif
}

}  // namespace qkgeom_app

int main(int argc, char** argv) {
    qkgeom_app::use_huge_pages(argv);      // first: it may start the program again
    qkgeom_app::keep_freed_pages();         // before the first allocation of a head
    qkgeom_app::install_signal_handling();  // before any thread starts
    qkgeom_app::cli const c = qkgeom_app::parse(argc, argv);
    try {
        qkgeom_app::ranks::start(argc, argv);  // under mpirun only (ranks.hpp)
    } catch (std::exception const& e) {
        std::cerr << "qkgeom: error: " << qkgeom_app::one_line(e.what()) << "\n";
        return 1;
    }
    qkgeom_app::set_signal_quiet(c.quiet || qkgeom_app::ranks::rank() != 0);
    int const rc = qkgeom_app::run_command(c);
    qkgeom_app::ranks::stop();
    return rc;
}
