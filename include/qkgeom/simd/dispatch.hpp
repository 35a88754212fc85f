// qkgeom — runtime instruction-set dispatch for the few hot kernels.
//
// The library never forces an ISA on its users (no -march in its targets), so
// a default build compiles Eigen and every loop for baseline x86-64 (SSE2).
// The hot kernels that decide whole-model time (the empirical check's score
// product and comparison count, method §6/§9.14; the batched PP of the dense
// Φ pass, method §5) are additionally compiled, inside the headers, for AVX2 and
// AVX-512 with per-function `target` attributes, and the widest level the CPU
// and the operating system support is chosen once at run time.
//
//   qkgeom::simd::detected()      what this CPU supports (and the compiler can target)
//   qkgeom::simd::active()        what the kernels use: detected(), capped by
//                                 set_limit() or the environment variable
//                                 QKGEOM_ISA=generic|avx2|avx512 (read once)
//   qkgeom::simd::set_limit(isa)  cap the level (tests, reproducibility studies)
//
// Results never depend on the level beyond what the method document allows: the
// empirical check's counts are those of double-precision scores at every
// level (the single-precision scores are certified per comparison, see
// plasticity/empirical.hpp), and the batched PP is within 1e-13 relative of
// the scalar std::erfc form at every level (tests/runtime/simd_test.cpp and
// gaussian_vector_test.cpp run every level the machine has).
//
// Define QKGEOM_NO_SIMD_DISPATCH to compile the generic kernels only; on
// compilers other than GCC/Clang or targets other than x86-64 that is the
// default.
//
// Compiled kernels (optional, docs/architecture.md "Compile cost"): with
// QKGEOM_COMPILED defined in every translation unit of a program
// (the CMake target qkgeom::kernels does that), the kernel headers of
// include/qkgeom/simd/ declare their dispatching entry points only and do
// not parse the kernels; one translation unit, src/qkgeom_compiled.cpp
// (the library of qkgeom::kernels), defines them. Without it (the default)
// every entry point is an inline function of the headers. A program uses
// one mode in all its translation units.
#pragma once

#include <atomic>
#include <cstdlib>
#include <string_view>

#if defined(QKGEOM_COMPILED) && !defined(QKGEOM_COMPILED_IMPLEMENTATION)
/// 0: the kernel headers declare their entry points only (compiled kernels).
#define QKGEOM_COMPILED_BODIES 0
#else
#define QKGEOM_COMPILED_BODIES 1
#endif
#if defined(QKGEOM_COMPILED)
/// How a dispatching kernel entry point is declared and defined: `inline` in
/// the headers, an ordinary function of src/qkgeom_compiled.cpp with compiled kernels.
#define QKGEOM_COMPILED_API
#else
#define QKGEOM_COMPILED_API inline
#endif

#if !defined(QKGEOM_NO_SIMD_DISPATCH) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QKGEOM_SIMD_X86 1
/// Compile one function for an instruction set (GCC/Clang `target` attribute).
#define QKGEOM_TARGET(isa_string) __attribute__((target(isa_string)))
/// Inline a shared kernel body into each target-specific wrapper.
#define QKGEOM_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define QKGEOM_SIMD_X86 0
#define QKGEOM_TARGET(isa_string)
#define QKGEOM_ALWAYS_INLINE inline
#endif

namespace qkgeom::simd {

/// \brief Instruction-set levels of the dispatched kernels, in increasing order.
/// `avx2` means AVX2 + FMA; `avx512` means AVX-512 F (the kernels use
/// 512-bit F instructions only).
enum class isa : int { generic = 0, avx2 = 1, avx512 = 2 };

/// \brief "generic", "avx2" or "avx512".
/// \param[in] level the level.
/// \returns a static string; "generic" for a value outside the enumeration.
[[nodiscard]] constexpr char const* isa_name(isa level) noexcept {
    switch (level) {
        case isa::avx2: return "avx2";
        case isa::avx512: return "avx512";
        default: return "generic";
    }
}

/// \brief The widest level this CPU and OS support (GCC/Clang's CPU model,
/// which checks the OS-enabled register state) that this build can target.
/// \returns the level, computed on the first call; always `isa::generic`
///          with QKGEOM_NO_SIMD_DISPATCH, off x86-64 or off GCC/Clang.
[[nodiscard]] inline isa detected() noexcept {
#if QKGEOM_SIMD_X86
    static isa const level = [] {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            return isa::avx512;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return isa::avx2;
        return isa::generic;
    }();
    return level;
#else
    return isa::generic;
#endif
}

namespace detail {
inline constexpr int no_limit = 1000;
/// The cap from QKGEOM_ISA (unknown values: no cap), read once.
inline int env_limit() noexcept {
    static int const value = [] {
        char const* s = std::getenv("QKGEOM_ISA");  // NOLINT(concurrency-mt-unsafe): read once
        if (s == nullptr) return no_limit;
        std::string_view const v(s);
        if (v == "generic") return static_cast<int>(isa::generic);
        if (v == "avx2") return static_cast<int>(isa::avx2);
        if (v == "avx512") return static_cast<int>(isa::avx512);
        return no_limit;
    }();
    return value;
}
inline std::atomic<int>& limit_slot() noexcept {
    static std::atomic<int> slot{no_limit};
    return slot;
}
}  // namespace detail

/// \brief Cap the level the kernels use (process-wide, thread-safe); a cap
/// above `detected()` has no effect beyond it.
/// \param[in] level the highest level the kernels may use; QKGEOM_ISA, when
///                  lower, still applies.
/// \sa clear_limit, scoped_limit, active
inline void set_limit(isa level) noexcept { detail::limit_slot().store(static_cast<int>(level)); }

/// \brief Remove a cap set by `set_limit` (QKGEOM_ISA still applies).
inline void clear_limit() noexcept { detail::limit_slot().store(detail::no_limit); }

/// \brief The level the dispatched kernels use now.
/// \returns min(detected(), the QKGEOM_ISA cap, the `set_limit` cap).
[[nodiscard]] inline isa active() noexcept {
    int level = static_cast<int>(detected());
    int const env = detail::env_limit();
    int const cap = detail::limit_slot().load(std::memory_order_relaxed);
    if (env < level) level = env;
    if (cap < level) level = cap;
    return static_cast<isa>(level);
}

/// \brief RAII cap for a scope (restores the previous cap).
///
/// The cap is process-wide: scopes must nest (on one thread, or with the
/// threads' scopes not overlapping), or the restores interleave.
class scoped_limit {
public:
    /// \brief Sets the cap to `level`, remembering the previous one.
    /// \param[in] level the highest level the kernels may use in the scope.
    explicit scoped_limit(isa level) noexcept : previous_(detail::limit_slot().exchange(static_cast<int>(level))) {}
    scoped_limit(scoped_limit const&) = delete;
    scoped_limit& operator=(scoped_limit const&) = delete;
    /// \brief Restores the cap in force at construction.
    ~scoped_limit() { detail::limit_slot().store(previous_); }

private:
    int previous_;
};

}  // namespace qkgeom::simd
