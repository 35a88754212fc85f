// qkgeom — 16-bit floating-point storage types (bfloat16, IEEE binary16).
//
// Captures are often stored in 16 bits. qkgeom never computes in 16 bits: the
// element types below are storage only, and every value is widened *exactly*
// to float/double on load (every bf16 and every binary16 value is exactly
// representable in binary32). Narrowing (`from_float`) rounds to nearest, ties
// to even, and is provided for writers and tests.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace qkgeom {

/// \brief bfloat16: 1 sign, 8 exponent, 7 mantissa bits (the top half of a binary32).
struct bfloat16 {
    std::uint16_t bits = 0;  ///< the raw bit pattern

    /// \brief From a raw bit pattern (no conversion).
    /// \param[in] b the raw bit pattern.
    /// \returns the bfloat16 with bit pattern `b`.
    [[nodiscard]] static constexpr bfloat16 from_bits(std::uint16_t b) noexcept { return bfloat16{b}; }

    /// \brief Exact widening.
    /// \returns the binary32 whose top 16 bits are `bits`.
    [[nodiscard]] constexpr float to_float() const noexcept {
        return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
    }

    /// \brief Round-to-nearest-even narrowing; NaN stays NaN (quiet, sign
    /// and top payload bits kept), infinities stay infinite, finite values
    /// beyond the bf16 range round to ±inf.
    /// \param[in] f the value.
    /// \returns the nearest bfloat16.
    [[nodiscard]] static constexpr bfloat16 from_float(float f) noexcept {
        auto const u = std::bit_cast<std::uint32_t>(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force a quiet payload
            return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
        }
        std::uint32_t const lsb = (u >> 16) & 1u;
        std::uint32_t const rounded = u + 0x7fffu + lsb;
        return bfloat16{static_cast<std::uint16_t>(rounded >> 16)};
    }

    /// \brief Bitwise equality (so NaN == NaN with equal bits, and +0 != −0).
    /// \param[in] a one value.
    /// \param[in] b the other.
    /// \returns `a.bits == b.bits`.
    friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }
};

/// \brief IEEE 754 binary16 ("half"): 1 sign, 5 exponent, 10 mantissa bits.
struct float16 {
    std::uint16_t bits = 0;  ///< the raw bit pattern

    /// \brief From a raw bit pattern (no conversion).
    /// \param[in] b the raw bit pattern.
    /// \returns the float16 with bit pattern `b`.
    [[nodiscard]] static constexpr float16 from_bits(std::uint16_t b) noexcept { return float16{b}; }

    /// \brief Exact widening to binary32, including subnormals, infinities and NaN payloads.
    /// \returns the binary32 with the same value.
    [[nodiscard]] constexpr float to_float() const noexcept {
        std::uint32_t const sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
        std::uint32_t const exp = (bits >> 10) & 0x1fu;
        std::uint32_t mant = bits & 0x3ffu;
        std::uint32_t out = 0;
        if (exp == 0x1fu) {  // inf / NaN
            out = sign | 0x7f800000u | (mant << 13);
        } else if (exp != 0) {  // normal
            out = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
        } else if (mant == 0) {  // signed zero
            out = sign;
        } else {  // subnormal: value = mant * 2^-24; normalise
            int e = -1;
            do {
                mant <<= 1;
                ++e;
            } while ((mant & 0x400u) == 0);
            mant &= 0x3ffu;
            out = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | (mant << 13);
        }
        return std::bit_cast<float>(out);
    }

    /// \brief Round-to-nearest-even narrowing from binary32 (overflow gives
    /// ±inf; underflow gives a subnormal or ±0; any NaN gives the quiet NaN
    /// 0x7e00 with the input's sign, payload dropped).
    /// \param[in] f the value.
    /// \returns the nearest float16.
    [[nodiscard]] static constexpr float16 from_float(float f) noexcept {
        auto const u = std::bit_cast<std::uint32_t>(f);
        auto const sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
        std::uint32_t const absu = u & 0x7fffffffu;
        if (absu > 0x7f800000u) return float16{static_cast<std::uint16_t>(sign | 0x7e00u)};  // NaN
        if (absu >= 0x477ff000u) return float16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds to inf
        int const exp = static_cast<int>(absu >> 23) - 127 + 15;
        std::uint32_t mant = (absu & 0x7fffffu) | 0x800000u;  // 24-bit significand
        if (exp >= 1) {  // normal result
            std::uint32_t const shifted = mant >> 13;
            std::uint32_t const rem = mant & 0x1fffu;
            std::uint32_t r = (static_cast<std::uint32_t>(exp) << 10) + (shifted - 0x400u);
            if (rem > 0x1000u || (rem == 0x1000u && (shifted & 1u))) ++r;
            return float16{static_cast<std::uint16_t>(sign | r)};
        }
        // subnormal or zero result: value = mant * 2^(exp-1-15-23+...)
        int const shift = 14 - exp;  // bits to drop from the 24-bit significand
        if (shift > 24) return float16{sign};
        if (absu == 0) return float16{sign};
        std::uint32_t const shifted = mant >> shift;
        std::uint32_t const rem = mant & ((1u << shift) - 1u);
        std::uint32_t const half = 1u << (shift - 1);
        std::uint32_t r = shifted;
        if (rem > half || (rem == half && (shifted & 1u))) ++r;
        return float16{static_cast<std::uint16_t>(sign | r)};
    }

    /// \brief Bitwise equality (so NaN == NaN with equal bits, and +0 != −0).
    /// \param[in] a one value.
    /// \param[in] b the other.
    /// \returns `a.bits == b.bits`.
    friend constexpr bool operator==(float16 a, float16 b) noexcept { return a.bits == b.bits; }
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2);

}  // namespace qkgeom
