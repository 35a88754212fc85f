// qkgeom Python extension — analyze_dataset: the loop of `qkgeom analyze`
// (run/dataset_analysis.hpp), the same library function the program calls,
// in parallel with the GIL released. Ctrl-C (KeyboardInterrupt) stops it after
// the heads in progress (run_interruptible, common.hpp).
#include "common.hpp"

#include <qkgeom/core/cancel.hpp>
#include <qkgeom/run/dataset_analysis.hpp>

#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <limits>

namespace qkgeom_py {

namespace {

namespace fs = std::filesystem;
namespace io = qkgeom::io;

/// The failures in the order failures.txt lists them: missing and failed
/// heads in plan order, then the stray entries (no head: None).
py::list failures_of(io::dataset_run const& run) {
    py::list out;
    std::size_t f = 0, k = 0;
    while (f < run.failures.size() || k < run.missing.size()) {
        bool const take_missing =
            k < run.missing.size() && (f >= run.failures.size() || run.missing[k] < run.failures[f].index);
        if (take_missing) {
            out.append(py::make_tuple(run.planned[run.missing[k]], io::missing_entry_message(run, run.missing[k])));
            ++k;
        } else {
            out.append(py::make_tuple(run.failures[f].id, run.failures[f].message));
            ++f;
        }
    }
    for (auto const& s : run.stray) out.append(py::make_tuple(py::none(), s.name + ": " + s.message));
    return out;
}

void bind_run(py::module_& m) {
    py::class_<io::dataset_run>(m, "DatasetRun", "The result of analyze_dataset: the analysed heads (plan order) "
                                                 "and every planned head that was not analysed, with why.")
        .def_property_readonly(
            "heads",
            [](py::object self) {
                auto& run = self.cast<io::dataset_run&>();
                py::list out;
                for (auto& h : run.heads) out.append(py::cast(&h, py::return_value_policy::reference_internal, self));
                return out;
            },
            "HeadAnalysis per analysed head, plan order (failed heads omitted).")
        .def_property_readonly("failures", &failures_of,
                               "[(HeadId or None, message)]: missing entries and failed heads in plan order, then "
                               "stray entries (None): the content of failures.txt.")
        .def_property_readonly("planned", [](io::dataset_run const& r) { return r.planned.size(); },
                               "Number of planned heads.")
        .def_readonly("planned_heads", &io::dataset_run::planned)
        .def_property_readonly("missing",
                               [](io::dataset_run const& r) {
                                   py::list out;
                                   for (auto i : r.missing) out.append(r.planned[i]);
                                   return out;
                               })
        .def_readonly("manifest", &io::dataset_run::m)
        .def_readonly("dir", &io::dataset_run::dir)
        .def("__len__", [](io::dataset_run const& r) { return r.heads.size(); })
        .def("__repr__", [](io::dataset_run const& r) {
            return "DatasetRun(" + std::to_string(r.heads.size()) + " of " + std::to_string(r.planned.size()) +
                   " heads analysed, " + std::to_string(r.failures.size() + r.missing.size() + r.stray.size()) +
                   " failures)";
        });
}

io::dataset_run analyze_dataset_py(fs::path const& dir, std::optional<qkgeom::analysis_options> const& options,
                                   std::int64_t jobs, bool strict, std::int64_t context, std::optional<std::int64_t> window) {
    constexpr std::int64_t none = std::numeric_limits<std::int64_t>::min();
    unsigned const threads = checked_run_args("analyze_dataset", jobs, context, window.value_or(none), none);
    io::dataset_run_options o;
    o.analysis = options_or_default(options, "analyze_dataset");
    o.jobs = threads;
    o.strict = strict;
    o.context = context;
    o.window = window.value_or(-1);
    o.context_name = "analyze_dataset(context=" + std::to_string(context) + ")";
    std::atomic<bool> stop{false};
    return run_interruptible(stop, [&] {
        return io::analyze_dataset(io::plan_dataset(dir), o, interruptible_analyzer(stop));
    });
}

}  // namespace

// Declared in common.hpp; run_study's analyzer too (bind_study.cpp).
qkgeom::head_analysis analyze_matrix_head(qkgeom::head_capture<qkgeom::row_matrix> const& h,
                                          qkgeom::analysis_options const& opt) {
    auto view = [](qkgeom::row_matrix const& m) {
        return array_rows(qkgeom::matrix_view<double>(m.data(), m.rows(), m.cols(), m.cols(), 1));
    };
    auto rows = [&](qkgeom::token_rows<qkgeom::row_matrix> const& r) {
        return qkgeom::token_rows<array_rows>{view(r.vectors), r.position, r.bucket, r.example_id};
    };
    qkgeom::head_capture<array_rows, array_rows> const v{h.id, h.facts, rows(h.queries), rows(h.keys)};
    return analyze_rows(v, opt);
}

qkgeom::io::head_analyzer interruptible_analyzer(std::atomic<bool> const& stop) {
    return [&stop](qkgeom::head_capture<qkgeom::row_matrix> const& h, qkgeom::analysis_options const& opt) {
        if (stop.load()) throw stop_requested{};  // a safe point: before each head
        qkgeom::scoped_cancel const guard(stop);  // and the head's own (core/cancel.hpp)
        return analyze_matrix_head(h, opt);
    };
}

void bind_dataset(py::module_& m) {
    bind_run(m);
    m.def("analyze_dataset", &analyze_dataset_py, py::arg("dir"), py::arg("options") = py::none(), py::kw_only(),
          py::arg("jobs") = 0, py::arg("strict") = false, py::arg("context") = 0, py::arg("window") = py::none(),
          "Analyse every planned head of a dataset folder: the library loop `qkgeom analyze` runs "
          "(io::analyze_dataset), on `jobs` threads (0: every core), GIL released. Ctrl-C raises KeyboardInterrupt "
          "once the heads in progress end.");
}

}  // namespace qkgeom_py
