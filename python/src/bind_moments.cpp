// qkgeom Python extension — HeadId, BucketSpec, bucket_of and the streaming
// moments (HeadMoments, shard files).
#include "common.hpp"

#include <optional>
#include <qkgeom/core/validate.hpp>
#include <qkgeom/io/moments_io.hpp>

#include <pybind11/eigen.h>
#include <pybind11/operators.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <optional>

namespace qkgeom_py {

namespace {

namespace fs = std::filesystem;

std::string id_repr(qkgeom::head_id const& h) {
    return "HeadId(" + std::to_string(h.layer) + ", " + std::to_string(h.q_head) + ", " + std::to_string(h.k_head) +
           ")";
}

void bind_head_id(py::module_& m) {
    using qkgeom::head_id;
    py::class_<head_id>(m, "HeadId", "A head pair: layer, query head and the key head it reads.")
        .def(py::init([](std::int64_t l, std::int64_t q, std::int64_t k) { return head_id{l, q, k}; }),
             py::arg("layer"), py::arg("q_head"), py::arg("k_head"))
        .def_readwrite("layer", &head_id::layer)
        .def_readwrite("q_head", &head_id::q_head)
        .def_readwrite("k_head", &head_id::k_head)
        .def("__iter__", [](head_id const& h) { return py::iter(py::make_tuple(h.layer, h.q_head, h.k_head)); })
        .def("__len__", [](head_id const&) { return 3; })
        .def("__getitem__",
             [](head_id const& h, py::ssize_t i) {
                 std::int64_t const v[3] = {h.layer, h.q_head, h.k_head};
                 py::ssize_t const at = i < 0 ? i + 3 : i;
                 if (at < 0 || at >= 3) throw py::index_error("HeadId index " + std::to_string(i) + " out of range");
                 return v[at];
             })
        .def("__hash__", [](head_id const& h) { return py::hash(py::make_tuple(h.layer, h.q_head, h.k_head)); })
        .def("__repr__", &id_repr)
        .def(py::self == py::self)
        .def(py::self != py::self)
        .def(py::self < py::self)
        .def(py::pickle([](head_id const& h) { return py::make_tuple(h.layer, h.q_head, h.k_head); },
                        [](py::tuple const& t) {
                            return head_id{t[0].cast<std::int64_t>(), t[1].cast<std::int64_t>(),
                                           t[2].cast<std::int64_t>()};
                        }));
}

/// A BucketSpec as the manifest reader and bucket_of check it (scheme known,
/// width >= 1, rate finite and > 0): refused when made or changed, not when used.
qkgeom::bucket_spec checked_spec(qkgeom::bucket_spec s) {
    qkgeom::detail::check_bucket_spec("BucketSpec", s);
    return s;
}

void bind_bucket_spec(py::module_& m) {
    using qkgeom::bucket_spec;
    py::class_<bucket_spec>(m, "BucketSpec",
                            "Bucket scheme (uniform | log | all), width (B or B_min, >= 1) and keep rate (finite, > 0); "
                            "checked when made or changed.")
        .def(py::init([](std::string const& scheme, std::int64_t width, double rate) {
                 return checked_spec(bucket_spec{scheme_of(scheme), width, rate});
             }),
             py::arg("scheme") = "uniform", py::arg("width") = 128, py::arg("rate") = 1.0)
        .def_property(
            "scheme", [](bucket_spec const& s) { return std::string(qkgeom::bucket_scheme_name(s.scheme)); },
            [](bucket_spec& s, std::string const& v) { s.scheme = scheme_of(v); })
        .def_property(
            "width", [](bucket_spec const& s) { return s.width; },
            [](bucket_spec& s, std::int64_t v) {
                bucket_spec t = s;
                t.width = v;
                s = checked_spec(t);
            })
        .def_property(
            "rate", [](bucket_spec const& s) { return s.rate; },
            [](bucket_spec& s, double v) {
                bucket_spec t = s;
                t.rate = v;
                s = checked_spec(t);
            })
        .def(py::self == py::self)
        .def("__repr__", [](bucket_spec const& s) {
            return "BucketSpec('" + std::string(qkgeom::bucket_scheme_name(s.scheme)) + "', " +
                   std::to_string(s.width) + ", " + std::string(py::repr(py::float_(s.rate))) + ")";
        });
    m.def(
        "bucket_of",
        [](bucket_spec const& spec, py::handle positions) {
            auto const p = indices_of(positions, "positions");
            std::vector<std::int64_t> out(static_cast<std::size_t>(p.view.size()));
            for (qkgeom::index_t i = 0; i < p.view.size(); ++i)
                out[static_cast<std::size_t>(i)] = qkgeom::bucket_of(spec, p.view[i]);
            return to_numpy(std::move(out));
        },
        py::arg("spec"), py::arg("positions"), "The bucket of every position (method §0.1).");
}

py::dict moments_dict(qkgeom::moments const& s) {
    py::dict d;
    d["n"] = s.n;
    d["mean_t"] = s.mean_t;
    d["m2_t"] = s.m2_t;
    d["t_min"] = s.t_min;
    d["t_max"] = s.t_max;
    d["mean_x"] = s.mean_x;
    d["c_xt"] = s.c_xt;
    d["c_xx"] = s.c_xx;
    return d;
}

void bind_head_moments(py::module_& m) {
    using qkgeom::head_moments;
    py::class_<head_moments>(m, "HeadMoments",
                             "Streaming, mergeable sufficient statistics of one head (method §1).")
        .def(py::init([](qkgeom::index_t dim, qkgeom::head_id const& id) {
                 qkgeom::check_head_dim("HeadMoments(dim)", dim);  // the shard files' limit: refused before allocating
                 return head_moments(dim, id);
             }),
             py::arg("dim"), py::arg("head") = qkgeom::head_id{0, 0, 0})
        .def_readonly("id", &head_moments::id)
        .def_readonly("dim", &head_moments::d)
        .def(
            "add",
            [](head_moments& hm, std::string const& kind, py::handle rows, py::handle positions, py::handle buckets) {
                auto const k = kind_of(kind);
                auto const r = rows_of(rows, "rows");
                auto const p = indices_of(positions, "positions");
                auto const b = indices_of(buckets, "buckets");
                py::gil_scoped_release nogil;
                std::lock_guard lock(object_lock(&hm));
                hm.add(k, r.view, p.view, b.view);
            },
            py::arg("kind"), py::arg("rows"), py::arg("positions"), py::arg("buckets"),
            "Add rows of one kind (read in place; the GIL is released while reducing).")
        .def(
            "rows",
            [](head_moments const& hm, std::string const& kind) {
                auto const k = kind_of(kind);
                std::lock_guard lock(object_lock(&hm));
                return hm[k].count();
            },
            py::arg("kind"))
        .def(
            "buckets",
            [](head_moments const& hm, std::string const& kind) {
                auto const k = kind_of(kind);
                std::lock_guard lock(object_lock(&hm));
                py::dict out;
                for (auto const& [b, s] : hm[k].buckets) out[py::int_(b)] = moments_dict(s);
                return out;
            },
            py::arg("kind"),
            "{bucket: {n, mean_t, m2_t, t_min, t_max, mean_x, c_xt, c_xx}}: the centred statistics per bucket.")
        .def(
            "merge",
            [](head_moments& hm, head_moments const& o) {
                py::gil_scoped_release nogil;
                pair_lock lock(&hm, &o);
                hm += o;
            },
            py::arg("other"))
        .def(
            "__iadd__",
            [](head_moments& hm, head_moments const& o) -> head_moments& {
                py::gil_scoped_release nogil;
                pair_lock lock(&hm, &o);
                return hm += o;
            },
            py::return_value_policy::reference_internal)
        .def(
            "save",
            [](head_moments const& hm, fs::path const& path, std::optional<qkgeom::bucket_spec> const& buckets) {
                py::gil_scoped_release nogil;
                std::lock_guard lock(object_lock(&hm));
                qkgeom::save_moments(path, hm, buckets);
            },
            py::arg("path"), py::arg("buckets") = py::none(),
            "Write a shard file (qkgeom merge reads it). With buckets (the BucketSpec the rows were "
            "bucketed with), format version 2: the scheme is recorded and every bucket's positions are "
            "checked to lie in its id under it, so shards of different schemes are refused at merge; "
            "without, version 1 (no scheme recorded).")
        .def("__repr__", [](head_moments const& hm) {
            return "HeadMoments(dim=" + std::to_string(hm.d) + ", head=" + id_repr(hm.id) +
                   ", query_rows=" + std::to_string(hm.q.count()) + ", key_rows=" + std::to_string(hm.k.count()) +
                   ")";
        });
    m.def(
        "load_moments",
        [](fs::path const& path) {
            py::gil_scoped_release nogil;
            return qkgeom::load_moments(path);
        },
        py::arg("path"));
    m.def(
        "merge_moment_files",
        [](std::vector<fs::path> const& paths) {
            py::gil_scoped_release nogil;
            return qkgeom::merge_moment_files(std::span<fs::path const>(paths));
        },
        py::arg("paths"));
}

}  // namespace

void bind_moments(py::module_& m) {
    bind_head_id(m);
    bind_bucket_spec(m);
    bind_head_moments(m);
}

}  // namespace qkgeom_py
