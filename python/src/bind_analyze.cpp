// qkgeom Python extension — analyze_head and analyze_moments: a head_capture
// of zero-copy views over the caller's arrays, analysed with the GIL released.
#include "common.hpp"

#include <optional>

namespace qkgeom_py {

namespace {

struct capture_args {
    std::optional<qkgeom::bucket_spec> buckets;
    std::int64_t sliding_window = 0;
    std::int64_t context_length = 0;
};

qkgeom::capture_facts facts_of(capture_args const& a) {
    return qkgeom::capture_facts{a.buckets, a.sliding_window, a.context_length, std::nullopt};
}

/// Buckets given, or computed from the positions under the BucketSpec.
std::vector<std::int64_t> buckets_or_spec(py::handle given, std::vector<std::int64_t> const& positions,
                                          std::optional<qkgeom::bucket_spec> const& spec, std::string_view name) {
    if (!given.is_none()) return index_values(given, name);
    if (!spec)
        throw py::value_error(std::string(name) + ": give the buckets, or the bucket scheme (buckets=BucketSpec(...)) "
                                                  "to compute them from the positions");
    std::vector<std::int64_t> out(positions.size());
    for (std::size_t i = 0; i < positions.size(); ++i) out[i] = qkgeom::bucket_of(*spec, positions[i]);
    return out;
}

/// Example ids given, or every row from one sequence (example 0) when None.
std::vector<std::int64_t> examples_or_zero(py::handle given, qkgeom::index_t n, std::string_view name) {
    if (!given.is_none()) return index_values(given, name);
    return std::vector<std::int64_t>(static_cast<std::size_t>(n), 0);
}

/// The rows of one kind: the zero-copy view plus owning annotations.
qkgeom::token_rows<array_rows> token_rows_of(held<array_rows> const& rows, py::handle positions, py::handle buckets,
                                              py::handle examples, bool need_examples, std::string_view kind,
                                              std::optional<qkgeom::bucket_spec> const& spec) {
    std::string const k(kind);
    auto pos = index_values(positions, k + "_positions");
    auto bkt = buckets_or_spec(buckets, pos, spec, k + "_buckets");
    std::vector<std::int64_t> ex;
    if (need_examples) ex = examples_or_zero(examples, rows.view.rows(), k + "_example_ids");
    else if (!examples.is_none()) ex = index_values(examples, k + "_example_ids");
    return {rows.view, qkgeom::token_positions(std::move(pos)), qkgeom::token_buckets(std::move(bkt)),
            qkgeom::example_ids(std::move(ex))};
}

qkgeom::head_analysis analyze_head_py(py::handle queries, py::handle q_positions, py::handle keys,
                                      py::handle k_positions, py::handle q_buckets, py::handle k_buckets,
                                      py::handle q_example_ids, py::handle k_example_ids, qkgeom::head_id const& id,
                                      std::optional<qkgeom::bucket_spec> const& buckets, std::int64_t sliding_window,
                                      std::int64_t context_length,
                                      std::optional<qkgeom::analysis_options> const& options) {
    auto const q = rows_of(queries, "queries");
    auto const k = rows_of(keys, "keys");
    capture_args const a{buckets, sliding_window, context_length};
    qkgeom::head_capture<array_rows, array_rows> const head{
        id, facts_of(a), token_rows_of(q, q_positions, q_buckets, q_example_ids, false, "q", buckets),
        token_rows_of(k, k_positions, k_buckets, k_example_ids, true, "k", buckets)};
    qkgeom::analysis_options const opt = options.value_or(qkgeom::analysis_options{});
    py::gil_scoped_release nogil;
    return analyze_rows(head, opt);
}

qkgeom::head_analysis analyze_moments_py(qkgeom::head_moments const& hm, py::handle keys, py::handle k_positions,
                                         py::handle k_buckets, py::handle k_example_ids,
                                         std::optional<qkgeom::bucket_spec> const& buckets,
                                         std::int64_t sliding_window, std::int64_t context_length,
                                         std::optional<qkgeom::analysis_options> const& options) {
    auto const k = rows_of(keys, "keys");
    auto const rows = token_rows_of(k, k_positions, k_buckets, k_example_ids, true, "k", buckets);
    capture_args const a{buckets, sliding_window, context_length};
    qkgeom::analysis_options const opt = options.value_or(qkgeom::analysis_options{});
    py::gil_scoped_release nogil;
    std::lock_guard lock(object_lock(&hm));
    return analyze_moment_rows(hm, rows, facts_of(a), opt);
}

}  // namespace

void bind_analyze(py::module_& m) {
    m.def("analyze_head", &analyze_head_py, py::arg("queries"), py::arg("q_positions"), py::arg("keys"),
          py::arg("k_positions"), py::kw_only(), py::arg("q_buckets") = py::none(),
          py::arg("k_buckets") = py::none(), py::arg("q_example_ids") = py::none(),
          py::arg("k_example_ids") = py::none(), py::arg("head") = qkgeom::head_id{0, 0, 0},
          py::arg("buckets") = py::none(), py::arg("sliding_window") = 0, py::arg("context_length") = 0,
          py::arg("options") = py::none(),
          "Analyse one head from its query and key rows (read in place, GIL released): PCA, rotation, "
          "Householder, diagnostics, plasticity (method §2-6). Buckets default to bucket_of(buckets, positions); "
          "key example ids default to one sequence (all 0).");
    m.def("analyze_moments", &analyze_moments_py, py::arg("moments"), py::arg("keys"), py::arg("k_positions"),
          py::arg("k_buckets") = py::none(), py::arg("k_example_ids") = py::none(), py::kw_only(),
          py::arg("buckets") = py::none(), py::arg("sliding_window") = 0, py::arg("context_length") = 0,
          py::arg("options") = py::none(),
          "Analyse one head from its merged moments and its key rows (no diagnostics, no empirical check).");
}

}  // namespace qkgeom_py
