// A whole model end to end: 300 query heads (25 layers × 12 query heads, GQA
// with 4 kv heads per layer), ≈ 8,000 query + 8,000 key rows per head, d = 128
// (workload.hpp). Analysed the way `qkgeom analyze` does it (one head per
// task, `-j` workers, default options), from memory and from a dataset
// directory in the page cache; the moments-only pass over the same data; a
// plain streaming read of the same bytes; and the scalar baseline
// (scalar_baseline.hpp) on a sample of heads, reported per head.
//
// Every benchmark here runs one iteration (a pass takes tens of seconds);
// QKGEOM_BENCH_LAYERS=N shrinks the model for quick runs, and
// QKGEOM_BENCH_BASELINE_HEADS (default 3) sets the baseline sample.
#include "scalar_baseline.hpp"
#include "workload.hpp"

#include <qkgeom/io/dataset.hpp>
#include <qkgeom/report/study_svg.hpp>
#include <qkgeom/report/study_tables.hpp>
#include <qkgeom/run/dataset_analysis.hpp>
#include <qkgeom/run/study_run.hpp>

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <variant>
#include <unistd.h>

namespace {

using namespace qkbench;

/// The rows of one kind of one head: f32 vectors with positions, buckets, example ids.
using kind_rows = qkgeom::token_rows<rows_f32>;

/// A head as the analysis takes it from memory: views of the rows held by
/// model_data (the kv head's rows shared by its GQA group), annotations and facts.
using head_view = qkgeom::head_capture<qkgeom::matrix_view<float>>;

struct model_data {
    model_shape shape;
    std::vector<kind_rows> q;  ///< per query head, layer-major
    std::vector<kind_rows> k;  ///< per kv head, layer-major
    std::vector<head_view> heads;  ///< per query head: views of q[i] and keys_of(i), built once
    std::size_t bytes = 0;     ///< f32 bytes of all rows
    [[nodiscard]] kind_rows const& keys_of(std::size_t head) const {
        auto const layer = std::int64_t(head) / shape.n_q_heads, h = std::int64_t(head) % shape.n_q_heads;
        auto const g = h / (shape.n_q_heads / shape.n_kv_heads);
        return k[std::size_t(layer * shape.n_kv_heads + g)];
    }
    /// Bytes one analysis pass reads: every head's queries and its kv head's keys.
    [[nodiscard]] std::size_t pass_bytes() const {
        std::size_t b = 0;
        for (std::size_t i = 0; i < q.size(); ++i) b += std::size_t(q[i].vectors.size() + keys_of(i).vectors.size()) * 4;
        return b;
    }
};

qkgeom::head_id id_of(model_shape const& s, std::size_t i) {
    auto const layer = std::int64_t(i) / s.n_q_heads, h = std::int64_t(i) % s.n_q_heads;
    return {layer, h, h / (s.n_q_heads / s.n_kv_heads)};
}

model_data const& the_model() {
    static model_data const m = [] {
        model_data out;
        out.shape = realistic_model();
        for (std::int64_t l = 0; l < out.shape.n_layers; ++l) {
            auto heads = make_layer(out.shape, l);
            std::int64_t const group = out.shape.n_q_heads / out.shape.n_kv_heads;
            for (auto& h : heads) {
                out.bytes += std::size_t(h.queries.vectors.size()) * 4;
                out.q.push_back(std::move(h.queries));
                if (h.id.q_head % group == 0) {
                    out.bytes += std::size_t(h.keys.vectors.size()) * 4;
                    out.k.push_back(std::move(h.keys));
                }
            }
        }
        // The heads as analysed, prepared outside every timed loop (as the
        // positional arrays were passed before): views of the rows, copies
        // of the annotations, the facts of the capture.
        auto view = [](kind_rows const& r) {
            return qkgeom::token_rows<qkgeom::matrix_view<float>>{qkgeom::as_matrix(r.vectors), r.position, r.bucket,
                                                                   r.example_id};
        };
        for (std::size_t i = 0; i < out.q.size(); ++i)
            out.heads.push_back({id_of(out.shape, i), capture_facts_of(out.shape), view(out.q[i]), view(out.keys_of(i))});
        return out;
    }();
    return m;
}

void model_counters(benchmark::State& st, model_data const& m, std::size_t bytes) {
    st.counters["heads"] = double(m.q.size());
    st.counters["threads"] = double(st.range(0));
    st.SetBytesProcessed(std::int64_t(st.iterations()) * std::int64_t(bytes));
}

// --- from memory ------------------------------------------------------------
void bm_model_memory(benchmark::State& st) {
    auto const& m = the_model();
    auto const opt = cli_options(m.shape);
    auto const jobs = unsigned(st.range(0));
    for (auto _ : st) {
        std::vector<qkgeom::head_analysis> res(m.q.size());
        parallel_for(m.q.size(), jobs, [&](std::size_t i) { res[i] = qkgeom::analyze_head(m.heads[i], opt); });
        auto const summary = qkgeom::summarise_model(res);
        benchmark::DoNotOptimize(summary.all.mean[0]);
    }
    model_counters(st, m, m.pass_bytes());
}
BENCHMARK(bm_model_memory)->ArgName("threads")->Arg(1)->Arg(2)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

// --- the moments-only pass over the same data --------------------------------
void bm_model_moments(benchmark::State& st) {
    auto const& m = the_model();
    auto const jobs = unsigned(st.range(0));
    for (auto _ : st) {
        std::vector<qkgeom::head_moments> res(m.q.size());
        parallel_for(m.q.size(), jobs, [&](std::size_t i) {
            auto const& q = m.q[i];
            auto const& k = m.keys_of(i);
            qkgeom::head_moments hm(q.vectors.cols(), id_of(m.shape, i));
            hm.add(qkgeom::kind::query, q);
            hm.add(qkgeom::kind::key, k);
            res[i] = std::move(hm);
        });
        benchmark::DoNotOptimize(res.back().q.buckets.begin()->second.c_xx.data());
    }
    model_counters(st, m, m.pass_bytes());
}
BENCHMARK(bm_model_moments)->ArgName("threads")->Arg(1)->Arg(2)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

// --- a plain streaming read of the same bytes (one thread) -------------------
void bm_model_stream_read(benchmark::State& st) {
    auto const& m = the_model();
    for (auto _ : st) {
        double total = 0;
        for (std::size_t i = 0; i < m.q.size(); ++i)
            for (auto const* x : {&m.q[i].vectors, &m.keys_of(i).vectors}) {
                float const* p = x->data();
                std::size_t const n = std::size_t(x->size());
                float acc[16] = {};
                for (std::size_t j = 0; j + 16 <= n; j += 16)
                    for (int u = 0; u < 16; ++u) acc[u] += p[j + std::size_t(u)];
                for (float a : acc) total += double(a);
            }
        benchmark::DoNotOptimize(total);
    }
    model_counters(st, m, m.pass_bytes());
}
BENCHMARK(bm_model_stream_read)->ArgName("threads")->Arg(1)->Iterations(3)->UseRealTime()->Unit(benchmark::kSecond);

// --- from dataset files in the page cache -------------------------------------
struct dataset_dir {
    std::filesystem::path dir;
    qkgeom::io::manifest manifest;
    dataset_dir() {
        auto const& m = the_model();
        char const* env = std::getenv("QKGEOM_BENCH_DIR");
        dir = env != nullptr && *env != '\0' ? std::filesystem::path(env)
                                             : std::filesystem::temp_directory_path() /
                                                   ("qkgeom_bench_" + std::to_string(::getpid()));
        auto& mf = manifest;
        mf.model = "bench";
        mf.n_layers = m.shape.n_layers;
        mf.n_q_heads.assign(std::size_t(mf.n_layers), m.shape.n_q_heads);
        mf.n_kv_heads.assign(std::size_t(mf.n_layers), m.shape.n_kv_heads);
        mf.head_dim = m.shape.d;
        mf.buckets = capture_of(m.shape).buckets;
        mf.context_length = m.shape.context_length;
        mf.seed = capture_of(m.shape).seed;
        std::filesystem::create_directories(dir);
        qkgeom::io::write_manifest(dir, mf);
        auto put = [&](kind_rows const& r, std::int64_t layer, std::int64_t head, qkgeom::kind kd) {
            qkgeom::io::head_entry e;
            e.layer = layer;
            e.head = head;
            e.k = kd;
            e.vectors = r.vectors.cast<double>();
            e.dtype = "f32";
            e.position = r.position;
            e.bucket = r.bucket;
            e.example_id = r.example_id;
            qkgeom::io::write_head(dir, mf, e, qkgeom::io::storage_format::npy, "f32");
        };
        for (std::size_t i = 0; i < m.q.size(); ++i) {
            auto const id = id_of(m.shape, i);
            put(m.q[i], id.layer, id.q_head, qkgeom::kind::query);
        }
        for (std::size_t g = 0; g < m.k.size(); ++g)
            put(m.k[g], std::int64_t(g) / m.shape.n_kv_heads, std::int64_t(g) % m.shape.n_kv_heads, qkgeom::kind::key);
    }
    ~dataset_dir() {
        if (std::getenv("QKGEOM_BENCH_DIR") == nullptr) {
            std::error_code ec;
            std::filesystem::remove_all(dir, ec);
        }
    }
    dataset_dir(dataset_dir const&) = delete;
    dataset_dir& operator=(dataset_dir const&) = delete;
};

dataset_dir const& the_dataset() {
    static dataset_dir const d;
    return d;
}

/// Reads one head as `qkgeom analyze` does (io::read_capture_rows: the query
/// entry, the key entry of the kv head it reads, the facts of the manifest;
/// f32 rows kept as floats, scanned for NaN / ±inf as they are read).
qkgeom::io::stored_capture read_pair(dataset_dir const& ds, model_shape const& s, std::size_t i) {
    return qkgeom::io::read_capture_rows(ds.dir, ds.manifest, id_of(s, i));
}

/// The rows of a read head (to keep the read from being optimised away).
void const* rows_of(qkgeom::io::stored_capture const& h) {
    return std::visit([](auto const& c) -> void const* { return c.queries.vectors.data(); }, h);
}

/// Analyses a read head in its stored precision (as analyze_dataset does).
qkgeom::head_analysis analyze_read(qkgeom::io::stored_capture const& h, qkgeom::analysis_options const& opt) {
    return std::visit([&](auto const& c) { return qkgeom::analyze_head(c, opt); }, h);
}

void bm_model_files(benchmark::State& st) {
    auto const& m = the_model();
    auto const& ds = the_dataset();
    auto const opt = cli_options(m.shape);
    auto const jobs = unsigned(st.range(0));
    for (std::size_t i = 0; i < m.q.size(); ++i)
        benchmark::DoNotOptimize(rows_of(read_pair(ds, m.shape, i)));
    for (auto _ : st) {
        std::vector<qkgeom::head_analysis> res(m.q.size());
        parallel_for(m.q.size(), jobs, [&](std::size_t i) { res[i] = analyze_read(read_pair(ds, m.shape, i), opt); });
        auto const summary = qkgeom::summarise_model(res);
        benchmark::DoNotOptimize(summary.all.mean[0]);
    }
    model_counters(st, m, m.pass_bytes());
}
BENCHMARK(bm_model_files)->ArgName("threads")->Arg(1)->Arg(2)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

// The same files through the library's dataset loop, io::analyze_dataset
// (what `qkgeom analyze` and Python's qkgeom.analyze_dataset call): the C++ API
// that benchmarks/python_bench.py compares the Python path against.
void bm_model_dataset_api(benchmark::State& st) {
    auto const& m = the_model();
    auto const& ds = the_dataset();
    qkgeom::io::dataset_run_options o;
    o.analysis = cli_options(m.shape);
    o.jobs = unsigned(st.range(0));
    for (std::size_t i = 0; i < m.q.size(); ++i)
        benchmark::DoNotOptimize(rows_of(read_pair(ds, m.shape, i)));
    for (auto _ : st) {
        auto const run = qkgeom::io::analyze_dataset(ds.dir, o);
        if (run.heads.size() != m.q.size()) st.SkipWithError("analyze_dataset: heads failed");
        auto const summary = qkgeom::summarise_model(run.heads);
        benchmark::DoNotOptimize(summary.all.mean[0]);
    }
    model_counters(st, m, m.pass_bytes());
}
BENCHMARK(bm_model_dataset_api)->ArgName("threads")->Arg(1)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

// --- a study of many runs (docs/study.md) -------------------------------------
// N captures holding the benchmark model's files (hard links; each manifest
// names another model, so every capture has its own content key and is
// analysed), run by study::run_all into a fresh cache on one thread, then
// the tables and the pictures. Its time against N × bm_model_dataset_api in
// the same run is the study's overhead (target: at most 5%): hashing every
// capture's bytes, writing and reading back the CSVs, the bootstrap
// intervals, the tables and the pictures.
struct study_captures {
    std::filesystem::path root;
    std::vector<std::filesystem::path> caps;
    explicit study_captures(std::size_t n) {
        auto const& ds = the_dataset();
        root = ds.dir.parent_path() / (ds.dir.filename().string() + "_study");
        std::filesystem::remove_all(root);
        for (std::size_t i = 0; i < n; ++i) {
            auto const dir = caps.emplace_back(root / ("cap" + std::to_string(i)));
            std::filesystem::create_directories(dir);
            for (auto const& e : std::filesystem::directory_iterator(ds.dir)) {
                if (e.path().filename() == "manifest.json") continue;
                std::error_code ec;
                std::filesystem::create_hard_link(e.path(), dir / e.path().filename(), ec);
                if (ec) std::filesystem::copy(e.path(), dir / e.path().filename(), std::filesystem::copy_options::recursive);
            }
            auto m = ds.manifest;
            m.model = "bench" + std::to_string(i);
            qkgeom::io::write_manifest(dir, m);
        }
    }
    ~study_captures() {
        std::error_code ec;
        std::filesystem::remove_all(root, ec);
    }
    study_captures(study_captures const&) = delete;
    study_captures& operator=(study_captures const&) = delete;
};

void bm_model_study(benchmark::State& st) {
    auto const& m = the_model();
    study_captures const caps(static_cast<std::size_t>(st.range(0)));
    qkgeom::study::study_spec spec;
    for (std::size_t i = 0; i < caps.caps.size(); ++i) {
        qkgeom::study::run_spec r;
        r.name = r.model = r.family = "run" + std::to_string(i);
        r.capture = caps.caps[i];
        r.index = i;
        spec.runs.push_back(r);
    }
    qkgeom::study::study_run_options o;
    o.analysis = cli_options(m.shape);
    o.jobs = 1;
    o.cache = caps.root / "cache";
    auto const out = caps.root / "out";
    for (auto _ : st) {
        std::filesystem::remove_all(o.cache);
        std::filesystem::remove_all(out);
        std::filesystem::create_directories(out);
        auto const outcomes = qkgeom::study::run_all(spec, o);
        for (auto const& oc : outcomes)
            if (oc.status != qkgeom::study::run_status::analysed) st.SkipWithError("study: a run was not analysed");
        auto const result = qkgeom::study::compute_study(spec, outcomes);
        for (auto const& t : qkgeom::study::study_tables(result)) qkgeom::study::write_table(out / t.file, t);
        benchmark::DoNotOptimize(qkgeom::report::write_study_pictures(out, result).size());
    }
    st.counters["runs"] = double(st.range(0));
    st.counters["heads"] = double(m.q.size()) * double(st.range(0));
}
BENCHMARK(bm_model_study)->ArgName("runs")->Arg(10)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

// Reading the files alone (read_capture_rows: parse, copy into f32 rows with
// the NaN / ±inf scan, validate the annotations).
void bm_model_files_read_only(benchmark::State& st) {
    auto const& m = the_model();
    auto const& ds = the_dataset();
    for (auto _ : st)
        for (std::size_t i = 0; i < m.q.size(); ++i)
            benchmark::DoNotOptimize(rows_of(read_pair(ds, m.shape, i)));
    model_counters(st, m, m.pass_bytes());
}
BENCHMARK(bm_model_files_read_only)->ArgName("threads")->Arg(1)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

// --- the scalar baseline, on a sample of heads, reported per head -------------
void bm_model_scalar_baseline(benchmark::State& st) {
    auto const& m = the_model();
    auto const n = std::size_t(std::max<std::int64_t>(1, std::min<std::int64_t>(env_int("QKGEOM_BENCH_BASELINE_HEADS", 3),
                                                                                  std::int64_t(m.q.size()))));
    // The baseline computes the same numbers as the library (checked here).
    double max_rel = 0;
    for (auto _ : st) {
        for (std::size_t i = 0; i < n; ++i) {
            head_data h;
            h.id = id_of(m.shape, i);
            h.facts = capture_facts_of(m.shape);
            h.queries = {m.q[i].vectors, m.q[i].position, m.q[i].bucket, {}};
            h.keys = m.keys_of(i);
            auto const r = scalar::analyze(h, m.shape.context_length);
            st.PauseTiming();
            auto const lib = analyze(h, cli_options(m.shape));
            for (auto [a, b] : {std::pair{r.ap_overall, lib.plasticity.ap_overall},
                                std::pair{r.gaussian_gap, lib.plasticity.gaussian_gap},
                                std::pair{r.pos_ks_p, lib.diagnostics.pos_ks_p},
                                std::pair{r.sem_median_ks_p, lib.diagnostics.sem_median_ks_p},
                                std::pair{r.bias_strength, lib.rotation.bias_strength}}) {
                double const rel = std::abs(a - b) / std::max(1e-300, std::abs(b));
                if (rel > 1e-9) std::fprintf(stderr, "baseline head %zu: %.17g vs library %.17g\n", i, a, b);
                max_rel = std::max(max_rel, rel);
            }
            st.ResumeTiming();
        }
    }
    st.counters["heads"] = double(n);
    st.counters["threads"] = 1;
    st.counters["max_rel_diff_vs_library"] = max_rel;
}
BENCHMARK(bm_model_scalar_baseline)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

}  // namespace
