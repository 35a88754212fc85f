// qkgeom program — `qkgeom analyze DIR -o OUT`: every planned head of a
// capture directory (docs/dataset.md), streamed (one head per worker), with
// the failures listed instead of aborting (docs/cli.md#reliability).
#include "program.hpp"
#include "ranks.hpp"

#include <qkgeom/core/bytes.hpp>

#include <qkgeom/io/dataset.hpp>
#include <qkgeom/run/dataset_analysis.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
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

/// What one rank analysed of a dataset (the lists of its dataset_run).
struct rank_share {
    std::vector<qkgeom::head_analysis> heads;
    std::vector<std::size_t> missing;
    std::vector<qkgeom::io::dataset_failure> failures;
};

/// Rank 0: every rank's share (rank order) put into `run` in plan order, as
/// one process would have listed them: the reports are the same bytes for
/// any number of ranks.
void in_plan_order(qkgeom::io::dataset_run& run, std::vector<std::string> const& parts) {
    std::map<qkgeom::head_id, std::size_t> index;
    for (std::size_t i = 0; i < run.planned.size(); ++i) index.emplace(run.planned[i], i);
    std::vector<std::unique_ptr<qkgeom::head_analysis>> heads(run.planned.size());
    std::vector<std::unique_ptr<qkgeom::io::dataset_failure>> failed(run.planned.size());
    std::vector<char> missing(run.planned.size(), 0);
    for (auto const& p : parts) {
        auto share = qkgeom::from_bytes<rank_share>(p);
        for (auto& h : share.heads) {
            auto const it = index.find(h.id);
            if (it == index.end()) throw run_error("a rank returned a head outside the plan");
            heads[it->second] = std::make_unique<qkgeom::head_analysis>(std::move(h));
        }
        for (auto const i : share.missing) missing.at(i) = 1;
        for (auto& f : share.failures) failed.at(f.index) = std::make_unique<qkgeom::io::dataset_failure>(std::move(f));
    }
    run.heads.clear();
    run.missing.clear();
    run.failures.clear();
    for (std::size_t i = 0; i < run.planned.size(); ++i) {
        if (heads[i]) run.heads.push_back(std::move(*heads[i]));
        else if (missing[i]) run.missing.push_back(i);
        else if (failed[i]) run.failures.push_back(std::move(*failed[i]));
        else throw run_error("head " + qkgeom::io::dataset_head_label(run.planned[i]) + " was analysed by no rank");
    }
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
    if (ranks::size() == 1) return qkgeom::io::analyze_dataset(std::move(plan), o, a);
    // Under mpirun: the heads handed out one at a time across the ranks;
    // rank 0 gathers every rank's lists and puts them in plan order.
    ranks::hand_out heads(plan.planned.size());
    o.next_head = [&heads] { return heads.next(); };
    qkgeom::io::dataset_run run;
    auto const parts = ranks::gather_results([&] {
        if (ranks::rank() == 1 && test_fault() == "rank-error")
            throw run_error("the planted failure of QKGEOM_TEST_FAULT=rank-error");
        run = qkgeom::io::analyze_dataset(std::move(plan), o, a);
        return qkgeom::to_bytes(rank_share{std::move(run.heads), std::move(run.missing), std::move(run.failures)});
    });
    if (ranks::rank() != 0) return run;
    in_plan_order(run, parts);
    if (!c.quiet) {  // what crossed the network: the results, never rows (docs/scale.md)
        std::size_t bytes = 0;
        for (std::size_t r = 1; r < parts.size(); ++r) bytes += parts[r].size();
        std::size_t const sent = run.heads.size() > 0 ? run.heads.size() : 1;
        std::cerr << "qkgeom: " << run.planned.size() << " heads on " << ranks::size() << " ranks; rank 0 received "
                  << bytes << " bytes of results from the others (" << (bytes + parts[0].size()) / sent
                  << " bytes a head)\n";
    }
    return run;
}

}  // namespace

int run_analyze(cli const& c) {
    // The heads the capture holds (method §0.1 head sample, or all; method §0
    // GQA mapping). A listed head whose entry is missing or bad is a failure,
    // never skipped; an entry outside the manifest is a failure too
    // (qkgeom/run/dataset_analysis.hpp).
    qkgeom::io::dataset_plan plan;
    ranks::on_every_rank([&] { plan = qkgeom::io::plan_dataset(c.dir); });
    std::optional<output_folder> out_folder;  // checked before any analysis, by rank 0
    ranks::on_rank_zero([&] { out_folder.emplace(c.out, report_marker, "-o", std::vector<fs::path>{c.dir}); });
    progress bar(plan.planned.size(), c.quiet || ranks::size() > 1);
    auto const run = analyze_folder(c, std::move(plan), bar);
    if (ranks::rank() != 0) return 0;  // rank 0 writes the reports
    output_folder& folder = *out_folder;
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
