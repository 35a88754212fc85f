// qkgeom program — `qkgeom analyze DIR -o OUT`: every planned head of a
// capture directory (docs/dataset.md), streamed (one head per worker), with
// the failures listed instead of aborting (docs/cli.md#reliability).
#include "program.hpp"

#include <qkgeom/io/dataset.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace qkgeom_app {

namespace {

namespace fs = std::filesystem;

/// Why a manifest plans no head (the run then fails: nothing to analyse is
/// never a success).
std::string no_heads_reason(fs::path const& dir, qkgeom::io::manifest const& m) {
    std::string const src = (dir / "manifest.json").string() + ": no head to analyse: ";
    if (m.heads && m.heads->count && *m.heads->count == 0) return src + "capture.head_count is 0";
    if (m.heads && m.heads->eligibility == qkgeom::layer_eligibility::full_attention_only)
        return src + "capture.eligibility is full_attention_only and every one of the " + std::to_string(m.n_layers) +
               " layer(s) has a sliding_window (no full-attention layer)";
    return src + "the manifest plans no query head";
}

/// The names in DIR that can hold a head entry (a folder lLLhHHq/, or a file
/// lLLhHHq.npz / .safetensors), without extension; one listing, so a missing
/// entry costs no I/O however many heads the manifest claims.
std::unordered_set<std::string> entry_names(fs::path const& dir) {
    std::unordered_set<std::string> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::string name = it->path().filename().string();
        for (std::string_view ext : {".npz", ".safetensors"})
            if (name.size() > ext.size() && name.ends_with(ext)) name.resize(name.size() - ext.size());
        out.insert(std::move(name));
    }
    if (ec) throw run_error(dir.string() + ": cannot list the capture folder: " + ec.message());
    return out;
}

/// The manifest's head counts, for the stray-entry lines.
std::string counts_text(qkgeom::io::manifest const& m) {
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
void check_context(cli const& c, qkgeom::head_capture<qkgeom::row_matrix> const& head, std::string const& manifest) {
    std::int64_t const L = head.facts.context_length;
    if (L <= 0) return;
    for (auto const* rows : {&head.queries, &head.keys}) {
        auto const& p = rows->position.values();
        if (p.empty()) continue;
        std::int64_t const top = *std::max_element(p.begin(), p.end());
        if (top >= L) {
            bool const q = rows == &head.queries;
            std::string const entry =
                qkgeom::io::head_entry_name(head.id.layer, q ? head.id.q_head : head.id.k_head,
                                            q ? qkgeom::kind::query : qkgeom::kind::key);
            throw run_error(std::string(q ? "query" : "key") + " entry " + entry + ": position " + std::to_string(top) + " is not below the context length " +
                            std::to_string(L) +
                            (c.context > 0 ? " given by --context" : " recorded in " + manifest + " (context_length)"));
        }
    }
}

std::string head_label(qkgeom::head_id const& t) {
    return qkgeom::io::head_entry_name(t.layer, t.q_head, qkgeom::kind::query) + " (layer " + std::to_string(t.layer) +
           ", query head " + std::to_string(t.q_head) + ")";
}

std::string missing_text(fs::path const& dir, std::string const& name) {
    return (dir / name).string() + ": no entry (neither a folder nor a .npz / .safetensors file)";
}

/// failures.txt: one line per failed head, in plan order; a run of at least
/// four planned heads whose query entries are all missing is one line (a
/// manifest claiming a million heads over an empty folder: one line).
std::string failure_text(fs::path const& dir, std::vector<qkgeom::head_id> const& tasks,
                         std::vector<std::string> const& errors, std::vector<char> const& missing) {
    std::string out;
    auto qname = [&](std::size_t i) {
        return qkgeom::io::head_entry_name(tasks[i].layer, tasks[i].q_head, qkgeom::kind::query);
    };
    for (std::size_t i = 0; i < tasks.size();) {
        std::size_t j = i;
        while (j < tasks.size() && missing[j]) ++j;
        if (j - i >= 4) {
            out += qname(i) + " .. " + qname(j - 1) + " (" + std::to_string(j - i) +
                   " planned query heads): no entries in " + dir.string() +
                   " (neither folders nor .npz / .safetensors files)\n";
            i = j;
            continue;
        }
        if (missing[i]) out += head_label(tasks[i]) + ": " + missing_text(dir, qname(i)) + "\n";
        else if (!errors[i].empty()) out += head_label(tasks[i]) + ": " + one_line(errors[i]) + "\n";
        ++i;
    }
    return out;
}

}  // namespace

int run_analyze(cli const& c) {
    auto const m = qkgeom::io::read_manifest(c.dir);
    std::string const manifest = (c.dir / "manifest.json").string();
    // The heads the capture holds (method §0.1 head sample, or all; method §0
    // GQA mapping). A listed head whose entry is missing or bad is a failure,
    // never skipped; an entry outside the manifest is a failure too.
    auto const tasks = qkgeom::io::planned_heads(m);
    if (tasks.empty()) throw run_error(no_heads_reason(c.dir, m));
    output_folder folder(c.out, report_marker, "-o");  // checked before any analysis
    auto const present = entry_names(c.dir);
    std::vector<std::string> stray;
    for (auto const& name : qkgeom::io::stray_entries(c.dir, m))
        stray.push_back(one_line(name) + ": entry outside the manifest's head counts (" + counts_text(m) + " in " +
                        manifest + "); not analysed");
    if (c.strict && !stray.empty()) throw run_error(stray.front());  // before any analysis

    std::vector<std::unique_ptr<qkgeom::head_analysis>> results(tasks.size());
    std::vector<std::string> errors(tasks.size());
    std::vector<char> missing(tasks.size(), 0);
    progress bar(tasks.size(), c.quiet);
    parallel_for(tasks.size(), c.jobs, [&](std::size_t i) {
        auto const& t = tasks[i];
        std::string const name = qkgeom::io::head_entry_name(t.layer, t.q_head, qkgeom::kind::query);
        if (!present.contains(name)) {
            missing[i] = 1;
            if (c.strict) throw run_error(head_label(t) + ": " + missing_text(c.dir, name));
        } else {
            try {
                auto head = qkgeom::io::read_capture(c.dir, m, t);
                apply_overrides(c, head.facts);
                check_context(c, head, manifest);
                results[i] = std::make_unique<qkgeom::head_analysis>(analyze(head, c.opt));
            } catch (std::exception const& e) {
                if (c.strict) throw run_error(head_label(t) + ": " + e.what());
                errors[i] = e.what();
            }
        }
        bar.tick(name);
    });
    std::vector<qkgeom::head_analysis> heads;
    for (auto& r : results)
        if (r) heads.push_back(std::move(*r));
    std::string failures = failure_text(c.dir, tasks, errors, missing);
    for (auto const& s : stray) failures += s + "\n";
    auto const record = run_record(c);
    std::string const intro = "qkgeom analyze of " + c.dir.string() + ": " + std::to_string(heads.size()) + " of " +
                              std::to_string(tasks.size()) + " query heads analysed" +
                              (stray.empty() ? "" : ", " + std::to_string(stray.size()) + " stray entries") + ".";
    report_page page("qkgeom report: " + m.model, intro, c.opt, c.pictures, record);
    fs::path const out = folder.staging();
    qkgeom::model_summary const summary =
        heads.empty() ? qkgeom::summarise_model(heads) : page.add_model(out, "", m.model, heads);
    std::string text = model_table({{m.model, summary}});
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
    std::size_t const failed = tasks.size() - heads.size() + stray.size();
    if (failed > 0) {
        std::cerr << "qkgeom: " << (tasks.size() - heads.size()) << " of " << tasks.size() << " heads failed"
                  << (stray.empty() ? "" : " and " + std::to_string(stray.size()) + " stray entries were found")
                  << " (listed in " << (folder.target() / "failures.txt").string() << ")\n";
        return 3;
    }
    return 0;
}

}  // namespace qkgeom_app
