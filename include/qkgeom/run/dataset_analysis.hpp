// qkgeom — analysis of every planned head of a dataset directory
// (docs/dataset.md, "Analysing a whole dataset: analyze_dataset"): the loop of
// `qkgeom analyze`, shared by the program and the Python package.
//
//   auto run = qkgeom::io::analyze_dataset(dir, {.jobs = 8});
//   run.heads     // head_analysis per analysed head, plan order
//   run.missing   // planned heads whose query entry is absent (plan indices)
//   run.failures  // heads that failed to read or analyse, with the reason
//   run.stray     // entries outside the manifest's head counts
//
// Heads are read and analysed in parallel (one head per worker: memory is
// bounded by `jobs` heads); a head that fails is listed, never skipped
// silently, and the others go on (unless `strict`).
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/parallel.hpp>
#include <qkgeom/io/dataset.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

namespace qkgeom::io {

/// \brief A dataset and the heads it plans (plan_dataset).
struct dataset_plan {
    std::filesystem::path dir;     ///< the dataset directory
    manifest m;                    ///< its manifest
    std::vector<head_id> planned;  ///< planned_heads(m), never empty
};

/// \brief A planned head whose entries are present but failed to read or
/// analyse (a missing entry is listed in dataset_run::missing instead).
struct dataset_failure {
    std::size_t index = 0;  ///< its place in the plan (dataset_run::planned)
    head_id id;             ///< the head
    std::string message;    ///< the error's message (file, field, value)
};

/// \brief An entry outside the manifest's head counts (never analysed).
struct dataset_stray {
    std::string name;     ///< the file name ("l09h00q", "l00h40k.npz"), or "... and N more"
    std::string message;  ///< "entry outside the manifest's head counts (...); not analysed"
};

/// \brief The result of analyze_dataset. Every planned head is in exactly
/// one of `heads`, `missing` and `failures`.
struct dataset_run {
    std::filesystem::path dir;              ///< the dataset directory
    manifest m;                             ///< the manifest
    std::vector<head_id> planned;           ///< every planned head, plan order
    std::vector<head_analysis> heads;       ///< the analysed heads, plan order
    /// The planned heads whose query entry is absent from the folder, as
    /// ascending indices into `planned` (8 bytes a head: a manifest claiming
    /// 10^6 heads over a small folder stays small); missing_entry_message
    /// gives the text.
    std::vector<std::size_t> missing;
    std::vector<dataset_failure> failures;  ///< the heads that failed, plan order
    std::vector<dataset_stray> stray;       ///< stray entries, directory order
};

/// \brief Options of analyze_dataset.
struct dataset_run_options {
    analysis_options analysis;  ///< options of every head's analysis
    unsigned jobs = 0;          ///< worker threads; 0 = every core (std::thread::hardware_concurrency)
    bool strict = false;        ///< throw at the first stray entry or failed head instead of listing it
    /// Context length replacing the manifest's for every head (method §6,
    /// §9.12); 0 = none. A head with a position ≥ it fails.
    std::int64_t context = 0;
    /// Sliding window for heads whose capture records none; -1 = none.
    std::int64_t window = -1;
    /// How messages name `context` ("... given by " + context_name).
    std::string context_name = "the context override";
    /// Called once per planned head when it is done (analysed, failed or
    /// missing) with its query entry name; calls are serialised (never two
    /// at once) but come from the worker threads. Empty = none.
    std::function<void(std::string const&)> on_head_done;
    /// Which planned heads this process analyses (plan indices, each handed
    /// out once across every process and thread; core/parallel.hpp). Empty =
    /// every planned head. With a source, a head handed out elsewhere is in
    /// none of dataset_run's lists: the program under mpirun gathers the
    /// lists of every process (docs/scale.md).
    task_source next_head;
};

/// \brief How analyze_dataset analyses one head (analyze_head by default; a
/// program with analyze_head instantiated elsewhere passes its own).
using head_analyzer = std::function<head_analysis(head_capture<row_matrix> const&, analysis_options const&)>;

/// \brief As head_analyzer, for a head whose rows stay in single precision
/// (read_capture_rows: both entries stored as f32, f16 or bf16).
using head_analyzer_f32 = std::function<head_analysis(head_capture<row_matrix_f32> const&, analysis_options const&)>;

/// \brief The analyses of analyze_dataset for heads read in their stored
/// precision (read_capture_rows): `f32` for heads whose entries are stored as
/// f32, f16 or bf16, `f64` for the others. Both must give the results
/// analyze_head gives (they are bit-identical for the two forms of a head).
struct head_analyzers {
    head_analyzer f64;      ///< heads with an entry stored as f64 (rows in double)
    head_analyzer_f32 f32;  ///< heads stored as f32 / f16 / bf16 (rows in single precision, exact)
};

/// \brief "lLLhHHq (layer L, query head Q)": how failures name a head.
/// \param[in] id the head.
/// \returns the label.
inline std::string dataset_head_label(head_id const& id) {
    return head_entry_name(id.layer, id.q_head, kind::query) + " (layer " + std::to_string(id.layer) +
           ", query head " + std::to_string(id.q_head) + ")";
}

/// \brief A head's capture facts with the run's overrides: `context` (> 0)
/// replaces the context length; `window` (≥ 0) applies where the capture
/// records no sliding window.
/// \param[in,out] facts the facts.
/// \param[in] context the context length override, 0 = none.
/// \param[in] window the sliding window override, -1 = none.
inline void apply_overrides(capture_facts& facts, std::int64_t context, std::int64_t window) noexcept {
    if (context > 0) facts.context_length = context;
    if (window >= 0 && facts.sliding_window == 0) facts.sliding_window = window;
}

namespace detail {

/// Why a manifest plans no head (nothing to analyse is never a success).
inline std::string no_heads_reason(std::filesystem::path const& dir, manifest const& m) {
    std::string const src = (dir / "manifest.json").string() + ": no head to analyse: ";
    if (m.heads && m.heads->count && *m.heads->count == 0) return src + "capture.head_count is 0";
    if (m.heads && m.heads->eligibility == layer_eligibility::full_attention_only)
        return src + "capture.eligibility is full_attention_only and every one of the " + std::to_string(m.n_layers) +
               " layer(s) has a sliding_window (no full-attention layer)";
    return src + "the manifest plans no query head";
}

/// The names in DIR that can hold a head entry, without extension: one
/// listing, so a missing entry costs no I/O however many heads are planned.
inline std::unordered_set<std::string> entry_names(std::filesystem::path const& dir) {
    namespace fs = std::filesystem;
    std::unordered_set<std::string> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::string name = it->path().filename().string();
        for (std::string_view ext : {".npz", ".safetensors"})
            if (name.size() > ext.size() && name.ends_with(ext)) name.resize(name.size() - ext.size());
        out.insert(std::move(name));
    }
    if (ec)
        throw input_error(dir.string(), "directory", dir.string(),
                          dir.string() + ": cannot list the capture folder: " + ec.message());
    return out;
}

/// The manifest's head counts, for the stray-entry messages.
inline std::string counts_text(manifest const& m) {
    std::string s = "n_layers " + std::to_string(m.n_layers);
    if (m.n_layers > 8) return s;
    auto list = [](std::vector<std::int64_t> const& v) {
        std::string t;
        for (auto x : v) t += (t.empty() ? "" : ", ") + std::to_string(x);
        return "[" + t + "]";
    };
    return s + ", n_q_heads " + list(m.n_q_heads) + ", n_kv_heads " + list(m.n_kv_heads);
}

/// The positions of a head must lie below its context length (method §9.12):
/// a context shorter than the capture is a contradiction, never a silent clip.
template <class M>
void check_context(head_capture<M> const& head, std::filesystem::path const& dir, dataset_run_options const& opt) {
    std::int64_t const L = head.facts.context_length;
    if (L <= 0) return;
    for (auto const* rows : {&head.queries, &head.keys}) {
        auto const& p = rows->position.values();
        if (p.empty()) continue;
        std::int64_t const top = *std::max_element(p.begin(), p.end());
        if (top < L) continue;
        bool const q = rows == &head.queries;
        std::string const entry =
            head_entry_name(head.id.layer, q ? head.id.q_head : head.id.k_head, q ? kind::query : kind::key);
        std::string const manifest_path = (dir / "manifest.json").string();
        throw input_error((dir / entry).string(), "position", std::to_string(top),
                          std::string(q ? "query" : "key") + " entry " + entry + ": position " + std::to_string(top) +
                              " is not below the context length " + std::to_string(L) +
                              (opt.context > 0 ? " given by " + opt.context_name
                                               : " recorded in " + manifest_path + " (context_length)"));
    }
}

inline std::string missing_text(std::filesystem::path const& dir, std::string const& name) {
    return (dir / name).string() + ": no entry (neither a folder nor a .npz / .safetensors file)";
}

}  // namespace detail

/// \brief Why a planned head of dataset_run::missing was not analysed:
/// "DIR/lLLhHHq: no entry (neither a folder nor a .npz / .safetensors file)".
/// \param[in] run the run.
/// \param[in] index an index into run.planned.
/// \returns the text.
/// \throws std::out_of_range for an index outside the plan.
inline std::string missing_entry_message(dataset_run const& run, std::size_t index) {
    auto const& t = run.planned.at(index);
    return detail::missing_text(run.dir, head_entry_name(t.layer, t.q_head, kind::query));
}

/// \brief Reads DIR's manifest and the heads it plans (planned_heads).
/// \param[in] dir the dataset directory.
/// \returns the plan.
/// \throws qkgeom::input_error as read_manifest, and when the manifest plans
///         no head ("DIR/manifest.json: no head to analyse: ..." saying why).
/// \throws std::invalid_argument for an inconsistent manifest (as planned_heads).
template <class = void>
[[nodiscard]] dataset_plan plan_dataset(std::filesystem::path const& dir) {
    dataset_plan p{dir, read_manifest(dir), {}};
    p.planned = planned_heads(p.m);
    if (p.planned.empty())
        throw input_error((dir / "manifest.json").string(), "capture", "no head", detail::no_heads_reason(dir, p.m));
    return p;
}

namespace detail {

/// A read head, its overrides applied and its positions checked, analysed.
template <class M, class F>
head_analysis analyse_read(head_capture<M>& head, std::filesystem::path const& dir, dataset_run_options const& opt,
                           F const& analyze) {
    apply_overrides(head.facts, opt.context, opt.window);
    check_context(head, dir, opt);
    return analyze(head, opt.analysis);
}

/// The loop of analyze_dataset; `one(dir, manifest, head)` reads and
/// analyses one head (analyse_read).
template <class One>
[[nodiscard]] dataset_run run_dataset(dataset_plan plan, dataset_run_options const& opt, One const& one) {
    dataset_run run{plan.dir, std::move(plan.m), std::move(plan.planned), {}, {}, {}, {}};
    auto const& dir = run.dir;
    auto const present = detail::entry_names(dir);
    std::string const counts = detail::counts_text(run.m), manifest_path = (dir / "manifest.json").string();
    for (auto& name : stray_entries(dir, run.m))
        run.stray.push_back({std::move(name), "entry outside the manifest's head counts (" + counts + " in " +
                                                  manifest_path + "); not analysed"});
    if (opt.strict && !run.stray.empty())
        throw input_error(dir.string(), "entry", run.stray.front().name,
                          run.stray.front().name + ": " + run.stray.front().message);
    auto const& tasks = run.planned;
    // Per head: a result, an error, or the missing flag (no message per head).
    std::vector<std::unique_ptr<head_analysis>> results(tasks.size());
    std::vector<std::unique_ptr<std::string>> errors(tasks.size());
    std::vector<char> missing(tasks.size(), 0);
    std::mutex done_mutex;
    unsigned const jobs = opt.jobs > 0 ? opt.jobs : std::max(1u, std::thread::hardware_concurrency());
    auto const body = [&](std::size_t i) {
        auto const& t = tasks[i];
        std::string const name = head_entry_name(t.layer, t.q_head, kind::query);
        auto strict_fail = [&](std::string const& why) {
            throw input_error((dir / name).string(), "entry", name, dataset_head_label(t) + ": " + why);
        };
        if (!present.contains(name)) {
            missing[i] = 1;
            if (opt.strict) strict_fail(detail::missing_text(dir, name));
        } else {
            try {
                results[i] = std::make_unique<head_analysis>(one(dir, run.m, t));
            } catch (std::bad_alloc const&) {  // never a bare "std::bad_alloc": say what did not fit
                std::string const why = "out of memory analysing this head (its rows, with head_dim " +
                                        std::to_string(run.m.head_dim) + ", and the analysis's work matrices)";
                if (opt.strict) strict_fail(why);
                errors[i] = std::make_unique<std::string>(why);
            } catch (std::exception const& e) {
                if (opt.strict) strict_fail(e.what());
                errors[i] = std::make_unique<std::string>(e.what());
            }
        }
        if (opt.on_head_done) {
            std::lock_guard lock(done_mutex);
            opt.on_head_done(name);
        }
    };
    if (opt.next_head) {
        parallel_for_handed(jobs, tasks.size(), [&]() -> std::optional<std::size_t> {
            auto const i = opt.next_head();
            if (i && *i >= tasks.size())
                throw std::out_of_range("qkgeom::io::analyze_dataset: next_head handed out head " + std::to_string(*i) +
                                        " of a plan of " + std::to_string(tasks.size()));
            return i;
        }, body);
    } else {
        parallel_for(tasks.size(), jobs, body);
    }
    for (std::size_t i = 0; i < tasks.size(); ++i) {
        if (results[i]) run.heads.push_back(std::move(*results[i]));
        else if (missing[i]) run.missing.push_back(i);
        else if (errors[i]) run.failures.push_back({i, tasks[i], std::move(*errors[i])});
        results[i].reset();
        errors[i].reset();
    }
    return run;
}

}  // namespace detail


/// \brief Analyses every planned head of a dataset (the loop of `qkgeom
/// analyze`), in parallel.
///
/// Lists the folder once; reports the stray entries (io::stray_entries);
/// then per head, on `jobs` threads: a missing query entry is a failure
/// (no I/O); else read_capture, the overrides (apply_overrides), the context
/// check (every position below the context length) and `analyze`; an
/// exception is the head's failure (its message). Every head is analysed or
/// listed, never skipped.
/// \param[in] plan the dataset and its heads (plan_dataset).
/// \param[in] opt the options.
/// \param[in] analyze the analysis of one head.
/// \returns the analysed heads and the failures, in plan order.
/// \throws qkgeom::input_error when the folder cannot be listed; under
///         `strict`, at the first stray entry (before any analysis; the
///         message "NAME: entry outside ...") or the first failed head (the
///         message "lLLhHHq (layer L, query head Q): " + why).
/// \throws std::bad_alloc when the results cannot be held.
template <class = void>
[[nodiscard]] dataset_run analyze_dataset(dataset_plan plan, dataset_run_options const& opt,
                                          head_analyzer const& analyze) {
    return detail::run_dataset(std::move(plan), opt,
                               [&](std::filesystem::path const& dir, manifest const& m, head_id const& t) {
                                   auto head = read_capture(dir, m, t);
                                   return detail::analyse_read(head, dir, opt, analyze);
                               });
}

/// \brief As above, each head read in its stored precision
/// (read_capture_rows: f32, f16 and bf16 rows stay floats, half the memory
/// traffic of double) and analysed by `analyze.f32` or `analyze.f64`. The
/// messages, the failures and the results are those of the overload above
/// when the two analyzers compute analyze_head (bit-identical results).
/// \param[in] plan the dataset and its heads (plan_dataset).
/// \param[in] opt the options.
/// \param[in] analyze the analyses of one head, per precision.
/// \returns the analysed heads and the failures, in plan order.
/// \throws as the overload above.
template <class = void>
[[nodiscard]] dataset_run analyze_dataset(dataset_plan plan, dataset_run_options const& opt,
                                          head_analyzers const& analyze) {
    return detail::run_dataset(std::move(plan), opt,
                               [&](std::filesystem::path const& dir, manifest const& m, head_id const& t) {
                                   auto head = read_capture_rows(dir, m, t);
                                   if (auto* h = std::get_if<head_capture<row_matrix_f32>>(&head))
                                       return detail::analyse_read(*h, dir, opt, analyze.f32);
                                   return detail::analyse_read(std::get<head_capture<row_matrix>>(head), dir, opt,
                                                               analyze.f64);
                               });
}

/// \brief As above, each head read in its stored precision and analysed by
/// analyze_head.
/// \param[in] plan the dataset and its heads (plan_dataset).
/// \param[in] opt the options.
/// \returns the analysed heads and the failures, in plan order.
/// \throws as the overloads above.
template <class = void>
[[nodiscard]] dataset_run analyze_dataset(dataset_plan plan, dataset_run_options const& opt) {
    return analyze_dataset(
        std::move(plan), opt,
        head_analyzers{[](head_capture<row_matrix> const& h, analysis_options const& o) { return analyze_head(h, o); },
                       [](head_capture<row_matrix_f32> const& h, analysis_options const& o) {
                           return analyze_head(h, o);
                       }});
}

/// \brief As above, for the dataset in DIR: analyze_dataset(plan_dataset(dir), opt).
/// \param[in] dir the dataset directory.
/// \param[in] opt the options.
/// \returns the analysed heads and the failures, in plan order.
/// \throws as plan_dataset and analyze_dataset.
template <class = void>
[[nodiscard]] dataset_run analyze_dataset(std::filesystem::path const& dir, dataset_run_options const& opt = {}) {
    return analyze_dataset(plan_dataset(dir), opt);
}

}  // namespace qkgeom::io
