// qkgeom — LibTorch adapter: `at::Tensor` (= `torch::Tensor`) as a RowMatrix
// and an IndexVector, and per-head views of rank-4 attention tensors.
//
// Include this header where you pass LibTorch tensors to qkgeom. It compiles
// to nothing unless the LibTorch C++ API is on the include path (link the
// `torch` target, or `qkgeom::torch` in this build tree); the core never
// requires LibTorch. See docs/torch.md for the copy and conversion rules,
// summarised here:
//
//   * rank 2 only (rows = tokens, cols = head dimension); a rank-4 attention
//     tensor [B, H, T, D] or [B, T, H, D] is read one head at a time through
//     `head_rows(x, layout, batch, head)`, a strided view (never a copy);
//   * element types f32, f64, f16, bf16; every value is widened exactly to
//     double when read (method §1); other dtypes are rejected, naming the dtype;
//   * a CPU tensor is read in place through its strides (contiguous or not:
//     transposed views, slices, expanded dimensions) — no copy;
//   * a tensor on any other device (CUDA, ...) is copied to the host once,
//     synchronously, keeping its dtype, when the reader is made; the reader
//     owns the copy. The capture object (torch_capture.hpp) avoids that path:
//     it gathers on the device and copies asynchronously;
//   * tensors requiring grad are read without touching autograd;
//   * sparse, quantized or otherwise non-strided tensors are rejected.
#pragma once

#include <qkgeom/core/tensor.hpp>

#if __has_include(<torch/torch.h>)
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <string_view>

#define QKGEOM_HAS_TORCH 1

namespace qkgeom {

/// \brief Axis order of a rank-4 attention tensor (queries or keys after RoPE).
enum class torch_layout : std::uint8_t {
    bhtd = 0,  ///< [batch, heads, tokens, head_dim]: HF/SDPA order after `transpose(1, 2)`
    bthd = 1,  ///< [batch, tokens, heads, head_dim]: the projection's `view(B, T, H, D)` before the transpose
};

/// \brief Name of a layout.
/// \param[in] l the layout.
/// \returns "bhtd" or "bthd" (a static string; any value other than bthd gives "bhtd").
constexpr const char* torch_layout_name(torch_layout l) noexcept {
    return l == torch_layout::bthd ? "bthd" : "bhtd";
}

/// \brief The sizes of a rank-4 attention tensor, whatever its axis order.
struct attention_shape {
    std::int64_t batch = 0, heads = 0, tokens = 0, head_dim = 0;  ///< B, H, T, D
};

namespace detail {

/// Element codes of the readable floating dtypes.
enum class torch_elem : std::uint8_t { f64, f32, f16, bf16 };

inline std::string torch_dtype_name(at::ScalarType s) { return std::string(c10::toString(s)); }

/// The element code of a readable floating tensor, or a clear error naming
/// the argument and its dtype.
inline torch_elem torch_element_of(at::Tensor const& t, std::string_view where, std::string_view arg) {
    switch (t.scalar_type()) {
        case at::kDouble: return torch_elem::f64;
        case at::kFloat: return torch_elem::f32;
        case at::kHalf: return torch_elem::f16;
        case at::kBFloat16: return torch_elem::bf16;
        default:
            fail_arg(where,
                     std::string(arg) + ": dtype must be Float, Double, Half or BFloat16 (f32, f64, f16, bf16); dtype",
                     torch_dtype_name(t.scalar_type()));
    }
}

inline std::string_view torch_elem_name(torch_elem e) noexcept {
    switch (e) {
        case torch_elem::f64: return element_traits<double>::name;
        case torch_elem::f32: return element_traits<float>::name;
        case torch_elem::f16: return element_traits<float16>::name;
        case torch_elem::bf16: return element_traits<bfloat16>::name;
    }
    return "?";
}

/// A defined, strided (dense-layout) tensor, or a clear error.
inline void check_torch_strided(at::Tensor const& t, std::string_view where, std::string_view arg) {
    if (!t.defined()) fail_arg(where, std::string(arg) + ": the tensor is undefined; defined", 0);
    if (t.layout() != at::kStrided)
        fail_arg(where, std::string(arg) + ": only strided (dense) tensors are read; layout",
                 std::string(c10::toString(t.layout())));
    if (t.is_quantized()) fail_arg(where, std::string(arg) + ": quantized tensors are not read; dtype",
                                   torch_dtype_name(t.scalar_type()));
}

inline void check_torch_rank(at::Tensor const& t, std::int64_t rank, std::string_view where, std::string_view arg,
                             std::string_view hint = {}) {
    if (t.dim() != rank)
        fail_arg(where,
                 std::string(arg) + ": must have rank " + std::to_string(rank) + std::string(hint) + ", but has rank",
                 t.dim());
}

/// The tensor itself when it lives on the CPU, else one synchronous copy to
/// the host (same dtype). Autograd is never involved (`detach`).
inline at::Tensor torch_on_host(at::Tensor const& t) {
    at::Tensor d = t.detach();
    if (d.device().is_cpu()) return d;
    return d.to(at::kCPU);
}

}  // namespace detail

/// \brief The sizes (batch, heads, tokens, head_dim) of a rank-4 attention
/// tensor in the given layout.
/// \param[in] x the tensor (any device, any floating or other dtype: only the
///            sizes are read).
/// \param[in] layout the axis order of `x`.
/// \param[in] where function name used in error messages.
/// \param[in] arg argument name used in error messages.
/// \returns the sizes, named.
/// \throws std::invalid_argument when `x` is undefined, not strided, quantized
///         or not of rank 4.
inline attention_shape attention_shape_of(at::Tensor const& x, torch_layout layout,
                                          std::string_view where = "qkgeom::attention_shape_of",
                                          std::string_view arg = "x") {
    detail::check_torch_strided(x, where, arg);
    detail::check_torch_rank(x, 4, where, arg,
                             layout == torch_layout::bhtd ? " [batch, heads, tokens, head_dim]"
                                                          : " [batch, tokens, heads, head_dim]");
    if (layout == torch_layout::bhtd) return {x.size(0), x.size(1), x.size(2), x.size(3)};
    return {x.size(0), x.size(2), x.size(1), x.size(3)};
}

/// \brief The [tokens, head_dim] rows of one (batch, head) of a rank-4
/// attention tensor: a strided view of `x` (no copy, whatever the layout or
/// the strides of `x`), detached from autograd.
/// \param[in] x the rank-4 tensor; the result shares its storage.
/// \param[in] layout the axis order of `x`.
/// \param[in] batch the batch index, 0 ≤ batch < B.
/// \param[in] head the head index, 0 ≤ head < H.
/// \returns the [T, D] view (same device and dtype as `x`; the dtype is not
///          checked here but when the view is read).
/// \throws std::invalid_argument for an undefined, non-strided, quantized or
///         not rank-4 tensor, or a batch or head index out of range (naming it).
inline at::Tensor head_rows(at::Tensor const& x, torch_layout layout, std::int64_t batch, std::int64_t head) {
    constexpr std::string_view fn = "qkgeom::head_rows";
    auto const s = attention_shape_of(x, layout, fn, "x");
    if (batch < 0 || batch >= s.batch)
        detail::fail_arg(fn, "batch must be in [0, " + std::to_string(s.batch) + ")", batch);
    if (head < 0 || head >= s.heads) detail::fail_arg(fn, "head must be in [0, " + std::to_string(s.heads) + ")", head);
    at::Tensor const b = x.detach().select(0, batch);
    return layout == torch_layout::bhtd ? b.select(0, head) : b.select(1, head);
}

/// \brief A MatrixReader over a rank-2 floating LibTorch tensor (rows =
/// tokens). Holds a reference to the tensor's storage (the input itself on
/// the CPU, else its host copy), so the reader stays valid on its own.
class torch_matrix {
public:
    /// \brief An empty 0 × 0 reader.
    torch_matrix() = default;

    /// \brief Makes the reader; a non-CPU tensor is copied to the host here,
    /// synchronously.
    /// \param[in] t the rank-2 [tokens, head_dim] tensor.
    /// \param[in] where function name used in error messages.
    /// \param[in] arg argument name used in error messages.
    /// \throws std::invalid_argument for an undefined, non-strided or
    ///         quantized tensor, a rank other than 2, or a dtype other than
    ///         f32/f64/f16/bf16 (naming `arg` and the offending value).
    /// \throws c10::Error (a std::exception) when LibTorch fails to copy the
    ///         tensor to the host.
    explicit torch_matrix(at::Tensor const& t, std::string_view where = "qkgeom::as_matrix(at::Tensor)",
                          std::string_view arg = "tensor") {
        detail::check_torch_strided(t, where, arg);
        detail::check_torch_rank(t, 2, where, arg,
                                 " [tokens, head_dim]; use qkgeom::head_rows(x, layout, batch, head) for the "
                                 "heads of a rank-4 tensor");
        elem_ = detail::torch_element_of(t, where, arg);
        host_ = detail::torch_on_host(t);
        rows_ = host_.size(0);
        cols_ = host_.size(1);
        rs_ = host_.stride(0);
        cs_ = host_.stride(1);
        data_ = host_.data_ptr();
    }

    /// \returns the number of rows (tokens).
    [[nodiscard]] index_t rows() const noexcept { return rows_; }
    /// \returns the number of columns (head dimension).
    [[nodiscard]] index_t cols() const noexcept { return cols_; }
    /// \returns "f64", "f32", "f16" or "bf16".
    [[nodiscard]] std::string_view dtype() const noexcept { return detail::torch_elem_name(elem_); }
    /// \returns the host tensor read (the input, detached, when it was on the CPU).
    [[nodiscard]] at::Tensor const& host_tensor() const noexcept { return host_; }

    /// \brief Element (i, j) widened to double.
    /// \pre 0 ≤ i < rows(), 0 ≤ j < cols() (not checked).
    /// \returns the element, exactly widened.
    [[nodiscard]] double operator()(index_t i, index_t j) const noexcept {
        index_t const o = i * rs_ + j * cs_;
        switch (elem_) {
            case detail::torch_elem::f64: return static_cast<double const*>(data_)[o];
            case detail::torch_elem::f32: return static_cast<double>(static_cast<float const*>(data_)[o]);
            case detail::torch_elem::f16: return element_traits<float16>::to_double(bits<float16>(o));
            case detail::torch_elem::bf16: return element_traits<bfloat16>::to_double(bits<bfloat16>(o));
        }
        return 0.0;
    }

    /// \brief Widen row i into out[0 .. cols()) (exact for every dtype).
    /// \param[in] i the row, 0 ≤ i < rows() (not checked).
    /// \param[out] out buffer of at least cols() doubles.
    void read_row(index_t i, double* out) const noexcept {
        switch (elem_) {
            case detail::torch_elem::f64: view<double>().read_row(i, out); return;
            case detail::torch_elem::f32: view<float>().read_row(i, out); return;
            case detail::torch_elem::f16: view<float16>().read_row(i, out); return;
            case detail::torch_elem::bf16: view<bfloat16>().read_row(i, out); return;
        }
    }

private:
    // c10::Half and c10::BFloat16 store the IEEE binary16 / bfloat16 bits in
    // one uint16_t, exactly like qkgeom::float16 / bfloat16 (checked below).
    template <class T>
    [[nodiscard]] matrix_view<T> view() const noexcept {
        return matrix_view<T>(static_cast<T const*>(data_), rows_, cols_, rs_, cs_);
    }
    template <class T>
    [[nodiscard]] T bits(index_t o) const noexcept {
        return static_cast<T const*>(data_)[o];
    }

    at::Tensor host_;
    void const* data_ = nullptr;
    index_t rows_ = 0, cols_ = 0, rs_ = 0, cs_ = 1;
    detail::torch_elem elem_ = detail::torch_elem::f32;
};

static_assert(sizeof(c10::Half) == sizeof(float16) && sizeof(c10::BFloat16) == sizeof(bfloat16),
              "qkgeom: c10::Half / c10::BFloat16 must be 16-bit storage types");

/// \brief An IndexReader over a rank-1 integer LibTorch tensor (int8, int16,
/// int32, int64, uint8; bool rejected). CPU tensors are read in place through
/// their stride; tensors on other devices are copied to the host once.
class torch_indices {
public:
    /// \brief An empty reader.
    torch_indices() = default;

    /// \brief Makes the reader; a non-CPU tensor is copied to the host here,
    /// synchronously.
    /// \param[in] t the rank-1 integer tensor.
    /// \param[in] where function name used in error messages.
    /// \param[in] arg argument name used in error messages.
    /// \throws std::invalid_argument for an undefined, non-strided or quantized
    ///         tensor, a rank other than 1, or a dtype other than int64, int32,
    ///         int16, int8 or uint8.
    /// \throws c10::Error (a std::exception) when LibTorch fails to copy the
    ///         tensor to the host.
    explicit torch_indices(at::Tensor const& t, std::string_view where = "qkgeom::as_indices(at::Tensor)",
                           std::string_view arg = "tensor") {
        detail::check_torch_strided(t, where, arg);
        detail::check_torch_rank(t, 1, where, arg);
        type_ = t.scalar_type();
        switch (type_) {
            case at::kLong: case at::kInt: case at::kShort: case at::kChar: case at::kByte: break;
            default:
                detail::fail_arg(where,
                                 std::string(arg) + ": dtype must be an integer type (int64, int32, int16, int8, "
                                                    "uint8); dtype",
                                 detail::torch_dtype_name(type_));
        }
        host_ = detail::torch_on_host(t);
        size_ = host_.size(0);
        stride_ = host_.stride(0);
        data_ = host_.data_ptr();
    }

    /// \returns the number of elements.
    [[nodiscard]] index_t size() const noexcept { return size_; }
    /// \pre 0 ≤ i < size() (not checked).
    /// \returns element i as int64.
    [[nodiscard]] std::int64_t operator[](index_t i) const noexcept {
        index_t const o = i * stride_;
        switch (type_) {
            case at::kLong: return static_cast<std::int64_t const*>(data_)[o];
            case at::kInt: return static_cast<std::int32_t const*>(data_)[o];
            case at::kShort: return static_cast<std::int16_t const*>(data_)[o];
            case at::kChar: return static_cast<std::int8_t const*>(data_)[o];
            default: return static_cast<std::uint8_t const*>(data_)[o];
        }
    }

private:
    at::Tensor host_;
    void const* data_ = nullptr;
    index_t size_ = 0, stride_ = 1;
    at::ScalarType type_ = at::kLong;
};

/// \brief LibTorch tensors plug into the tensor concept: rank-2 floating
/// tensors are row matrices, rank-1 integer tensors are index vectors (the
/// rank and dtype are checked at run time, when the reader is made).
template <>
struct tensor_traits<at::Tensor> {
    /// \returns `torch_matrix(t)`. \throws as the torch_matrix constructor.
    static torch_matrix as_matrix(at::Tensor const& t) { return torch_matrix(t); }
    /// \returns `torch_indices(t)`. \throws as the torch_indices constructor.
    static torch_indices as_indices(at::Tensor const& t) { return torch_indices(t); }
};

static_assert(MatrixReader<torch_matrix> && IndexReader<torch_indices>);
static_assert(RowMatrix<at::Tensor> && IndexVector<at::Tensor>);

}  // namespace qkgeom

#endif
