// qkgeom Python extension — the token sampler and the head sampler of a
// capture (method §0.1): the C++ ones, the only implementation.
#include "common.hpp"

#include <optional>
#include <span>

namespace qkgeom_py {

namespace {

qkgeom::model_layout make_layout(std::int64_t head_dim, std::vector<std::int64_t> const& n_q,
                                 std::vector<std::int64_t> const& n_kv,
                                 std::optional<std::vector<std::optional<std::int64_t>>> const& windows) {
    constexpr std::string_view fn = "qkgeom.ModelLayout";
    if (n_q.size() != n_kv.size())
        qkgeom::detail::fail_arg(fn, "n_kv_heads: length differs from n_q_heads (" + std::to_string(n_q.size()) +
                                         " layers); length",
                                 n_kv.size());
    if (windows && windows->size() != n_q.size())
        qkgeom::detail::fail_arg(fn, "sliding_window: length differs from n_q_heads (" + std::to_string(n_q.size()) +
                                         " layers); length",
                                 windows->size());
    qkgeom::model_layout out;
    out.head_dim = head_dim;
    for (std::size_t l = 0; l < n_q.size(); ++l)
        out.layers.push_back({n_q[l], n_kv[l], windows ? (*windows)[l] : std::optional<std::int64_t>{}});
    qkgeom::check_layout(out, fn);
    return out;
}

template <class F>
py::list per_layer(qkgeom::model_layout const& m, F f) {
    py::list out;
    for (auto const& l : m.layers) out.append(f(l));
    return out;
}

void bind_layout(py::module_& m) {
    using qkgeom::model_layout;
    py::class_<model_layout>(m, "ModelLayout", "A model's attention layout: head_dim and per-layer head counts.")
        .def(py::init(&make_layout), py::arg("head_dim"), py::arg("n_q_heads"), py::arg("n_kv_heads"),
             py::arg("sliding_window") = py::none())
        .def_readonly("head_dim", &model_layout::head_dim)
        .def_property_readonly("n_layers", [](model_layout const& l) { return l.layers.size(); })
        .def_property_readonly("n_q_heads",
                               [](model_layout const& l) { return per_layer(l, [](auto const& x) { return x.n_q_heads; }); })
        .def_property_readonly("n_kv_heads",
                               [](model_layout const& l) { return per_layer(l, [](auto const& x) { return x.n_kv_heads; }); })
        .def_property_readonly("sliding_window",
                               [](model_layout const& l) {
                                   return per_layer(l, [](auto const& x) {
                                       return x.sliding_window ? py::object(py::int_(*x.sliding_window)) : py::none();
                                   });
                               })
        .def("__eq__", [](model_layout const& a, model_layout const& b) { return a == b; })
        .def("__repr__", [](model_layout const& l) {
            return "ModelLayout(head_dim=" + std::to_string(l.head_dim) + ", n_layers=" +
                   std::to_string(l.layers.size()) + ")";
        });
    m.def(
        "sample_heads",
        [](model_layout const& l, std::optional<std::int64_t> count, std::uint64_t seed,
           std::string const& eligibility) {
            auto const e = eligibility_of(eligibility);
            return count ? qkgeom::sample_heads(l, *count, seed, e) : qkgeom::eligible_heads(l, e);
        },
        py::arg("layout"), py::arg("count"), py::arg("seed") = 0, py::arg("eligibility") = "full_attention_only",
        "count query heads drawn without replacement from the eligible ones (all when count is None), "
        "ascending by (layer, q_head) (method §0.1).");
    m.def("key_head_of", &qkgeom::key_head_of, py::arg("q_head"), py::arg("n_q_heads"), py::arg("n_kv_heads"));
}

void bind_token_sampler(py::module_& m) {
    using qkgeom::capture_sampler;
    py::class_<capture_sampler>(m, "TokenSampler",
                                "The keep decision of method §0.1 bound to a bucket scheme and a seed.")
        .def(py::init([](qkgeom::bucket_spec const& b, std::uint64_t seed) {
                 qkgeom::detail::check_bucket_spec("qkgeom.TokenSampler", b);
                 return capture_sampler{b, seed};
             }),
             py::arg("buckets"), py::arg("seed") = 0)
        .def_readonly("buckets", &capture_sampler::buckets)
        .def_readonly("seed", &capture_sampler::seed)
        .def(
            "select",
            [](capture_sampler const& s, py::handle positions, py::handle example_ids, std::int64_t layer,
               std::string const& kind) {
                auto const k = kind_of(kind);
                auto const p = index_values(positions, "positions");
                auto const e = index_values(example_ids, "example_ids");
                std::vector<std::int64_t> kept;
                {
                    py::gil_scoped_release nogil;
                    kept = s.select(std::span<std::int64_t const>(p), std::span<std::int64_t const>(e), layer, k);
                }
                return to_numpy(std::move(kept));
            },
            py::arg("positions"), py::arg("example_ids"), py::arg("layer"), py::arg("kind"),
            "Indices of the kept tokens, ascending (the same for every head of one layer and kind).")
        .def(
            "keep",
            [](capture_sampler const& s, std::int64_t example_id, std::int64_t layer, std::string const& kind,
               std::int64_t position) { return s.keep(example_id, layer, kind_of(kind), position); },
            py::arg("example_id"), py::arg("layer"), py::arg("kind"), py::arg("position"));
}

}  // namespace

void bind_sampler(py::module_& m) {
    bind_layout(m);
    bind_token_sampler(m);
}

}  // namespace qkgeom_py
