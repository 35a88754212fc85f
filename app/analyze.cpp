// qkgeom program — `qkgeom analyze DIR -o OUT`: every planned head of a
// capture directory (docs/dataset.md), streamed (one head per worker), with
// the failures listed instead of aborting (docs/cli.md#reliability).
#include "program.hpp"

#include <qkgeom/io/dataset.hpp>
#include <qkgeom/run/dataset_analysis.hpp>

#include <cstddef>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace qkgeom_app {

namespace {

namespace fs = std::filesystem;

std::string qname(qkgeom::head_id const& t) {
    return qkgeom::io::head_entry_name(t.layer, t.q_head, qkgeom::kind::query);
}

/// failures.txt: one line per failed head, in plan order; a run of at least
/// four planned heads whose query entries are all missing is one line (a
/// manifest claiming a million heads over an empty folder: one line); then
/// the stray entries.
std::string failure_text(qkgeom::io::dataset_run const& run) {
    std::string out;
    auto const& miss = run.missing;
    auto const& bad = run.failures;
    std::size_t a = 0, b = 0;
    while (a < miss.size() || b < bad.size()) {
        if (b < bad.size() && (a >= miss.size() || bad[b].index < miss[a])) {
            out += qkgeom::io::dataset_head_label(bad[b].id) + ": " + one_line(bad[b].message) + "\n";
            ++b;
            continue;
        }
        std::size_t j = a + 1;  // the run of consecutive missing heads [a, j)
        while (j < miss.size() && miss[j] == miss[j - 1] + 1) ++j;
        if (j - a >= 4) {
            out += qname(run.planned[miss[a]]) + " .. " + qname(run.planned[miss[j - 1]]) + " (" +
                   std::to_string(j - a) + " planned query heads): no entries in " + run.dir.string() +
                   " (neither folders nor .npz / .safetensors files)\n";
        } else {
            for (std::size_t k = a; k < j; ++k)
                out += qkgeom::io::dataset_head_label(run.planned[miss[k]]) + ": " +
                       qkgeom::io::missing_entry_message(run, miss[k]) + "\n";
        }
        a = j;
    }
    for (auto const& s : run.stray) out += one_line(s.name) + ": " + s.message + "\n";
    return out;
}

/// The heads of a run through the program's analyze (analysis.cpp: the
/// engines are instantiated there once), each read in its stored precision
/// (f32 / f16 / bf16 rows stay floats; results bit-identical to double rows).
qkgeom::io::dataset_run analyze_folder(cli const& c, qkgeom::io::dataset_plan plan, progress& bar) {
    qkgeom::io::dataset_run_options o;
    o.analysis = c.opt;
    o.jobs = c.jobs;
    o.strict = c.strict;
    o.context = c.context;
    o.window = c.window;
    o.context_name = "--context";
    o.on_head_done = [&bar](std::string const& name) { bar.tick(name); };
    qkgeom::io::head_analyzers const a{
        [](qkgeom::head_capture<qkgeom::row_matrix> const& h, qkgeom::analysis_options const& opt) {
            check_interrupted();  // a safe point: before each head
            return analyze(h, opt);
        },
        [](qkgeom::head_capture<qkgeom::io::row_matrix_f32> const& h, qkgeom::analysis_options const& opt) {
            check_interrupted();
            return analyze(h, opt);
        }};
    return qkgeom::io::analyze_dataset(std::move(plan), o, a);
}

}  // namespace

int run_analyze(cli const& c) {
    // The heads the capture holds (method §0.1 head sample, or all; method §0
    // GQA mapping). A listed head whose entry is missing or bad is a failure,
    // never skipped; an entry outside the manifest is a failure too
    // (qkgeom/run/dataset_analysis.hpp).
    auto plan = qkgeom::io::plan_dataset(c.dir);
    output_folder folder(c.out, report_marker, "-o", {c.dir});  // checked before any analysis
    progress bar(plan.planned.size(), c.quiet);
    auto const run = analyze_folder(c, std::move(plan), bar);
    auto const& heads = run.heads;
    std::size_t const planned = run.planned.size(), stray = run.stray.size();
    std::string const failures = failure_text(run);
    auto const record = run_record(c);
    std::string const intro = "qkgeom analyze of " + c.dir.string() + ": " + std::to_string(heads.size()) + " of " +
                              std::to_string(planned) + " query heads analysed" +
                              (stray == 0 ? "" : ", " + std::to_string(stray) + " stray entries") + ".";
    report_page page("qkgeom report: " + run.m.model, intro, c.opt, c.pictures, record);
    fs::path const out = folder.staging();
    qkgeom::model_summary const summary =
        heads.empty() ? qkgeom::summarise_model(heads) : page.add_model(out, "", run.m.model, heads);
    std::string text = model_table({{run.m.model, summary}});
    std::string const note = nan_notes(heads);
    std::vector<std::string> files{"summary.txt"};
    if (!failures.empty()) {
        write_text(out / "failures.txt", failures);
        files.emplace_back("failures.txt");
    }
    write_text(out / "summary.txt", run_record_text(record) + "# " + intro + "\n" + text + note);
    page.finish(out, files);
    folder.commit();
    std::cout << text << note << "reports written to " << folder.target().string() << "/\n";
    std::size_t const failed = planned - heads.size() + stray;
    if (failed > 0) {
        std::cerr << "qkgeom: " << (planned - heads.size()) << " of " << planned << " heads failed"
                  << (stray == 0 ? "" : " and " + std::to_string(stray) + " stray entries were found")
                  << " (listed in " << (folder.target() / "failures.txt").string() << ")\n";
        return 3;
    }
    return 0;
}

}  // namespace qkgeom_app
