// qkgeom Python extension — the module qkgeom._qkgeom (re-exported by the
// package qkgeom; docs/python.md) and the mapping of C++ errors to Python's,
// messages unchanged:
//   qkgeom::input_error (bad input data)   -> qkgeom.InputError, a ValueError
//                                              with .source, .field, .value
//   std::invalid_argument                  -> ValueError (pybind11)
//   qkgeom::io_error, filesystem_error     -> OSError (the message names the path)
//   std::runtime_error / logic_error       -> RuntimeError (pybind11)
#include "common.hpp"

#include <qkgeom/core/errors.hpp>

#include <filesystem>
#include <string>

#ifndef QKGEOM_PY_VERSION
#define QKGEOM_PY_VERSION "unknown"
#endif

namespace qkgeom_py {

void out_of_memory(std::string const& what) {
    PyErr_SetString(PyExc_MemoryError, (what + ": out of memory (std::bad_alloc): the rows, the d x d work matrices "
                                               "or the plasticity buffers did not fit")
                                           .c_str());
    throw py::error_already_set();
}

void bind_errors(py::module_& m) {
    static py::handle input_error;  // the module keeps the class alive
    py::object const cls = py::reinterpret_steal<py::object>(
        PyErr_NewExceptionWithDoc("qkgeom._qkgeom.InputError",
                                  "Bad input data (a file, array or field violating its contract): a ValueError "
                                  "with .source (file or stream), .field and .value (as text).",
                                  PyExc_ValueError, nullptr));
    if (!cls) throw py::error_already_set();
    m.attr("InputError") = cls;
    input_error = cls;
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (qkgeom::input_error const& e) {
            py::object const err = input_error(py::str(e.what()));
            err.attr("source") = py::str(e.source());
            err.attr("field") = py::str(e.field());
            err.attr("value") = py::str(e.value());
            PyErr_SetObject(input_error.ptr(), err.ptr());
        } catch (qkgeom::io_error const& e) {
            PyErr_SetString(PyExc_OSError, e.what());  // (no .filename: OSError's str() would then drop the message)
        } catch (std::filesystem::filesystem_error const& e) {
            PyErr_SetString(PyExc_OSError, e.what());
        }
    });
}

}  // namespace qkgeom_py

PYBIND11_MODULE(_qkgeom, m) {
    m.doc() = "qkgeom: position vs content geometry of transformer attention heads (C++ extension)";
    m.attr("__version__") = QKGEOM_PY_VERSION;
#if defined(QKGEOM_HAVE_ZLIB) && QKGEOM_HAVE_ZLIB
    m.attr("zlib") = true;  // deflated .npz members readable and writable
#else
    m.attr("zlib") = false;
#endif
    qkgeom_py::bind_errors(m);
    qkgeom_py::bind_moments(m);
    qkgeom_py::bind_sampler(m);
    qkgeom_py::bind_options(m);
    qkgeom_py::bind_analysis(m);
    qkgeom_py::bind_analyze(m);
    qkgeom_py::bind_io(m);
    qkgeom_py::bind_dataset(m);
    qkgeom_py::bind_study(m);
}
