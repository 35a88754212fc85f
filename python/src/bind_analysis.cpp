// qkgeom Python extension — HeadAnalysis, analyze_head / analyze_moments
// over NumPy rows, and the CSV tables as columns (report/csv.hpp).
//
// Column names come from report::*_columns() only: every name is looked up
// in the value table below, so a column the library adds without a Python
// value fails at import instead of being dropped.
#include "common.hpp"

#include <qkgeom/report/csv.hpp>

#include <pybind11/eigen.h>

#include <algorithm>
#include <functional>
#include <map>

namespace qkgeom_py {

namespace {

using qkgeom::head_analysis;
using namespace pybind11::literals;

/// One row of a table: the head and the row's index within it.
struct row_ref {
    head_analysis const* h;
    std::size_t i;
};

/// A column's value getter: exactly one of the three is set.
struct column {
    std::function<std::int64_t(row_ref)> i64;
    std::function<double(row_ref)> f64;
    std::function<std::string(row_ref)> str;
};

using column_map = std::map<std::string, column, std::less<>>;

column int_col(std::function<std::int64_t(row_ref)> f) { return {std::move(f), {}, {}}; }
column dbl_col(std::function<double(row_ref)> f) { return {{}, std::move(f), {}}; }
column str_col(std::function<std::string(row_ref)> f) { return {{}, {}, std::move(f)}; }

column_map with_id(column_map m) {
    m["layer"] = int_col([](row_ref r) { return r.h->id.layer; });
    m["q_head"] = int_col([](row_ref r) { return r.h->id.q_head; });
    m["k_head"] = int_col([](row_ref r) { return r.h->id.k_head; });
    return m;
}

column_map head_metrics_getters() {
    column_map m;
    // One column per entry of the registry; the counts (metric_kind::count:
    // n_q_tokens, n_k_tokens, d_model) are integers, written as such by
    // report::write_head_metrics.
    for (qkgeom::head_metric const& hm : qkgeom::head_metrics) {
        auto const value = hm.value;
        if (hm.kind == qkgeom::metric_kind::count)
            m[std::string(hm.name)] = int_col([value](row_ref r) { return static_cast<std::int64_t>(value(*r.h)); });
        else m[std::string(hm.name)] = dbl_col([value](row_ref r) { return value(*r.h); });
    }
    m["taxonomy"] = str_col([](row_ref r) { return std::string(qkgeom::to_string(r.h->pca.taxonomy)); });
    m["flags"] = str_col([](row_ref r) { return qkgeom::head_flags_text(*r.h); });
    m["rope_status"] = str_col([](row_ref r) { return std::string(qkgeom::rope_status_name(r.h->rope.status)); });
    return with_id(std::move(m));
}

column_map cell_getters() {
    auto c = [](row_ref r) -> auto const& { return r.h->plasticity.cells[r.i]; };
    return with_id({{"q_bucket", int_col([c](row_ref r) { return c(r).q_bucket; })},
                    {"k_bucket", int_col([c](row_ref r) { return c(r).k_bucket; })},
                    {"plasticity", dbl_col([c](row_ref r) { return c(r).plasticity; })},
                    {"n_pairs", int_col([c](row_ref r) { return c(r).n_pairs; })},
                    {"std_error", dbl_col([c](row_ref r) { return c(r).std_error; })},
                    {"empirical", dbl_col([c](row_ref r) { return c(r).empirical; })}});
}

double entry(Eigen::VectorXd const& v, std::size_t i) {
    return static_cast<qkgeom::index_t>(i) < v.size() ? v(static_cast<qkgeom::index_t>(i)) : qkgeom::detail::nan;
}

column_map weight_getters() {
    return with_id({{"component", int_col([](row_ref r) { return static_cast<std::int64_t>(r.i); })},
                    {"component_r2", dbl_col([](row_ref r) { return entry(r.h->householder.component_r2, r.i); })},
                    {"component_weight",
                     dbl_col([](row_ref r) { return entry(r.h->householder.component_weight, r.i); })}});
}

column_map pca_getters() {
    auto c = [](row_ref r) -> auto const& { return r.h->pca.components[r.i]; };
    return with_id({{"component", int_col([c](row_ref r) { return static_cast<std::int64_t>(c(r).component); })},
                    {"explained_variance_ratio", dbl_col([c](row_ref r) { return c(r).explained_variance_ratio; })},
                    {"r_q", dbl_col([c](row_ref r) { return c(r).r_q; })},
                    {"r_k", dbl_col([c](row_ref r) { return c(r).r_k; })}});
}

/// One CSV file's table: its columns (report/csv.hpp), the value of each,
/// and the rows a head contributes (as the writer iterates them).
struct table {
    std::vector<std::string> names;
    column_map values;
    std::function<std::size_t(head_analysis const&)> rows;
    std::vector<column> ordered;  // values of `names`, in order (copies: the table is copied into tables())
};

table make_table(std::string const& file, std::vector<std::string> names, column_map values,
                 std::function<std::size_t(head_analysis const&)> rows) {
    table t{std::move(names), std::move(values), std::move(rows), {}};
    for (auto const& n : t.names) {
        auto const it = t.values.find(n);
        if (it == t.values.end())
            throw std::logic_error("qkgeom._qkgeom: column '" + n + "' of " + file +
                                   " has no Python value (python/src/bind_analysis.cpp)");
        t.ordered.push_back(it->second);
    }
    return t;
}

std::map<std::string, table, std::less<>> const& tables() {
    namespace r = qkgeom::report;
    static std::map<std::string, table, std::less<>> const t{
        {"head_metrics", make_table(std::string(r::head_metrics_file), r::head_metrics_columns(),
                                    head_metrics_getters(), [](head_analysis const&) { return std::size_t{1}; })},
        {"head_bucket_plasticity",
         make_table(std::string(r::head_bucket_plasticity_file), r::head_bucket_plasticity_columns(), cell_getters(),
                    [](head_analysis const& h) { return h.plasticity.cells.size(); })},
        {"head_component_weights",
         make_table(std::string(r::head_component_weights_file), r::head_component_weights_columns(),
                    weight_getters(),
                    [](head_analysis const& h) {
                        return static_cast<std::size_t>(
                            std::max(h.householder.component_r2.size(), h.householder.component_weight.size()));
                    })},
        {"qk_pca", make_table(std::string(r::qk_pca_file), r::qk_pca_columns(), pca_getters(),
                              [](head_analysis const& h) { return h.pca.components.size(); })},
    };
    return t;
}

table const& table_of(std::string_view kind) {
    auto const it = tables().find(kind);
    if (it == tables().end())
        throw py::value_error("kind: '" + std::string(kind) +
                              "' is not one of head_metrics | head_bucket_plasticity | head_component_weights | qk_pca");
    return it->second;
}

py::object cell_value(column const& c, row_ref r) {
    if (c.i64) return py::int_(c.i64(r));
    if (c.f64) return py::float_(c.f64(r));
    return py::str(c.str(r));
}

/// The columns of one table over `heads`: {name: ndarray} in file order
/// (int64, float64, or object arrays of str).
py::dict columns_of(std::string_view kind, std::vector<head_analysis const*> const& heads) {
    table const& t = table_of(kind);
    std::vector<row_ref> rows;
    for (auto const* h : heads)
        for (std::size_t i = 0, n = t.rows(*h); i < n; ++i) rows.push_back({h, i});
    auto const n = static_cast<py::ssize_t>(rows.size());
    py::dict out;
    for (std::size_t c = 0; c < t.names.size(); ++c) {
        column const& col = t.ordered[c];
        if (col.i64) {
            py::array_t<std::int64_t> a(n);
            auto* p = a.mutable_data();
            for (py::ssize_t i = 0; i < n; ++i) p[i] = col.i64(rows[static_cast<std::size_t>(i)]);
            out[py::str(t.names[c])] = a;
        } else if (col.f64) {
            py::array_t<double> a(n);
            auto* p = a.mutable_data();
            for (py::ssize_t i = 0; i < n; ++i) p[i] = col.f64(rows[static_cast<std::size_t>(i)]);
            out[py::str(t.names[c])] = a;
        } else {
            py::list l;
            for (auto const& r : rows) l.append(py::str(col.str(r)));
            out[py::str(t.names[c])] = py::module_::import("numpy").attr("array")(l, "dtype"_a = "object");
        }
    }
    return out;
}

/// The rows of one table for one head, as dicts (column -> value).
py::list records_of(std::string_view kind, head_analysis const& h) {
    table const& t = table_of(kind);
    py::list out;
    for (std::size_t i = 0, n = t.rows(h); i < n; ++i) {
        py::dict d;
        for (std::size_t c = 0; c < t.names.size(); ++c) d[py::str(t.names[c])] = cell_value(t.ordered[c], {&h, i});
        out.append(d);
    }
    return out;
}

py::object metric_of(head_analysis const& h, std::string const& name) {
    auto const& t = table_of("head_metrics");
    return cell_value(t.values.find(name)->second, {&h, 0});
}

py::dict metrics_of(head_analysis const& h) {
    auto const& t = table_of("head_metrics");
    py::dict d;
    for (std::size_t c = 0; c < t.names.size(); ++c) d[py::str(t.names[c])] = cell_value(t.ordered[c], {&h, 0});
    return d;
}

py::list profile_of(head_analysis const& h) {
    py::list out;
    for (auto const& b : h.plasticity.profile) {
        py::dict d;
        d["q_bucket"] = b.q_bucket;
        d["n_queries"] = b.n_queries;
        d["tau"] = b.tau;
        d["ap"] = b.ap;
        d["ap_empirical"] = b.ap_empirical;
        d["std_error"] = b.std_error;
        d["n_pairs"] = b.n_pairs;
        d["n_cells"] = b.n_cells;
        d["quintile"] = b.quintile;
        d["decile"] = b.decile;
        auto const extra = qkgeom::profile_beyond_values(h, std::size_t(&b - h.plasticity.profile.data()));
        for (std::size_t k = 0; k < extra.size(); ++k) d[py::str(std::string(qkgeom::profile_beyond_names[k]))] = extra[k];
        out.append(d);
    }
    return out;
}

Eigen::MatrixXd loadings_of(head_analysis const& h) {
    auto const& c = h.pca.components;
    Eigen::MatrixXd out(static_cast<qkgeom::index_t>(c.size()), h.d_model);
    for (std::size_t i = 0; i < c.size(); ++i)
        out.row(static_cast<qkgeom::index_t>(i)) =
            c[i].loading.size() == h.d_model ? Eigen::VectorXd(c[i].loading)
                                             : Eigen::VectorXd::Constant(h.d_model, qkgeom::detail::nan);
    return out;
}

void bind_head_analysis(py::module_& m) {
    auto cls = py::class_<head_analysis>(m, "HeadAnalysis",
                                         "Everything qkgeom computes for one head; every head_metrics.csv column "
                                         "is an attribute of the same name.");
    cls.def_readonly("id", &head_analysis::id);
    for (auto const& name : qkgeom::report::head_metrics_columns())
        cls.def_property_readonly(name.c_str(), [name](head_analysis const& h) { return metric_of(h, name); });
    cls.def_property_readonly("metrics", &metrics_of, "The head_metrics.csv row: {column: value}, column order.");
    cls.def_readonly("flag_bits", &head_analysis::flags);
    cls.def_property_readonly("cells", [](head_analysis const& h) { return records_of("head_bucket_plasticity", h); },
                              "head_bucket_plasticity.csv rows of this head (dicts).");
    cls.def_property_readonly("pca_components", [](head_analysis const& h) { return records_of("qk_pca", h); },
                              "qk_pca.csv rows of this head (dicts).");
    cls.def_property_readonly("component_weights",
                              [](head_analysis const& h) { return records_of("head_component_weights", h); },
                              "head_component_weights.csv rows of this head (dicts).");
    cls.def_property_readonly("profile", &profile_of, "The plasticity profile, one dict per query bucket.");
    cls.def_property_readonly("ap_quintile", [](head_analysis const& h) {
        return Eigen::VectorXd(Eigen::Map<Eigen::VectorXd const>(h.plasticity.ap_quintile.data(), 5));
    });
    cls.def_property_readonly("ap_decile", [](head_analysis const& h) {
        return Eigen::VectorXd(Eigen::Map<Eigen::VectorXd const>(h.plasticity.ap_decile.data(), 10));
    });
    cls.def_property_readonly("pca_loadings", &loadings_of, "Unit loadings v_j of the reported components (k x d).");
    cls.def_property_readonly("axis_a", [](head_analysis const& h) { return h.rotation.a; }, "Drift axis a (§3).");
    cls.def_property_readonly("axis_b", [](head_analysis const& h) { return h.rotation.b; },
                              "Separation axis b (§3).");
    cls.def("__repr__", [](head_analysis const& h) {
        return "HeadAnalysis(layer=" + std::to_string(h.id.layer) + ", q_head=" + std::to_string(h.id.q_head) +
               ", k_head=" + std::to_string(h.id.k_head) + ", taxonomy=" +
               std::string(qkgeom::to_string(h.pca.taxonomy)) + ")";
    });
}

std::vector<head_analysis const*> head_list(py::handle heads) {
    std::vector<head_analysis const*> out;
    for (auto h : py::iter(heads)) {
        if (!py::isinstance<head_analysis>(h))
            throw py::type_error("heads: expected HeadAnalysis objects, got " +
                                 std::string(py::str(py::type::of(h).attr("__name__"))));
        out.push_back(&h.cast<head_analysis const&>());
    }
    return out;
}

}  // namespace

void bind_analysis(py::module_& m) {
    (void)tables();  // every column resolved at import
    bind_head_analysis(m);
    namespace r = qkgeom::report;
    m.def("head_metrics_columns", &r::head_metrics_columns, "Columns of head_metrics.csv, in file order.");
    m.def("head_bucket_plasticity_columns", &r::head_bucket_plasticity_columns);
    m.def("head_component_weights_columns", &r::head_component_weights_columns);
    m.def("qk_pca_columns", &r::qk_pca_columns);
    m.def(
        "_columns", [](std::string const& kind, py::handle heads) { return columns_of(kind, head_list(heads)); },
        py::arg("kind"), py::arg("heads"),
        "{column: ndarray} of one CSV table (head_metrics, head_bucket_plasticity, head_component_weights, "
        "qk_pca) over the heads, in file order; the same doubles the CSV holds.");
    m.def(
        "_gqa_groups",
        [](py::handle heads) {
            auto const hs = head_list(heads);
            auto const rows = qkgeom::gqa_groups(std::span<head_analysis const* const>(hs));
            py::dict out;
            auto col = [&](char const* name, auto get) {
                py::list l;
                for (auto const& r : rows) l.append(get(r));
                out[name] = l;
            };
            col("layer", [](auto const& r) { return r.layer; });
            col("metric", [](auto const& r) { return r.metric; });
            col("n_groups", [](auto const& r) { return r.n_groups; });
            col("n_shared_groups", [](auto const& r) { return r.n_shared_groups; });
            col("n_heads", [](auto const& r) { return r.n_heads; });
            col("n_excluded", [](auto const& r) { return r.n_excluded; });
            col("df_within", [](auto const& r) { return r.df_within; });
            col("df_between", [](auto const& r) { return r.df_between; });
            col("within_var", [](auto const& r) { return r.within_var; });
            col("between_var", [](auto const& r) { return r.between_var; });
            col("ratio", [](auto const& r) { return r.ratio; });
            col("p_value", [](auto const& r) { return r.p_value; });
            col("status", [](auto const& r) { return r.status; });
            return out;
        },
        py::arg("heads"),
        "gqa_groups.csv as {column: list} over the heads (docs/beyond-gqa.md); the columns are "
        "report::gqa_groups_columns(), checked at import.");
    {
        py::list names;
        for (auto const& n : r::gqa_groups_columns()) names.append(n);
        m.attr("_gqa_groups_columns") = names;
    }
    m.attr("head_flag_names") = [] {
        py::list l;
        for (auto n : qkgeom::head_flag_names) l.append(py::str(std::string(n)));
        return l;
    }();
}

}  // namespace qkgeom_py
