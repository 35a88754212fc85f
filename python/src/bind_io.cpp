// qkgeom Python extension — datasets (docs/dataset.md): the manifest, one
// entry read or written, and the streaming DatasetWriter.
#include "common.hpp"

#include <qkgeom/core/errors.hpp>
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/io/dataset_writer.hpp>

#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <mutex>
#include <new>
#include <span>
#include <string>

namespace qkgeom_py {

namespace {

namespace fs = std::filesystem;
namespace io = qkgeom::io;

qkgeom::rope_pairing pairing_of(std::string_view s) {
    for (auto p : {qkgeom::rope_pairing::rotate_half, qkgeom::rope_pairing::interleaved})
        if (s == qkgeom::rope_pairing_name(p)) return p;
    throw py::value_error("pairing: '" + std::string(s) + "' is not one of rotate_half | interleaved");
}

void bind_rope(py::module_& m) {
    using qkgeom::rope_spec;
    py::class_<rope_spec>(m, "RopeSpec", "The rotary embedding a capture was taken under (manifest 'rope').")
        .def(py::init([](std::string const& pairing, std::int64_t rotary_dim, double theta, std::string scaling,
                         double scaling_factor) {
                 return rope_spec{pairing_of(pairing), rotary_dim, theta, std::move(scaling), scaling_factor};
             }),
             py::arg("pairing") = "rotate_half", py::arg("rotary_dim") = 0, py::arg("theta") = 10000.0,
             py::arg("scaling") = "none", py::arg("scaling_factor") = 1.0)
        .def_property(
            "pairing", [](rope_spec const& r) { return std::string(qkgeom::rope_pairing_name(r.pairing)); },
            [](rope_spec& r, std::string const& v) { r.pairing = pairing_of(v); })
        .def_readwrite("rotary_dim", &rope_spec::rotary_dim)
        .def_readwrite("theta", &rope_spec::theta)
        .def_readwrite("scaling", &rope_spec::scaling)
        .def_readwrite("scaling_factor", &rope_spec::scaling_factor)
        .def("__eq__", [](rope_spec const& a, rope_spec const& b) { return a == b; });
    using io::head_sampling;
    py::class_<head_sampling>(m, "HeadSampling",
                              "How the heads of a capture were chosen (capture.head_count, head_seed, eligibility).")
        .def(py::init([](std::optional<std::int64_t> count, std::uint64_t seed, std::string const& e) {
                 return head_sampling{count, seed, eligibility_of(e)};
             }),
             py::arg("count") = py::none(), py::arg("seed") = 0, py::arg("eligibility") = "full_attention_only")
        .def_readwrite("count", &head_sampling::count)
        .def_readwrite("seed", &head_sampling::seed)
        .def_property(
            "eligibility", [](head_sampling const& h) { return std::string(io::layer_eligibility_name(h.eligibility)); },
            [](head_sampling& h, std::string const& v) { h.eligibility = eligibility_of(v); })
        .def("__eq__", [](head_sampling const& a, head_sampling const& b) { return a == b; });
}

/// Manifest.head_list from Python: None, or a sequence of (layer, q_head) pairs or HeadIds
/// (k_head kept: write_manifest / planned_heads refuse one off the GQA mapping).
std::vector<qkgeom::head_id> head_list_of(std::optional<py::sequence> const& v) {
    std::vector<qkgeom::head_id> out;
    if (!v) return out;
    if (v->size() == 0)
        throw py::value_error("head_list: an empty list plans no head; pass None when no explicit plan is recorded");
    out.reserve(v->size());
    for (std::size_t i = 0; i < v->size(); ++i) {
        py::handle e = (*v)[i];
        if (py::isinstance<qkgeom::head_id>(e)) {
            out.push_back(e.cast<qkgeom::head_id>());
            continue;
        }
        auto const t = py::reinterpret_borrow<py::object>(e);
        if (!py::isinstance<py::sequence>(t) || py::isinstance<py::str>(t) || py::len(t) != 2)
            throw py::value_error("head_list[" + std::to_string(i) + "]: expected a (layer, q_head) pair or a HeadId, got " +
                                  std::string(py::repr(t)));
        out.push_back({t[py::int_(0)].cast<std::int64_t>(), t[py::int_(1)].cast<std::int64_t>(), -1});
    }
    return out;
}

void bind_manifest(py::module_& m) {
    using io::manifest;
    py::class_<manifest>(m, "Manifest", "A dataset's manifest.json (docs/dataset.md): every field as an attribute.")
        .def(py::init([](std::string model, std::int64_t n_layers, std::vector<std::int64_t> n_q_heads,
                         std::vector<std::int64_t> n_kv_heads, std::int64_t head_dim, qkgeom::bucket_spec buckets,
                         std::int64_t context_length, std::uint64_t seed, std::optional<qkgeom::rope_spec> rope,
                         std::vector<std::optional<std::int64_t>> sliding_window,
                         std::optional<io::head_sampling> heads, std::optional<std::vector<bool>> rope_applied,
                         std::string token_sampler, std::optional<py::sequence> head_list) {
                 manifest x;
                 x.model = std::move(model);
                 x.n_layers = n_layers;
                 x.n_q_heads = std::move(n_q_heads);
                 x.n_kv_heads = std::move(n_kv_heads);
                 x.head_dim = head_dim;
                 x.buckets = buckets;
                 x.context_length = context_length;
                 x.seed = seed;
                 x.rope = std::move(rope);
                 x.sliding_window = std::move(sliding_window);
                 x.heads = heads;
                 x.rope_applied = rope_applied.value_or(std::vector<bool>{});
                 x.token_sampler = std::move(token_sampler);
                 x.head_list = head_list_of(head_list);
                 return x;
             }),
             py::kw_only(), py::arg("model") = "", py::arg("n_layers") = 0,
             py::arg("n_q_heads") = std::vector<std::int64_t>{}, py::arg("n_kv_heads") = std::vector<std::int64_t>{},
             py::arg("head_dim") = 0, py::arg("buckets") = qkgeom::bucket_spec{}, py::arg("context_length") = 0,
             py::arg("seed") = 0, py::arg("rope") = py::none(),
             py::arg("sliding_window") = std::vector<std::optional<std::int64_t>>{}, py::arg("heads") = py::none(),
             py::arg("rope_applied") = py::none(), py::arg("token_sampler") = "qkgeom", py::arg("head_list") = py::none())
        .def_readwrite("model", &manifest::model)
        .def_readwrite("n_layers", &manifest::n_layers)
        .def_readwrite("n_q_heads", &manifest::n_q_heads)
        .def_readwrite("n_kv_heads", &manifest::n_kv_heads)
        .def_readwrite("head_dim", &manifest::head_dim)
        .def_readwrite("buckets", &manifest::buckets)
        .def_readwrite("context_length", &manifest::context_length)
        .def_readwrite("seed", &manifest::seed)
        .def_readwrite("rope", &manifest::rope)
        .def_readwrite("sliding_window", &manifest::sliding_window)
        .def_readwrite("heads", &manifest::heads)
        .def_property(
            "rope_applied",
            [](manifest const& x) -> std::optional<std::vector<bool>> {
                if (x.rope_applied.empty()) return std::nullopt;
                return x.rope_applied;
            },
            [](manifest& x, std::optional<std::vector<bool>> v) { x.rope_applied = v.value_or(std::vector<bool>{}); },
            "Per layer: True = rows captured after RoPE, False = before (NoPE layers); None = not recorded.")
        .def_property(
            "head_list",
            [](manifest const& x) -> py::object {
                if (x.head_list.empty()) return py::none();
                py::list l;
                for (auto const& h : x.head_list) l.append(py::make_tuple(h.layer, h.q_head));
                py::object r = std::move(l);
                return r;
            },
            [](manifest& x, std::optional<py::sequence> v) { x.head_list = head_list_of(v); },
            "Explicit planned query heads (capture.heads) as [(layer, q_head)] in the listed order; None = not "
            "recorded. Exclusive with heads (a head sampling).")
        .def_readwrite("token_sampler", &manifest::token_sampler,
                       "Who chose the kept tokens: 'qkgeom' (method §0.1 sampler with seed) or another tool.")
        .def("to_json", &io::dump_manifest, "The manifest.json text.")
        .def("__repr__", [](manifest const& x) {
            return "Manifest(model=" + std::string(py::repr(py::str(x.model))) +
                   ", n_layers=" + std::to_string(x.n_layers) + ", head_dim=" + std::to_string(x.head_dim) + ")";
        });
    m.def("read_manifest", &io::read_manifest, py::arg("dir"), py::call_guard<py::gil_scoped_release>());
    m.def("write_manifest", &io::write_manifest, py::arg("dir"), py::arg("manifest"),
          py::call_guard<py::gil_scoped_release>());
    m.def("planned_heads", &io::planned_heads, py::arg("manifest"),
          "The head pairs a capture holds (its explicit head list, its head sample, or every query head), ascending.");
    m.def("layout_of", &io::layout_of, py::arg("manifest"));
}

py::dict entry_dict(io::head_entry&& e) {
    py::dict d;
    d["vectors"] = to_numpy(std::move(e.vectors));
    d["position"] = to_numpy(std::move(e.position.values()));
    d["bucket"] = to_numpy(std::move(e.bucket.values()));
    d["example_id"] = to_numpy(std::move(e.example_id.values()));
    d["sliding_window"] = e.sliding_window ? py::object(py::int_(*e.sliding_window)) : py::none();
    d["dtype"] = e.dtype;
    return d;
}

io::storage_format format_of(std::string_view s) {
    for (auto f : {io::storage_format::npy, io::storage_format::safetensors, io::storage_format::npz})
        if (s == io::storage_format_name(f)) return f;
    throw py::value_error("format: '" + std::string(s) + "' is not one of npy | safetensors | npz");
}

void bind_entries(py::module_& m) {
    m.def(
        "read_entry",
        [](fs::path const& dir, io::manifest const& man, std::int64_t layer, std::int64_t head,
           std::string const& kind) {
            auto const k = kind_of(kind);
            io::head_entry e;
            {
                py::gil_scoped_release nogil;
                e = io::read_head(dir, man, layer, head, k);
            }
            return entry_dict(std::move(e));
        },
        py::arg("dir"), py::arg("manifest"), py::arg("layer"), py::arg("head"), py::arg("kind"),
        "One entry, validated: {vectors (float64, widened exactly), position, bucket, example_id, "
        "sliding_window, dtype}.");
    m.def(
        "write_entry",
        [](fs::path const& dir, io::manifest const& man, std::int64_t layer, std::int64_t head,
           std::string const& kind, py::handle rows, py::handle positions, py::handle example_ids,
           py::handle buckets, std::optional<std::int64_t> sliding_window, std::string const& format,
           std::string const& dtype) {
            io::head_entry e;
            e.layer = layer;
            e.head = head;
            e.k = kind_of(kind);
            auto const r = rows_of(rows, "rows");
            e.vectors.resize(r.view.rows(), r.view.cols());
            for (qkgeom::index_t i = 0; i < r.view.rows(); ++i) r.view.read_row(i, e.vectors.row(i).data());
            e.position = qkgeom::token_positions(index_values(positions, "positions"));
            e.example_id = qkgeom::example_ids(index_values(example_ids, "example_ids"));
            if (buckets.is_none()) {
                std::vector<std::int64_t> b;
                for (auto t : e.position) b.push_back(qkgeom::bucket_of(man.buckets, t));
                e.bucket = qkgeom::token_buckets(std::move(b));
            } else {
                e.bucket = qkgeom::token_buckets(index_values(buckets, "buckets"));
            }
            e.sliding_window = sliding_window;
            auto const f = format_of(format);
            py::gil_scoped_release nogil;
            io::write_head(dir, man, e, f, dtype);
        },
        py::arg("dir"), py::arg("manifest"), py::arg("layer"), py::arg("head"), py::arg("kind"), py::arg("rows"),
        py::arg("positions"), py::arg("example_ids"), py::arg("buckets") = py::none(),
        py::arg("sliding_window") = py::none(), py::arg("format") = "npy", py::arg("dtype") = "f32",
        "Write one whole entry (io::write_head); buckets default to bucket_of(manifest.buckets, positions).");
}

/// The writer with a lock: its methods run with the GIL released, so two
/// Python threads could otherwise enter it at once (it is not thread-safe).
/// `failed` keeps the first write that failed (a flush that could not write,
/// or memory): that batch is not in the files, so close() refuses to write a
/// manifest.json that would present the folder as a complete capture.
struct py_writer {
    io::dataset_writer w;
    std::mutex mu;
    std::string failed;
};

/// Runs a writer call that may write; a write failure is remembered (py_writer::failed).
template <class F>
void writing(py_writer& pw, F const& call) {
    try {
        call();
    } catch (qkgeom::io_error const& e) {
        if (pw.failed.empty()) pw.failed = e.what();
        throw;
    } catch (std::bad_alloc const&) {
        if (pw.failed.empty()) pw.failed = "out of memory (std::bad_alloc) while buffering or writing a batch";
        throw;
    }
}

void bind_writer(py::module_& m) {
    py::class_<py_writer>(m, "DatasetWriter",
                          "Streams rows into a dataset in NumPy form, memory bounded by buffer_bytes "
                          "(io::dataset_writer); close() writes the headers and manifest.json.")
        .def(py::init([](fs::path dir, io::manifest man, std::string const& dtype, std::size_t buffer_bytes) {
                 py::gil_scoped_release nogil;
                 return new py_writer{io::dataset_writer(std::move(dir), std::move(man), dtype, buffer_bytes), {}, {}};
             }),
             py::arg("dir"), py::arg("manifest"), py::arg("dtype") = "f32",
             py::arg("buffer_bytes") = io::dataset_writer::default_buffer_bytes)
        .def(
            "append",
            [](py_writer& pw, std::int64_t layer, std::string const& kind, std::int64_t head, py::handle rows,
               py::handle positions, py::handle example_ids) {
                auto const k = kind_of(kind);
                auto const r = rows_of(rows, "rows");
                auto const p = index_values(positions, "positions");
                auto const e = index_values(example_ids, "example_ids");
                py::gil_scoped_release nogil;
                std::lock_guard lock(pw.mu);
                writing(pw, [&] {
                    pw.w.append(layer, k, head, r.view, std::span<std::int64_t const>(p),
                                std::span<std::int64_t const>(e));
                });
            },
            py::arg("layer"), py::arg("kind"), py::arg("head"), py::arg("rows"), py::arg("positions"),
            py::arg("example_ids"))
        .def(
            "close",
            [](py_writer& pw) {
                py::gil_scoped_release nogil;
                std::lock_guard lock(pw.mu);
                if (!pw.w.closed() && !pw.failed.empty())
                    throw qkgeom::io_error(pw.w.dir().string(),
                                           "DatasetWriter.close: " + pw.w.dir().string() +
                                               ": an earlier write failed (" + pw.failed +
                                               "): its rows are not in the files, so no manifest.json is written "
                                               "(the folder does not read as a dataset); capture again into a new "
                                               "folder");
                writing(pw, [&] { pw.w.close(); });
            },
            "Flush, finish the .npy headers, write manifest.json last. Refused (OSError, no manifest.json) after a "
            "write of append() or close() failed.")
        .def_property_readonly("closed",
                               [](py_writer& pw) {
                                   std::lock_guard lock(pw.mu);
                                   return pw.w.closed();
                               })
        .def_property_readonly("buffered_bytes",
                               [](py_writer& pw) {
                                   std::lock_guard lock(pw.mu);
                                   return pw.w.buffered_bytes();
                               })
        .def_property_readonly("dir", [](py_writer& pw) { return pw.w.dir(); })
        .def_property_readonly("manifest", [](py_writer& pw) { return pw.w.manifest_of(); })
        .def(
            "rows",
            [](py_writer& pw, std::int64_t layer, std::string const& kind, std::int64_t head) {
                auto const k = kind_of(kind);
                std::lock_guard lock(pw.mu);
                return pw.w.rows(layer, k, head);
            },
            py::arg("layer"), py::arg("kind"), py::arg("head"))
        .def("__enter__", [](py_writer& pw) -> py_writer& { return pw; }, py::return_value_policy::reference)
        .def(
            "__exit__",
            [](py_writer& pw, py::handle type, py::handle, py::handle) {
                if (type.is_none()) {  // on an exception: no manifest.json, so the folder never reads as a dataset
                    py::gil_scoped_release nogil;
                    std::lock_guard lock(pw.mu);
                    pw.w.close();
                }
                return false;
            });
}

}  // namespace

void bind_io(py::module_& m) {
    bind_rope(m);
    bind_manifest(m);
    bind_entries(m);
    bind_writer(m);
}

}  // namespace qkgeom_py
