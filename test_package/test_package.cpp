#include "head_check.hpp"
#include "moments_check.hpp"

#include <qkgeom/plasticity.hpp>
#include <cstdlib>
#include <iostream>

int main() {
    moments_numbers const m = moments_check();
    std::cout << "qkgeom test_package: n = " << m.n << ", max |cov_x error| = " << m.err << '\n';
    head_numbers h;
    bool const head_ok = print_head_check(h);  // the last line: compare_modes.cmake reads it
    return m.ok() && head_ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
