// With QKGEOM_COMPILED (the CMake target qkgeom::compiled), the umbrella header
// declares the SIMD kernels and the plasticity engine and parses neither their
// bodies nor <immintrin.h> (docs/architecture.md, "Compile cost"). This file
// compiles only then: it redeclares, as unrelated types, names that only the
// engine's headers define, and fails on the include guards of <immintrin.h>
// (GCC and Clang spell them differently). Without QKGEOM_COMPILED it must fail
// (the control test).
#include <qkgeom/plasticity.hpp>

#if defined(_IMMINTRIN_H_INCLUDED) || defined(__IMMINTRIN_H)
#error "<immintrin.h> was included"
#endif

namespace qkgeom::detail {
struct pair_evaluator_t {};  // plasticity/closed_form.hpp: a class template
struct empirical_check {};   // plasticity/empirical.hpp
namespace mom {
struct vec512 {};  // simd/moment_kernels.hpp's AVX-512 operations
}  // namespace mom
}  // namespace qkgeom::detail

int main() { return 0; }
