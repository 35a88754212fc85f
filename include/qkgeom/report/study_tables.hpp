// qkgeom — a study's tables as named columns (docs/study.md#tables): the CSV
// files of `qkgeom study` and the DataFrames of qkgeom.study() are both made
// from study_tables().
#pragma once

#include <qkgeom/report/csv.hpp>
#include <qkgeom/study/metrics.hpp>
#include <qkgeom/study/types.hpp>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace qkgeom {
namespace study {

/// \brief One table: a file name, its columns and rows of cells (text,
/// integer or number; NaN written `nan`).
struct table {
    using cell = std::variant<std::string, std::int64_t, double>;
    std::string file;
    std::vector<std::string> columns;
    std::vector<std::vector<cell>> rows;
};

/// \brief The name of a run status as the tables write it.
/// \param[in] s the status.
/// \returns "analysed", "cached", "read", "given" or "failed".
constexpr std::string_view to_string(run_status s) noexcept {
    switch (s) {
        case run_status::analysed: return "analysed";
        case run_status::cached: return "cached";
        case run_status::read: return "read";
        case run_status::given: return "given";
        case run_status::failed: break;
    }
    return "failed";
}

namespace detail {

inline std::vector<table::cell> run_key(run_summary const& r) {
    auto const& c = r.spec.ckpt;
    return {r.spec.name, r.spec.family, r.spec.model, c.phase, c.step ? table::cell(*c.step) : table::cell(nan),
            c.tokens ? *c.tokens : nan, c.order ? *c.order : nan};
}
inline std::vector<std::string> run_key_columns() { return {"run", "family", "model", "phase", "step", "tokens", "order"}; }

inline table model_table(study_result const& r) {
    table t{"study_models.csv", run_key_columns(), {}};
    for (auto const* c : {"status", "message", "n_heads", "n_layers"}) t.columns.emplace_back(c);
    for (auto const& b : r.benchmarks) t.columns.push_back("score_" + b);
    auto const names = study_metric_names();
    for (auto const& m : names)
        for (auto const* suffix : {"", "_lo", "_hi", "_n"}) t.columns.push_back(m + suffix);
    for (auto const& run : r.runs) {
        auto row = run_key(run);
        row.insert(row.end(), {std::string(to_string(run.status)), run.message, run.n_heads, run.n_layers});
        for (auto const& b : r.benchmarks) {
            auto const it = run.scores.find(b);
            row.emplace_back(it == run.scores.end() ? nan : it->second);
        }
        for (auto const& m : names) {
            auto const it = run.metrics.find(m);
            estimate const e = it == run.metrics.end() ? estimate{} : it->second;
            row.insert(row.end(), {e.value, e.lo, e.hi, e.n});
        }
        t.rows.push_back(std::move(row));
    }
    return t;
}

inline table profile_table(study_result const& r) {
    table t{"study_profiles.csv", run_key_columns(), {}};
    for (auto const* c : {"profile", "bin", "lo", "hi", "plasticity"}) t.columns.emplace_back(c);
    for (auto const& run : r.runs) {
        if (run.status == run_status::failed) continue;
        auto add = [&](char const* kind, std::size_t i, double lo, double hi, double v) {
            auto row = run_key(run);
            row.insert(row.end(), {std::string(kind), std::int64_t(i), lo, hi, v});
            t.rows.push_back(std::move(row));
        };
        for (std::size_t i = 0; i < 5; ++i) add("quintile", i, double(i) / 5, double(i + 1) / 5, run.quintile[i]);
        for (std::size_t i = 0; i < 10; ++i) add("decile", i, double(i) / 10, double(i + 1) / 10, run.decile[i]);
        for (std::size_t i = 0; i < run.token_profile.size(); ++i)
            add("tokens", i, r.token_edges[i], r.token_edges[i + 1], run.token_profile[i]);
    }
    return t;
}

inline double metric_value(run_summary const& run, std::string const& m) {
    auto const it = run.metrics.find(m);
    return it == run.metrics.end() ? nan : it->second.value;
}

inline table trajectory_table(study_result const& r) {
    static constexpr std::array<std::string_view, 8> shown{"ap_overall",    "ap_first_20pct", "ap_last_20pct",
                                                           "ap_drop",       "bias_strength",  "abs_alpha_k",
                                                           "abs_mu_q_a",    "abs_r_k_a"};
    table t{"study_trajectory.csv", run_key_columns(), {}};
    t.columns.emplace_back("step_index");
    for (auto m : shown) t.columns.emplace_back(m);
    for (auto m : shown) t.columns.push_back("delta_" + std::string(m));
    for (auto const* c : {"gm_abs_bias_strength", "gm_abs_mu_q_a", "gm_abs_alpha_k", "n_decomposed",
                          "dlog_bias_strength", "dlog_mu_q_a", "dlog_alpha_k"})
        t.columns.emplace_back(c);
    std::string model;
    std::int64_t k = 0;
    for (auto const& s : r.trajectory) {
        k = s.model == model ? k + 1 : 0;
        model = s.model;
        auto const& run = r.runs[s.run];
        auto row = run_key(run);
        row.emplace_back(k);
        for (auto m : shown) row.emplace_back(metric_value(run, std::string(m)));
        for (auto m : shown)
            row.emplace_back(s.from < r.runs.size()
                                 ? metric_value(run, std::string(m)) - metric_value(r.runs[s.from], std::string(m))
                                 : nan);
        row.insert(row.end(), {s.gm_bias, s.gm_mu_q_a, s.gm_alpha_k, s.n_decomposed, s.dlog_bias, s.dlog_mu_q_a,
                               s.dlog_alpha_k});
        t.rows.push_back(std::move(row));
    }
    return t;
}

inline table taxonomy_table(study_result const& r) {
    table t{"study_taxonomy.csv", run_key_columns(), {}};
    for (auto const* c : {"class", "count", "share"}) t.columns.emplace_back(c);
    for (auto const& run : r.runs) {
        if (run.status == run_status::failed || run.status == run_status::given) continue;
        for (auto k : report::taxonomy_classes) {
            auto const it = run.taxonomy.find(k);
            std::int64_t const n = it == run.taxonomy.end() ? 0 : it->second;
            auto row = run_key(run);
            row.insert(row.end(), {std::string(qkgeom::to_string(k)), n,
                                   run.n_heads > 0 ? double(n) / double(run.n_heads) : nan});
            t.rows.push_back(std::move(row));
        }
    }
    return t;
}

inline table depth_table(study_result const& r) {
    table t{"study_depth.csv", {"metric"}, {}};
    for (auto const& c : run_key_columns()) t.columns.push_back(c);
    for (auto const* c : {"bin", "depth_lo", "depth_hi", "value", "n_heads"}) t.columns.emplace_back(c);
    double const nb = double(r.depth_bins);
    for (auto const& d : r.depth) {
        std::vector<table::cell> row{d.metric};
        auto key = run_key(r.runs[d.run]);
        row.insert(row.end(), key.begin(), key.end());
        row.insert(row.end(), {d.bin, double(d.bin) / nb, double(d.bin + 1) / nb, d.value, d.n});
        t.rows.push_back(std::move(row));
    }
    return t;
}

inline table correlation_table(study_result const& r) {
    table t{"study_correlations.csv",
            {"metric", "benchmark", "group", "n", "pearson", "p_pearson", "spearman", "p_spearman", "kendall",
             "p_kendall", "p_method"},
            {}};
    for (auto const& c : r.correlations)
        t.rows.push_back({c.metric, c.benchmark, c.group, c.n, c.pearson, c.p_pearson, c.spearman, c.p_spearman,
                          c.kendall, c.p_kendall, c.p_method});
    return t;
}

inline table length_table(study_result const& r) {
    table t{"study_length.csv", {"benchmark", "model", "run", "lo", "hi", "score", "plasticity"}, {}};
    for (auto const& l : r.length_correlations)
        for (auto const& p : l.points)
            t.rows.push_back({l.benchmark, l.model, r.runs[l.run].spec.name, p.lo, p.hi, p.score, p.plasticity});
    return t;
}

inline table head_trajectory_table(study_result const& r) {
    table t{"study_head_trajectories.csv",
            {"model", "metric", "layer", "q_head", "k_head", "run", "step_index", "value"},
            {}};
    for (auto const& h : r.head_trajectories)
        for (std::size_t i = 0; i < h.heads.size(); ++i)
            for (std::size_t k = 0; k < h.runs.size(); ++k)
                t.rows.push_back({h.model, h.metric, h.heads[i].layer, h.heads[i].q_head, h.heads[i].k_head,
                                  r.runs[h.runs[k]].spec.name, std::int64_t(k), h.values[i][k]});
    return t;
}

}  // namespace detail

/// \brief Every table of a study (docs/study.md#tables), in file order:
/// study_models.csv, study_profiles.csv, study_trajectory.csv,
/// study_taxonomy.csv, study_depth.csv, study_correlations.csv,
/// study_length.csv, study_head_trajectories.csv.
/// \param[in] r the computed study.
/// \returns the tables (a table without rows keeps its header).
[[nodiscard]] inline std::vector<table> study_tables(study_result const& r) {
    return {detail::model_table(r),       detail::profile_table(r),     detail::trajectory_table(r),
            detail::taxonomy_table(r),    detail::depth_table(r),       detail::correlation_table(r),
            detail::length_table(r),      detail::head_trajectory_table(r)};
}

/// \brief Writes a table as CSV (numbers in shortest round-trip form, text
/// quoted when needed).
/// \param[in] path the file.
/// \param[in] t the table.
/// \throws qkgeom::io_error naming the file when it cannot be written.
inline void write_table(std::filesystem::path const& path, table const& t) {
    errno = 0;
    std::ofstream out(path, std::ios::binary);
    auto cellText = [](table::cell const& c) {
        if (auto const* s = std::get_if<std::string>(&c)) return report::csv_quote(*s);
        if (auto const* i = std::get_if<std::int64_t>(&c)) return report::format_int(*i);
        return report::format_double(std::get<double>(c));
    };
    for (std::size_t i = 0; i < t.columns.size(); ++i) out << (i ? "," : "") << t.columns[i];
    out << "\n";
    for (auto const& row : t.rows) {
        for (std::size_t i = 0; i < row.size(); ++i) out << (i ? "," : "") << cellText(row[i]);
        out << "\n";
    }
    int const err = errno;
    out.close();
    if (!out)
        throw io_error(path.string(), path.string() + ": cannot be written: " +
                                          (err != 0 ? std::string(std::strerror(err)) : std::string("the stream failed")));
}

}  // namespace study
}  // namespace qkgeom
