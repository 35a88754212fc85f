// qkgeom — the vector types and operations of the dispatched kernels (internal).
// IWYU pragma: private, include <qkgeom/stats/moments.hpp>
// (SIMD kernels live in include/qkgeom/simd/; the dispatch is qkgeom/simd/dispatch.hpp.)
//
// The AVX2 + FMA and AVX-512 F kernels of simd/ are written against this
// layer, not against <immintrin.h>: that header alone costs about a third of
// <Eigen/Dense> to parse (docs/architecture.md, "Compile cost"). The
// types are GCC/Clang vector extensions; the element-wise arithmetic is the
// extensions' operators (what the compilers' own intrinsics expand to), one
// operation per call, so that no multiply and add is contracted that the
// intrinsics would not contract either; loads and stores go through
// unaligned, may-alias vector types. The operations the extensions do not
// express (fused multiply-add, masked loads and stores, the quiet ordered
// comparisons and their bit masks, square root, sign masks) use the
// `__builtin_ia32_*` builtins that have the same name and signature in
// GCC ≥ 12 and Clang ≥ 14. Every function here carries the `target` of its
// instruction set, so it is inlined only into kernels compiled for it:
//
//   f64v4, f32v8, f32v4   256/128-bit operations without FMA, target "avx2"
//                         (usable from the "avx2", "avx2,fma" and "avx512f"
//                         kernels: AVX-512 F implies AVX2, not FMA, in GCC)
//   fmadd(...)            256-bit FMA, target "avx2,fma"
//   f64v8, f32v16, i32v16 512-bit operations, target "avx512f"
//
// Without QKGEOM_SIMD_X86 (another compiler or target, QKGEOM_NO_SIMD_DISPATCH)
// this header declares nothing.
#pragma once

#include <qkgeom/simd/dispatch.hpp>

#if QKGEOM_SIMD_X86
namespace qkgeom::detail::vx {

// --- types (may_alias, as the compilers' __m256d etc.; _u: any alignment)

typedef double f64x2 __attribute__((vector_size(16), may_alias));
typedef double f64x4 __attribute__((vector_size(32), may_alias));
typedef double f64x8 __attribute__((vector_size(64), may_alias));
typedef float f32x4 __attribute__((vector_size(16), may_alias));
typedef float f32x8 __attribute__((vector_size(32), may_alias));
typedef float f32x16 __attribute__((vector_size(64), may_alias));
typedef int i32x4 __attribute__((vector_size(16), may_alias));
typedef int i32x8 __attribute__((vector_size(32), may_alias));
typedef int i32x16 __attribute__((vector_size(64), may_alias));
typedef long long i64x4 __attribute__((vector_size(32), may_alias));
typedef long long i64x8 __attribute__((vector_size(64), may_alias));
typedef double f64x4_u __attribute__((vector_size(32), may_alias, aligned(1)));
typedef double f64x8_u __attribute__((vector_size(64), may_alias, aligned(1)));
typedef float f32x4_u __attribute__((vector_size(16), may_alias, aligned(1)));
typedef float f32x8_u __attribute__((vector_size(32), may_alias, aligned(1)));
typedef float f32x16_u __attribute__((vector_size(64), may_alias, aligned(1)));
typedef int i32x16_u __attribute__((vector_size(64), may_alias, aligned(1)));

/// AVX-512 lane masks (one bit per lane).
using mask8 = unsigned char;
using mask16 = unsigned short;

/// Comparison predicates of the compare builtins (Intel's _CMP_GT_OQ, _CMP_LT_OQ:
/// ordered, quiet; false when either operand is NaN).
inline constexpr int cmp_gt_oq = 0x1e;
inline constexpr int cmp_lt_oq = 0x11;
/// The rounding argument of the 512-bit builtins: the current direction.
inline constexpr int round_current = 4;

#define QKGEOM_VX_AVX2 QKGEOM_TARGET("avx2") static QKGEOM_ALWAYS_INLINE
#define QKGEOM_VX_512 QKGEOM_TARGET("avx512f") static QKGEOM_ALWAYS_INLINE

// --- 256 and 128 bits, no FMA (target "avx2")

/// 4 doubles (ymm).
struct f64v4 {
    using type = f64x4;
    QKGEOM_VX_AVX2 type zero() noexcept { return type{}; }
    QKGEOM_VX_AVX2 type set1(double v) noexcept { return type{v, v, v, v}; }
    QKGEOM_VX_AVX2 type load(double const* p) noexcept { return *reinterpret_cast<type const*>(p); }
    QKGEOM_VX_AVX2 type loadu(double const* p) noexcept { return *reinterpret_cast<f64x4_u const*>(p); }
    QKGEOM_VX_AVX2 void store(double* p, type v) noexcept { *reinterpret_cast<type*>(p) = v; }
    QKGEOM_VX_AVX2 void storeu(double* p, type v) noexcept { *reinterpret_cast<f64x4_u*>(p) = v; }
    QKGEOM_VX_AVX2 type add(type a, type b) noexcept { return a + b; }
    QKGEOM_VX_AVX2 type sub(type a, type b) noexcept { return a - b; }
    QKGEOM_VX_AVX2 type mul(type a, type b) noexcept { return a * b; }
    QKGEOM_VX_AVX2 type div(type a, type b) noexcept { return a / b; }
    QKGEOM_VX_AVX2 type sqrt(type a) noexcept { return __builtin_ia32_sqrtpd256(a); }
    /// The bits of a where m is all ones, zero where m is zero.
    QKGEOM_VX_AVX2 type and_mask(type a, i64x4 m) noexcept {
        return __builtin_bit_cast(type, __builtin_bit_cast(i64x4, a) & m);
    }
    /// The lanes whose mask element is negative from p (zeros in the others; those are not read).
    QKGEOM_VX_AVX2 type maskload(double const* p, i64x4 m) noexcept {
        return __builtin_ia32_maskloadpd256(reinterpret_cast<type const*>(p), m);
    }
    /// p[l] = v[l] for the lanes whose mask element is negative.
    QKGEOM_VX_AVX2 void maskstore(double* p, i64x4 m, type v) noexcept {
        __builtin_ia32_maskstorepd256(reinterpret_cast<type*>(p), m, v);
    }
    /// (a[0] + a[2]) + (a[1] + a[3]): the two halves added as one xmm, then its lanes.
    QKGEOM_VX_AVX2 double fold(type a) noexcept {
        f64x2 const s = __builtin_shufflevector(a, a, 0, 1) + __builtin_ia32_vextractf128_pd256(a, 1);
        return s[0] + s[1];
    }
};

/// 8 floats (ymm).
struct f32v8 {
    using type = f32x8;
    QKGEOM_VX_AVX2 type zero() noexcept { return type{}; }
    QKGEOM_VX_AVX2 type set1(float v) noexcept { return type{v, v, v, v, v, v, v, v}; }
    QKGEOM_VX_AVX2 type loadu(float const* p) noexcept { return *reinterpret_cast<f32x8_u const*>(p); }
    QKGEOM_VX_AVX2 void storeu(float* p, type v) noexcept { *reinterpret_cast<f32x8_u*>(p) = v; }
    QKGEOM_VX_AVX2 type sub(type a, type b) noexcept { return a - b; }
    /// |a| (the sign bit cleared).
    QKGEOM_VX_AVX2 type abs(type a) noexcept {
        return __builtin_bit_cast(type, __builtin_bit_cast(i32x8, a) & 0x7fffffff);
    }
    /// a with its sign bits flipped.
    QKGEOM_VX_AVX2 type negate(type a) noexcept {
        return __builtin_bit_cast(type, __builtin_bit_cast(i32x8, a) ^ static_cast<int>(0x80000000u));
    }
    /// The lane mask (all ones or zero per lane) of a > b, ordered and quiet (false with a NaN).
    QKGEOM_VX_AVX2 type gt(type a, type b) noexcept { return __builtin_ia32_cmpps256(a, b, cmp_gt_oq); }
    /// The lane mask of a < b, ordered and quiet.
    QKGEOM_VX_AVX2 type lt(type a, type b) noexcept { return __builtin_ia32_cmpps256(a, b, cmp_lt_oq); }
    /// The lanes set in both masks.
    QKGEOM_VX_AVX2 type both(type m1, type m2) noexcept {
        return __builtin_bit_cast(type, __builtin_bit_cast(i32x8, m1) & __builtin_bit_cast(i32x8, m2));
    }
    /// A lane mask as a bit mask (bit l = the sign of lane l).
    QKGEOM_VX_AVX2 unsigned bits(type m) noexcept { return static_cast<unsigned>(__builtin_ia32_movmskps256(m)); }
    /// The lane mask of the first n lanes: element l is −1 for l < n, else 0.
    QKGEOM_VX_AVX2 i32x8 first(int n) noexcept { return i32x8{n, n, n, n, n, n, n, n} > i32x8{0, 1, 2, 3, 4, 5, 6, 7}; }
    /// The lanes whose mask element is negative from p (zeros in the others; those are not read).
    QKGEOM_VX_AVX2 type maskload(float const* p, i32x8 m) noexcept {
        return __builtin_ia32_maskloadps256(reinterpret_cast<type const*>(p), m);
    }
    QKGEOM_VX_AVX2 unsigned bits(i32x8 m) noexcept { return bits(__builtin_bit_cast(type, m)); }
};

/// 4 floats (xmm), the f32 operands of the 4-double kernels.
struct f32v4 {
    using type = f32x4;
    QKGEOM_VX_AVX2 type loadu(float const* p) noexcept { return *reinterpret_cast<f32x4_u const*>(p); }
    /// The lanes l < n of p, zeros past them (not read).
    QKGEOM_VX_AVX2 type load_first(float const* p, int n) noexcept {
        i32x4 const m = i32x4{n, n, n, n} > i32x4{0, 1, 2, 3};
        return __builtin_ia32_maskloadps(reinterpret_cast<type const*>(p), m);
    }
    /// Widened to doubles (exact). Element by element, not __builtin_convertvector:
    /// GCC 12 splits that into two halves; this is one vcvtps2pd with GCC and Clang.
    QKGEOM_VX_AVX2 f64x4 widen(type a) noexcept { return f64x4{a[0], a[1], a[2], a[3]}; }
};

// --- 256-bit fused multiply-add (target "avx2,fma"): a·b + c, rounded once

QKGEOM_TARGET("avx2,fma") QKGEOM_ALWAYS_INLINE f64x4 fmadd(f64x4 a, f64x4 b, f64x4 c) noexcept {
    return __builtin_ia32_vfmaddpd256(a, b, c);
}
QKGEOM_TARGET("avx2,fma") QKGEOM_ALWAYS_INLINE f32x8 fmadd(f32x8 a, f32x8 b, f32x8 c) noexcept {
    return __builtin_ia32_vfmaddps256(a, b, c);
}

// --- 512 bits (target "avx512f")

/// 8 doubles (zmm).
struct f64v8 {
    using type = f64x8;
    QKGEOM_VX_512 type zero() noexcept { return type{}; }
    QKGEOM_VX_512 type set1(double v) noexcept { return type{v, v, v, v, v, v, v, v}; }
    QKGEOM_VX_512 type load(double const* p) noexcept { return *reinterpret_cast<type const*>(p); }
    QKGEOM_VX_512 type loadu(double const* p) noexcept { return *reinterpret_cast<f64x8_u const*>(p); }
    QKGEOM_VX_512 void store(double* p, type v) noexcept { *reinterpret_cast<type*>(p) = v; }
    QKGEOM_VX_512 void storeu(double* p, type v) noexcept { *reinterpret_cast<f64x8_u*>(p) = v; }
    QKGEOM_VX_512 type add(type a, type b) noexcept { return a + b; }
    QKGEOM_VX_512 type sub(type a, type b) noexcept { return a - b; }
    QKGEOM_VX_512 type mul(type a, type b) noexcept { return a * b; }
    QKGEOM_VX_512 type div(type a, type b) noexcept { return a / b; }
    QKGEOM_VX_512 type fmadd(type a, type b, type c) noexcept {
        return __builtin_ia32_vfmaddpd512_mask(a, b, c, static_cast<mask8>(0xffu), round_current);
    }
    /// The lanes set in m from p, zeros in the others (not read).
    QKGEOM_VX_512 type maskz_loadu(mask8 m, double const* p) noexcept {
        return __builtin_ia32_loadupd512_mask(p, type{}, m);
    }
    /// p[l] = v[l] for the lanes set in m.
    QKGEOM_VX_512 void mask_storeu(double* p, mask8 m, type v) noexcept { __builtin_ia32_storeupd512_mask(p, v, m); }
    /// 8 floats widened (exact; element by element, as f32v4::widen).
    QKGEOM_VX_512 type widen(f32x8 a) noexcept { return type{a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]}; }
};

/// 16 floats (zmm).
struct f32v16 {
    using type = f32x16;
    QKGEOM_VX_512 type zero() noexcept { return type{}; }
    QKGEOM_VX_512 type set1(float v) noexcept { return type{v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v}; }
    QKGEOM_VX_512 type loadu(float const* p) noexcept { return *reinterpret_cast<f32x16_u const*>(p); }
    QKGEOM_VX_512 void storeu(float* p, type v) noexcept { *reinterpret_cast<f32x16_u*>(p) = v; }
    QKGEOM_VX_512 type sub(type a, type b) noexcept { return a - b; }
    QKGEOM_VX_512 type fmadd(type a, type b, type c) noexcept {
        return __builtin_ia32_vfmaddps512_mask(a, b, c, static_cast<mask16>(0xffffu), round_current);
    }
    QKGEOM_VX_512 type maskz_loadu(mask16 m, float const* p) noexcept {
        return __builtin_ia32_loadups512_mask(p, type{}, m);
    }
    QKGEOM_VX_512 type abs(type a) noexcept {
        return __builtin_bit_cast(type, __builtin_bit_cast(i32x16, a) & 0x7fffffff);
    }
    QKGEOM_VX_512 type negate(type a) noexcept {
        return __builtin_bit_cast(type, __builtin_bit_cast(i32x16, a) ^ static_cast<int>(0x80000000u));
    }
    /// Lanes set in m with a > b (ordered, quiet).
    QKGEOM_VX_512 mask16 gt(mask16 m, type a, type b) noexcept {
        return __builtin_ia32_cmpps512_mask(a, b, cmp_gt_oq, m, round_current);
    }
    /// Lanes set in m with a < b (ordered, quiet).
    QKGEOM_VX_512 mask16 lt(mask16 m, type a, type b) noexcept {
        return __builtin_ia32_cmpps512_mask(a, b, cmp_lt_oq, m, round_current);
    }
};

/// 16 int32 (zmm), the bits of 16 floats.
struct i32v16 {
    using type = i32x16;
    QKGEOM_VX_512 type loadu(void const* p) noexcept { return *static_cast<i32x16_u const*>(p); }
    QKGEOM_VX_512 type maskz_loadu(mask16 m, void const* p) noexcept {
        return __builtin_ia32_loaddqusi512_mask(static_cast<int const*>(p), type{}, m);
    }
    /// Lanes set in m with a == b.
    QKGEOM_VX_512 mask16 eq(mask16 m, type a, type b) noexcept { return __builtin_ia32_cmpd512_mask(a, b, 0, m); }
};

#undef QKGEOM_VX_AVX2
#undef QKGEOM_VX_512

}  // namespace qkgeom::detail::vx
#endif  // QKGEOM_SIMD_X86
