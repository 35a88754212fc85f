// test_package with qkgeom::compiled: the SIMD kernels and the plasticity
// engine come from the compiled part (src/qkgeom_compiled.cpp), not the headers.
// With three arguments (the header-only program's "ap_overall n_pairs
// gaussian_gap", compare_modes.cmake) it also requires the same head: n_pairs
// equal, the two values within 1e-12 relative (the same kernels; only
// inlining differs).
#include "head_check.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
    head_numbers h;
    if (!print_head_check(h)) return EXIT_FAILURE;
    if (argc != 4) return EXIT_SUCCESS;
    double const ap = std::stod(argv[1]), gap = std::stod(argv[3]);
    long long const pairs = std::stoll(argv[2]);
    auto close = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)); };
    if (pairs != h.n_pairs || !close(ap, h.ap_overall) || !close(gap, h.gaussian_gap)) {
        std::printf("differs from the header-only program: %s %s %s\n", argv[1], argv[2], argv[3]);
        return EXIT_FAILURE;
    }
    std::printf("equals the header-only program to 1e-12\n");
    return EXIT_SUCCESS;
}
