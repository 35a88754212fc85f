// qkgeom — the command-line program.
//
//   qkgeom demo -o OUT [options]   analyse the embedded synthetic study (three
//                                  model families with different drift and
//                                  content strength) and write its reports
//   qkgeom synth DIR [options]     write one synthetic family as a capture in
//                                  the dataset layout (docs/dataset.md)
//   qkgeom analyze DIR -o OUT      analyse every head of a capture directory
//   qkgeom --help
//
// Heads are analysed in parallel (--jobs, default: all cores); each worker
// holds one head at a time. Progress goes to stderr: a bar with rate and ETA
// on a terminal, plain lines otherwise. Errors: one line on stderr, exit 1
// (usage errors exit 2).
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/parallel.hpp>
#include <qkgeom/plasticity.hpp>
#include <qkgeom/report/csv.hpp>
#include <qkgeom/report/html.hpp>
#include <qkgeom/report/svg.hpp>
#include <qkgeom/synthetic.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

constexpr char const* usage_text = R"(qkgeom — how position and content compete inside attention heads

Usage:
  qkgeom demo -o OUT [options]   analyse the embedded synthetic study and write
                                 its reports to OUT/<model>/ (no input needed)
  qkgeom synth DIR [options]     write one family of the study as a capture in
                                 the dataset layout of docs/dataset.md
  qkgeom analyze DIR -o OUT      analyse every query head of the capture in DIR
                                 (the manifest's head sample when it records one:
                                 capture.head_count; manifest.json + lLLhHHq/k
                                 entries) and write
                                 the reports to OUT/; a head that fails to read
                                 is listed in OUT/failures.txt and the others go
                                 on (exit status 3), unless --strict
  qkgeom --help                  this text

The demo study: three synthetic model families (steady, moderate, steep) of
4 layers x 8 query heads (GQA, 2 kv heads), d = 64 (32 rotary coordinates,
RoPE theta 10000), 96 sequences of 4096 tokens, uniform buckets of 256 tokens,
about one kept token per bucket per sequence (method §0.1). The families differ
in positional drift and content strength, like the thesis' three families.

Reports per model (docs/outputs.md): head_metrics.csv, head_bucket_plasticity.csv,
head_component_weights.csv, qk_pca.csv, model_report.csv, layer_report.csv; and
OUT/summary.txt, the model table printed at the end.
Pictures (docs/pictures.md) next to the CSVs: plasticity_profile.svg,
plasticity_heatmap.svg, component_weights.svg, taxonomy_scatter.svg per model;
OUT/model_comparison.svg; and OUT/index.html, a page (no scripts) with the
model table, every picture and links to every CSV. --no-pictures skips them.

Options (defaults are the thesis'; SPEC section in brackets):
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
      --window W             sliding window in tokens, 0 = full attention (0) [§6]
      --context L            context length for the quantiles, 0 = max position + 1 [§6]
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

[[noreturn]] void usage_error(std::string const& msg) {
    std::cerr << "qkgeom: " << msg << " (see qkgeom --help)\n";
    std::exit(2);
}

struct cli {
    std::string command;
    std::filesystem::path out;
    unsigned jobs = 0;
    bool quiet = false;
    std::int64_t layers = 4;
    std::filesystem::path dir;  // synth / analyze
    std::string family = "steep";
    qkgeom::io::storage_format format = qkgeom::io::storage_format::npy;
    qkgeom::io::npz_compression npz = qkgeom::io::npz_compression::stored;
    std::int64_t heads = 0;        // synth: sampled query heads, 0 = all
    std::uint64_t head_seed = 0;   // synth: head-sample seed
    std::string dtype = "f32";
    bool strict = false;
    bool pictures = true;
    qkgeom::analysis_options opt;
};

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

cli parse(int argc, char** argv) {
    cli c;
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) usage_error("no command given");
    if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
        std::cout << usage_text;
        std::exit(0);
    }
    c.command = args[0];
    if (c.command != "demo" && c.command != "synth" && c.command != "analyze")
        usage_error("unknown command '" + c.command + "'");
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
        else if (!a.empty() && a[0] != '-' && c.dir.empty() && c.command != "demo") c.dir = a;
        else if (a == "--components") o.pca.n_components = parse_int(a, value(), 1);
        else if (a == "--sign")
            o.pca.sign = parse_choice<qkgeom::sign_policy>(
                a, value(), {{"dominant", qkgeom::sign_policy::dominant}, {"query_anchor", qkgeom::sign_policy::query_anchor}});
        else if (a == "--low") o.pca.thresholds.low = parse_double(a, value());
        else if (a == "--high") o.pca.thresholds.high = parse_double(a, value());
        else if (a == "--separation")
            o.rotation.separation = parse_choice<qkgeom::separation_policy>(
                a, value(),
                {{"centroid", qkgeom::separation_policy::centroid},
                 {"max_separation", qkgeom::separation_policy::max_separation}});
        else if (a == "--semantic")
            o.householder.model = parse_choice<qkgeom::semantic_model>(
                a, value(),
                {{"diag", qkgeom::semantic_model::diag},
                 {"full", qkgeom::semantic_model::full},
                 {"global_linear", qkgeom::semantic_model::global_linear}});
        else if (a == "--no-diagnostics") o.diagnostics = false;
        else if (a == "--ks-alpha") o.ks_alpha = parse_double(a, value());
        else if (a == "--pairs")
            o.plasticity.pairs = parse_choice<qkgeom::pair_policy>(
                a, value(), {{"same_bucket", qkgeom::pair_policy::same_bucket}, {"prefix", qkgeom::pair_policy::prefix}});
        else if (a == "--weighting")
            o.plasticity.weighting = parse_choice<qkgeom::ap_weighting>(
                a, value(),
                {{"query_count", qkgeom::ap_weighting::query_count}, {"cell_mean", qkgeom::ap_weighting::cell_mean}});
        else if (a == "--enumeration")
            o.plasticity.enumeration = parse_choice<qkgeom::enumeration_policy>(
                a, value(),
                {{"auto", qkgeom::enumeration_policy::automatic},
                 {"exact", qkgeom::enumeration_policy::exact},
                 {"sampled", qkgeom::enumeration_policy::sampled}});
        else if (a == "--max-exact-pairs") o.plasticity.max_exact_pairs = parse_int(a, value(), 0);
        else if (a == "--samples") o.plasticity.samples_per_cell = parse_int(a, value(), 1);
        else if (a == "--seed") o.plasticity.seed = static_cast<std::uint64_t>(parse_int(a, value(), 0));
        else if (a == "--window") o.plasticity.sliding_window = parse_int(a, value(), 0);
        else if (a == "--context") o.plasticity.context_length = parse_int(a, value(), 0);
        else usage_error("unknown option '" + a + "'");
    }
    if (c.command != "demo" && c.dir.empty()) usage_error(c.command + " needs DIR");
    if (c.command != "synth" && c.out.empty()) usage_error(c.command + " needs -o OUT");
    if (!(o.pca.thresholds.low >= 0 && o.pca.thresholds.low <= o.pca.thresholds.high && o.pca.thresholds.high <= 1))
        usage_error("--low/--high: need 0 <= low <= high <= 1");
    if (!(o.ks_alpha > 0 && o.ks_alpha < 1)) usage_error("--ks-alpha: need 0 < alpha < 1");
    if (c.jobs == 0) c.jobs = std::max(1u, std::thread::hardware_concurrency());
    return c;
}

/// Progress on stderr: a bar with rate and ETA on a terminal, plain lines otherwise.
class progress {
public:
    progress(std::size_t total, bool quiet)
        : total_(total), quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}
    void tick(std::string const& what) {
        std::lock_guard lock(m_);
        ++done_;
        if (quiet_) return;
        double const el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        double const rate = el > 0 ? double(done_) / el : 0.0;
        double const eta = rate > 0 ? double(total_ - done_) / rate : 0.0;
        if (tty_) {
            int const width = 30;
            int const fill = static_cast<int>(width * done_ / std::max<std::size_t>(1, total_));
            std::fprintf(stderr, "\r[%s%s] %zu/%zu heads  %.1f heads/s  ETA %.0fs ", std::string(fill, '#').c_str(),
                         std::string(width - fill, '.').c_str(), done_, total_, rate, eta);
            if (done_ == total_) std::fprintf(stderr, "\n");
        } else {
            std::fprintf(stderr, "qkgeom: %zu/%zu %s (%.1f heads/s, ETA %.0f s)\n", done_, total_, what.c_str(), rate,
                         eta);
        }
        std::fflush(stderr);
    }

private:
    std::size_t total_, done_ = 0;
    bool quiet_, tty_;
    std::chrono::steady_clock::time_point start_;
    std::mutex m_;
};

using qkgeom::parallel_for;  // qkgeom/parallel.hpp

/// One synthetic model family of the demo study.
struct family {
    std::string name;
    double q_slope, k_slope;  ///< positional drift per token (plain units)
    double content;           ///< per-bucket semantic mean scale (content strength)
    double noise;             ///< semantic noise sd
};

qkgeom::synthetic::layer_spec demo_layer(family const& f, std::int64_t layer) {
    qkgeom::synthetic::layer_spec L;
    L.d = 64;
    L.rotary_dims = 32;
    L.mix = true;
    L.n_q_heads = 8;
    L.n_kv_heads = 2;
    L.layer = layer;
    L.model_seed = 1000 + static_cast<std::uint64_t>(layer);
    for (std::int64_t h = 0; h < L.n_q_heads; ++h) {
        qkgeom::synthetic::q_head_params q;
        double const jitter = 1.0 + 0.15 * double((h * 7 + layer * 3) % 5 - 2);  // heads differ
        q.query.intercept = 2.0;
        q.query.slope = f.q_slope * jitter;
        q.query.bucket_mean_scale = f.content;
        q.query.noise_sd = f.noise;
        L.q_heads.push_back(q);
    }
    for (std::int64_t g = 0; g < L.n_kv_heads; ++g) {
        qkgeom::synthetic::kv_head_params kv;
        kv.key.intercept = -1.0;
        kv.key.slope = f.k_slope * (1.0 + 0.2 * double(g + layer % 2));
        kv.key.bucket_mean_scale = f.content;
        kv.key.noise_sd = f.noise;
        L.kv_heads.push_back(kv);
    }
    return L;
}

std::vector<family> const families{
    {"steady", 2e-4, 4e-4, 1.0, 1.0},    // weak drift, strong content: small AP_drop
    {"moderate", 6e-4, 1.2e-3, 0.6, 1.0},
    {"steep", 1.2e-3, 2.4e-3, 0.3, 0.8},  // strong drift, weak content: large AP_drop
};

qkgeom::synthetic::capture_spec demo_capture() {
    qkgeom::synthetic::capture_spec cap;
    cap.n_examples = 96;
    cap.context_length = 4096;
    cap.buckets = {.scheme = qkgeom::bucket_scheme::uniform, .width = 256, .rate = 1.0};
    cap.seed = 7;
    return cap;
}

std::string model_table(std::vector<std::pair<std::string, qkgeom::model_summary>> const& table) {
    std::string text = "model      heads  ap_overall  ap_first_20pct  ap_last_20pct  ap_drop  gaussian_gap  bias_strength\n";
    for (auto const& [name, m] : table) {
        char line[256];
        std::snprintf(line, sizeof line, "%-10s %5lld  %10.4f  %14.4f  %13.4f  %7.4f  %12.4f  %13.3g\n", name.c_str(),
                      static_cast<long long>(m.all.n_heads), m.all["ap_overall"], m.all["ap_first_20pct"],
                      m.all["ap_last_20pct"], m.all["ap_drop"], m.all["gaussian_gap"], m.all["bias_strength"]);
        text += line;
    }
    return text;
}

void write_text(std::filesystem::path const& p, std::string const& text) {
    std::FILE* fp = std::fopen(p.string().c_str(), "w");
    if (fp == nullptr) throw std::runtime_error("cannot write " + p.string());
    std::fputs(text.c_str(), fp);
    if (std::fclose(fp) != 0) throw std::runtime_error("writing " + p.string() + " failed");
}

/// The 2D heatmap grid of the program (method §6, §9.13), unless the library
/// caller set one: one grid for every head of a model (so the model picture
/// sums all heads), from the context length L: offsets τ_b − midpoint in 32
/// bins over [−L, L]; inter-key distances in 16 bins over [0, B] for
/// `same_bucket` pairs of uniform buckets of width B (a pair never spans more),
/// else over [0, L].
void picture_grid(qkgeom::plasticity_options& p, std::int64_t context_length) {
    if (p.context_length > 0) context_length = p.context_length;
    if (context_length <= 0) return;  // per-head default grid
    auto const L = static_cast<double>(context_length);
    double span = L;
    if (p.pairs == qkgeom::pair_policy::same_bucket && p.buckets && p.buckets->scheme != qkgeom::bucket_scheme::log)
        span = std::min(L, static_cast<double>(p.buckets->width));
    if (p.heatmap.distance_edges.empty()) p.heatmap.distance_edges = qkgeom::detail::default_edges(0, span, 16);
    if (p.heatmap.offset_edges.empty()) p.heatmap.offset_edges = qkgeom::detail::default_edges(-L, L, 32);
}

/// The CSV names written by write_reports, each prefixed with `dir`.
std::vector<std::string> csv_links(std::string const& dir) {
    std::vector<std::string> out;
    for (auto f : {qkgeom::report::head_metrics_file, qkgeom::report::head_bucket_plasticity_file,
                   qkgeom::report::head_component_weights_file, qkgeom::report::qk_pca_file,
                   qkgeom::report::model_report_file, qkgeom::report::layer_report_file})
        out.push_back(dir + std::string(f));
    return out;
}

/// The pictures of one model into `dir` (method §7, docs/pictures.md) and its
/// section of index.html; `prefix` is `dir` relative to index.html.
qkgeom::report::html_model write_model_pictures(std::filesystem::path const& dir, std::string const& prefix,
                                                qkgeom::report::model_pictures const& pics,
                                                qkgeom::model_summary const& summary,
                                                qkgeom::report::picture_options const& popt) {
    qkgeom::report::html_model sec{{pics.model, summary.all}, {}, csv_links(prefix)};
    for (auto const& p : qkgeom::report::write_pictures(dir, pics, popt))
        sec.pictures.push_back(qkgeom::report::to_html(p, prefix));
    return sec;
}

/// qkgeom synth DIR: one family of the study in the dataset layout.
int run_synth(cli const& c) {
    auto const fit = std::find_if(families.begin(), families.end(), [&](family const& f) { return f.name == c.family; });
    if (fit == families.end()) usage_error("--family: '" + c.family + "' is not one of steady | moderate | steep");
    auto const cap = demo_capture();
    qkgeom::io::manifest m;
    m.model = fit->name;
    m.n_layers = c.layers;
    m.n_q_heads.assign(static_cast<std::size_t>(c.layers), 8);
    m.n_kv_heads.assign(static_cast<std::size_t>(c.layers), 2);
    m.head_dim = 64;
    m.buckets = cap.buckets;
    m.context_length = cap.context_length;
    m.seed = cap.seed;
    // method §0.1 head sampling, recorded in the manifest (capture.head_count).
    m.heads = qkgeom::io::head_sampling{c.heads > 0 ? std::optional<std::int64_t>(c.heads) : std::nullopt, c.head_seed,
                                        qkgeom::layer_eligibility::full_attention_only};
    auto const chosen = qkgeom::io::sampled_heads(m);
    auto const keys = qkgeom::key_heads_of(chosen);
    std::filesystem::create_directories(c.dir);
    qkgeom::io::write_manifest(c.dir, m);
    progress bar(static_cast<std::size_t>(c.layers), c.quiet);
    for (std::int64_t layer = 0; layer < c.layers; ++layer) {
        auto const heads = qkgeom::synthetic::generate_layer(demo_layer(*fit, layer), cap);
        for (auto const& hc : heads) {
            if (std::binary_search(chosen.begin(), chosen.end(), qkgeom::head_pair{hc.layer, hc.q_head, hc.k_head})) {
                qkgeom::io::head_entry q{hc.layer, hc.q_head, qkgeom::kind::query, hc.q, c.dtype, hc.q_position,
                                         hc.q_bucket, hc.q_example, std::nullopt};
                qkgeom::io::write_head(c.dir, m, q, c.format, c.dtype, c.npz);
            }
            // Each key head once (the first query head of its GQA group carries it),
            // and only when a sampled query head reads it.
            if (hc.q_head % qkgeom::gqa_group_size(m.n_q_heads[0], m.n_kv_heads[0]) == 0 &&
                std::binary_search(keys.begin(), keys.end(), std::pair{hc.layer, hc.k_head})) {
                qkgeom::io::head_entry k{hc.layer, hc.k_head, qkgeom::kind::key, hc.k, c.dtype, hc.k_position,
                                         hc.k_bucket, hc.k_example, std::nullopt};
                qkgeom::io::write_head(c.dir, m, k, c.format, c.dtype, c.npz);
            }
        }
        bar.tick("layer " + std::to_string(layer));
    }
    std::cout << "synthetic capture '" << m.model << "' (" << chosen.size() << " of " << c.layers * 8
              << " query heads) written to " << c.dir.string() << "\n";
    return 0;
}

/// qkgeom analyze DIR -o OUT: every query head of a capture, streamed (one
/// head per worker), with the failures listed instead of aborting.
int run_analyze(cli const& c) {
    auto const m = qkgeom::io::read_manifest(c.dir);
    struct task {
        std::int64_t layer, q_head, k_head;
    };
    // The heads the capture holds: the manifest's head sample when it records
    // one (method §0.1, capture.head_count), else every query head of every layer.
    // A listed head whose entry is missing or bad is a failure, never skipped.
    std::vector<task> tasks;
    auto const planned = m.heads ? qkgeom::io::sampled_heads(m)
                               : qkgeom::eligible_heads(qkgeom::io::layout_of(m), qkgeom::layer_eligibility::all_layers);
    for (auto const& h : planned) tasks.push_back({h.layer, h.q_head, h.k_head});  // method §0 GQA mapping
    qkgeom::analysis_options opt = c.opt;
    opt.plasticity.buckets = m.buckets;
    if (opt.plasticity.context_length == 0) opt.plasticity.context_length = m.context_length;
    picture_grid(opt.plasticity, opt.plasticity.context_length);
    std::vector<std::optional<qkgeom::head_analysis>> results(tasks.size());
    std::vector<std::string> errors(tasks.size());
    progress bar(tasks.size(), c.quiet);
    parallel_for(tasks.size(), c.jobs, [&](std::size_t i) {
        auto const& t = tasks[i];
        std::string const name = qkgeom::io::head_entry_name(t.layer, t.q_head, qkgeom::kind::query);
        try {
            auto const q = qkgeom::io::read_head(c.dir, m, t.layer, t.q_head, qkgeom::kind::query);
            auto const k = qkgeom::io::read_head(c.dir, m, t.layer, t.k_head, qkgeom::kind::key);
            qkgeom::analysis_options o = opt;
            if (q.sliding_window) o.plasticity.sliding_window = *q.sliding_window;
            results[i] = qkgeom::analyze_head(q.vectors, q.position, q.bucket, k.vectors, k.position, k.bucket,
                                              k.example_id, o, {t.layer, t.q_head, t.k_head});
        } catch (std::exception const& e) {
            if (c.strict) throw;
            errors[i] = e.what();
        }
        bar.tick(name);
    });
    std::vector<qkgeom::head_analysis> heads;
    std::string failures;
    for (std::size_t i = 0; i < tasks.size(); ++i) {
        if (results[i]) heads.push_back(std::move(*results[i]));
        else
            failures += "l" + std::to_string(tasks[i].layer) + " q_head " + std::to_string(tasks[i].q_head) + ": " +
                        errors[i] + "\n";
    }
    std::filesystem::create_directories(c.out);
    if (!heads.empty()) qkgeom::report::write_reports(c.out, m.model, heads);
    write_text(c.out / "failures.txt", failures);
    auto const summary = qkgeom::summarise_model(heads);
    std::string const text = model_table({{m.model, summary}});
    write_text(c.out / "summary.txt", text);
    if (c.pictures && !heads.empty()) {
        // Pictures and index.html next to the CSVs; the picture data is compact
        // (profiles, heatmap sums, weights, r_q/r_k), no rows.
        qkgeom::report::picture_options popt;
        popt.thresholds = opt.pca.thresholds;
        qkgeom::report::html_page page;
        page.title = "qkgeom report: " + m.model;
        page.intro = "qkgeom analyze of " + c.dir.string() + ": " + std::to_string(heads.size()) + " of " +
                     std::to_string(tasks.size()) + " query heads analysed.";
        page.models.push_back(write_model_pictures(c.out, "", qkgeom::report::collect_pictures(m.model, heads),
                                                   summary, popt));
        page.overview.push_back(qkgeom::report::to_html(qkgeom::report::write_model_comparison(
            c.out / std::string(qkgeom::report::model_comparison_svg_file), {&page.models[0].entry, 1}, popt)));
        page.files = {"summary.txt"};
        if (!failures.empty()) page.files.emplace_back("failures.txt");
        qkgeom::report::write_index_html(c.out / std::string(qkgeom::report::index_html_file), page);
    }
    std::cout << text << "reports written to " << c.out.string() << "/\n";
    if (!failures.empty()) {
        std::cerr << "qkgeom: " << (tasks.size() - heads.size()) << " of " << tasks.size()
                  << " heads failed (listed in " << (c.out / "failures.txt").string() << ")\n";
        return 3;
    }
    return 0;
}

int run_demo(cli const& c) {
    std::int64_t const n_layers = c.layers;
    auto const cap = demo_capture();
    qkgeom::analysis_options opt = c.opt;
    opt.plasticity.buckets = cap.buckets;
    picture_grid(opt.plasticity, cap.context_length);
    qkgeom::report::picture_options popt;
    popt.thresholds = opt.pca.thresholds;
    qkgeom::report::html_page page;
    page.title = "qkgeom demo: three synthetic model families";
    page.intro = "The embedded synthetic study (steady, moderate, steep: rising positional drift, falling content "
                 "strength), " + std::to_string(n_layers) + " layer(s) x 8 query heads per model.";

    std::filesystem::create_directories(c.out);
    std::size_t const per_model = static_cast<std::size_t>(n_layers * 8);
    progress bar(families.size() * per_model, c.quiet);
    std::vector<std::pair<std::string, qkgeom::model_summary>> table;
    for (auto const& f : families) {
        std::vector<qkgeom::head_analysis> heads(per_model);
        // One task per (layer, q head): the task generates its head and analyses it,
        // so a worker holds one head at a time.
        parallel_for(per_model, c.jobs, [&](std::size_t i) {
            auto const layer = static_cast<std::int64_t>(i / 8), qh = static_cast<std::int64_t>(i % 8);
            auto const hc = qkgeom::synthetic::generate_head(demo_layer(f, layer), cap, qh);
            heads[i] = qkgeom::analyze_head(hc.q, hc.q_position, hc.q_bucket, hc.k, hc.k_position, hc.k_bucket,
                                            hc.k_example, opt, {hc.layer, hc.q_head, hc.k_head});
            bar.tick(f.name + " l" + std::to_string(layer) + "h" + std::to_string(qh));
        });
        qkgeom::report::write_reports(c.out / f.name, f.name, heads);
        table.emplace_back(f.name, qkgeom::summarise_model(heads));
        if (c.pictures)
            page.models.push_back(write_model_pictures(c.out / f.name, f.name + "/",
                                                       qkgeom::report::collect_pictures(f.name, heads),
                                                       table.back().second, popt));
    }
    if (c.pictures) {
        std::vector<qkgeom::report::model_entry> entries;
        for (auto const& sec : page.models) entries.push_back(sec.entry);
        page.overview.push_back(qkgeom::report::to_html(qkgeom::report::write_model_comparison(
            c.out / std::string(qkgeom::report::model_comparison_svg_file), entries, popt)));
        page.files = {"summary.txt"};
        qkgeom::report::write_index_html(c.out / std::string(qkgeom::report::index_html_file), page);
    }

    // The model table (also in OUT/summary.txt).
    std::string const text = model_table(table);
    std::cout << text;
    write_text(c.out / "summary.txt", text);
    std::cout << "reports written to " << c.out.string() << "/{steady,moderate,steep}/\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    cli const c = parse(argc, argv);
    try {
        if (c.command == "synth") return run_synth(c);
        if (c.command == "analyze") return run_analyze(c);
        return run_demo(c);
    } catch (std::exception const& e) {
        std::cerr << "qkgeom: error: " << e.what() << "\n";
        return 1;
    }
}
