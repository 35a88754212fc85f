// qkgeom program — the output folder of a run (docs/cli.md#the-output-folder):
// checked before any analysis (never an input, never inside or around one),
// written as a fresh staging folder next to the target and swapped in at the
// end, so a folder never mixes two runs; folders a killed run left next to
// the target are removed by the next run (only those carrying the owner
// record of a process that is gone).
#include "program.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <signal.h>
#include <unistd.h>

namespace qkgeom_app {

namespace fs = std::filesystem;

namespace output_impl {  // named: the program may be compiled as one unity translation unit

/// The owner record of a staging (and old) folder: which process made it.
constexpr char const* owner_file = ".qkgeom-owner";
constexpr char const* owner_magic = "qkgeom staging folder";

/// `out` without a trailing separator ("out/" -> "out"), so that its
/// filename and parent are the folder's own.
fs::path normalised(fs::path const& out) {
    fs::path p = out.lexically_normal();
    if (p.has_relative_path() && p.filename().empty()) p = p.parent_path();
    if (p.empty() || p == "." || p == ".." || p.filename() == "..")
        throw run_error("-o " + out.string() + ": name a folder to write (not '.', '..' or empty)");
    return p;
}

std::string why(std::error_code const& ec) { return ec.message(); }

/// A name next to `target` that does not exist yet: ".NAME.<what>-<pid>-<n>".
fs::path sibling(fs::path const& target, std::string const& what) {
    static std::atomic<unsigned> counter{0};
    for (;;) {
        fs::path const p = target.parent_path() / ("." + target.filename().string() + "." + what + "-" +
                                                   std::to_string(::getpid()) + "-" + std::to_string(counter++));
        std::error_code ec;
        if (!fs::exists(fs::symlink_status(p, ec))) return p;
    }
}

// ---- inputs: a run never replaces (deletes) what it reads ------------------------------

/// `p` absolute, symbolic links resolved as far as the path exists.
fs::path canonical_of(fs::path const& p) {
    std::error_code ec;
    fs::path c = fs::weakly_canonical(fs::absolute(p, ec), ec);
    if (ec) c = fs::absolute(p, ec).lexically_normal();
    if (!c.has_filename() && c.has_relative_path()) c = c.parent_path();  // no trailing separator
    return c;
}

/// Whether `inner` is `outer` or lies inside it (both canonical).
bool within(fs::path const& inner, fs::path const& outer) {
    auto i = inner.begin();
    for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
        if (i == inner.end() || *i != *o) return false;
    return true;
}

/// A symbolic link inside the input folder `in` whose target lies in `out`
/// (the run would read through it what the swap deletes); nullopt if none.
std::optional<std::pair<fs::path, fs::path>> link_into(fs::path const& in, fs::path const& out) {
    std::error_code ec;
    if (!fs::is_directory(fs::symlink_status(in, ec))) return std::nullopt;
    fs::recursive_directory_iterator it(in, fs::directory_options::skip_permission_denied, ec), end;
    for (std::size_t seen = 0; !ec && it != end && seen < 1'000'000; it.increment(ec), ++seen) {
        if (!it->is_symlink(ec)) continue;
        fs::path const target = canonical_of(it->path());
        if (within(target, out)) return std::pair{it->path(), target};
    }
    return std::nullopt;
}

/// Refuses a target equal to, inside, or containing an input, or reached by a
/// link inside an input folder.
void check_inputs(fs::path const& target, std::vector<fs::path> const& inputs, std::string const& flag) {
    fs::path const out = canonical_of(target);
    std::string const head = flag + " " + target.string() + ": ";
    std::string const tail = "; a run replaces its output folder as a whole and never deletes what it reads: "
                             "name a folder outside every input";
    for (auto const& in : inputs) {
        fs::path const c = canonical_of(in);
        std::string const named = in.string() + (c.string() == in.string() ? "" : " (" + c.string() + ")");
        if (c == out) throw run_error(head + "is the input " + named + tail);
        if (within(c, out)) throw run_error(head + "contains the input " + named + tail);
        if (within(out, c))
            throw run_error(head + "lies inside the input " + named +
                            "; a run never writes into what it reads: name a folder outside every input");
        if (auto const link = link_into(c, out))
            throw run_error(head + "the input " + in.string() + " reads " + link->second.string() +
                            " through the symbolic link " + link->first.string() + tail);
    }
}

// ---- owner records and what a killed run left ----------------------------------------------

struct owner_id {
    long pid = 0;
    std::string start, boot, pidns;  ///< start time (/proc/PID/stat field 22), boot id, pid namespace
};

std::string read_small(fs::path const& p) {
    std::ifstream f(p, std::ios::binary);
    std::string s;
    if (f) std::getline(f, s, '\0');
    return s.size() > 4096 ? std::string() : s;
}

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

/// Field `n` (3 = state, 22 = starttime in clock ticks since boot) of /proc/PID/stat.
std::string stat_field(long pid, int n) {
    std::string const s = read_small("/proc/" + std::to_string(pid) + "/stat");
    auto const close = s.rfind(')');
    if (close == std::string::npos) return {};
    std::istringstream in(s.substr(close + 2));  // from field 3
    std::string f;
    for (int i = 3; i <= n && (in >> f); ++i)
        if (i == n) return f;
    return {};
}

std::string start_time(long pid) { return stat_field(pid, 22); }

owner_id self_owner() {
    owner_id me;
    me.pid = static_cast<long>(::getpid());
    me.start = start_time(me.pid);
    me.boot = trimmed(read_small("/proc/sys/kernel/random/boot_id"));
    std::error_code ec;
    me.pidns = fs::read_symlink("/proc/self/ns/pid", ec).string();
    return me;
}

std::string owner_text(owner_id const& o) {
    return std::string(owner_magic) + "\npid " + std::to_string(o.pid) + "\nstart " + o.start + "\nboot " + o.boot +
           "\npidns " + o.pidns + "\n";
}

std::optional<owner_id> parse_owner(std::string const& text) {
    std::istringstream in(text);
    std::string line;
    if (!std::getline(in, line) || line != owner_magic) return std::nullopt;
    owner_id o;
    bool have_pid = false;
    while (std::getline(in, line)) {
        auto const sp = line.find(' ');
        std::string const key = line.substr(0, sp), value = sp == std::string::npos ? "" : line.substr(sp + 1);
        if (key == "pid") {
            char* end = nullptr;
            o.pid = std::strtol(value.c_str(), &end, 10);
            have_pid = end != value.c_str() && *end == '\0' && o.pid > 0;
        } else if (key == "start") o.start = value;
        else if (key == "boot") o.boot = value;
        else if (key == "pidns") o.pidns = value;
    }
    return have_pid ? std::optional<owner_id>(o) : std::nullopt;
}

/// Whether the process that wrote `o` is certainly gone: same boot and pid
/// namespace as this process (else nothing can be told), and no process
/// with that id, one that has exited and waits to be reaped (a zombie: an
/// MPI rank whose launcher is gone, in a container whose init never reaps),
/// or one started at another time (the id was reused).
bool owner_gone(owner_id const& o, owner_id const& me) {
    if (o.boot != me.boot || o.pidns != me.pidns || o.pid == me.pid) return false;
    if (::kill(static_cast<pid_t>(o.pid), 0) != 0 && errno == ESRCH) return true;
    std::string const now = start_time(o.pid);
    if (now.empty() || o.start.empty()) return false;
    if (now != o.start) return true;
    std::string const state = stat_field(o.pid, 3);
    return state == "Z" || state == "X";
}

/// Removes a folder of ours, its owner record last (a removal cut short
/// leaves a folder the next run still recognises).
void remove_owned(fs::path const& dir) {
    std::error_code ec;
    std::vector<fs::path> items;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        if (it->path().filename() != owner_file) items.push_back(it->path());
    for (auto const& p : items) fs::remove_all(p, ec);  // remove_all never follows symlinks
    fs::remove(dir / owner_file, ec);
    fs::remove(dir, ec);
}

struct stale_folder {
    fs::path path;
    bool old = false;  ///< ".NAME.old-*": a previous report moved aside by a swap
    fs::file_time_type when;
};

/// The staging / old folders next to `target` that a process now gone left.
std::vector<stale_folder> stale_folders(fs::path const& target, std::vector<fs::path> const& inputs) {
    std::vector<stale_folder> out;
    fs::path const parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    std::string const prefix = "." + target.filename().string() + ".";
    owner_id const me = self_owner();
    std::error_code ec;
    for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
        std::string const name = it->path().filename().string();
        if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
        std::string const rest = name.substr(prefix.size());
        bool const old = rest.rfind("old-", 0) == 0;
        if (!old && rest.rfind("staging-", 0) != 0) continue;
        std::error_code e2;
        if (!fs::is_directory(fs::symlink_status(it->path(), e2))) continue;  // never a link or a file
        fs::path const rec = it->path() / owner_file;
        if (!fs::is_regular_file(fs::symlink_status(rec, e2))) continue;      // not ours: left alone
        auto const o = parse_owner(read_small(rec));
        std::string const id = rest.substr(old ? 4 : 8);
        if (!o || id.rfind(std::to_string(o->pid) + "-", 0) != 0 || !owner_gone(*o, me)) continue;
        fs::path const c = canonical_of(it->path());
        if (std::any_of(inputs.begin(), inputs.end(), [&](fs::path const& in) { return within(canonical_of(in), c); }))
            continue;  // never delete what this run reads
        out.push_back({it->path(), old, fs::last_write_time(rec, e2)});
    }
    return out;
}

/// Removes what killed runs left next to `target`; when the target itself is
/// missing (a run killed between the two renames of its swap), the newest
/// old report it moved aside is put back first.
void sweep_stale(fs::path const& target, std::string const& marker, std::vector<fs::path> const& inputs,
                 std::vector<fs::path>* with_cache) {
    auto stale = stale_folders(target, inputs);
    if (stale.empty()) return;
    std::sort(stale.begin(), stale.end(), [](auto const& a, auto const& b) { return a.when > b.when; });
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(target, ec)))
        for (auto& s : stale) {
            if (!s.old || !fs::is_regular_file(fs::symlink_status(s.path / marker, ec))) continue;
            fs::rename(s.path, target, ec);
            if (ec) break;
            fs::remove(target / owner_file, ec);
            std::cerr << "qkgeom: note: " << target.string() << " restored from " << s.path.string()
                      << ", where a run that was killed during its swap had moved it\n";
            s.path.clear();
            break;
        }
    std::size_t removed = 0;
    for (auto const& s : stale) {
        if (s.path.empty()) continue;
        if (with_cache != nullptr && !s.old && fs::is_directory(fs::symlink_status(s.path / "cache", ec))) {
            with_cache->push_back(s.path);  // a killed study's staging: its finished entries are kept first
            continue;
        }
        remove_owned(s.path), ++removed;
    }
    if (removed > 0)
        std::cerr << "qkgeom: note: removed " << removed << " folder(s) next to " << target.string()
                  << " left by a qkgeom run that was killed\n";
}

/// Refuses a target that is not absent, an empty directory, or a folder an
/// earlier run marked with `marker`.
void check_target(fs::path const& target, std::string const& marker, std::string const& flag) {
    std::error_code ec;
    auto const st = fs::symlink_status(target, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
        throw run_error(flag + " " + target.string() + ": cannot inspect it: " + why(ec));
    if (!fs::exists(st)) return;
    if (fs::is_symlink(st))
        throw run_error(flag + " " + target.string() +
                        ": is a symbolic link; name the folder itself (a report folder is replaced as a whole)");
    if (!fs::is_directory(st))
        throw run_error(flag + " " + target.string() + ": exists and is not a directory");
    fs::directory_iterator it(target, ec);
    if (ec) throw run_error(flag + " " + target.string() + ": cannot list it: " + why(ec));
    if (it == fs::directory_iterator{}) return;  // empty
    if (!fs::is_regular_file(fs::symlink_status(target / marker, ec)))
        throw run_error(flag + " " + target.string() + ": is a non-empty folder that qkgeom did not write (no " +
                        marker + " in it); refusing to replace it: name a new or empty folder");
}

/// Moves the whole entries (a key folder holding study_key.json; never a
/// `.partial-` or `.stale-` folder) of each killed study's staging cache into
/// `cache`, then removes the staging folder. The entries are checked whole
/// before a study serves them (docs/study.md#caching). Returns how many.
std::size_t keep_killed_caches(std::vector<fs::path> const& killed, fs::path const& cache) {
    std::size_t kept = 0;
    std::error_code ec;
    for (auto const& k : killed) {
        for (fs::directory_iterator it(k / "cache", ec), end; !ec && it != end; it.increment(ec)) {
            std::string const name = it->path().filename().string();
            std::error_code e2;
            if (name.empty() || name.find('.') != std::string::npos ||
                !fs::is_regular_file(fs::symlink_status(it->path() / "study_key.json", e2)))
                continue;
            fs::create_directories(cache, e2);
            if (fs::exists(fs::symlink_status(cache / name, e2))) continue;
            fs::rename(it->path(), cache / name, e2);
            if (!e2) ++kept;
        }
        ec.clear();
        remove_owned(k);
    }
    return kept;
}

}  // namespace output_impl

namespace {
/// The staging folder of this process's output folder and its target: what
/// messages say instead of the staging name (public_paths).
std::mutex staging_mutex;
std::pair<std::string, std::string> staging_names;
}  // namespace

std::string public_paths(std::string msg) {
    std::lock_guard lock(staging_mutex);
    auto const& [from, to] = staging_names;
    if (from.empty()) return msg;
    for (std::size_t at = msg.find(from); at != std::string::npos; at = msg.find(from, at + to.size()))
        msg.replace(at, from.size(), to);
    return msg;
}

std::string test_fault() {
    char const* f = std::getenv("QKGEOM_TEST_FAULT");
    return f != nullptr ? std::string(f) : std::string();
}

output_folder::output_folder(fs::path const& out, std::string marker, std::string flag,
                             std::vector<fs::path> const& inputs, bool keep_study_cache)
    : marker_(std::move(marker)) {
    using namespace output_impl;
    target_ = normalised(out);
    check_inputs(target_, inputs, flag);
    std::vector<fs::path> killed;  // staging folders of killed studies that hold a cache
    sweep_stale(target_, marker_, inputs, keep_study_cache ? &killed : nullptr);
    check_target(target_, marker_, flag);
    std::error_code ec;
    if (!target_.parent_path().empty()) {
        fs::create_directories(target_.parent_path(), ec);
        if (ec)
            throw run_error(flag + " " + target_.string() + ": cannot create its parent folder " +
                            target_.parent_path().string() + ": " + why(ec));
    }
    staging_ = sibling(target_, "staging");
    {
        std::lock_guard lock(staging_mutex);
        staging_names = {staging_.string(), target_.string()};
    }
    if (!fs::create_directory(staging_, ec) || ec)
        throw run_error(flag + " " + target_.string() + ": cannot create a folder next to it (" + staging_.string() +
                        "): " + why(ec));
    try {
        write_text(staging_ / owner_file, owner_text(self_owner()));
    } catch (...) {
        fs::remove_all(staging_, ec);
        throw;
    }
    if (std::size_t const kept = keep_killed_caches(killed, staging_ / "cache"); kept > 0)
        std::cerr << "qkgeom: note: kept the analyses of " << kept << " finished run" << (kept == 1 ? "" : "s")
                  << " of a study into " << target_.string()
                  << " that was killed; they are checked whole before they are served\n";
}

output_folder::~output_folder() {
    if (!committed_) output_impl::remove_owned(staging_);  // best effort: a failed run leaves the old folder as it was
}

void output_folder::commit() {
    using namespace output_impl;
    check_interrupted();  // the last safe point: after it the swap runs to its end
    write_text(staging_ / marker_, "This folder was written by qkgeom; a later run into it replaces it as a whole.\n");
    std::string const fault = test_fault();
    std::error_code ec;
    fs::path old;
    if (fs::exists(fs::symlink_status(target_, ec))) {
        old = sibling(target_, "old");
        fs::rename(target_, old, ec);
        if (ec)
            throw run_error("cannot move the previous " + target_.string() + " aside (to " + old.string() +
                            "): " + why(ec) + "; " + target_.string() + " is left as it was");
        std::ofstream(old / owner_file, std::ios::binary) << owner_text(self_owner());  // best effort
    }
    if (fault == "swap" || fault == "swap-stuck") ec = std::make_error_code(std::errc::io_error);
    else fs::rename(staging_, target_, ec);
    if (ec) {
        std::string const msg = "cannot move the reports from " + staging_.string() + " into " + target_.string() +
                                ": " + why(ec);
        if (old.empty()) throw run_error(msg);
        std::error_code back;
        if (fault != "swap-stuck") fs::rename(old, target_, back);
        else back = std::make_error_code(std::errc::io_error);
        if (!back) {
            fs::remove(target_ / owner_file, back);
            throw run_error(msg + "; the previous report is back in " + target_.string());
        }
        throw run_error(msg + "; the previous report could not be moved back (" + why(back) + ") and is in " +
                        old.string() + " (mv it to " + target_.string() +
                        "; the next qkgeom run into that folder puts it back too)");
    }
    committed_ = true;
    if (!old.empty()) remove_owned(old);
    fs::remove(target_ / owner_file, ec);
}

}  // namespace qkgeom_app
