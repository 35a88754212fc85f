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

#include <qkgeom/analysis/policy_names.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/run/dataset_analysis.hpp>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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
or .qkgeom-capture); they are checked before any analysis, written next to the
target and swapped in at the end, so a folder never mixes two runs. summary.txt
and index.html record the command line, the input and the options.
Exit status: 0 success; 1 the run failed (one line on stderr naming the file,
field and value; the old OUT is left as it was); 2 usage error; 3 some heads
(analyze) or runs (study) failed (each listed in OUT/failures.txt, the others
reported).

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

Options (defaults are the thesis'; method section in brackets, docs/method.md):
  -o, --out DIR              output directory (required)
  -j, --jobs N               worker threads (default: all cores)
      --components K         PCA components reported (10) [§2]
      --sign POLICY          dominant | query_anchor (dominant) [§2]
      --low X, --high X      taxonomy thresholds (0.3, 0.7) [§2]
      --separation POLICY    centroid | max_separation (centroid) [§3]
      --semantic MODEL       diag | full | global_linear (diag) [§4]
      --no-diagnostics       skip the row-based normality diagnostics [§4]
      --ks-alpha X           level of the KS rejection fraction (0.05) [§4]
      --pairs POLICY         same_bucket | prefix (same_bucket) [§6]
      --weighting POLICY     query_count | cell_mean (query_count) [§6]
      --enumeration MODE     auto | exact | sampled (auto) [§6]
      --max-exact-pairs N    auto: exact up to N evaluations per head (4000000) [§6]
      --samples N            sampled: pairs per cell (2000) [§6]
      --seed N               sampled: seed (0) [§6]
      --no-split             skip the split of AP_drop into bias and content parts [§10.1]
      --no-ranks             skip top-1 flip and Kendall of m keys [§10.4]
      --rank-keys M          keys per set of the top-1/Kendall analysis, 2..64 (8) [§10.4]
      --rank-sets N          key sets drawn per query bucket (16) [§10.4]
      --rank-draw POLICY     prefix | same_bucket: how a key set is drawn (prefix) [§10.4]
      --rope-bands N         frequency bands of the RoPE analysis (8) [§10.2]
      --window W             sliding window in tokens for heads whose capture records
                             none (the capture's own window wins) [§6]
      --context L            context length for the quantiles and the heatmap grid,
                             replacing the capture's (the manifest's context_length;
                             the demo: 4096); 0 = not given. A head with a position
                             >= L fails [§6, §9.12]
      --layers N             layers per demo/synth model (4)
      --family NAME          synth: steady | moderate | steep (steep)
      --format F             synth: npy | safetensors | npz | npz_deflate (npy) [docs/dataset.md]
      --heads N              synth: write N query heads sampled uniformly without
                             replacement (and the key heads they read); 0 = all (0) [§0.1]
      --head-seed N          synth: seed of the head sample (0) [§0.1]
      --dtype T              synth: f32 | f16 | bf16 | f64 (f32)
      --strict               analyze: stop at the first head that fails
      --no-pictures          write no SVG pictures and no index.html
      --quiet                no progress output
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

double parse_double(std::string const& flag, std::string const& v) {
    try {
        std::size_t pos = 0;
        double const x = std::stod(v, &pos);
        if (pos != v.size()) throw std::invalid_argument(v);
        return x;
    } catch (std::exception const&) {
        usage_error(flag + ": not a number: '" + v + "'");
    }
}

std::int64_t parse_int(std::string const& flag, std::string const& v, std::int64_t lo) {
    try {
        std::size_t pos = 0;
        long long const x = std::stoll(v, &pos);
        if (pos != v.size() || x < lo) throw std::invalid_argument(v);
        return x;
    } catch (std::exception const&) {
        usage_error(flag + ": expected an integer >= " + std::to_string(lo) + ", got '" + v + "'");
    }
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

}  // namespace

cli parse(int argc, char** argv) {
    cli c;
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) usage_error("no command given");
    if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
        std::cout << usage_text;
        std::exit(0);
    }
    c.command = args[0];
    if (c.command != "demo" && c.command != "synth" && c.command != "analyze" && c.command != "merge" &&
        c.command != "study")
        usage_error("unknown command '" + c.command + "'");
    c.command_line = "qkgeom";
    for (auto const& a : args) c.command_line += " " + shell_quoted(a);
    auto& o = c.opt;
    for (std::size_t i = 1; i < args.size(); ++i) {
        std::string const& a = args[i];
        auto value = [&]() -> std::string const& {
            if (i + 1 >= args.size()) usage_error(a + " needs a value");
            return args[++i];
        };
        if (a == "--help" || a == "-h") {
            std::cout << usage_text;
            std::exit(0);
        } else if (a == "-o" || a == "--out") c.out = value();
        else if (a == "-j" || a == "--jobs") c.jobs = static_cast<unsigned>(parse_int(a, value(), 1));
        else if (a == "--quiet") c.quiet = true;
        else if (a == "--layers") c.layers = parse_int(a, value(), 1);
        else if (a == "--family") c.family = value();
        else if (a == "--format") {
            std::string const f = parse_choice<std::string>(
                a, value(), {{"npy", "npy"}, {"safetensors", "safetensors"}, {"npz", "npz"}, {"npz_deflate", "npz_deflate"}});
            c.format = f == "npy"           ? qkgeom::io::storage_format::npy
                       : f == "safetensors" ? qkgeom::io::storage_format::safetensors
                                            : qkgeom::io::storage_format::npz;
            c.npz = f == "npz_deflate" ? qkgeom::io::npz_compression::deflate : qkgeom::io::npz_compression::stored;
            if (f == "npz_deflate" && !qkgeom::io::npz_deflate_available())
                usage_error("--format npz_deflate: this qkgeom was built without zlib");
        } else if (a == "--heads") c.heads = parse_int(a, value(), 0);
        else if (a == "--head-seed") c.head_seed = static_cast<std::uint64_t>(parse_int(a, value(), 0));
        else if (a == "--dtype") c.dtype = parse_choice<std::string>(a, value(), {{"f32", "f32"}, {"f16", "f16"}, {"bf16", "bf16"}, {"f64", "f64"}});
        else if (a == "--strict") c.strict = true;
        else if (a == "--no-pictures") c.pictures = false;
        else if (!a.empty() && a[0] != '-' && c.command == "merge") c.inputs.emplace_back(a);
        else if (!a.empty() && a[0] != '-' && c.dir.empty() && c.command != "demo") c.dir = a;
        else if (a == "--components") o.pca.n_components = parse_int(a, value(), 1);
        else if (a == "--sign")
            o.pca.sign = parse_policy<qkgeom::sign_policy>(a, value());
        else if (a == "--low") o.pca.thresholds.low = parse_double(a, value());
        else if (a == "--high") o.pca.thresholds.high = parse_double(a, value());
        else if (a == "--separation")
            o.rotation.separation = parse_policy<qkgeom::separation_policy>(a, value());
        else if (a == "--semantic")
            o.householder.model = parse_policy<qkgeom::semantic_model>(a, value());
        else if (a == "--no-diagnostics") o.diagnostics = false;
        else if (a == "--ks-alpha") o.ks_alpha = parse_double(a, value());
        else if (a == "--pairs")
            o.plasticity.pairs = parse_policy<qkgeom::pair_policy>(a, value());
        else if (a == "--weighting")
            o.plasticity.weighting = parse_policy<qkgeom::ap_weighting>(a, value());
        else if (a == "--enumeration")
            o.plasticity.enumeration = parse_policy<qkgeom::enumeration_policy>(a, value());
        else if (a == "--max-exact-pairs") o.plasticity.max_exact_pairs = parse_int(a, value(), 0);
        else if (a == "--samples") o.plasticity.samples_per_cell = parse_int(a, value(), 1);
        else if (a == "--seed") o.plasticity.seed = static_cast<std::uint64_t>(parse_int(a, value(), 0));
        else if (a == "--no-split") o.plasticity.split_profile = false;
        else if (a == "--no-ranks") o.ranks_on = false;
        else if (a == "--rank-keys") o.ranks.keys_per_set = parse_int(a, value(), 2);
        else if (a == "--rank-sets") o.ranks.sets_per_bucket = parse_int(a, value(), 1);
        else if (a == "--rank-draw") o.ranks.keys = parse_policy<qkgeom::rank_key_policy>(a, value());
        else if (a == "--rope-bands") o.rope.n_bands = parse_int(a, value(), 1);
        else if (a == "--window") c.window = parse_int(a, value(), 0);
        else if (a == "--context") c.context = parse_int(a, value(), 0);
        else usage_error("unknown option '" + a + "'");
    }
    if (c.command == "merge" && c.inputs.empty()) usage_error("merge needs at least one SHARD");
    if (c.command != "demo" && c.command != "merge" && c.dir.empty())
        usage_error(c.command + (c.command == "study" ? " needs STUDY_FILE" : " needs DIR"));
    if (c.command != "synth" && c.out.empty()) usage_error(c.command + " needs -o OUT");
    if (!(o.pca.thresholds.low >= 0 && o.pca.thresholds.low <= o.pca.thresholds.high && o.pca.thresholds.high <= 1))
        usage_error("--low/--high: need 0 <= low <= high <= 1");
    if (!(o.ks_alpha > 0 && o.ks_alpha < 1)) usage_error("--ks-alpha: need 0 < alpha < 1");
    if (o.ranks.keys_per_set > 64) usage_error("--rank-keys: need 2 <= M <= 64");
    if (c.jobs == 0) c.jobs = std::max(1u, std::thread::hardware_concurrency());
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

}  // namespace qkgeom_app

int main(int argc, char** argv) {
    qkgeom_app::cli const c = qkgeom_app::parse(argc, argv);
    try {
        if (c.command == "synth") return qkgeom_app::run_synth(c);
        if (c.command == "analyze") return qkgeom_app::run_analyze(c);
        if (c.command == "merge") return qkgeom_app::run_merge(c);
        if (c.command == "study") return qkgeom_app::run_study_command(c);
        return qkgeom_app::run_demo(c);
    } catch (std::exception const& e) {
        std::cerr << "qkgeom: error: " << qkgeom_app::one_line(e.what()) << "\n";
        return 1;
    }
}

