// Runtime tests of the tensor concept: every adapted type reads the same
// values; 16-bit floats widen exactly; views are bounds-checked.
#include <qkgeom/plasticity.hpp>

#ifdef QKGEOM_TEST_XTENSOR
#include <qkgeom/adapters/xtensor.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>
#endif
#ifdef QKGEOM_TEST_RANGE_V3
#include <range/v3/view/filter.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#endif

#include <catch2/catch.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <list>
#include <span>
#include <vector>

#include "test_util.hpp"

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_tensor_test {

namespace {

using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Read every element through the reader into a dense Eigen matrix.
template <class T>
Eigen::MatrixXd read_all(T const& x) {
    auto const r = qkgeom::as_matrix(x);
    Eigen::MatrixXd out(r.rows(), r.cols());
    std::vector<double> row(static_cast<std::size_t>(r.cols()));
    for (qkgeom::index_t i = 0; i < r.rows(); ++i) {
        r.read_row(i, row.data());
        for (qkgeom::index_t j = 0; j < r.cols(); ++j) out(i, j) = row[static_cast<std::size_t>(j)];
    }
    return out;
}

template <class T>
std::vector<std::int64_t> read_indices(T const& v) {
    auto const r = qkgeom::as_indices(v);
    std::vector<std::int64_t> out;
    for (qkgeom::index_t i = 0; i < r.size(); ++i) out.push_back(r[i]);
    return out;
}

// Independent binary16 decoder (value = (-1)^s * 2^(e-15) * 1.m, or subnormal).
double decode_half(std::uint16_t h) {
    int const s = (h >> 15) & 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0x1f) v = m ? std::nan("") : INFINITY;
    else if (e == 0) v = std::ldexp(static_cast<double>(m), -24);
    else v = std::ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}

}  // namespace

TEST_CASE("float16 widening is exact for all 65536 bit patterns", "[tensor][float16]") {
    for (std::uint32_t b = 0; b < 65536; ++b) {
        auto const h = qkgeom::float16::from_bits(static_cast<std::uint16_t>(b));
        double const ref = decode_half(static_cast<std::uint16_t>(b));
        double const got = h.to_float();
        if (std::isnan(ref)) {
            REQUIRE(std::isnan(got));
            continue;
        }
        REQUIRE(got == ref);
        REQUIRE(std::signbit(got) == std::signbit(ref));
        // Eigen's independent implementation agrees, and narrowing round-trips.
        REQUIRE(static_cast<float>(Eigen::half(static_cast<float>(ref))) == static_cast<float>(got));
        REQUIRE(qkgeom::float16::from_float(h.to_float()).bits == b);
    }
}

TEST_CASE("float16 narrowing rounds to nearest even like Eigen::half", "[tensor][float16]") {
    std::mt19937 gen(7);
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int i = 0; i < 200000; ++i) {
        float const f = std::bit_cast<float>(bits(gen));
        if (std::isnan(f)) continue;
        Eigen::half const e(f);
        REQUIRE(qkgeom::float16::from_float(f).bits == std::bit_cast<std::uint16_t>(e));
    }
    // ties: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> even (1.0)
    REQUIRE(qkgeom::float16::from_float(1.0f + std::ldexp(1.0f, -11)).to_float() == 1.0f);
    REQUIRE(qkgeom::float16::from_float(1.0f + 3 * std::ldexp(1.0f, -11)).to_float() ==
            1.0f + std::ldexp(1.0f, -9));
    REQUIRE(std::isinf(qkgeom::float16::from_float(65520.0f).to_float()));
    REQUIRE(qkgeom::float16::from_float(65504.0f).to_float() == 65504.0f);
}

TEST_CASE("bfloat16 widening is exact and narrowing matches Eigen::bfloat16", "[tensor][float16]") {
    for (std::uint32_t b = 0; b < 65536; ++b) {
        auto const h = qkgeom::bfloat16::from_bits(static_cast<std::uint16_t>(b));
        float const got = h.to_float();
        float const ref = std::bit_cast<float>(b << 16);
        if (std::isnan(ref)) {
            REQUIRE(std::isnan(got));
            continue;
        }
        REQUIRE(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(ref));
        REQUIRE(static_cast<float>(Eigen::bfloat16(ref)) == got);
        REQUIRE(qkgeom::bfloat16::from_float(got).bits == b);
    }
    std::mt19937 gen(11);
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int i = 0; i < 200000; ++i) {
        float const f = std::bit_cast<float>(bits(gen));
        if (std::isnan(f)) continue;
        REQUIRE(qkgeom::bfloat16::from_float(f).bits == std::bit_cast<std::uint16_t>(Eigen::bfloat16(f)));
    }
}

TEST_CASE("Eigen objects of any storage order and stride read identically", "[tensor][eigen]") {
    Eigen::MatrixXd const A = Eigen::MatrixXd::Random(7, 5);
    RowMajor const R = A;
    CHECK(read_all(A) == A);
    CHECK(read_all(R) == A);
    CHECK(read_all(A.block(2, 1, 4, 3)) == A.block(2, 1, 4, 3));
    CHECK(read_all(R.block(2, 1, 4, 3)) == A.block(2, 1, 4, 3));
    CHECK(read_all(A.transpose()) == A.transpose());
    CHECK(read_all(A.middleCols(1, 2)) == A.middleCols(1, 2));
    Eigen::Ref<Eigen::MatrixXd const> const ref = A;
    CHECK(read_all(ref) == A);
    Eigen::Ref<RowMajor const> const rref = R;
    CHECK(read_all(rref) == A);
    // Map with an outer stride (padding) and with an inner stride (every 2nd element)
    std::vector<double> buf(7 * 9, -1.0);
    Eigen::Map<RowMajor, 0, Eigen::OuterStride<>> padded(buf.data(), 7, 5, Eigen::OuterStride<>(9));
    padded = A;
    CHECK(read_all(padded) == A);
    std::vector<double> buf2(2 * 35, -1.0);
    Eigen::Map<Eigen::MatrixXd, 0, Eigen::Stride<Eigen::Dynamic, 2>> inner(buf2.data(), 7, 5,
                                                                            Eigen::Stride<Eigen::Dynamic, 2>(14, 2));
    inner = A;
    CHECK(read_all(inner) == A);
    // expression templates are evaluated once
    CHECK(read_all(A + A) == 2 * A);
    // float, half and bfloat16 element types widen exactly
    Eigen::MatrixXf const F = A.cast<float>();
    CHECK(read_all(F) == F.cast<double>());
    Eigen::Matrix<Eigen::half, Eigen::Dynamic, Eigen::Dynamic> H = F.cast<Eigen::half>();
    Eigen::MatrixXd Hd(7, 5);
    for (int i = 0; i < 7; ++i)
        for (int j = 0; j < 5; ++j) Hd(i, j) = static_cast<float>(H(i, j));
    CHECK(read_all(H) == Hd);
    auto const v = qkgeom::as_matrix(H);
    CHECK(v.dtype() == "f16");
    CHECK(qkgeom::as_matrix(F).dtype() == "f32");
}

TEST_CASE("std::span views, contiguous and strided, are bounds-checked", "[tensor][span]") {
    std::vector<float> data(30);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
    auto const v = qkgeom::make_matrix_view(std::span<float const>(data), 5, 6);
    CHECK(v.rows() == 5);
    CHECK(v(3, 2) == 20.0);
    // strided: every other column of a 5 x 6 buffer, transposed access
    auto const s = qkgeom::make_matrix_view(std::span<float const>(data), 5, 3, 6, 2);
    CHECK(s(4, 2) == 28.0);
    auto const t = qkgeom::make_matrix_view(std::span<float const>(data), 6, 5, 1, 6);  // column-major read
    CHECK(read_all(t) == read_all(v).transpose());
    CHECK_THROWS_AS(qkgeom::make_matrix_view(std::span<float const>(data), 5, 7), std::invalid_argument);
    CHECK_THROWS_WITH(qkgeom::make_matrix_view(std::span<float const>(data), 6, 6),
                      Catch::Contains("past the end") && Catch::Contains("35"));
    CHECK_THROWS_AS(qkgeom::make_matrix_view(std::span<float const>(data), -1, 6), std::invalid_argument);
    std::vector<qkgeom::bfloat16> b16(12);
    for (std::size_t i = 0; i < b16.size(); ++i) b16[i] = qkgeom::bfloat16::from_float(0.5f * static_cast<float>(i));
    auto const bv = qkgeom::make_matrix_view(std::span<qkgeom::bfloat16 const>(b16), 3, 4);
    CHECK(bv(2, 3) == 5.5);
    CHECK(bv.dtype() == "bf16");
}

TEST_CASE("ranges of fixed-size rows", "[tensor][ranges]") {
    std::vector<std::array<double, 3>> rows{{1, 2, 3}, {4, 5, 6}};
    Eigen::MatrixXd expect(2, 3);
    expect << 1, 2, 3, 4, 5, 6;
    CHECK(read_all(rows) == expect);
    CHECK(read_all(std::span<std::array<double, 3> const>(rows)) == expect);
    // non-contiguous (random access not required)
    std::list<std::array<float, 3>> lst{{1, 2, 3}, {4, 5, 6}};
    CHECK(read_all(lst) == expect);
    // rows as fixed-size Eigen vectors
    std::vector<Eigen::Vector3d> ev{{1, 2, 3}, {4, 5, 6}};
    CHECK(read_all(ev) == expect);
    double raw[2][3] = {{1, 2, 3}, {4, 5, 6}};
    CHECK(read_all(raw) == expect);
#ifdef QKGEOM_TEST_RANGE_V3
    auto tv = ranges::views::iota(0, 4) | ranges::views::transform([](int i) {
                  return std::array<float, 2>{static_cast<float>(i), static_cast<float>(10 * i)};
              });
    Eigen::MatrixXd e2(4, 2);
    e2 << 0, 0, 1, 10, 2, 20, 3, 30;
    CHECK(read_all(tv) == e2);
    auto fv = rows | ranges::views::filter([](auto const& r) { return r[0] > 2; });  // forward only
    CHECK(read_all(fv) == expect.bottomRows(1));
#endif
}

TEST_CASE("index vectors from containers, spans, Eigen and ranges", "[tensor][indices]") {
    std::vector<int> vi{3, 1, 4};
    std::vector<std::int64_t> const expect{3, 1, 4};
    CHECK(read_indices(vi) == expect);
    CHECK(read_indices(std::span<int const>(vi)) == expect);
    std::vector<std::uint16_t> vu{3, 1, 4};
    CHECK(read_indices(vu) == expect);
    Eigen::VectorXi ei(3);
    ei << 3, 1, 4;
    CHECK(read_indices(ei) == expect);
    Eigen::Matrix<std::int64_t, 1, Eigen::Dynamic> er(3);
    er << 3, 1, 4;
    CHECK(read_indices(er) == expect);
    std::list<long> lst{3, 1, 4};
    CHECK(read_indices(lst) == expect);
#ifdef QKGEOM_TEST_RANGE_V3
    CHECK(read_indices(ranges::views::iota(0, 3)) == std::vector<std::int64_t>{0, 1, 2});
#endif
}

#ifdef QKGEOM_TEST_XTENSOR
TEST_CASE("xtensor containers and views", "[tensor][xtensor]") {
    Eigen::MatrixXd const A = Eigen::MatrixXd::Random(6, 4);
    xt::xtensor<double, 2> xa = xt::zeros<double>({6, 4});
    for (std::size_t i = 0; i < 6; ++i)
        for (std::size_t j = 0; j < 4; ++j) xa(i, j) = A(static_cast<int>(i), static_cast<int>(j));
    CHECK(read_all(xa) == A);
    xt::xtensor<double, 2, xt::layout_type::column_major> xc = xa;
    CHECK(read_all(xc) == A);
    xt::xarray<double> xr = xa;
    CHECK(read_all(xr) == A);
    auto rows_view = xt::view(xa, xt::range(1, 5), xt::all());
    CHECK(read_all(rows_view) == A.middleRows(1, 4));
    auto step_view = xt::view(xa, xt::range(0, 6, 2), xt::range(1, 4));
    CHECK(read_all(step_view) == A(Eigen::seq(0, 4, 2), Eigen::seq(1, 3)));
    auto tr = xt::transpose(xa);
    CHECK(read_all(tr) == A.transpose());
    auto sv = xt::strided_view(xa, {xt::range(5, 0, -1), xt::all()});  // negative stride
    CHECK(read_all(sv) == A(Eigen::seq(5, 1, Eigen::fix<-1>), Eigen::all));
    xt::xtensor<float, 2> xf = xt::cast<float>(xa);
    CHECK(read_all(xf) == A.cast<float>().cast<double>());
    CHECK(read_all(xa + xa) == 2 * A);  // expression: evaluated
    xt::xarray<double> r3 = xt::zeros<double>({2, 3, 4});
    CHECK_THROWS_WITH(qkgeom::as_matrix(r3), Catch::Contains("rank 2") && Catch::Contains("3"));
    xt::xtensor<int, 1> ix = {3, 1, 4};
    CHECK(read_indices(ix) == std::vector<std::int64_t>{3, 1, 4});
}
#endif

TEST_CASE("make_matrix_view refuses strides whose extent overflows, dense_rows refuses negative sizes", "[tensor][span]") {
    std::vector<float> data(30);
    constexpr qkgeom::index_t big = std::numeric_limits<qkgeom::index_t>::max();
    // (rows − 1)·row_stride wraps to a small or negative index without the check (UB, and a
    // wrapped value could pass the bounds test)
    CHECK_THROWS_WITH(qkgeom::make_matrix_view(std::span<float const>(data), 3, 2, big / 2 + 1, 1),
                      Catch::Contains("overflows"));
    CHECK_THROWS_WITH(qkgeom::make_matrix_view(std::span<float const>(data), 2, 3, big / 2, big / 2),
                      Catch::Contains("overflows"));
    CHECK_THROWS_WITH(qkgeom::make_matrix_view(std::span<float const>(data), std::int64_t{1} << 32, 2, std::int64_t{1} << 32, 1),
                      Catch::Contains("overflows"));
    // the largest extent that does not overflow is only refused as past the end
    CHECK_THROWS_WITH(qkgeom::make_matrix_view(std::span<float const>(data), 2, 1, big, 0), Catch::Contains("past the end"));
    CHECK_THROWS_WITH(qkgeom::dense_rows(-1, 3, "f64"), Catch::Contains("rows must be >= 0"));
    CHECK_THROWS_WITH(qkgeom::dense_rows(3, -2, "f64"), Catch::Contains("cols must be >= 0"));
    CHECK_THROWS_WITH(qkgeom::dense_rows(big / 2, 3, "f64"), Catch::Contains("overflows"));
    CHECK(qkgeom::dense_rows(2, 3, "f64").rows() == 2);
}

}  // namespace qkgeom_tests_tensor_test
