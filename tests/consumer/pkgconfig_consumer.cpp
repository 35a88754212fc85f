// The pkg-config consumer of an installed qkgeom (tests/consumer/run_consumer.cmake):
// compiled with nothing but `pkg-config --cflags --libs qkgeom`, it proves that
// the installed qkgeom.pc carries the include path, the language level, Eigen
// (Requires: eigen3) and zlib (Requires: zlib, QKGEOM_HAVE_ZLIB=1: a deflated
// .npz is written and read back, which links zlib). It includes the moments and
// the .npz reader, not the whole umbrella, which the find_package consumer
// (test_package/) already compiles and runs.
#include "../../test_package/moments_check.hpp"

#include <qkgeom/io/npz.hpp>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

int main() {
    moments_numbers const m = moments_check();

    // a deflated member round trip (zlib through the .pc)
    Eigen::MatrixXd const x = moments_rows();
    qkgeom::io::npy_array a;
    a.descr = "<f8";
    a.shape = {4, 2};
    a.data.resize(8 * sizeof(double));
    std::memcpy(a.data.data(), x.data(), a.data.size());
    qkgeom::io::npz_file f;
    f.add("x", a);
    auto const bytes = qkgeom::io::serialize_npz(f, {.compression = qkgeom::io::npz_compression::deflate});
    auto const back = qkgeom::io::parse_npz(bytes, "memory");
    bool const same = back.find("x") != nullptr && back.find("x")->data == a.data;

    std::cout << "qkgeom pkg-config consumer: n = " << m.n << ", max |cov_x error| = " << m.err
              << ", deflated .npz round trip " << (same ? "equal" : "DIFFERENT") << " (" << bytes.size()
              << " bytes)\n";
    return m.ok() && same && qkgeom::io::npz_deflate_available() ? EXIT_SUCCESS : EXIT_FAILURE;
}
