// qkgeom program — the embedded synthetic study: `qkgeom demo` (three model
// families analysed in memory) and `qkgeom synth` (one family written as a
// capture in the dataset layout of docs/dataset.md).
#include "program.hpp"

#include <qkgeom/capture/synthetic.hpp>
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/run/study_run.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace qkgeom_app {

namespace {

/// One synthetic model family of the demo study.
struct family {
    std::string name;
    double q_slope, k_slope;  ///< positional drift per token (plain units)
    double content;           ///< per-bucket semantic mean scale (content strength)
    double noise;             ///< semantic noise sd
};

/// One checkpoint of a demo model: the key drift grows, then collapses (as
/// the thesis' long-context extension does), while the query's mean on the
/// drift axis rises slowly.
struct demo_checkpoint {
    std::int64_t step;
    char const* phase;
    double k_factor;     ///< key drift slope, relative to the family's
    double q_intercept;  ///< query mean along the drift direction
};

/// `qkgeom synth` writes a family at the second checkpoint (step 2000): the
/// family's own drift.
std::vector<demo_checkpoint> const demo_checkpoints{
    {1000, "pre-train", 0.5, 1.9}, {2000, "pre-train", 1.0, 2.0}, {3000, "anneal", 1.5, 2.2}, {4000, "long-context", 0.2, 2.6}};

qkgeom::synthetic::layer_spec demo_layer(family const& f, std::int64_t layer,
                                         demo_checkpoint const& ck = demo_checkpoints[1]) {
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
        q.query.intercept = ck.q_intercept;
        q.query.slope = f.q_slope * jitter;
        q.query.bucket_mean_scale = f.content;
        q.query.noise_sd = f.noise;
        L.q_heads.push_back(q);
    }
    for (std::int64_t g = 0; g < L.n_kv_heads; ++g) {
        qkgeom::synthetic::kv_head_params kv;
        kv.key.intercept = -1.0;
        kv.key.slope = f.k_slope * ck.k_factor * (1.0 + 0.2 * double(g + layer % 2));
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

/// The made-up benchmark of the demo: overall and per-length scores that
/// fall with the family's planted drift (so the scatter and the per-length
/// correlation have something to show); never a measurement.
qkgeom::study::benchmark demo_benchmark() {
    qkgeom::study::benchmark b;
    b.name = "demo_score";
    double const overall[] = {40.0, 33.0, 22.0};  // steady, moderate, steep
    double const slope[] = {2.0, 4.0, 8.0};       // per length bin
    for (std::size_t f = 0; f < families.size(); ++f) {
        b.overall[families[f].name] = overall[f];
        double const edges[] = {0, 1024, 2048, 4096};  // the demo's context is 4096 tokens
        for (int k = 0; k < 3; ++k)
            b.by_length.push_back({families[f].name, edges[k], edges[k + 1], overall[f] + slope[f] * (1 - k)});
    }
    return b;
}

}  // namespace

/// qkgeom synth DIR: one family of the study in the dataset layout.
int run_synth(cli const& c) {
    auto const fit = std::find_if(families.begin(), families.end(), [&](family const& f) { return f.name == c.family; });
    if (fit == families.end()) throw run_error("--family: '" + c.family + "' is not one of steady | moderate | steep");
    if (c.heads > c.layers * 8)  // parse refuses it (a manifest never claims more heads than it holds)
        throw run_error("--heads: " + std::to_string(c.heads) + " is more than the " + std::to_string(c.layers * 8) +
                        " query heads of the capture");
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
    output_folder folder(c.dir, capture_marker, "synth");  // a capture folder never mixes two runs either
    std::filesystem::path const dir = folder.staging();
    qkgeom::io::write_manifest(dir, m);
    progress bar(static_cast<std::size_t>(c.layers), c.quiet);
    auto entry = [&](qkgeom::head_id const& id, qkgeom::kind k, qkgeom::token_rows<Eigen::MatrixXd> const& rows) {
        qkgeom::io::head_entry e;
        e.layer = id.layer;
        e.head = k == qkgeom::kind::query ? id.q_head : id.k_head;
        e.k = k;
        e.vectors = rows.vectors;
        e.position = rows.position;
        e.bucket = rows.bucket;
        e.example_id = rows.example_id;
        e.dtype = c.dtype;
        qkgeom::io::write_head(dir, m, e, c.format, c.dtype, c.npz);
    };
    for (std::int64_t layer = 0; layer < c.layers; ++layer) {
        auto const heads = generate_layer(demo_layer(*fit, layer), cap);
        for (auto const& hc : heads) {
            if (std::binary_search(chosen.begin(), chosen.end(), hc.id)) entry(hc.id, qkgeom::kind::query, hc.queries);
            // Each key head once (the first query head of its GQA group carries it),
            // and only when a sampled query head reads it.
            if (hc.id.q_head % qkgeom::gqa_group_size(m.n_q_heads[0], m.n_kv_heads[0]) == 0 &&
                std::binary_search(keys.begin(), keys.end(), std::pair{hc.id.layer, hc.id.k_head}))
                entry(hc.id, qkgeom::kind::key, hc.keys);
        }
        bar.tick("layer " + std::to_string(layer));
    }
    folder.commit();
    std::cout << "synthetic capture '" << m.model << "' (" << chosen.size() << " of " << c.layers * 8
              << " query heads) written to " << c.dir.string() << "\n";
    return 0;
}

/// qkgeom demo: a small study (docs/study.md#the-demo): the three families,
/// each trained through four checkpoints whose key drift grows then
/// collapses; each head generated and analysed by one task (a worker holds
/// one head at a time); each run's reports in OUT/runs/<run>/, then the
/// study's tables and pictures on OUT/index.html.
int run_demo(cli const& c) {
    std::int64_t const n_layers = c.layers;
    auto const cap = demo_capture();
    output_folder folder(c.out, report_marker, "-o");  // checked before any analysis
    std::filesystem::path const out = folder.staging();
    std::size_t const per_model = static_cast<std::size_t>(n_layers * 8);
    progress bar(families.size() * demo_checkpoints.size() * per_model, c.quiet);
    qkgeom::study::study_spec spec;
    spec.title = "qkgeom demo: three synthetic model families through four checkpoints";
    for (auto const& f : families)
        for (auto const& ck : demo_checkpoints) {
            std::string const name = f.name + "@" + std::to_string(ck.step);
            std::vector<qkgeom::head_analysis> heads(per_model);
            parallel_for(per_model, c.jobs, [&](std::size_t i) {
                auto const layer = static_cast<std::int64_t>(i / 8), qh = static_cast<std::int64_t>(i % 8);
                auto hc = generate_head(demo_layer(f, layer, ck), cap, qh);
                apply_overrides(c, hc.facts);
                heads[i] = analyze(hc, c.opt);
                bar.tick(name + " l" + std::to_string(layer) + "h" + std::to_string(qh));
            });
            auto const dir = out / "runs" / name;
            write_run_reports(dir, name, heads, c);
            qkgeom::study::run_spec r;
            r.name = name;
            r.family = r.model = f.name;
            r.ckpt.step = ck.step;
            r.ckpt.phase = ck.phase;
            r.analysis = dir;
            r.index = spec.runs.size();
            spec.runs.push_back(std::move(r));
        }
    spec.benchmarks.push_back(demo_benchmark());
    qkgeom::study::study_run_options o;
    auto const outcomes = qkgeom::study::run_all(spec, o);
    std::string const intro =
        "The embedded synthetic study: three families (steady, moderate, steep: rising positional drift, falling "
        "content strength), each through four checkpoints whose key drift grows, then collapses (long-context "
        "phase); " + std::to_string(n_layers) + " layer(s) x 8 query heads per run. The benchmark 'demo_score' is made "
        "up for the demo (it falls with the planted drift), not measured.";
    return write_study_report(c, spec, outcomes, folder, intro);
}

}  // namespace qkgeom_app
