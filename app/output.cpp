// qkgeom program — the output folder of a run (docs/cli.md#the-output-folder):
// checked before any analysis, written as a fresh staging folder next to the
// target and swapped in at the end, so a folder never mixes two runs.
#include "program.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include <unistd.h>

namespace qkgeom_app {

namespace fs = std::filesystem;

namespace {

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

}  // namespace

output_folder::output_folder(fs::path const& out, std::string marker, std::string flag)
    : marker_(std::move(marker)) {
    target_ = normalised(out);
    check_target(target_, marker_, flag);
    std::error_code ec;
    if (!target_.parent_path().empty()) {
        fs::create_directories(target_.parent_path(), ec);
        if (ec)
            throw run_error(flag + " " + target_.string() + ": cannot create its parent folder " +
                            target_.parent_path().string() + ": " + why(ec));
    }
    staging_ = sibling(target_, "staging");
    if (!fs::create_directory(staging_, ec) || ec)
        throw run_error(flag + " " + target_.string() + ": cannot create a folder next to it (" + staging_.string() +
                        "): " + why(ec));
}

output_folder::~output_folder() {
    if (committed_) return;
    std::error_code ec;
    fs::remove_all(staging_, ec);  // best effort: a failed run leaves the old folder as it was
}

void output_folder::commit() {
    write_text(staging_ / marker_, "This folder was written by qkgeom; a later run into it replaces it as a whole.\n");
    std::error_code ec;
    fs::path old;
    if (fs::exists(fs::symlink_status(target_, ec))) {
        old = sibling(target_, "old");
        fs::rename(target_, old, ec);
        if (ec) throw run_error("cannot move the previous " + target_.string() + " aside: " + why(ec));
    }
    fs::rename(staging_, target_, ec);
    if (ec) {
        std::error_code back;
        if (!old.empty()) fs::rename(old, target_, back);
        throw run_error("cannot move the reports into " + target_.string() + ": " + why(ec));
    }
    committed_ = true;
    if (!old.empty()) fs::remove_all(old, ec);  // remove_all never follows symlinks
}

}  // namespace qkgeom_app
