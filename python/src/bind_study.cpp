// qkgeom Python extension — run_study: a study file (docs/study.md) read, its
// runs analysed or taken from the cache, and its tables (report/study_tables.hpp, the
// same columns as the program's study_*.csv) returned column by column; the
// GIL is released while the study runs; Ctrl-C (KeyboardInterrupt) stops it
// after the heads in progress, as SIGINT stops `qkgeom study` (the cache keeps
// no half-written entry). qkgeom.study() (python/qkgeom/study.py) turns the
// result into DataFrames.
#include "common.hpp"

#include <qkgeom/report/study_tables.hpp>
#include <qkgeom/run/study_run.hpp>

#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace qkgeom_py {

void bind_study(py::module_& m);

namespace {

namespace fs = std::filesystem;
namespace st = qkgeom::study;

/// One cell as a Python object: str, int or float (NaN stays NaN).
py::object cell_object(st::table::cell const& c) {
    if (auto const* s = std::get_if<std::string>(&c)) return py::str(*s);
    if (auto const* i = std::get_if<std::int64_t>(&c)) return py::int_(*i);
    return py::float_(std::get<double>(c));
}

/// {"columns": [names], "data": [one list per column]}: column-major, so a
/// DataFrame is made from it without transposing.
py::dict table_object(st::table const& t) {
    py::list data;
    for (std::size_t j = 0; j < t.columns.size(); ++j) {
        py::list col(t.rows.size());
        for (std::size_t i = 0; i < t.rows.size(); ++i) {
            py::object v = j < t.rows[i].size() ? cell_object(t.rows[i][j]) : py::object(py::none());
            PyList_SET_ITEM(col.ptr(), static_cast<Py_ssize_t>(i), v.release().ptr());  // steals the reference
        }
        data.append(std::move(col));
    }
    py::dict out;
    out["columns"] = py::cast(t.columns);
    out["data"] = std::move(data);
    return out;
}

/// "study_models.csv" -> "study_models".
std::string stem_of(std::string const& file) { return fs::path(file).stem().string(); }

py::dict run_study_py(fs::path const& study_file, fs::path const& cache,
                      std::optional<qkgeom::analysis_options> const& options, std::int64_t jobs, std::int64_t context,
                      std::int64_t window) {
    unsigned const threads = checked_run_args("run_study", jobs, context, window, -1);
    st::study_run_options o;
    o.analysis = options_or_default(options, "run_study");
    o.jobs = threads;
    o.context = context;
    o.window = window;
    o.cache = cache;
    std::atomic<bool> stop{false};
    o.analyzer = interruptible_analyzer(stop);  // common.hpp: the module's one analyze_head instantiation
    st::study_result result;
    std::vector<st::table> tables;
    run_interruptible(stop, [&] {
        result = st::run_study(st::read_study(study_file), o);
        tables = st::study_tables(result);
        return true;
    });
    py::dict out_tables;
    for (auto const& t : tables) out_tables[py::str(stem_of(t.file))] = table_object(t);
    py::list runs;
    for (auto const& r : result.runs) {
        py::dict d;
        d["name"] = r.spec.name;
        d["status"] = std::string(st::to_string(r.status));
        d["message"] = r.message;
        d["note"] = r.note;  // a damaged cache entry analysed again (qkgeom.study warns)
        runs.append(std::move(d));
    }
    py::dict out;
    out["tables"] = std::move(out_tables);
    out["runs"] = std::move(runs);
    out["title"] = result.title;
    return out;
}

}  // namespace

void bind_study(py::module_& m) {
    m.def("run_study", &run_study_py, py::arg("study_file"), py::arg("cache"), py::arg("options") = py::none(),
          py::kw_only(), py::arg("jobs") = 0, py::arg("context") = 0, py::arg("window") = -1,
          "Run a study file (docs/study.md): every run's analysis from the cache, its analysis folder or the file, "
          "or analysed from its capture (with `options`, on `jobs` threads, 0: every core) and cached in `cache`; "
          "GIL released. Returns {'title': str, 'tables': {file stem: {'columns': [names], 'data': [one list per "
          "column]}}, 'runs': [{'name', 'status', 'message', 'note'}]}. qkgeom.study() wraps it in DataFrames.");
}

}  // namespace qkgeom_py
