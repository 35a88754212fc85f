// qkgeom Python extension — analyze_head and analyze_moments: a head_capture
// of zero-copy views over the caller's arrays, analysed with the GIL released.
// Before anything is allocated, the inputs pass the program's checks
// (qkgeom/core/validate.hpp): the head dimension limit, every position below
// the context length, the options' ranges, and for analyze_moments key rows
// that are the moments' own.
#include "common.hpp"

#include <qkgeom/core/cancel.hpp>
#include <qkgeom/core/validate.hpp>

#include <atomic>
#include <new>
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

/// Every position below a given context length (0: the largest position + 1),
/// as the program requires of --context and the manifest's context_length.
void check_context(std::string_view fn, std::string_view kind, qkgeom::token_positions const& pos, std::int64_t L) {
    if (auto const top = qkgeom::position_beyond_context(pos, L))
        throw py::value_error(std::string(fn) + ": " + std::string(kind) + "_positions: position " +
                              std::to_string(*top) + " is not below context_length " + std::to_string(L) +
                              " (every position must lie below it; 0 = the largest position + 1)");
}

std::string rows_text(held<array_rows> const& r, std::string_view name) {
    return std::to_string(r.view.rows()) + " " + std::string(name) + " rows";
}

qkgeom::head_analysis analyze_head_py(py::handle queries, py::handle q_positions, py::handle keys,
                                      py::handle k_positions, py::handle q_buckets, py::handle k_buckets,
                                      py::handle q_example_ids, py::handle k_example_ids, qkgeom::head_id const& id,
                                      std::optional<qkgeom::bucket_spec> const& buckets, std::int64_t sliding_window,
                                      std::int64_t context_length,
                                      std::optional<qkgeom::analysis_options> const& options) {
    constexpr std::string_view fn = "analyze_head";
    auto const q = rows_of(queries, "queries");
    auto const k = rows_of(keys, "keys");
    qkgeom::check_head_dim("analyze_head: queries", q.view.cols());
    qkgeom::check_head_dim("analyze_head: keys", k.view.cols());
    qkgeom::analysis_options const opt = options_or_default(options, fn);
    capture_args const a{buckets, sliding_window, context_length};
    qkgeom::head_capture<array_rows, array_rows> const head{
        id, facts_of(a), token_rows_of(q, q_positions, q_buckets, q_example_ids, false, "q", buckets),
        token_rows_of(k, k_positions, k_buckets, k_example_ids, true, "k", buckets)};
    check_context(fn, "q", head.queries.position, context_length);
    check_context(fn, "k", head.keys.position, context_length);
    try {
        std::atomic<bool> stop{false};  // Ctrl-C: KeyboardInterrupt at the next safe point (core/cancel.hpp)
        return run_interruptible(stop, [&] {
            qkgeom::scoped_cancel const guard(stop);
            return analyze_rows(head, opt);
        });
    } catch (std::bad_alloc const&) {
        out_of_memory("analyze_head of " + rows_text(q, "query") + " and " + rows_text(k, "key") + " of d = " +
                      std::to_string(q.view.cols()));
    }
}

qkgeom::head_analysis analyze_moments_py(qkgeom::head_moments const& hm, py::handle keys, py::handle k_positions,
                                         py::handle k_buckets, py::handle k_example_ids,
                                         std::optional<qkgeom::bucket_spec> const& buckets,
                                         std::int64_t sliding_window, std::int64_t context_length,
                                         std::optional<qkgeom::analysis_options> const& options) {
    constexpr std::string_view fn = "analyze_moments";
    auto const k = rows_of(keys, "keys");
    qkgeom::check_head_dim("analyze_moments: keys", k.view.cols());
    qkgeom::analysis_options const opt = options_or_default(options, fn);
    auto const rows = token_rows_of(k, k_positions, k_buckets, k_example_ids, true, "k", buckets);
    check_context(fn, "k", rows.position, context_length);
    capture_args const a{buckets, sliding_window, context_length};
    try {
        std::atomic<bool> stop{false};  // Ctrl-C: KeyboardInterrupt at the next safe point (core/cancel.hpp)
        return run_interruptible(stop, [&] {
            qkgeom::scoped_cancel const guard(stop);
            std::lock_guard lock(object_lock(&hm));
            if (k.view.cols() == hm.d && k.view.rows() == hm.k.count() && rows.position.size() == k.view.rows() &&
                rows.bucket.size() == k.view.rows()) {  // else analyze_head names the difference
                if (auto const why = qkgeom::keys_moments_mismatch(hm.k, k.view, rows.position, rows.bucket))
                    throw py::value_error("analyze_moments: keys: " + *why);  // a plain C++ exception: no GIL needed
            }
            return analyze_moment_rows(hm, rows, facts_of(a), opt);
        });
    } catch (std::bad_alloc const&) {
        out_of_memory("analyze_moments of " + rows_text(k, "key") + " of d = " + std::to_string(k.view.cols()));
    }
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
