// qkgeom — running a study (docs/study.md): every run's analysis is found in
// the cache, read from its analysis folder, taken from the study file, or
// analysed from its capture and cached; a broken run is reported and the
// others go on; then the tables are computed (study/compute.hpp).
//
// The cache is keyed by the capture's content (the bytes of the files the
// analysis reads: manifest.json and the head entries), the analysis options
// in effect (options_text) and the qkgeom version: adding a run analyses only
// it, changing an option analyses every capture again, and a capture whose
// bytes changed is analysed again. An entry records a checksum of each of its
// files and is served only whole; a capture written while it was analysed is
// never cached; entries are put in place by one rename, so studies sharing a
// cache can run at once (docs/study.md#caching).
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
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/stat.h>
#define QKGEOM_STUDY_POSIX_STAT 1
#else
#define QKGEOM_STUDY_POSIX_STAT 0
#endif

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
/// \brief How old a `KEY.partial-*` / `KEY.stale-*` folder of a study cache
/// must be (last modified) before a study removes it as a killed writer's
/// debris: one day (a writer fills and renames its own within one capture's
/// analysis).
inline constexpr std::chrono::hours cache_debris_age{24};

/// \brief Files of a capture larger than this (1 GiB) are fingerprinted by
/// their metadata, not their bytes (capture_fingerprint): a 64 GB sparse
/// entry is never read whole.
inline constexpr std::uintmax_t fingerprint_max_file_bytes = std::uintmax_t(1) << 30;

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

/// The files of a capture the analysis reads, relative to `dir`, sorted:
/// manifest.json and every item at the top level named as a head entry
/// (lLLhHH[qk], bare or ending in .npz / .safetensors); an entry folder
/// (symbolic links followed) stands for the NumPy files it holds. Other
/// files are not read by the analysis and are left out.
inline std::vector<std::filesystem::path> capture_files(std::filesystem::path const& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        throw input_error(dir.string(), "capture", dir.string(), dir.string() + ": not a capture folder (not a directory)");
    std::vector<fs::path> out;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::string const name = it->path().filename().string();
        std::string_view bare = name;
        if (bare.ends_with(".safetensors")) bare.remove_suffix(12);
        else if (bare.ends_with(".npz")) bare.remove_suffix(4);
        io::entry_id id;
        bool const manifest = name == "manifest.json";
        if (!manifest && !io::detail::parse_entry_name(bare, id)) continue;
        std::error_code sec;
        if (!manifest && bare.size() == name.size() && fs::is_directory(it->path(), sec)) {
            for (auto f : io::detail::npy_entry_files) {
                std::error_code fec;
                if (fs::exists(it->path() / std::string(f), fec)) out.push_back(fs::path(name) / std::string(f));
            }
            continue;
        }
        out.emplace_back(name);
    }
    if (ec) throw input_error(dir.string(), "capture", dir.string(), dir.string() + ": cannot list: " + ec.message());
    std::sort(out.begin(), out.end());
    return out;
}

/// A file's metadata as text: size and modification time, and where the
/// system has them (POSIX) device, inode and status-change time (which no
/// program can set back). Symbolic links are followed.
inline std::string file_metadata(std::filesystem::path const& p) {
#if QKGEOM_STUDY_POSIX_STAT
    struct ::stat st {};
    if (::stat(p.c_str(), &st) != 0) return "unreadable";
#if defined(__APPLE__)
    auto const& m = st.st_mtimespec;
    auto const& c = st.st_ctimespec;
#else
    auto const& m = st.st_mtim;
    auto const& c = st.st_ctim;
#endif
    return "size " + std::to_string(st.st_size) + ", modified " + std::to_string(m.tv_sec) + "." +
           std::to_string(m.tv_nsec) + ", changed " + std::to_string(c.tv_sec) + "." + std::to_string(c.tv_nsec) +
           ", inode " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
#else
    std::error_code ec, ec2;
    auto const size = std::filesystem::file_size(p, ec);
    auto const t = std::filesystem::last_write_time(p, ec2);
    if (ec || ec2) return "unreadable";
    return "size " + std::to_string(size) + ", modified " + std::to_string(t.time_since_epoch().count());
#endif
}

/// Hashes a file's bytes into `h` (its size after them); input_error naming it when it cannot be read.
inline void hash_file_bytes(std::filesystem::path const& p, std::string const& rel, content_hash& h) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw input_error(p.string(), "capture", rel, p.string() + ": cannot be opened");
    std::vector<char> buf(std::size_t(1) << 20);
    std::uint64_t size = 0;
    while (in) {
        in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        auto const got = static_cast<std::size_t>(in.gcount());
        h.add(buf.data(), got);
        size += got;
    }
    if (in.bad()) throw input_error(p.string(), "capture", rel, p.string() + ": read failed");
    h.add(&size, sizeof size);
}

/// A file's checksum: content_hash of its bytes.
inline std::string file_checksum(std::filesystem::path const& p) {
    content_hash h;
    hash_file_bytes(p, p.filename().string(), h);
    return h.hex();
}

}  // namespace detail

/// \brief The content fingerprint of a capture folder: a 128-bit hash of the
/// files the analysis reads (manifest.json and the head entries, symbolic
/// links followed to what they point at), each by its relative path and
/// bytes; a file over fingerprint_max_file_bytes by its metadata instead
/// (size, modification time; on POSIX also device, inode, status-change
/// time). Other files in the folder are not read.
/// \param[in] dir the capture folder.
/// \returns 32 hexadecimal digits.
/// \throws qkgeom::input_error naming the folder or file when it cannot be
///         listed or read.
[[nodiscard]] inline std::string capture_fingerprint(std::filesystem::path const& dir) {
    detail::content_hash h;
    for (auto const& rel : detail::capture_files(dir)) {
        auto const p = dir / rel;
        h.add_text(rel.generic_string());
        std::error_code ec;
        auto const size = std::filesystem::file_size(p, ec);
        if (!ec && size > fingerprint_max_file_bytes) h.add_text("metadata " + detail::file_metadata(p));
        else detail::hash_file_bytes(p, rel.generic_string(), h);
    }
    return h.hex();
}

/// \brief The state of the files capture_fingerprint covers, as their
/// metadata (size, modification time; on POSIX device, inode and
/// status-change time), one (relative path, text) per file, sorted: taken
/// before and after an analysis, so that a file written meanwhile (even when
/// its bytes were put back) is seen. Reads no bytes.
/// \param[in] dir the capture folder.
/// \returns the state.
/// \throws qkgeom::input_error as capture_fingerprint when the folder cannot be listed.
[[nodiscard]] inline std::vector<std::pair<std::string, std::string>> capture_state(std::filesystem::path const& dir) {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto const& rel : detail::capture_files(dir))
        out.emplace_back(rel.generic_string(), detail::file_metadata(dir / rel));
    return out;
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

/// The key file of an entry, parsed (input_error / json errors propagate).
inline json::value read_entry_record(std::filesystem::path const& entry) {
    auto const kf = entry / std::string(cache_key_file);
    auto const bytes = io::detail::read_file_bytes(kf, std::uint64_t(1) << 20, "file size");
    return json::parse(std::string_view(reinterpret_cast<char const*>(bytes.data()), bytes.size()), kf.string());
}

/// Why a cache entry cannot be served: "" when it is whole (its record names
/// `key` and every file it lists has the recorded size and checksum, and the
/// folder holds no other file); `absent` when there is nothing at `entry`;
/// else what is wrong, naming the file (never the entry's folder).
inline constexpr std::string_view entry_absent = "absent";
inline std::string entry_problem(std::filesystem::path const& entry, std::string const& key) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto const t = fs::symlink_status(entry, ec).type();
    if (t == fs::file_type::not_found) return std::string(entry_absent);
    if (t != fs::file_type::directory) return "not a folder";
    json::value v;
    try {
        v = read_entry_record(entry);
    } catch (std::exception const&) {
        return std::string(cache_key_file) + " missing or unreadable";
    }
    auto const* k = v.find("key");
    if (k == nullptr || !k->is_string() || k->as_string() != key) return std::string(cache_key_file) + " names another key";
    auto const* files = v.find("files");
    if (files == nullptr || !files->is_array()) return std::string(cache_key_file) + " lists no checksums";
    std::set<std::string> listed{std::string(cache_key_file)};
    for (auto const& f : files->as_array()) {
        auto const* n = f.find("name");
        auto const* sz = f.find("size");
        auto const* h = f.find("checksum");
        if (n == nullptr || !n->is_string() || sz == nullptr || !sz->is_int() || h == nullptr || !h->is_string() ||
            n->as_string().find_first_of("/\\") != std::string::npos || n->as_string().empty() || n->as_string()[0] == '.')
            return std::string(cache_key_file) + " has a malformed file record";
        auto const p = entry / n->as_string();
        listed.insert(n->as_string());
        if (fs::symlink_status(p, ec).type() != fs::file_type::regular)
            return n->as_string() + " is missing or not a regular file";
        auto const size = fs::file_size(p, ec);
        if (ec || size != static_cast<std::uintmax_t>(sz->as_int()))
            return n->as_string() + " has " + std::to_string(size) + " bytes, not the " + std::to_string(sz->as_int()) +
                   " recorded";
        try {
            if (file_checksum(p) != h->as_string()) return n->as_string() + " differs from its recorded checksum";
        } catch (std::exception const&) {
            return n->as_string() + " cannot be read";
        }
    }
    for (fs::directory_iterator it(entry, ec), end; !ec && it != end; it.increment(ec))
        if (!listed.count(it->path().filename().string()))
            return escape_text(it->path().filename().string()) + " is not listed in " + std::string(cache_key_file);
    return ec ? "cannot be listed: " + ec.message() : std::string();
}

inline json::value entry_record(std::string const& key, std::string const& fp, std::string const& options,
                                std::filesystem::path const& capture, io::manifest const& m,
                                std::filesystem::path const& folder) {
    json::array files;
    std::vector<std::string> names;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec))
        names.push_back(it->path().filename().string());
    if (ec) throw io_error(folder.string(), "the study cache cannot be listed: " + ec.message());
    std::sort(names.begin(), names.end());
    for (auto const& n : names)
        files.push_back(json::object{
            {"name", json::value(n)},
            {"size", json::value(static_cast<std::int64_t>(std::filesystem::file_size(folder / n)))},
            {"checksum", json::value(file_checksum(folder / n))}});
    return json::object{{"key", json::value(key)},
                        {"qkgeom", json::value(QKGEOM_VERSION_STRING)},
                        {"fingerprint", json::value(fp)},
                        {"options", json::value(options)},
                        {"capture", json::value(capture.string())},
                        {"model", json::value(m.model)},
                        {"n_layers", json::value(m.n_layers)},
                        {"context_length", json::value(m.context_length)},
                        {"files", json::value(std::move(files))}};
}

/// n_layers and context_length from an entry's key file.
inline void apply_entry_record(std::filesystem::path const& entry, run_heads& rh) {
    auto const v = read_entry_record(entry);
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

/// A name next to `entry` no other process or thread uses: KEY.<what>-<token>.
inline std::filesystem::path unique_sibling(std::filesystem::path const& entry, char const* what) {
    static std::atomic<std::uint64_t> counter{0};
    content_hash h;
    auto const t = std::chrono::steady_clock::now().time_since_epoch().count();
    auto const w = std::chrono::system_clock::now().time_since_epoch().count();
    auto const id = std::hash<std::thread::id>{}(std::this_thread::get_id());
    std::uint64_t const n = counter++;
    unsigned r = 0;
    try {
        r = std::random_device{}();
    } catch (std::exception const&) {  // no entropy source: the clocks and the address below suffice
    }
    auto const here = reinterpret_cast<std::uintptr_t>(&counter);
    h.add(&t, sizeof t), h.add(&w, sizeof w), h.add(&id, sizeof id), h.add(&n, sizeof n), h.add(&r, sizeof r);
    h.add(&here, sizeof here);
    return entry.parent_path() / (entry.filename().string() + "." + what + "-" + h.hex().substr(0, 16));
}

/// Removes a folder of ours on the way out unless released.
struct folder_guard {
    std::filesystem::path path;
    ~folder_guard() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
};

/// Puts a finished folder (`partial`, ours) in place as `entry` by one
/// rename. An entry already there (a concurrent study finished first) is
/// accepted when it is whole; a damaged one is moved aside and removed.
inline void publish_entry(std::filesystem::path const& partial, std::filesystem::path const& entry,
                          std::string const& key, std::filesystem::path const& capture) {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (int attempt = 0; attempt < 4; ++attempt) {
        fs::rename(partial, entry, ec);
        if (!ec) return;
        auto const problem = entry_problem(entry, key);
        if (problem.empty()) {  // another process's identical entry: ours is not needed
            fs::remove_all(partial, ec);
            return;
        }
        if (problem == entry_absent) continue;
        auto const aside = unique_sibling(entry, "stale");
        std::error_code mec;
        fs::rename(entry, aside, mec);
        fs::remove_all(aside, mec);
    }
    throw io_error(capture.string(), "the analysis of " + capture.string() + " cannot be stored in the study cache (entry " +
                                         key + "): " + ec.message());
}

/// Analyses a capture into cache/key: written into a folder of its own
/// (KEY.partial-<token>), checked against the capture's state before the
/// analysis (`before`), then renamed into place (publish_entry).
/// (A template, like its callers: instantiated on use, docs/building.md.)
template <class = void>
void analyse_into(run_spec const& r, study_run_options const& o, std::string const& key, std::string const& fp,
                  std::string const& options, std::filesystem::path const& entry,
                  std::vector<std::pair<std::string, std::string>> const& before) {
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
    auto const after = capture_state(r.capture);
    if (after != before) {
        std::string what = "files added or removed";
        for (std::size_t i = 0; i < std::min(before.size(), after.size()); ++i)
            if (before[i] != after[i]) {
                what = before[i].first == after[i].first ? before[i].first + " was written" : "files added or removed";
                break;
            }
        throw std::runtime_error(r.capture.string() + ": the capture changed while it was analysed (" + escape_text(what) +
                                 "): its analysis is neither used nor cached; run the study again");
    }
    folder_guard partial{unique_sibling(entry, "partial")};
    report::write_reports(partial.path, r.model, run.heads);
    auto const record = json::dump(entry_record(key, fp, options, r.capture, run.m, partial.path), 2) + "\n";
    auto const kf = partial.path / std::string(cache_key_file);
    std::ofstream out(kf, std::ios::binary);
    out << record;
    out.close();
    if (!out) throw io_error(r.capture.string(), "the analysis of " + r.capture.string() +
                                                     " cannot be stored in the study cache (entry " + key + ")");
    publish_entry(partial.path, entry, key, r.capture);
    partial.path.clear();  // renamed into place, or removed by publish_entry
}

/// Copies a whole entry of a previous cache into the cache (checked before
/// and after the copy); false when none has one. A damaged one is said in `note`.
inline bool take_previous(study_run_options const& o, std::string const& key, std::filesystem::path const& entry,
                          std::filesystem::path const& capture, std::string& note) {
    for (auto const& prev : o.previous_caches) {
        auto const src = prev / key;
        if (auto const problem = entry_problem(src, key); !problem.empty()) {
            if (problem != entry_absent)
                note = "the earlier cache's entry " + key + " was damaged (" + problem + "); analysed again";
            continue;
        }
        folder_guard partial{unique_sibling(entry, "partial")};
        std::error_code ec;
        std::filesystem::copy(src, partial.path, std::filesystem::copy_options::recursive, ec);
        if (ec || !entry_problem(partial.path, key).empty()) continue;  // a failed copy: analysed again
        publish_entry(partial.path, entry, key, capture);
        partial.path.clear();
        return true;
    }
    return false;
}

/// The cached analysis read back; a read error names the entry by its key
/// (the cache may lie in a staging folder no message should name).
inline run_heads read_entry(std::filesystem::path const& entry, std::string const& key,
                            std::filesystem::path const& capture) {
    try {
        auto heads = read_analysis(entry);
        apply_entry_record(entry, heads);
        return heads;
    } catch (std::exception const& e) {
        std::string m = e.what();
        for (auto const s = entry.string(); !s.empty();) {
            auto const at = m.find(s);
            if (at == std::string::npos) break;
            m.replace(at, s.size(), "cache entry " + key);
        }
        throw std::runtime_error(capture.string() + ": its cached analysis cannot be read back: " + m);
    }
}

/// Removes what a killed writer left in a cache folder: `KEY.partial-*` and
/// `KEY.stale-*` folders last modified more than `cache_debris_age` ago (a live
/// writer fills and renames its own within the analysis of one capture).
/// Errors are ignored: the sweep is housekeeping, never a reason to fail.
inline void sweep_cache_debris(std::filesystem::path const& cache) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto const now = fs::file_time_type::clock::now();
    std::vector<fs::path> old;
    for (fs::directory_iterator it(cache, ec), end; !ec && it != end; it.increment(ec)) {
        std::string const name = it->path().filename().string();
        if (name.find(".partial-") == std::string::npos && name.find(".stale-") == std::string::npos) continue;
        std::error_code tec;
        auto const t = fs::last_write_time(it->path(), tec);
        if (!tec && now - t > cache_debris_age) old.push_back(it->path());
    }
    for (auto const& p : old) fs::remove_all(p, ec);
}

/// A run with a capture: from the cache (an entry checked whole), or
/// analysed and cached. A damaged entry is said in the outcome's note and
/// analysed again.
template <class = void>
run_outcome capture_run(run_spec const& r, study_run_options const& o) {
    if (o.cache.empty())
        throw std::invalid_argument("qkgeom::study::run_study: run '" + r.name +
                                    "' has a capture but study_run_options::cache is empty");
    std::filesystem::create_directories(o.cache);
    std::string const options = run_options_text(o);
    auto const before = capture_state(r.capture);
    std::string const fp = capture_fingerprint(r.capture);
    std::string const key = cache_key(fp, options);
    auto const entry = o.cache / key;
    run_outcome out;
    out.status = run_status::cached;
    auto const problem = entry_problem(entry, key);
    if (!problem.empty() && problem != entry_absent)
        out.note = "cache entry " + key + " was damaged (" + problem + "); analysed again";
    if (!problem.empty() && !take_previous(o, key, entry, r.capture, out.note)) {
        analyse_into(r, o, key, fp, options, entry, before);
        out.status = run_status::analysed;
    }
    out.folder = entry;
    out.heads = read_entry(entry, key, r.capture);
    return out;
}

}  // namespace detail

namespace detail {
/// `make()`'s outcome, or a `failed` outcome carrying the message of the
/// std::exception it threw (a run never stops the study).
template <class F>
run_outcome outcome_of(F const& make) {
    try {
        return make();
    } catch (std::exception const& e) {
        run_outcome oc;
        oc.status = run_status::failed;
        oc.message = e.what();
        return oc;
    }
}
}  // namespace detail

/// \brief The cache key of a capture run: what run_one looks up in o.cache
/// (reads every byte of the capture once, as capture_run does).
/// \param[in] r the run (with a capture).
/// \param[in] o the options (their analysis part is in the key).
/// \returns the key.
/// \throws qkgeom::input_error when the capture cannot be read.
[[nodiscard]] inline std::string run_cache_key(run_spec const& r, study_run_options const& o) {
    return cache_key(capture_fingerprint(r.capture), detail::run_options_text(o));
}

/// \brief The outcome of a capture run whose analysis another process has
/// just put into o.cache under `key` (the program under mpirun): the entry
/// read back, with the given status; the capture is not read again.
/// \param[in] r the run.
/// \param[in] o the options.
/// \param[in] key the run's key (run_cache_key).
/// \param[in] status the status to report (analysed, or cached).
/// \returns the outcome; a run whose entry cannot be read back is `failed`.
template <class = void>
[[nodiscard]] run_outcome cached_run(run_spec const& r, study_run_options const& o, std::string const& key,
                                     run_status status) {
    return detail::outcome_of([&] {
        run_outcome oc;
        oc.folder = o.cache / key;
        oc.heads = detail::read_entry(oc.folder, key, r.capture);
        oc.status = status;
        return oc;
    });
}

/// \brief One run of a study, as run_all does it (without the study file's
/// options, which run_all applies first): its given metrics, its analysis
/// folder read, or its capture from the cache or analysed and cached. A run
/// that fails is an outcome with status `failed` and its message. The
/// program under mpirun runs the captures of a study on several processes
/// with it (docs/scale.md).
/// \param[in] r the run.
/// \param[in] o the options (o.cache required when the run has a capture).
/// \returns the outcome.
template <class = void>
[[nodiscard]] run_outcome run_one(run_spec const& r, study_run_options const& o) {
    return detail::outcome_of([&] {
        run_outcome oc;
        if (!r.metrics.empty()) {
            oc.status = run_status::given;
        } else if (!r.analysis.empty()) {
            oc.heads = read_analysis(r.analysis);
            oc.folder = r.analysis;
            oc.status = run_status::read;
        } else {
            oc = detail::capture_run(r, o);
        }
        return oc;
    });
}

/// \brief Finds or makes every run's analysis. A run that fails (unreadable
/// capture, a failed head, a bad analysis folder) is an outcome with status
/// `failed` and its message; the others go on.
/// \param[in] spec the study; its file's "options" replace those of `o` they name.
/// \param[in] o the options.
/// \returns one outcome per run, study order.
template <class = void>
[[nodiscard]] std::vector<run_outcome> run_all(study_spec const& spec, study_run_options o) {
    apply_study_options(spec, o.analysis, o.context, o.window);  // the file's options win
    if (!o.cache.empty()) detail::sweep_cache_debris(o.cache);     // once per study (no cache yet: nothing)
    std::vector<run_outcome> out;
    for (std::size_t i = 0; i < spec.runs.size(); ++i) {
        run_outcome oc = run_one(spec.runs[i], o);
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
