// qkgeom — running a study (docs/study.md): every run's analysis is found in
// the cache, read from its analysis folder, taken from the study file, or
// analysed from its capture and cached; a broken run is reported and the
// others go on; then the tables are computed (study/compute.hpp).
//
// The cache is keyed by the capture's content (every file's relative name,
// size and bytes), the analysis options in effect (options_text) and the
// qkgeom version: adding a run analyses only it, changing an option analyses
// every capture again, and a capture whose bytes changed is analysed again.
#pragma once

#include <qkgeom/analysis/policy_names.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/io/json.hpp>
#include <qkgeom/report/csv.hpp>
#include <qkgeom/run/dataset_analysis.hpp>
#include <qkgeom/run/study_read.hpp>
#include <qkgeom/run/study_spec.hpp>
#include <qkgeom/study/compute.hpp>
#include <qkgeom/study/types.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace qkgeom {
namespace study {

/// \brief Options of run_study.
struct study_run_options {
    analysis_options analysis;  ///< every capture's analysis
    unsigned jobs = 0;          ///< worker threads of an analysis; 0 = every core
    std::int64_t context = 0;   ///< context length override (as io::dataset_run_options)
    std::int64_t window = -1;   ///< sliding window for heads whose capture records none
    /// Where analysed runs are kept (one folder per key); required when a run
    /// has a capture.
    std::filesystem::path cache;
    /// Earlier caches to look in: a hit is copied into `cache` (the program
    /// passes the cache of the report it replaces).
    std::vector<std::filesystem::path> previous_caches;
    /// How a head is analysed (empty: analyze_head, each head in its stored
    /// precision). Set alone, every head is read in double and analysed by it.
    io::head_analyzer analyzer;
    /// With `analyzer`: how a head stored as f32 / f16 / bf16 is analysed,
    /// its rows kept in single precision (io::head_analyzers; the results are
    /// bit-identical to `analyzer` on the double rows, half the memory
    /// traffic). Ignored without `analyzer`.
    io::head_analyzer_f32 analyzer_f32;
    /// Called when a run is done (index, outcome); serialised.
    std::function<void(std::size_t, run_outcome const&)> on_run;
    /// Called when a head of an analysed capture is done (as io::dataset_run_options).
    std::function<void(std::string const&)> on_head_done;
};

/// \brief The cache's record of an entry, written last into the entry.
inline constexpr std::string_view cache_key_file = "study_key.json";

namespace detail {

/// A 128-bit content hash (four xxHash64-style lanes over 32-byte blocks;
/// not cryptographic: it guards against accidents, not adversaries).
class content_hash {
public:
    void add(void const* data, std::size_t n) {
        auto const* p = static_cast<unsigned char const*>(data);
        total_ += n;
        while (n > 0) {
            std::size_t const take = std::min(n, block_.size() - fill_);
            std::memcpy(block_.data() + fill_, p, take);
            fill_ += take, p += take, n -= take;
            if (fill_ == block_.size()) round(), fill_ = 0;
        }
    }
    void add_text(std::string const& s) {
        std::uint64_t const n = s.size();
        add(&n, sizeof n);
        add(s.data(), s.size());
    }
    std::string hex() {
        std::uint64_t const total = total_;
        std::fill(block_.begin() + static_cast<std::ptrdiff_t>(fill_), block_.end(), 0);
        if (fill_ > 0) round();
        std::uint64_t h1 = rotl(lane_[0], 1) + rotl(lane_[1], 7) + rotl(lane_[2], 12) + rotl(lane_[3], 18) + total;
        std::uint64_t h2 = rotl(lane_[3], 5) ^ rotl(lane_[2], 11) ^ rotl(lane_[1], 17) ^ lane_[0] ^ (total * P1);
        char buf[33];
        std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(avalanche(h1)),
                      static_cast<unsigned long long>(avalanche(h2 + P3)));
        return buf;
    }

private:
    static constexpr std::uint64_t P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL, P3 = 0x165667B19E3779F9ULL;
    static std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
    static std::uint64_t avalanche(std::uint64_t h) {
        h ^= h >> 33;
        h *= P2;
        h ^= h >> 29;
        h *= P3;
        return h ^ (h >> 32);
    }
    void round() {
        for (std::size_t i = 0; i < 4; ++i) {
            std::uint64_t w;
            std::memcpy(&w, block_.data() + 8 * i, 8);
            lane_[i] = rotl(lane_[i] + w * P2, 31) * P1;
        }
    }
    std::array<unsigned char, 32> block_{};
    std::size_t fill_ = 0;
    std::uint64_t total_ = 0;
    std::array<std::uint64_t, 4> lane_{P1 + P2, P2, 0, 0 - P1};
};

/// Every regular file under `dir` (recursively, symlinks followed to files),
/// sorted by relative path.
inline std::vector<std::filesystem::path> capture_files(std::filesystem::path const& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        throw input_error(dir.string(), "capture", dir.string(), dir.string() + ": not a capture folder (not a directory)");
    std::vector<fs::path> out;
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file(ec)) out.push_back(fs::relative(it->path(), dir));
    if (ec) throw input_error(dir.string(), "capture", dir.string(), dir.string() + ": cannot list: " + ec.message());
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace detail

/// \brief The content fingerprint of a capture folder: a 128-bit hash of
/// every regular file's relative path, size and bytes, in path order.
/// \param[in] dir the capture folder.
/// \returns 32 hexadecimal digits.
/// \throws qkgeom::input_error naming the folder or file when it cannot be
///         listed or read.
[[nodiscard]] inline std::string capture_fingerprint(std::filesystem::path const& dir) {
    detail::content_hash h;
    std::vector<char> buf(std::size_t(1) << 20);
    for (auto const& rel : detail::capture_files(dir)) {
        auto const p = dir / rel;
        std::ifstream in(p, std::ios::binary);
        if (!in) throw input_error(p.string(), "capture", rel.generic_string(), p.string() + ": cannot be opened");
        h.add_text(rel.generic_string());
        std::uint64_t size = 0;
        while (in) {
            in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
            auto const got = static_cast<std::size_t>(in.gcount());
            h.add(buf.data(), got);
            size += got;
        }
        if (in.bad()) throw input_error(p.string(), "capture", rel.generic_string(), p.string() + ": read failed");
        h.add(&size, sizeof size);
    }
    return h.hex();
}

/// \brief The cache key of a capture analysed with some options.
/// \param[in] fingerprint capture_fingerprint of the capture.
/// \param[in] options the options text (options_text plus overrides).
/// \returns 32 hexadecimal digits (the hash also covers the qkgeom version
///          and the number of head metrics and per-bucket values written).
[[nodiscard]] inline std::string cache_key(std::string const& fingerprint, std::string const& options) {
    detail::content_hash h;
    h.add_text(fingerprint);
    h.add_text(options);
    h.add_text(QKGEOM_VERSION_STRING);
    // The output schema: an analysis with more columns (a new analysis) gets
    // new keys, so older cache entries are not reused without its numbers.
    h.add_text(std::to_string(head_metric_names.size()) + " metrics, " +
               std::to_string(profile_beyond_names.size()) + " profile values");
    return h.hex();
}

namespace detail {

inline std::string run_options_text(study_run_options const& o) {
    return options_text(o.analysis) + " window=" + (o.window >= 0 ? std::to_string(o.window) : std::string("capture")) +
           " context=" + (o.context > 0 ? std::to_string(o.context) : std::string("capture"));
}

/// A complete cache entry: its key file names this key.
inline bool entry_complete(std::filesystem::path const& entry, std::string const& key) {
    std::error_code ec;
    auto const kf = entry / std::string(cache_key_file);
    if (!std::filesystem::is_regular_file(kf, ec)) return false;
    try {
        auto const bytes = io::detail::read_file_bytes(kf, std::uint64_t(1) << 20, "file size");
        auto const v = json::parse(std::string_view(reinterpret_cast<char const*>(bytes.data()), bytes.size()), kf.string());
        auto const* k = v.find("key");
        return k != nullptr && k->is_string() && k->as_string() == key;
    } catch (std::exception const&) {
        return false;  // an unreadable key file: not an entry (analysed again)
    }
}

inline json::value entry_record(std::string const& key, std::string const& fp, std::string const& options,
                                std::filesystem::path const& capture, io::manifest const& m) {
    return json::object{{"key", json::value(key)},
                        {"qkgeom", json::value(QKGEOM_VERSION_STRING)},
                        {"fingerprint", json::value(fp)},
                        {"options", json::value(options)},
                        {"capture", json::value(capture.string())},
                        {"model", json::value(m.model)},
                        {"n_layers", json::value(m.n_layers)},
                        {"context_length", json::value(m.context_length)}};
}

/// n_layers and context_length from an entry's key file.
inline void apply_entry_record(std::filesystem::path const& entry, run_heads& rh) {
    auto const kf = entry / std::string(cache_key_file);
    auto const bytes = io::detail::read_file_bytes(kf, std::uint64_t(1) << 20, "file size");
    auto const v = json::parse(std::string_view(reinterpret_cast<char const*>(bytes.data()), bytes.size()), kf.string());
    if (auto const* n = v.find("n_layers"); n != nullptr && n->is_int() && n->as_int() >= rh.n_layers)
        rh.n_layers = n->as_int();
    if (auto const* c = v.find("context_length"); c != nullptr && c->is_int()) rh.context_length = c->as_int();
}

/// "N of M heads failed; first: ..." for a dataset run that is not whole.
inline std::string incomplete_text(io::dataset_run const& run) {
    std::size_t const failed = run.planned.size() - run.heads.size();
    std::string first;
    if (!run.failures.empty()) first = io::dataset_head_label(run.failures.front().id) + ": " + run.failures.front().message;
    else if (!run.missing.empty()) first = io::missing_entry_message(run, run.missing.front());
    else if (!run.stray.empty()) first = run.stray.front().name + ": " + run.stray.front().message;
    return std::to_string(failed) + " of " + std::to_string(run.planned.size()) + " heads failed" +
           (run.stray.empty() ? "" : ", " + std::to_string(run.stray.size()) + " stray entries") + "; first: " +
           escape_text(first);
}

/// Analyses a capture into cache/key (written as key.partial, then renamed).
/// (A template, like its callers: instantiated on use, docs/building.md.)
template <class = void>
void analyse_into(run_spec const& r, study_run_options const& o, std::string const& key, std::string const& fp,
                  std::string const& options, std::filesystem::path const& entry) {
    io::dataset_run_options d;
    d.analysis = o.analysis;
    d.jobs = o.jobs;
    d.context = o.context;
    d.window = o.window;
    d.on_head_done = o.on_head_done;
    auto run = !o.analyzer ? io::analyze_dataset(io::plan_dataset(r.capture), d)
               : o.analyzer_f32 ? io::analyze_dataset(io::plan_dataset(r.capture), d,
                                                      io::head_analyzers{o.analyzer, o.analyzer_f32})
                                : io::analyze_dataset(io::plan_dataset(r.capture), d, o.analyzer);
    if (run.heads.size() != run.planned.size() || !run.stray.empty())
        throw std::runtime_error(r.capture.string() + ": " + incomplete_text(run));
    auto const partial = entry.parent_path() / (entry.filename().string() + ".partial");
    std::error_code ec;
    std::filesystem::remove_all(partial, ec);
    report::write_reports(partial, r.model, run.heads);
    auto const kf = partial / std::string(cache_key_file);
    std::ofstream out(kf, std::ios::binary);
    out << json::dump(entry_record(key, fp, options, r.capture, run.m), 2) << "\n";
    out.close();
    if (!out) throw io_error(kf.string(), kf.string() + ": cannot be written");
    std::filesystem::remove_all(entry, ec);
    std::filesystem::rename(partial, entry, ec);
    if (ec) throw io_error(entry.string(), "cannot move " + partial.string() + " to " + entry.string() + ": " + ec.message());
}

/// Copies a previous cache's entry into the cache.
inline bool take_previous(study_run_options const& o, std::string const& key, std::filesystem::path const& entry) {
    for (auto const& prev : o.previous_caches) {
        auto const src = prev / key;
        if (!entry_complete(src, key)) continue;
        auto const partial = entry.parent_path() / (key + ".partial");
        std::error_code ec;
        std::filesystem::remove_all(partial, ec);
        std::filesystem::copy(src, partial, std::filesystem::copy_options::recursive, ec);
        if (!ec) std::filesystem::rename(partial, entry, ec);
        if (!ec) return true;
        std::filesystem::remove_all(partial, ec);  // a failed copy: analysed again
    }
    return false;
}

/// A run with a capture: from the cache, or analysed and cached.
template <class = void>
run_outcome capture_run(run_spec const& r, study_run_options const& o) {
    if (o.cache.empty())
        throw std::invalid_argument("qkgeom::study::run_study: run '" + r.name +
                                    "' has a capture but study_run_options::cache is empty");
    std::filesystem::create_directories(o.cache);
    std::string const options = run_options_text(o);
    std::string const fp = capture_fingerprint(r.capture);
    std::string const key = cache_key(fp, options);
    auto const entry = o.cache / key;
    run_outcome out;
    out.status = run_status::cached;
    if (!entry_complete(entry, key) && !take_previous(o, key, entry)) {
        analyse_into(r, o, key, fp, options, entry);
        out.status = run_status::analysed;
    }
    out.folder = entry;
    out.heads = read_analysis(entry);
    apply_entry_record(entry, out.heads);
    return out;
}

}  // namespace detail

/// \brief Finds or makes every run's analysis. A run that fails (unreadable
/// capture, a failed head, a bad analysis folder) is an outcome with status
/// `failed` and its message; the others go on.
/// \param[in] spec the study; its file's "options" replace those of `o` they name.
/// \param[in] o the options.
/// \returns one outcome per run, study order.
template <class = void>
[[nodiscard]] std::vector<run_outcome> run_all(study_spec const& spec, study_run_options o) {
    apply_study_options(spec, o.analysis, o.context, o.window);  // the file's options win
    std::vector<run_outcome> out;
    for (std::size_t i = 0; i < spec.runs.size(); ++i) {
        auto const& r = spec.runs[i];
        run_outcome oc;
        try {
            if (!r.metrics.empty()) {
                oc.status = run_status::given;
            } else if (!r.analysis.empty()) {
                oc.heads = read_analysis(r.analysis);
                oc.folder = r.analysis;
                oc.status = run_status::read;
            } else {
                oc = detail::capture_run(r, o);
            }
        } catch (std::exception const& e) {
            oc = run_outcome{};
            oc.status = run_status::failed;
            oc.message = e.what();
        }
        if (o.on_run) o.on_run(i, oc);
        out.push_back(std::move(oc));
    }
    return out;
}

/// \brief Runs a study: run_all, then compute_study.
/// \param[in] spec the study.
/// \param[in] o the options.
/// \returns the study's tables; each run's status says what happened to it.
/// \throws std::invalid_argument when a run has a capture and o.cache is empty.
template <class = void>
[[nodiscard]] study_result run_study(study_spec const& spec, study_run_options const& o) {
    for (auto const& r : spec.runs)
        if (!r.capture.empty() && o.cache.empty())
            throw std::invalid_argument("qkgeom::study::run_study: run '" + r.name +
                                        "' has a capture but study_run_options::cache is empty");
    return compute_study(spec, run_all(spec, o));
}

}  // namespace study
}  // namespace qkgeom
