// qkgeom Python extension — NumPy arrays in place (zero copy) and the enum
// spellings shared with the program and the manifest.
#include "common.hpp"

#include <qkgeom/io/dataset.hpp>

#include <Eigen/Core>

#include <array>
#include <functional>
#include <memory>
#include <utility>

namespace qkgeom_py {

namespace {

std::string shape_text(py::array const& a) {
    std::string s = "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
    return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string describe(py::array const& a) {
    return "dtype " + std::string(py::str(a.dtype())) + ", shape " + shape_text(a);
}

/// The common checks of an array read in place: native byte order, aligned,
/// strides a whole number of elements.
void check_layout(py::array const& a, std::string_view name) {
    char const order = a.dtype().byteorder();
    if (order == '>') throw py::value_error(std::string(name) + ": non-native byte order (" + describe(a) +
                                            "); convert with .astype(its dtype.newbyteorder('='))");
    if ((a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_) == 0)
        throw py::value_error(std::string(name) + ": the array's data is not aligned to its element size (" +
                              describe(a) + "); pass a copy (np.ascontiguousarray)");
    for (py::ssize_t i = 0; i < a.ndim(); ++i)
        if (a.strides(i) % a.itemsize() != 0)
            throw py::value_error(std::string(name) + ": stride " + std::to_string(a.strides(i)) +
                                  " bytes is not a multiple of the element size (" + describe(a) + ")");
}

template <class T>
array_rows::views view_as(py::array const& a) {
    auto const is = a.itemsize();
    return qkgeom::matrix_view<T>(static_cast<T const*>(a.data()), a.shape(0), a.shape(1), a.strides(0) / is,
                                  a.strides(1) / is);
}

/// The tag a dtype implies: "f64", "f32", "f16"; "" for 16-bit integers
/// (bf16 bits need the tag) and anything else.
std::string implied_tag(py::dtype const& t) {
    if (t.kind() == 'f' && t.itemsize() == 8) return "f64";
    if (t.kind() == 'f' && t.itemsize() == 4) return "f32";
    if (t.kind() == 'f' && t.itemsize() == 2) return "f16";
    return "";
}

bool is_int16(py::dtype const& t) { return (t.kind() == 'i' || t.kind() == 'u') && t.itemsize() == 2; }

}  // namespace

std::mutex& object_lock(void const* object) noexcept {
    static std::array<std::mutex, 64> stripes;
    auto const h = std::hash<void const*>{}(object);
    return stripes[(h ^ (h >> 6)) % stripes.size()];
}

pair_lock::pair_lock(void const* a, void const* b) : first_(&object_lock(a)), second_(&object_lock(b)) {
    if (first_ == second_) {
        first_->lock();
        second_ = nullptr;
    } else {
        std::lock(*first_, *second_);
    }
}

pair_lock::~pair_lock() {
    first_->unlock();
    if (second_) second_->unlock();
}

held<array_rows> rows_of(py::handle x, std::string_view name) {
    py::object obj;
    std::string tag;
    if (py::isinstance<py::tuple>(x) && py::len(x) == 2 && py::isinstance<py::array>(x[py::int_(0)]) &&
        py::isinstance<py::str>(x[py::int_(1)])) {
        obj = x[py::int_(0)];
        tag = py::cast<std::string>(x[py::int_(1)]);
    } else if (py::isinstance<py::array>(x)) {
        obj = py::reinterpret_borrow<py::object>(x);
    } else {  // torch tensors and the like: qkgeom._arrays makes a NumPy view (no copy)
        py::tuple const r = py::module_::import("qkgeom._arrays").attr("as_rows")(x, py::str(std::string(name)));
        obj = r[0];
        tag = py::cast<std::string>(r[1]);
    }
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (a.ndim() != 2)
        throw py::value_error(std::string(name) + ": expected a 2-D array of rows (tokens x head_dim), got " +
                              describe(a));
    py::dtype const t = a.dtype();
    std::string const implied = implied_tag(t);
    if (implied.empty() && !(is_int16(t) && tag == "bf16"))
        throw py::type_error(std::string(name) + ": unsupported " + describe(a) +
                             ": expected float16, float32 or float64 rows, or int16/uint16 bfloat16 bits tagged "
                             "'bf16' (qkgeom._arrays.as_rows)");
    if (!tag.empty() && !implied.empty() && tag != implied)
        throw py::type_error(std::string(name) + ": dtype tag '" + tag + "' does not match the array's " +
                             describe(a));
    if (!tag.empty() && tag != "f64" && tag != "f32" && tag != "f16" && tag != "bf16")
        throw py::value_error(std::string(name) + ": unknown dtype tag '" + tag + "' (f64 | f32 | f16 | bf16)");
    check_layout(a, name);
    std::string const dt = implied.empty() ? tag : implied;
    array_rows::views v = dt == "f64"   ? view_as<double>(a)
                          : dt == "f32" ? view_as<float>(a)
                          : dt == "f16" ? view_as<qkgeom::float16>(a)
                                        : view_as<qkgeom::bfloat16>(a);
    return {std::move(obj), array_rows(v)};
}

held<array_indices> indices_of(py::handle x, std::string_view name) {
    auto direct = [](py::handle h) {
        if (!py::isinstance<py::array>(h)) return false;
        auto const a = py::reinterpret_borrow<py::array>(h);
        py::dtype const t = a.dtype();
        return a.ndim() == 1 && t.kind() == 'i' && (t.itemsize() == 8 || t.itemsize() == 4);
    };
    py::object obj = py::reinterpret_borrow<py::object>(x);
    if (!direct(obj)) {  // torch tensors, sequences, other integer widths: qkgeom._arrays (names the problem)
        obj = py::module_::import("qkgeom._arrays").attr("as_indices")(x, py::str(std::string(name)));
        if (!direct(obj)) throw py::type_error(std::string(name) + ": qkgeom._arrays.as_indices returned no 1-D integer array");
    }
    auto const a = py::reinterpret_borrow<py::array>(obj);
    check_layout(a, name);
    bool const is64 = a.itemsize() == 8;
    return {std::move(obj), array_indices(a.data(), a.shape(0), a.strides(0) / a.itemsize(), is64)};
}

std::vector<std::int64_t> index_values(py::handle x, std::string_view name) {
    auto const h = indices_of(x, name);
    std::vector<std::int64_t> v(static_cast<std::size_t>(h.view.size()));
    for (qkgeom::index_t i = 0; i < h.view.size(); ++i) v[static_cast<std::size_t>(i)] = h.view[i];
    return v;
}

py::array_t<std::int64_t> to_numpy(std::vector<std::int64_t>&& v) {
    auto* p = new std::vector<std::int64_t>(std::move(v));
    py::capsule owner(p, [](void* q) { delete static_cast<std::vector<std::int64_t>*>(q); });
    return py::array_t<std::int64_t>(static_cast<py::ssize_t>(p->size()), p->data(), owner);
}

py::array_t<double> to_numpy(qkgeom::row_matrix&& m) {
    auto* p = new qkgeom::row_matrix(std::move(m));
    py::capsule owner(p, [](void* q) { delete static_cast<qkgeom::row_matrix*>(q); });
    auto const r = static_cast<py::ssize_t>(p->rows()), c = static_cast<py::ssize_t>(p->cols());
    return py::array_t<double>({r, c}, {static_cast<py::ssize_t>(c * sizeof(double)), py::ssize_t{sizeof(double)}},
                               p->data(), owner);
}

qkgeom::kind kind_of(std::string_view s, std::string_view name) {
    if (s == "query" || s == "q") return qkgeom::kind::query;
    if (s == "key" || s == "k") return qkgeom::kind::key;
    throw py::value_error(std::string(name) + ": '" + std::string(s) + "' is not one of query | key (or q | k)");
}

qkgeom::bucket_scheme scheme_of(std::string_view s) {
    for (auto b : {qkgeom::bucket_scheme::uniform, qkgeom::bucket_scheme::log, qkgeom::bucket_scheme::all})
        if (s == qkgeom::bucket_scheme_name(b)) return b;
    throw py::value_error("scheme: '" + std::string(s) + "' is not one of uniform | log | all");
}

qkgeom::layer_eligibility eligibility_of(std::string_view s) {
    for (auto e : {qkgeom::layer_eligibility::full_attention_only, qkgeom::layer_eligibility::all_layers})
        if (s == qkgeom::io::layer_eligibility_name(e)) return e;
    throw py::value_error("eligibility: '" + std::string(s) + "' is not one of full_attention_only | all_layers");
}

}  // namespace qkgeom_py
