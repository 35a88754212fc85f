// qkgeom program — `qkgeom analyze DIR -o OUT`: every planned head of a
// capture directory (docs/dataset.md), streamed (one head per worker), with
// the failures listed instead of aborting.
#include "program.hpp"

#include <qkgeom/io/dataset.hpp>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace qkgeom_app {

int run_analyze(cli const& c) {
    auto const m = qkgeom::io::read_manifest(c.dir);
    // The heads the capture holds (method §0.1 head sample, or all; method §0
    // GQA mapping). A listed head whose entry is missing or bad is a failure,
    // never skipped.
    auto const tasks = qkgeom::io::planned_heads(m);
    std::vector<std::optional<qkgeom::head_analysis>> results(tasks.size());
    std::vector<std::string> errors(tasks.size());
    progress bar(tasks.size(), c.quiet);
    parallel_for(tasks.size(), c.jobs, [&](std::size_t i) {
        auto const& t = tasks[i];
        std::string const name = qkgeom::io::head_entry_name(t.layer, t.q_head, qkgeom::kind::query);
        try {
            auto head = qkgeom::io::read_capture(c.dir, m, t);
            apply_overrides(c, head.facts);
            results[i] = analyze(head, c.opt);
        } catch (std::exception const& e) {
            if (c.strict) throw;
            errors[i] = e.what();
        }
        bar.tick(name);
    });
    std::vector<qkgeom::head_analysis> heads;
    std::string failures;
    for (std::size_t i = 0; i < tasks.size(); ++i) {
        if (results[i]) heads.push_back(std::move(*results[i]));
        else
            failures += "l" + std::to_string(tasks[i].layer) + " q_head " + std::to_string(tasks[i].q_head) + ": " +
                        errors[i] + "\n";
    }
    std::filesystem::create_directories(c.out);
    report_page page("qkgeom report: " + m.model,
                     "qkgeom analyze of " + c.dir.string() + ": " + std::to_string(heads.size()) + " of " +
                         std::to_string(tasks.size()) + " query heads analysed.",
                     c.opt, c.pictures);
    qkgeom::model_summary const summary =
        heads.empty() ? qkgeom::summarise_model(heads) : page.add_model(c.out, "", m.model, heads);
    write_text(c.out / "failures.txt", failures);
    std::string const text = model_table({{m.model, summary}});
    write_text(c.out / "summary.txt", text);
    std::vector<std::string> files{"summary.txt"};
    if (!failures.empty()) files.emplace_back("failures.txt");
    page.finish(c.out, files);
    std::cout << text << "reports written to " << c.out.string() << "/\n";
    if (!failures.empty()) {
        std::cerr << "qkgeom: " << (tasks.size() - heads.size()) << " of " << tasks.size()
                  << " heads failed (listed in " << (c.out / "failures.txt").string() << ")\n";
        return 3;
    }
    return 0;
}

}  // namespace qkgeom_app
