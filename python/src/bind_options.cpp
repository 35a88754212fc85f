// qkgeom Python extension — Options: analysis_options with the program's
// option names and policy spellings (qkgeom/analysis/policy_names.hpp, shared with the
// program) and its ranges (qkgeom/core/validate.hpp, shared with the program
// and study files). One table below serves the keyword constructor, the
// attributes and the repr. Every value is checked where it is set (its type
// and range: a TypeError / ValueError naming `Options.<name>` and the value);
// the checks across options (low <= high) when the constructor ends and
// where the options are used (check_options).
#include "common.hpp"

#include <qkgeom/analysis/policy_names.hpp>
#include <qkgeom/core/validate.hpp>

#include <functional>
#include <utility>

namespace qkgeom_py {

namespace {

using qkgeom::analysis_options;
using qkgeom::option_range;
namespace ranges = qkgeom::option_ranges;

struct option_field {
    char const* name;
    std::function<py::object(analysis_options const&)> get;
    std::function<void(analysis_options&, py::handle)> set;
    char const* doc;
};

std::string field_name(char const* name) { return std::string("Options.") + name; }

std::string shown(py::handle v) {
    return std::string(py::str(py::type::handle_of(v).attr("__name__"))) + " " + std::string(py::repr(v));
}

/// A Python integer (int, NumPy integer; not bool) in the option's range.
std::int64_t integer_of(py::handle v, option_range const& r) {
    std::string const f = field_name(r.name.data());
    if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
        throw py::type_error(f + ": expected an integer in " + r.text() + ", got " + shown(v));
    py::object const i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    long long const x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (overflow != 0 || !r.contains(x))
        throw py::value_error(f + ": " + std::string(py::str(i)) + " is out of range: expected an integer in " +
                              r.text());
    return x;
}

/// A real number (int, float, NumPy number; not bool, not str).
double number_of(py::handle v, char const* name) {
    if (PyBool_Check(v.ptr()) || !PyNumber_Check(v.ptr()) || PyComplex_Check(v.ptr()))
        throw py::type_error(field_name(name) + ": expected a number, got " + shown(v));
    double const x = PyFloat_AsDouble(v.ptr());
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        throw py::type_error(field_name(name) + ": expected a number, got " + shown(v));
    }
    return x;
}

/// A threshold in [0, 1] (NaN refused); low <= high is checked across options.
double threshold_of(py::handle v, char const* name) {
    double const x = number_of(v, name);
    if (!(x >= 0 && x <= 1))
        throw py::value_error(field_name(name) + ": " + qkgeom::number_text(x) +
                              " is out of range: need 0 <= low <= high <= 1");
    return x;
}

/// A policy attribute: a string of the policy's name table.
template <class E, class Get>
option_field policy(char const* name, Get ref, char const* doc) {
    return {name,
            [ref](analysis_options const& o) {
                return py::object(py::str(std::string(qkgeom::policy_name<E>(ref(o)))));
            },
            [ref, name](analysis_options& o, py::handle v) {
                if (!py::isinstance<py::str>(v))
                    throw py::type_error(field_name(name) + ": expected one of " +
                                         qkgeom::policy_choices_text<E>() + ", got " + shown(v));
                ref(o) = qkgeom::parse_policy<E>(py::cast<std::string>(v), field_name(name));
            },
            doc};
}

/// An integer attribute with its documented range.
template <class T, class Get>
option_field integer(option_range const& r, Get ref, char const* doc) {
    return {r.name.data(), [ref](analysis_options const& o) { return py::cast(ref(o)); },
            [ref, r](analysis_options& o, py::handle v) { ref(o) = static_cast<T>(integer_of(v, r)); }, doc};
}

/// A boolean attribute: True or False only (a string or a number is refused,
/// never read as true).
template <class Get>
option_field boolean(char const* name, Get ref, char const* doc) {
    return {name, [ref](analysis_options const& o) { return py::cast(ref(o)); },
            [ref, name](analysis_options& o, py::handle v) {
                bool const numpy_bool = std::string(py::str(py::type::handle_of(v).attr("__name__"))) == "bool_";
                if (!PyBool_Check(v.ptr()) && !numpy_bool)
                    throw py::type_error(field_name(name) + ": expected True or False, got " + shown(v));
                ref(o) = PyObject_IsTrue(v.ptr()) == 1;
            },
            doc};
}

/// A real attribute checked by `check` (the value's own range).
template <class Get, class Check>
option_field real(char const* name, Get ref, Check check, char const* doc) {
    return {name, [ref](analysis_options const& o) { return py::cast(ref(o)); },
            [ref, name, check](analysis_options& o, py::handle v) { ref(o) = check(v, name); }, doc};
}

double ks_alpha_of(py::handle v, char const* name) {
    double const x = number_of(v, name);
    if (auto p = qkgeom::ks_alpha_problem(x))
        throw py::value_error(field_name(name) + ": " + p->value + " is out of range: need " + p->expected);
    return x;
}

std::vector<option_field> const& fields() {
    static std::vector<option_field> const f{
        integer<qkgeom::index_t>(ranges::components, [](auto& o) -> auto& { return o.pca.n_components; },
                                 "PCA components reported, 1..4096 (--components, 10) [§2]"),
        policy<qkgeom::sign_policy>("sign", [](auto& o) -> auto& { return o.pca.sign; },
                                    "dominant | query_anchor (--sign) [§2]"),
        real("low", [](auto& o) -> auto& { return o.pca.thresholds.low; }, threshold_of,
             "taxonomy threshold, 0 <= low <= high <= 1 (--low, 0.3)"),
        real("high", [](auto& o) -> auto& { return o.pca.thresholds.high; }, threshold_of,
             "taxonomy threshold, 0 <= low <= high <= 1 (--high, 0.7)"),
        policy<qkgeom::separation_policy>("separation", [](auto& o) -> auto& { return o.rotation.separation; },
                                          "centroid | max_separation (--separation) [§3]"),
        policy<qkgeom::semantic_model>("semantic", [](auto& o) -> auto& { return o.householder.model; },
                                       "diag | full | global_linear (--semantic) [§4]"),
        boolean("diagnostics", [](auto& o) -> auto& { return o.diagnostics; },
                    "row-based normality diagnostics (--no-diagnostics turns them off) [§4]"),
        real("ks_alpha", [](auto& o) -> auto& { return o.ks_alpha; }, ks_alpha_of,
             "level of sem_frac_ks_reject, 0 < ks_alpha < 1 (--ks-alpha, 0.05)"),
        policy<qkgeom::pair_policy>("pairs", [](auto& o) -> auto& { return o.plasticity.pairs; },
                                    "same_bucket | prefix (--pairs) [§6]"),
        policy<qkgeom::ap_weighting>("weighting", [](auto& o) -> auto& { return o.plasticity.weighting; },
                                     "query_count | cell_mean (--weighting) [§6]"),
        policy<qkgeom::enumeration_policy>("enumeration", [](auto& o) -> auto& { return o.plasticity.enumeration; },
                                           "auto | exact | sampled (--enumeration) [§6]"),
        integer<std::int64_t>(ranges::max_exact_pairs, [](auto& o) -> auto& { return o.plasticity.max_exact_pairs; },
                              "auto: exact up to N evaluations per head, 0..2^62 (--max-exact-pairs)"),
        integer<std::int64_t>(ranges::samples, [](auto& o) -> auto& { return o.plasticity.samples_per_cell; },
                              "sampled: pairs per cell, 1..10^9 (--samples)"),
        integer<std::uint64_t>(ranges::seed, [](auto& o) -> auto& { return o.plasticity.seed; },
                               "sampled: seed, 0..2^63-1 (--seed)"),
        policy<qkgeom::empirical_policy>("empirical_check", [](auto& o) -> auto& { return o.plasticity.empirical_check; },
                                         "gaussian_gap check: sampled | exact (--empirical-check) [§6]"),
        integer<std::int64_t>(ranges::empirical_budget, [](auto& o) -> auto& { return o.plasticity.empirical_budget; },
                              "sampled check: evaluations of a drawn cell, 4..10^9 (--empirical-budget)"),
        integer<std::int64_t>(ranges::empirical_max_exact, [](auto& o) -> auto& { return o.plasticity.empirical_max_exact; },
                              "sampled check: cells up to N evaluations counted exactly, 0..2^62 (--empirical-max-exact)"),
        integer<std::int64_t>(ranges::empirical_pairs, [](auto& o) -> auto& { return o.plasticity.empirical_pairs; },
                              "sampled check: pairs of a pair-sampled cell, 0..10^6, < 2: draws only (--empirical-pairs)"),
        boolean("split", [](auto& o) -> auto& { return o.plasticity.split_profile; },
                    "split AP_drop into bias and content parts (--no-split turns it off) [§10.1]"),
        boolean("ranks", [](auto& o) -> auto& { return o.ranks_on; },
                    "top-1 flip and Kendall of m keys (--no-ranks turns it off) [§10.4]"),
        integer<qkgeom::index_t>(ranges::rank_keys, [](auto& o) -> auto& { return o.ranks.keys_per_set; },
                                 "keys per set m, 2..64 (--rank-keys, 8) [§10.4]"),
        integer<std::int64_t>(ranges::rank_sets, [](auto& o) -> auto& { return o.ranks.sets_per_bucket; },
                              "key sets per query bucket, 1..10^6 (--rank-sets, 16) [§10.4]"),
        policy<qkgeom::rank_key_policy>("rank_draw", [](auto& o) -> auto& { return o.ranks.keys; },
                                        "prefix | same_bucket: the key-set draw (--rank-draw) [§10.4]"),
        integer<qkgeom::index_t>(ranges::rope_bands, [](auto& o) -> auto& { return o.rope.n_bands; },
                                 "frequency bands of the RoPE analysis, 1..2048 (--rope-bands, 8) [§10.2]"),
    };
    return f;
}

option_field const& field_of(std::string const& name) {
    for (auto const& f : fields())
        if (name == f.name) return f;
    std::string all;
    for (auto const& f : fields()) all += (all.empty() ? "" : ", ") + std::string(f.name);
    throw py::type_error("Options: unknown option '" + name + "' (options: " + all + ")");
}

}  // namespace

void check_options(qkgeom::analysis_options const& o, std::string_view where) {
    if (auto const p = qkgeom::options_problem(o))
        throw py::value_error(std::string(where) + ": Options." + p->option + " = " + p->value + ": expected " +
                              p->expected);
}

unsigned checked_run_args(std::string_view where, std::int64_t jobs, std::int64_t context, std::int64_t window,
                          std::int64_t none_value) {
    auto const fail = [&](char const* arg, std::int64_t v, std::string const& range) {
        throw py::value_error(std::string(where) + ": " + arg + " = " + std::to_string(v) +
                              " is out of range: expected " + range);
    };
    if (jobs != 0 && !ranges::jobs.contains(jobs)) fail("jobs", jobs, "0 (every core) or " + ranges::jobs.text());
    if (!ranges::context.contains(context)) fail("context", context, ranges::context.text() + " (0: the capture's)");
    if (window != none_value && !ranges::window.contains(window))
        fail("window", window, ranges::window.text() + (none_value < 0 ? " or -1 (the capture's)" : " or None"));
    return static_cast<unsigned>(jobs);
}

qkgeom::analysis_options options_or_default(std::optional<qkgeom::analysis_options> const& o, std::string_view where) {
    qkgeom::analysis_options out = o.value_or(qkgeom::analysis_options{});
    check_options(out, where);
    return out;
}

void bind_options(py::module_& m) {
    auto cls = py::class_<analysis_options>(
        m, "Options",
        "Options of every analysis of a head, with the program's option names and defaults "
        "(Options(sign='query_anchor', samples=500)).");
    cls.def(py::init([](py::kwargs const& kw) {
        analysis_options o;
        for (auto const& [k, v] : kw) field_of(py::cast<std::string>(k)).set(o, v);
        check_options(o, "Options");
        return o;
    }));
    for (auto const& f : fields())
        cls.def_property(f.name, f.get, f.set, f.doc);
    cls.def("__repr__", [](analysis_options const& o) {
        std::string s = "Options(";
        for (auto const& f : fields())
            s += (s.size() > 8 ? ", " : "") + std::string(f.name) + "=" + std::string(py::repr(f.get(o)));
        return s + ")";
    });
    cls.def("__eq__", [](analysis_options const& a, analysis_options const& b) {
        for (auto const& f : fields())
            if (!f.get(a).equal(f.get(b))) return false;
        return true;
    });
}

}  // namespace qkgeom_py
