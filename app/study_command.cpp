// qkgeom program — `qkgeom study STUDY_FILE -o OUT`: every run of a study
// file analysed once (cached by capture content and options) and compared in
// tables, pictures and one index.html (docs/study.md); and the report writer
// the demo shares.
#include "program.hpp"
#include "ranks.hpp"

#include <qkgeom/core/bytes.hpp>

#include <qkgeom/report/csv.hpp>
#include <qkgeom/report/study_html.hpp>
#include <qkgeom/report/study_svg.hpp>
#include <qkgeom/report/study_tables.hpp>
#include <qkgeom/run/study_run.hpp>
#include <qkgeom/run/study_spec.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace qkgeom_app {

namespace {

namespace fs = std::filesystem;
namespace st = qkgeom::study;

std::string number(double x, char const* fmt) {
    if (!std::isfinite(x)) return "nan";
    char b[64];
    std::snprintf(b, sizeof b, fmt, x);
    return b;
}

/// run_all; when a signal stops it and OUT is an earlier qkgeom report, the
/// cache entries of the runs finished so far are moved into OUT/cache (whole
/// entries only; the report files are left as they were), so the next study
/// into OUT serves them as `cached` instead of analysing them again.
std::vector<st::run_outcome> run_keeping_finished(st::study_spec const& spec, st::study_run_options const& o,
                                                  output_folder const& folder) {
    try {
        return st::run_all(spec, o);
    } catch (interrupted const&) {
        std::error_code ec;
        if (!fs::exists(folder.target() / report_marker, ec)) throw;
        fs::path const keep = folder.target() / "cache";
        std::size_t kept = 0;
        for (fs::directory_iterator it(o.cache, ec), end; !ec && it != end; it.increment(ec)) {
            std::string const name = it->path().filename().string();
            if (name.empty() || name[0] == '.' || name.find(".partial-") != std::string::npos) continue;
            if (!fs::is_regular_file(it->path() / "study_key.json", ec)) continue;  // not a whole entry
            fs::create_directories(keep, ec);
            if (fs::exists(keep / name, ec)) continue;
            fs::rename(it->path(), keep / name, ec);
            if (!ec) ++kept;
            ec.clear();
        }
        if (kept > 0)
            std::cerr << "qkgeom: kept the analyses of " << kept << " finished run" << (kept == 1 ? "" : "s") << " in "
                      << one_line(keep.string()) << " (the report is unchanged); the next study into "
                      << one_line(folder.target().string()) << " reuses them\n";
        throw;
    }
}

/// What a rank did with one run of a study (mpirun): its cache key, or
/// what its analysis ended with.
struct run_done {
    std::size_t index = 0;
    std::string key;
    st::run_status status = st::run_status::failed;
    std::string note, message;
};

/// Every rank's records of one phase (gather_results), by run index.
std::map<std::size_t, run_done> by_index(std::vector<std::string> const& parts) {
    std::map<std::size_t, run_done> done;
    for (auto const& p : parts)
        for (auto& r : qkgeom::from_bytes<std::vector<run_done>>(p)) done[r.index] = std::move(r);
    return done;
}

/// `step` on the runs `which`, handed out across the ranks; rank 0 gets the records.
std::map<std::size_t, run_done> on_runs(std::vector<std::size_t> const& which,
                                        std::function<run_done(std::size_t)> const& step) {
    ranks::hand_out runs(which.size());
    return by_index(ranks::gather_results([&] {
        std::vector<run_done> mine;
        while (auto const k = runs.next()) {
            mine.push_back(step(which[*k]));
            check_interrupted();
        }
        return qkgeom::to_bytes(mine);
    }));
}

/// The runs of a study. One process: run_all (run_keeping_finished). Under
/// mpirun (docs/scale.md): (1) the capture runs' cache keys, handed out
/// across the ranks; (2) the first run of each key in study order analysed
/// on the ranks, into the one cache in OUT's staging folder (a file system
/// every rank sees); (3) rank 0 goes through the study in order as one
/// process would: each capture run's entry read back with the status its
/// rank recorded, a later run of the same key `cached`, so the report is the
/// same bytes for any number of ranks. The other ranks get no outcomes.
/// `kept_cache`: o.cache is the user's (--cache), not OUT's, so nothing is
/// moved on an interruption: its entries stay where they are.
std::vector<st::run_outcome> run_study_ranks(st::study_spec const& spec, st::study_run_options o,
                                             std::optional<output_folder> const& folder, bool kept_cache) {
    if (ranks::size() == 1) return kept_cache ? st::run_all(spec, o) : run_keeping_finished(spec, o, *folder);
    st::apply_study_options(spec, o.analysis, o.context, o.window);  // as run_all: the file's options win
    std::vector<std::size_t> captures;
    for (std::size_t i = 0; i < spec.runs.size(); ++i)
        if (spec.runs[i].metrics.empty() && spec.runs[i].analysis.empty()) captures.push_back(i);
    auto const keys = on_runs(captures, [&](std::size_t i) {
        run_done d{i, {}, st::run_status::analysed, {}, {}};
        try {
            d.key = st::run_cache_key(spec.runs[i], o);
        } catch (std::exception const&) {  // the analysis says why
        }
        return d;
    });
    std::vector<std::size_t> first;  // the first run of each key (rank 0 decides, every rank learns)
    std::map<std::string, std::size_t> seen;
    for (auto const& [i, d] : keys)
        if (d.key.empty() || seen.emplace(d.key, i).second) first.push_back(i);
    first = qkgeom::from_bytes<std::vector<std::size_t>>(ranks::broadcast(qkgeom::to_bytes(first)));
    auto const done = on_runs(first, [&](std::size_t i) {
        auto const oc = st::run_one(spec.runs[i], o);
        return run_done{i, oc.folder.filename().string(), oc.status, oc.note, oc.message};
    });
    if (ranks::rank() != 0) return {};
    std::vector<st::run_outcome> out;
    for (std::size_t i = 0; i < spec.runs.size(); ++i) {
        st::run_outcome oc;
        auto const k = keys.find(i);
        auto const it = k == keys.end() || k->second.key.empty() ? done.find(i) : done.find(seen.at(k->second.key));
        if (k == keys.end()) {
            oc = st::run_one(spec.runs[i], o);  // given metrics or an analysis folder: cheap
        } else if (it == done.end() || it->second.status == st::run_status::failed) {
            if (it != done.end() && it->first == i) {
                oc.status = st::run_status::failed;
                oc.message = it->second.message;
            } else {
                oc = st::run_one(spec.runs[i], o);  // as one process: the earlier run of its key failed
            }
        } else if (it->first == i) {
            oc = st::cached_run(spec.runs[i], o, it->second.key, it->second.status);
            oc.note = it->second.note;
        } else {
            oc = st::cached_run(spec.runs[i], o, it->second.key, st::run_status::cached);
        }
        if (o.on_run) o.on_run(i, oc);
        out.push_back(std::move(oc));
    }
    return out;
}

/// The run table of summary.txt and stdout: one line per run.
std::string run_table(st::study_result const& r) {
    std::string text = "run                  status    heads  ap_overall  ap_first_20pct  ap_last_20pct  ap_drop  "
                       "bias_strength\n";
    for (auto const& run : r.runs) {
        auto v = [&](char const* m) {
            auto const it = run.metrics.find(m);
            return it == run.metrics.end() ? qkgeom::study::nan : it->second.value;
        };
        char line[512];
        std::snprintf(line, sizeof line, "%-20s %-8s %6lld  %10s  %14s  %13s  %7s  %13s\n", run.spec.name.c_str(),
                      std::string(st::to_string(run.status)).c_str(), static_cast<long long>(run.n_heads),
                      number(v("ap_overall"), "%.4f").c_str(), number(v("ap_first_20pct"), "%.4f").c_str(),
                      number(v("ap_last_20pct"), "%.4f").c_str(), number(v("ap_drop"), "%.4f").c_str(),
                      number(v("bias_strength"), "%.3g").c_str());
        text += line;
    }
    return text;
}

}  // namespace

int write_study_report(cli const& c, st::study_spec const& spec, std::vector<st::run_outcome> const& outcomes,
                       output_folder& folder, std::string const& intro) {
    fs::path const out = folder.staging();
    auto const result = st::compute_study(spec, outcomes);
    std::vector<std::string> tables;
    for (auto const& t : st::study_tables(result)) {
        st::write_table(out / t.file, t);
        tables.push_back(t.file);
    }
    auto const record = run_record(c);
    std::string const text = run_table(result);
    std::string failures;
    for (auto const& run : result.runs)
        if (run.status == st::run_status::failed) failures += run.spec.name + ": " + one_line(run.message) + "\n";
    tables.emplace_back("summary.txt");
    if (!failures.empty()) {
        write_text(out / "failures.txt", failures);
        tables.emplace_back("failures.txt");
    }
    write_text(out / "summary.txt", run_record_text(record) + "# " + intro + "\n" + text);
    if (c.pictures) {
        qkgeom::report::study_page page;
        page.title = spec.title.empty() ? "qkgeom study" : spec.title;
        page.intro = intro;
        page.run = record;
        page.tables = tables;
        page.pictures = qkgeom::report::write_study_pictures(out, result);
        qkgeom::report::write_study_index_html(out / std::string(qkgeom::report::index_html_file), result, page);
    }
    folder.commit();
    std::cout << text << "study written to " << folder.target().string() << "/\n";
    if (!failures.empty()) {
        std::cerr << "qkgeom: runs failed (listed in " << (folder.target() / "failures.txt").string() << "):\n"
                  << failures;
        return 3;
    }
    return 0;
}

int run_study_command(cli const& given) {
    st::study_spec spec;
    ranks::on_every_rank([&] { spec = st::read_study(given.dir); });
    // A run's model that a benchmark does not score: its score is NaN and it
    // is left out of that benchmark's correlations; said, never silent.
    for (auto const& b : spec.benchmarks) {
        if (b.overall_file.empty() || ranks::rank() != 0) continue;
        std::set<std::string> missing;
        for (auto const& r : spec.runs)
            if (!b.overall.count(r.model)) missing.insert(r.model);
        std::string list;
        for (auto const& m : missing) list += (list.empty() ? "'" : ", '") + one_line(m) + "'";
        if (!missing.empty())
            std::cerr << "qkgeom: note: " << one_line(b.overall_file.string()) << " (benchmark " << one_line(b.name)
                      << ") has no score for model " << list
                      << ": its score is nan and it is left out of that benchmark's correlations\n";
    }
    cli c = given;  // the study file's "options" win over the command line's (docs/study.md)
    st::apply_study_options(spec, c.opt, c.context, c.window);
    // Everything the study reads: never inside, around or equal to OUT.
    std::vector<fs::path> inputs{given.dir};
    for (auto const& r : spec.runs)
        for (auto const& p : {r.capture, r.analysis})
            if (!p.empty()) inputs.push_back(p);
    for (auto const& b : spec.benchmarks)
        for (auto const& p : {b.overall_file, b.by_length_file})
            if (!p.empty()) inputs.push_back(p);
    if (!c.cache.empty()) inputs.push_back(c.cache);  // OUT is replaced whole: never around or inside the cache
    std::optional<output_folder> folder;  // checked before any analysis, by rank 0
    // without --cache, a killed study's finished entries in its staging folder are kept (output_folder)
    ranks::on_rank_zero([&] { folder.emplace(c.out, report_marker, "-o", inputs, c.cache.empty()); });
    st::study_run_options o;
    o.analysis = c.opt;
    o.jobs = c.jobs;
    o.context = c.context;
    o.window = c.window;
    o.cache = !c.cache.empty() ? c.cache
                               : fs::path(ranks::broadcast(folder ? (folder->staging() / "cache").string() : std::string()));
    // The report this one replaces (output_folder checked its marker): its
    // cache entries are reused when their key matches.
    std::error_code ec;
    if (fs::is_directory(c.out / "cache", ec)) o.previous_caches.push_back(c.out / "cache");
    o.analyzer = [](qkgeom::head_capture<qkgeom::row_matrix> const& h, qkgeom::analysis_options const& opt) {
        check_interrupted();  // the safe points: each head's start and end, each run's end
        return analyze(h, opt);
    };
    // f32 / f16 / bf16 captures stay floats, as in `qkgeom analyze` (bit-identical results).
    o.analyzer_f32 = [](qkgeom::head_capture<qkgeom::io::row_matrix_f32> const& h,
                        qkgeom::analysis_options const& opt) {
        check_interrupted();
        return analyze(h, opt);
    };
    o.on_head_done = [](std::string const&) { check_interrupted(); };
    o.on_run = [&](std::size_t i, st::run_outcome const& r) {
        check_interrupted();
        // A damaged cache entry analysed again is said even with --quiet.
        if (!r.note.empty()) std::cerr << "qkgeom: note: run " << one_line(spec.runs[i].name) << ": " << one_line(r.note) << "\n";
        if (c.quiet) return;
        std::cerr << "qkgeom: run " << spec.runs[i].name << ": " << st::to_string(r.status)
                  << (r.message.empty() ? "" : " (" + one_line(r.message) + ")") << "\n";
    };
    auto const outcomes = run_study_ranks(spec, o, folder, !c.cache.empty());
    if (ranks::rank() != 0) return 0;  // rank 0 writes the report
    std::string const intro = "qkgeom study of " + c.dir.string() + ": " + std::to_string(spec.runs.size()) + " runs.";
    return write_study_report(c, spec, outcomes, *folder, intro);
}

}  // namespace qkgeom_app
