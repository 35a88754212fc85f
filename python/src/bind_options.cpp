// qkgeom Python extension — Options: analysis_options with the program's
// option names and policy spellings (qkgeom/analysis/policy_names.hpp, shared with the
// program). One table below serves the keyword constructor, the attributes
// and the repr.
#include "common.hpp"

#include <qkgeom/analysis/policy_names.hpp>

#include <functional>
#include <utility>

namespace qkgeom_py {

namespace {

using qkgeom::analysis_options;

struct option_field {
    char const* name;
    std::function<py::object(analysis_options const&)> get;
    std::function<void(analysis_options&, py::handle)> set;
    char const* doc;
};

/// A policy attribute: a string of the policy's name table.
template <class E, class Get>
option_field policy(char const* name, Get ref, char const* doc) {
    return {name,
            [ref](analysis_options const& o) {
                return py::object(py::str(std::string(qkgeom::policy_name<E>(ref(o)))));
            },
            [ref, name](analysis_options& o, py::handle v) {
                ref(o) = qkgeom::parse_policy<E>(py::cast<std::string>(v), std::string("Options.") + name);
            },
            doc};
}

/// A numeric / boolean attribute.
template <class T, class Get>
option_field value(char const* name, Get ref, char const* doc) {
    return {name, [ref](analysis_options const& o) { return py::cast(ref(o)); },
            [ref](analysis_options& o, py::handle v) { ref(o) = py::cast<T>(v); }, doc};
}

std::vector<option_field> const& fields() {
    static std::vector<option_field> const f{
        value<qkgeom::index_t>("components", [](auto& o) -> auto& { return o.pca.n_components; },
                               "PCA components reported (--components, 10) [§2]"),
        policy<qkgeom::sign_policy>("sign", [](auto& o) -> auto& { return o.pca.sign; },
                                    "dominant | query_anchor (--sign) [§2]"),
        value<double>("low", [](auto& o) -> auto& { return o.pca.thresholds.low; }, "taxonomy threshold (--low, 0.3)"),
        value<double>("high", [](auto& o) -> auto& { return o.pca.thresholds.high; },
                      "taxonomy threshold (--high, 0.7)"),
        policy<qkgeom::separation_policy>("separation", [](auto& o) -> auto& { return o.rotation.separation; },
                                          "centroid | max_separation (--separation) [§3]"),
        policy<qkgeom::semantic_model>("semantic", [](auto& o) -> auto& { return o.householder.model; },
                                       "diag | full | global_linear (--semantic) [§4]"),
        value<bool>("diagnostics", [](auto& o) -> auto& { return o.diagnostics; },
                    "row-based normality diagnostics (--no-diagnostics turns them off) [§4]"),
        value<double>("ks_alpha", [](auto& o) -> auto& { return o.ks_alpha; }, "level of sem_frac_ks_reject (--ks-alpha)"),
        policy<qkgeom::pair_policy>("pairs", [](auto& o) -> auto& { return o.plasticity.pairs; },
                                    "same_bucket | prefix (--pairs) [§6]"),
        policy<qkgeom::ap_weighting>("weighting", [](auto& o) -> auto& { return o.plasticity.weighting; },
                                     "query_count | cell_mean (--weighting) [§6]"),
        policy<qkgeom::enumeration_policy>("enumeration", [](auto& o) -> auto& { return o.plasticity.enumeration; },
                                           "auto | exact | sampled (--enumeration) [§6]"),
        value<std::int64_t>("max_exact_pairs", [](auto& o) -> auto& { return o.plasticity.max_exact_pairs; },
                            "auto: exact up to N evaluations per head (--max-exact-pairs)"),
        value<std::int64_t>("samples", [](auto& o) -> auto& { return o.plasticity.samples_per_cell; },
                            "sampled: pairs per cell (--samples)"),
        value<std::uint64_t>("seed", [](auto& o) -> auto& { return o.plasticity.seed; }, "sampled: seed (--seed)"),
        policy<qkgeom::empirical_policy>("empirical_check", [](auto& o) -> auto& { return o.plasticity.empirical_check; },
                                         "gaussian_gap check: sampled | exact (--empirical-check) [§6]"),
        value<std::int64_t>("empirical_budget", [](auto& o) -> auto& { return o.plasticity.empirical_budget; },
                            "sampled check: evaluations of a sampled cell (--empirical-budget)"),
        value<std::int64_t>("empirical_max_exact", [](auto& o) -> auto& { return o.plasticity.empirical_max_exact; },
                            "sampled check: cells up to N evaluations counted exactly (--empirical-max-exact)"),
        value<bool>("split", [](auto& o) -> auto& { return o.plasticity.split_profile; },
                    "split AP_drop into bias and content parts (--no-split turns it off) [§10.1]"),
        value<bool>("ranks", [](auto& o) -> auto& { return o.ranks_on; },
                    "top-1 flip and Kendall of m keys (--no-ranks turns it off) [§10.4]"),
        value<qkgeom::index_t>("rank_keys", [](auto& o) -> auto& { return o.ranks.keys_per_set; },
                               "keys per set m, 2..64 (--rank-keys, 8) [§10.4]"),
        value<std::int64_t>("rank_sets", [](auto& o) -> auto& { return o.ranks.sets_per_bucket; },
                            "key sets per query bucket (--rank-sets, 16) [§10.4]"),
        policy<qkgeom::rank_key_policy>("rank_draw", [](auto& o) -> auto& { return o.ranks.keys; },
                                        "prefix | same_bucket: the key-set draw (--rank-draw) [§10.4]"),
        value<qkgeom::index_t>("rope_bands", [](auto& o) -> auto& { return o.rope.n_bands; },
                               "frequency bands of the RoPE analysis (--rope-bands, 8) [§10.2]"),
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

void bind_options(py::module_& m) {
    auto cls = py::class_<analysis_options>(
        m, "Options",
        "Options of every analysis of a head, with the program's option names and defaults "
        "(Options(sign='query_anchor', samples=500)).");
    cls.def(py::init([](py::kwargs const& kw) {
        analysis_options o;
        for (auto const& [k, v] : kw) field_of(py::cast<std::string>(k)).set(o, v);
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
