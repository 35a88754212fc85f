// qkgeom program — declarations shared by its translation units.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/analysis/model.hpp>
#include <qkgeom/capture/synthetic.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/parallel.hpp>
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/study/compute.hpp>

#include <Eigen/Core>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

namespace qkgeom_app {

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
    std::int64_t window = -1;   ///< --window: sliding window for heads whose capture records none (-1: not given)
    std::int64_t context = 0;   ///< --context: context length overriding the capture's (0: not given)
    std::vector<std::filesystem::path> inputs;  ///< merge: the shard files
    std::filesystem::path cache;  ///< study --cache: the cache kept outside OUT (empty: OUT/cache)
    std::string command_line;   ///< the whole command line, as recorded in summary.txt and index.html
};

/// A failure of the run as a whole (exit status 1): its message names the
/// file, field and value.
struct run_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// \brief The folder a run writes (docs/cli.md#the-output-folder).
///
/// The constructor checks the target before any analysis: never equal to,
/// inside or containing one of `inputs` (compared as canonical paths, so
/// through symbolic links too, and no link inside an input folder may point
/// into the target): a run replaces its folder as a whole and must never
/// delete what it reads; then absent, an empty directory, or a folder an
/// earlier run marked with `marker`; anything else (a file, a symlink, a
/// foreign non-empty folder, an uncreatable parent) throws run_error. Staging
/// and old folders next to the target left by a killed run (they carry the
/// owner record `.qkgeom-owner` of a process that is gone) are removed, and
/// an old report whose swap was cut short is put back first. With
/// `keep_study_cache`, the whole cache entries in a killed study's staging
/// folder are moved into the new staging folder's `cache` first, so a study
/// killed even by SIGKILL keeps the runs it finished. The run writes
/// into `staging()`, a fresh folder next to the target that carries its owner
/// record; `commit()` swaps it in, so a folder never mixes two runs. A run
/// that never commits leaves the target as it was.
class output_folder {
public:
    output_folder(std::filesystem::path const& target, std::string marker, std::string flag,
                  std::vector<std::filesystem::path> const& inputs = {}, bool keep_study_cache = false);
    ~output_folder();
    output_folder(output_folder const&) = delete;
    output_folder& operator=(output_folder const&) = delete;
    std::filesystem::path const& staging() const { return staging_; }
    std::filesystem::path const& target() const { return target_; }
    void commit();

private:
    std::filesystem::path target_, staging_;
    std::string marker_;
    bool committed_ = false;
};

/// `msg` with this process's staging folder named as the output folder it
/// stands for: a message about a report file that cannot be written names
/// OUT/file, never the internal `.OUT.staging-*` name.
std::string public_paths(std::string msg);

/// \brief Thrown at a safe point once SIGINT or SIGTERM has arrived
/// (interrupt.cpp). Deliberately not a std::exception: the library's
/// per-head `catch (std::exception const&)` lets it through, so the run
/// stops instead of recording a failed head; the output_folder destructor
/// removes the staging folder while it unwinds. main exits 128 + signal.
struct interrupted {
    int signal;
};

/// Blocks SIGINT and SIGTERM in every thread and starts the thread that
/// waits for them: the first one is recorded (the run stops at its next
/// safe point), a second one ends the process at once (exit 128 + signal;
/// the staging folder is left for the next run into OUT to remove).
/// SIGPIPE is ignored, so a closed stdout is a write error (EPIPE) that
/// finish_stdout reports. Call first in main, before any thread starts.
void install_signal_handling();
/// Whether the immediate "stopping" line is printed on the first signal.
void set_signal_quiet(bool quiet);
/// The signal received so far (SIGINT, SIGTERM), 0 when none.
int received_signal();
/// Throws `interrupted` when a signal has arrived: the safe points (each
/// head's start and end, each demo head, each synth layer, before a swap).
void check_interrupted();
/// The fault the test suite asks for (QKGEOM_TEST_FAULT, docs/cli.md, empty
/// outside the tests): "swap" fails the rename of the staging folder into
/// place, "swap-stuck" fails the move back of the old folder too, "slow" waits
/// 50 ms at every safe point (check_interrupted), "rank-error" fails rank 1's
/// analysis under mpirun (ranks.hpp).
std::string test_fault();
/// The name of a signal ("SIGINT", "SIGTERM").
std::string signal_name(int sig);
/// Flushes stdout; on a write error (EPIPE, ENOSPC, ...) returns the OS's
/// reason, else the empty string.
std::string finish_stdout();

/// The marker file of a report folder (demo, analyze).
inline constexpr char const* report_marker = ".qkgeom-report";
/// The marker file of a capture folder written by synth.
inline constexpr char const* capture_marker = ".qkgeom-capture";

/// The record of a run: (what, value) lines for summary.txt and index.html:
/// the command line, the input, and every option in effect.
std::vector<std::pair<std::string, std::string>> run_record(cli const& c);
/// `record` as the comment block that heads summary.txt ("# what: value").
std::string run_record_text(std::vector<std::pair<std::string, std::string>> const& record);


/// Parses the command line (usage errors exit 2).
cli parse(int argc, char** argv);

class progress {
public:
    progress(std::size_t total, bool quiet)
        : total_(total), quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}
    void tick(std::string const& what) {
        check_interrupted();  // a safe point: after each head (each synth layer)
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
        } else if (total_ <= 200 || done_ % (total_ / 100) == 0 || done_ == total_) {  // at most ~100 lines
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

using qkgeom::parallel_for;  // qkgeom/core/parallel.hpp

/// Runs the command of `c` (main): its exit status; errors as one stderr
/// line (1), an interruption (128 + signal), a stdout write error (1).
int run_command(cli const& c);
int run_synth(cli const& c);
int run_analyze(cli const& c);
int run_demo(cli const& c);
int run_merge(cli const& c);
int run_study_command(cli const& c);

/// The study report (study_command.cpp): the tables, pictures, index.html and
/// summary.txt of a study into `folder`, committed; prints the run table.
/// Returns the exit status (3 when a run failed).
int write_study_report(cli const& c, qkgeom::study::study_spec const& spec,
                       std::vector<qkgeom::study::run_outcome> const& outcomes, output_folder& folder,
                       std::string const& intro);
/// One run's reports (reports.cpp): the CSVs of docs/outputs.md and, when
/// pictures are on, the model's pictures, into `dir`.
void write_run_reports(std::filesystem::path const& dir, std::string const& name,
                       std::vector<qkgeom::head_analysis> const& heads, cli const& c);

/// The command line's overrides of a head's capture facts: --context replaces
/// the context length; --window applies to heads whose capture records none.
void apply_overrides(cli const& c, qkgeom::capture_facts& facts);

/// analyze_head for the program's three row types (analysis.cpp): double
/// rows, the demo's in-memory rows and heads read in single precision
/// (`io::read_capture_rows`).
qkgeom::head_analysis analyze(qkgeom::head_capture<qkgeom::row_matrix> const& head, qkgeom::analysis_options const& opt);
qkgeom::head_analysis analyze(qkgeom::head_capture<Eigen::MatrixXd> const& head, qkgeom::analysis_options const& opt);
qkgeom::head_analysis analyze(qkgeom::head_capture<qkgeom::io::row_matrix_f32> const& head,
                              qkgeom::analysis_options const& opt);

/// The synthetic generator (generate.cpp: instantiated there only).
std::vector<qkgeom::synthetic::head_capture> generate_layer(qkgeom::synthetic::layer_spec const& layer,
                                                            qkgeom::synthetic::capture_spec const& capture);
qkgeom::synthetic::head_capture generate_head(qkgeom::synthetic::layer_spec const& layer,
                                              qkgeom::synthetic::capture_spec const& capture, std::int64_t q_head);

/// Reports (reports.cpp).
std::string model_table(std::vector<std::pair<std::string, qkgeom::model_summary>> const& table);
/// Writes `text` to `p` (run_error naming the file and the OS's reason).
void write_text(std::filesystem::path const& p, std::string const& text);
/// `msg` on one line: control characters escaped (\n, \r, \t, \xNN), so a
/// message quoting bytes of a file never breaks a line of stderr or failures.txt.
std::string one_line(std::string_view msg);
/// The notes on NaN columns a reader would otherwise have to puzzle out
/// (e.g. ap_last_20pct NaN because the sequences are shorter than the
/// recorded context length); empty when there is nothing to say.
std::string nan_notes(std::vector<qkgeom::head_analysis> const& heads);
/// The reports of one run: per model its CSVs (and pictures) under its
/// directory, then the model comparison and index.html (reports.cpp).
class report_page {
public:
    report_page(std::string title, std::string intro, qkgeom::analysis_options const& opt, bool pictures,
                std::vector<std::pair<std::string, std::string>> run = {});
    ~report_page();
    report_page(report_page const&) = delete;
    report_page& operator=(report_page const&) = delete;

    /// One model: CSVs, and the pictures when enabled, under `dir`; `prefix`
    /// is `dir` relative to index.html. Returns the model summary.
    qkgeom::model_summary add_model(std::filesystem::path const& dir, std::string const& prefix,
                                    std::string const& name, std::vector<qkgeom::head_analysis> const& heads);
    /// The model comparison picture and index.html under `out` (when pictures
    /// are enabled), listing `files` next to it.
    void finish(std::filesystem::path const& out, std::vector<std::string> const& files);

private:
    struct impl;
    impl* impl_;
};

}  // namespace qkgeom_app
