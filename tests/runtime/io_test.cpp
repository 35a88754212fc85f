// Runtime tests of the dataset I/O layer: .npy, safetensors, JSON and the
// dataset layout (round-trips, read_capture of one head, and every malformed
// input fails with an input_error whose message names the problem).
#include "temp_dir.hpp"

#include <qkgeom/io/dataset.hpp>
#include <qkgeom/io/json.hpp>
#include <qkgeom/io/moments_io.hpp>
#include <qkgeom/io/npy.hpp>
#include <qkgeom/io/npz.hpp>
#include <qkgeom/io/safetensors.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <string>
#include <sstream>
#include <vector>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_io_test {

namespace {

namespace fs = std::filesystem;
namespace io = qkgeom::io;
using Catch::Matchers::Contains;
using bytes_t = std::vector<unsigned char>;

struct temp_dir : qkgeom_test::temp_dir {  // tests/runtime/temp_dir.hpp
    temp_dir() : qkgeom_test::temp_dir("qkgeom_io_test_") {}
};

bytes_t to_bytes(std::string const& s) { return bytes_t(s.begin(), s.end()); }

void write_bytes(fs::path const& p, bytes_t const& b) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<char const*>(b.data()), static_cast<std::streamsize>(b.size()));
}

/// An .npy v1.0 file with the given header dict and data bytes.
bytes_t npy_bytes(std::string const& dict, bytes_t const& data, unsigned major = 1) {
    std::string header = dict;
    std::size_t const prefix = major == 1 ? 10 : 12;
    while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    bytes_t out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
    std::size_t const n = header.size();
    out.push_back(static_cast<unsigned char>(n & 0xFF));
    out.push_back(static_cast<unsigned char>((n >> 8) & 0xFF));
    if (major != 1) {
        out.push_back(0);
        out.push_back(0);
    }
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

bytes_t f32_le(std::vector<float> const& v) {
    bytes_t out;
    for (float f : v) {
        auto const u = std::bit_cast<std::uint32_t>(f);
        for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>((u >> (8 * i)) & 0xFF));
    }
    return out;
}

template <class F>
void require_input_error(F&& f, std::string const& needle) {
    try {
        f();
        FAIL("expected qkgeom::input_error containing: " << needle);
    } catch (qkgeom::input_error const& e) {
        INFO("message: " << e.what());
        REQUIRE_THAT(std::string(e.what()), Contains(needle));
    }
}

}  // namespace

// ---------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------

TEST_CASE("json: valid documents parse", "[io][json]") {
    namespace json = qkgeom::json;
    auto v = json::parse(R"( {"a": [1, -2, 3.5, 1e3, -0.0, true, false, null], "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "o": {}} )");
    REQUIRE(v.is_object());
    auto const& a = v.find("a")->as_array();
    REQUIRE(a.size() == 8);
    CHECK(a[0].as_int() == 1);
    CHECK(a[1].as_int() == -2);
    CHECK(a[2].as_double() == 3.5);
    CHECK(a[3].is_double());
    CHECK(a[3].as_double() == 1000.0);
    CHECK(a[4].is_double());
    CHECK(a[5].as_bool());
    CHECK(!a[6].as_bool());
    CHECK(a[7].is_null());
    CHECK(v.find("s")->as_string() == "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
    CHECK(v.find("o")->as_object().empty());
    CHECK(v.find("missing") == nullptr);
    CHECK(json::parse("9223372036854775807").as_int() == std::numeric_limits<std::int64_t>::max());
    CHECK(json::parse("-9223372036854775808").as_int() == std::numeric_limits<std::int64_t>::min());
    CHECK(json::parse("9223372036854775808").is_double());
    CHECK(json::parse("1e-400").as_double() == 0.0);
    CHECK(json::parse("\"\xe2\x82\xac\"").as_string() == "\xe2\x82\xac");

    // round trip through dump
    std::string const text = json::dump(v);
    auto const w = json::parse(text);
    CHECK(json::dump(w) == text);
    CHECK(json::dump(json::value(0.1)) == "0.1");
    CHECK(json::parse(json::dump(json::value(2.0))).is_double());
    CHECK(json::dump(json::value("\x01")) == "\"\\u0001\"");
}

TEST_CASE("json: invalid documents are rejected with a message", "[io][json]") {
    namespace json = qkgeom::json;
    struct bad {
        char const* text;
        char const* needle;
    };
    bad const cases[] = {
        {"", "unexpected end of input"},
        {"{", "expected a string key"},
        {"[1,]", "invalid value"},
        {"{\"a\":1,}", "expected a string key"},
        {"{\"a\" 1}", "expected ':'"},
        {"[1 2]", "expected ',' or ']'"},
        {"01", "leading zero"},
        {"1.", "digit after the decimal point"},
        {"1e", "digit in the exponent"},
        {"-", "expected a digit"},
        {"NaN", "invalid value"},
        {"tru", "invalid value"},
        {"\"abc", "unterminated string"},
        {"\"a\nb\"", "raw control character"},
        {"\"\\x\"", "invalid escape"},
        {"\"\\u12G4\"", "invalid hex digit"},
        {"\"\\ud800\"", "high surrogate"},
        {"\"\\udc00\"", "lone low surrogate"},
        {"\"\xff\"", "invalid UTF-8"},
        {"\"\xc0\xaf\"", "invalid UTF-8"},
        {"{\"a\":1,\"a\":2}", "duplicate object key"},
        {"1 2", "unexpected content after"},
        {"1e999", "out of the range"},
        {"// c\n1", "invalid value"},
    };
    for (auto const& c : cases) {
        INFO("document: " << c.text);
        require_input_error([&] { (void)json::parse(c.text, "doc.json"); }, c.needle);
    }
    std::string deep(100, '[');
    deep += std::string(100, ']');
    require_input_error([&] { (void)json::parse(deep, "deep.json"); }, "nesting deeper than the limit");
    CHECK_NOTHROW(json::parse(std::string(64, '[') + std::string(64, ']')));
    try {
        (void)json::parse("[1,]", "x.json");
    } catch (qkgeom::input_error const& e) {
        CHECK(e.source() == "x.json");
        CHECK(e.field() == "json");
        CHECK(e.value() == "byte 3");
    }
    CHECK_THROWS_AS(json::dump(json::value(std::nan(""))), std::invalid_argument);
}

// ---------------------------------------------------------------------------
// .npy
// ---------------------------------------------------------------------------

TEST_CASE("npy: round trip of every dtype", "[io][npy]") {
    temp_dir tmp;
    std::vector<double> const dv{0.0, -1.5, 3.25, 1e-300, 2.0, -7.0};
    std::vector<float> const fv{0.0f, -1.5f, 3.25f, 1e-30f, 2.0f, -7.0f};
    std::vector<qkgeom::float16> hv;
    std::vector<qkgeom::bfloat16> bv;
    for (float f : {0.0f, -1.5f, 3.25f, 0.0009765625f, 65504.0f, -7.0f}) hv.push_back(qkgeom::float16::from_float(f));
    for (float f : {0.0f, -1.5f, 3.25f, 1e30f, 2.0f, -7.0f}) bv.push_back(qkgeom::bfloat16::from_float(f));
    std::vector<std::int64_t> const i64{0, -1, std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min(), 5, 6};
    std::vector<std::int32_t> const i32{0, -1, 2147483647, -2147483647 - 1, 5, 6};

    io::write_npy(tmp.path / "d.npy", dv, {2, 3});
    io::write_npy(tmp.path / "f.npy", fv, {2, 3});
    io::write_npy(tmp.path / "h.npy", hv, {2, 3});
    io::write_npy(tmp.path / "b.npy", bv, {2, 3});
    io::write_npy(tmp.path / "i64.npy", i64, {6});
    io::write_npy(tmp.path / "i32.npy", i32, {3, 2});

    auto check_matrix = [&](char const* file, auto const& src, char const* descr) {
        auto const a = io::read_npy(tmp.path / file);
        CHECK(a.descr == descr);
        CHECK(a.shape == std::vector<std::int64_t>{2, 3});
        CHECK(!a.fortran_order);
        auto const m = io::npy_to_matrix(a, file);
        for (int i = 0; i < 6; ++i) {
            double expect;
            if constexpr (requires { src[0].to_float(); }) expect = static_cast<double>(src[static_cast<std::size_t>(i)].to_float());
            else expect = static_cast<double>(src[static_cast<std::size_t>(i)]);
            CHECK(m(i / 3, i % 3) == expect);  // exact
        }
    };
    check_matrix("d.npy", dv, "<f8");
    check_matrix("f.npy", fv, "<f4");
    check_matrix("h.npy", hv, "<f2");
    check_matrix("b.npy", bv, "<V2");
    CHECK(io::npy_to_int64(io::read_npy(tmp.path / "i64.npy")) == i64);
    auto const a32 = io::read_npy(tmp.path / "i32.npy");
    CHECK(a32.descr == "<i4");
    CHECK(io::npy_to_int64(a32) == std::vector<std::int64_t>(i32.begin(), i32.end()));

    // small integer types
    std::vector<std::uint8_t> const u8{0, 1, 255};
    std::vector<std::int8_t> const s8{-128, 0, 127};
    std::vector<std::int16_t> const s16{-32768, 0, 32767};
    std::vector<std::uint32_t> const u32{0, 1, 4294967295u};
    std::vector<std::uint64_t> const u64{0, 1, 9223372036854775807ull};
    io::write_npy(tmp.path / "u8.npy", u8, {3});
    io::write_npy(tmp.path / "s8.npy", s8, {3});
    io::write_npy(tmp.path / "s16.npy", s16, {3});
    io::write_npy(tmp.path / "u32.npy", u32, {3});
    io::write_npy(tmp.path / "u64.npy", u64, {3});
    CHECK(io::read_npy(tmp.path / "u8.npy").descr == "|u1");
    CHECK(io::npy_to_int64(io::read_npy(tmp.path / "u8.npy")) == std::vector<std::int64_t>{0, 1, 255});
    CHECK(io::npy_to_int64(io::read_npy(tmp.path / "s8.npy")) == std::vector<std::int64_t>{-128, 0, 127});
    CHECK(io::npy_to_int64(io::read_npy(tmp.path / "s16.npy")) == std::vector<std::int64_t>{-32768, 0, 32767});
    CHECK(io::npy_to_int64(io::read_npy(tmp.path / "u32.npy")) == std::vector<std::int64_t>{0, 1, 4294967295});
    CHECK(io::npy_to_int64(io::read_npy(tmp.path / "u64.npy")) ==
          std::vector<std::int64_t>{0, 1, std::numeric_limits<std::int64_t>::max()});
    std::vector<std::uint64_t> const big{9223372036854775808ull};
    io::write_npy(tmp.path / "big.npy", big, {1});
    require_input_error([&] { (void)io::npy_to_int64(io::read_npy(tmp.path / "big.npy")); }, "exceeds the int64 range");

    // 0-d and empty arrays
    std::int64_t const scalar = 42;
    io::write_npy(tmp.path / "s.npy", std::span<std::int64_t const>(&scalar, 1), {});
    auto const s = io::read_npy(tmp.path / "s.npy");
    CHECK(s.shape.empty());
    CHECK(io::npy_to_int64(s) == std::vector<std::int64_t>{42});
    io::write_npy(tmp.path / "e.npy", std::vector<float>{}, {0, 4});
    CHECK(io::npy_to_matrix(io::read_npy(tmp.path / "e.npy")).rows() == 0);

    // header: data offset aligned to 64, numpy's dict layout
    auto const raw = io::serialize_npy(io::make_npy(std::span<float const>(fv), {6}));
    std::string const hdr(raw.begin() + 10, raw.begin() + 10 + raw[8]);
    CHECK((10 + hdr.size()) % 64 == 0);
    CHECK_THAT(hdr, Contains("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }"));
}

TEST_CASE("npy: numpy-style header variants and versions 2.0 / 3.0", "[io][npy]") {
    auto const data = f32_le({1, 2, 3, 4, 5, 6});
    for (unsigned major : {1u, 2u, 3u}) {
        auto const a = io::parse_npy(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, major), "v.npy");
        CHECK(a.shape == std::vector<std::int64_t>{2, 3});
        CHECK(io::npy_to_matrix(a)(1, 2) == 6.0);
    }
    // key order, double quotes, no trailing comma, Python 2 'L'
    auto const b = io::parse_npy(npy_bytes("{\"shape\": (6L,), \"fortran_order\": False, \"descr\": \"<f4\"}", data), "v.npy");
    CHECK(b.shape == std::vector<std::int64_t>{6});
    // bf16 as '|V2'
    CHECK(io::parse_npy(npy_bytes("{'descr': '|V2', 'fortran_order': False, 'shape': (1,), }", {0x80, 0x3f}), "b.npy").descr == "|V2");
    CHECK(io::npy_to_matrix(io::parse_npy(npy_bytes("{'descr': '|V2', 'fortran_order': False, 'shape': (1, 1), }", {0x80, 0x3f}))).coeff(0, 0) == 1.0);
}

TEST_CASE("npy: fortran_order is honoured", "[io][npy]") {
    // 2x3 matrix [[1,2,3],[4,5,6]] stored column-major: 1 4 2 5 3 6
    auto const a = io::parse_npy(
        npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f32_le({1, 4, 2, 5, 3, 6})), "f.npy");
    CHECK(a.fortran_order);
    auto const m = io::npy_to_matrix(a);
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) CHECK(m(i, j) == 1 + 3 * i + j);
    // integers, rank 2, Fortran: C-order result
    std::vector<std::int32_t> const col{1, 4, 2, 5, 3, 6};
    auto b = io::make_npy(std::span<std::int32_t const>(col), {2, 3}, true);
    auto const back = io::parse_npy(io::serialize_npy(b), "fi.npy");
    CHECK(back.fortran_order);
    CHECK(io::npy_to_int64(back) == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("npy: malformed files fail with a message naming the problem", "[io][npy]") {
    auto const good = io::serialize_npy(io::make_npy(std::span<float const>(std::vector<float>{1, 2, 3, 4, 5, 6}), {2, 3}));
    std::size_t const data_start = good.size() - 24;
    SECTION("truncated at every length") {
        for (std::size_t n = 0; n < good.size(); ++n) {
            INFO("length " << n);
            bytes_t const cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
            CHECK_THROWS_AS(io::parse_npy(cut, "cut.npy"), qkgeom::input_error);
        }
        bytes_t const cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(data_start + 10));
        require_input_error([&] { (void)io::parse_npy(cut, "cut.npy"); }, "file truncated");
        require_input_error([&] { (void)io::parse_npy(cut, "cut.npy"); }, "cut.npy: data:");
        require_input_error([&] { (void)io::parse_npy(bytes_t(good.begin(), good.begin() + 3), "cut.npy"); },
                            "file truncated");
        require_input_error([&] { (void)io::parse_npy(bytes_t(good.begin(), good.begin() + 40), "cut.npy"); },
                            "header length exceeds");
    }
    SECTION("trailing bytes") {
        bytes_t more = good;
        more.push_back(0);
        require_input_error([&] { (void)io::parse_npy(more, "t.npy"); }, "trailing bytes");
    }
    SECTION("wrong magic") {
        bytes_t bad = good;
        bad[1] = 'X';
        require_input_error([&] { (void)io::parse_npy(bad, "m.npy"); }, "wrong magic");
        require_input_error([&] { (void)io::parse_npy(to_bytes("PK\x03\x04 hello"), "m.npy"); }, "m.npy: magic:");
    }
    SECTION("wrong version") {
        bytes_t bad = good;
        bad[6] = 4;
        require_input_error([&] { (void)io::parse_npy(bad, "v.npy"); }, "unsupported .npy format version");
        require_input_error([&] { (void)io::parse_npy(bad, "v.npy"); }, "(value 4.0)");
    }
    SECTION("bad headers") {
        struct bad {
            std::string dict;
            char const* needle;
        };
        bad const cases[] = {
            {"'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", "expected '{'"},
            {"{'descr': '<f4', 'fortran_order': False}", "lacks the key 'shape'"},
            {"{'descr': '<f4', 'shape': (6,)}", "lacks the key 'fortran_order'"},
            {"{'fortran_order': False, 'shape': (6,)}", "lacks the key 'descr'"},
            {"{'descr': '<f4', 'fortran_order': false, 'shape': (6,)}", "fortran_order must be True or False"},
            {"{'descr': '<f4', 'fortran_order': False, 'shape': [6]}", "shape must be a tuple"},
            {"{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}", "non-negative integers"},
            {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'extra': 1}", "unexpected key"},
            {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", "duplicate key"},
            {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,)}", "structured dtypes"},
            {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x", "unexpected content after"},
            {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", ""},  // valid
            {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", "shape extent too large"},
            {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", "byte count overflows"},
        };
        auto const data = f32_le({1, 2, 3, 4, 5, 6});
        for (auto const& c : cases) {
            INFO("header: " << c.dict);
            if (*c.needle == 0) CHECK_NOTHROW(io::parse_npy(npy_bytes(c.dict, data), "h.npy"));
            else require_input_error([&] { (void)io::parse_npy(npy_bytes(c.dict, data), "h.npy"); }, c.needle);
        }
        // header without the terminating newline
        bytes_t nonl = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", data);
        nonl[data_start - 1 + (nonl.size() - good.size())] = ' ';
        require_input_error([&] { (void)io::parse_npy(nonl, "h.npy"); }, "newline");
    }
    SECTION("wrong dtype") {
        auto const data = f32_le({1, 2});
        require_input_error(
            [&] { (void)io::parse_npy(npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", data), "be.npy"); },
            "big-endian dtype is not supported");
        require_input_error(
            [&] { (void)io::parse_npy(npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", data), "c.npy"); },
            "unsupported dtype");
        require_input_error(
            [&] { (void)io::parse_npy(npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", data), "c.npy"); },
            "c.npy: descr:");
        auto const f = io::parse_npy(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data), "f.npy");
        require_input_error([&] { (void)io::npy_to_int64(f, "f.npy", "position"); }, "expected an integer dtype");
        require_input_error([&] { (void)io::npy_to_matrix(f, "f.npy"); }, "expected a rank-2 array");
    }
    SECTION("shape mismatch") {
        require_input_error(
            [&] {
                (void)io::parse_npy(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", f32_le({1, 2, 3, 4, 5, 6})),
                                    "s.npy");
            },
            "shape (2, 4) of <f4 needs 32 data bytes");
    }
    SECTION("missing file") {
        require_input_error([&] { (void)io::read_npy("/nonexistent/qkgeom/x.npy"); }, "cannot open file");
    }
}

// ---------------------------------------------------------------------------
// safetensors
// ---------------------------------------------------------------------------

namespace {

bytes_t st_bytes(std::string const& header, bytes_t const& buffer) {
    // Sized once and filled with memcpy: vector::insert trips a g++ 12 -O3
    // -Warray-bounds false positive here.
    bytes_t out(8 + header.size() + buffer.size());
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<unsigned char>((header.size() >> (8 * i)) & 0xFF);
    if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
    if (!buffer.empty()) std::memcpy(out.data() + 8 + header.size(), buffer.data(), buffer.size());
    return out;
}

}  // namespace

TEST_CASE("safetensors: round trip of every dtype", "[io][safetensors]") {
    temp_dir tmp;
    io::safetensors_file f;
    std::vector<double> const dv{1.5, -2.25, 0.0, 1e-300};
    std::vector<float> const fv{1.5f, -2.25f, 0.0f, 1e-30f};
    std::vector<qkgeom::float16> hv;
    std::vector<qkgeom::bfloat16> bv;
    for (float x : {1.5f, -2.25f, 0.0f, 6.103515625e-05f}) hv.push_back(qkgeom::float16::from_float(x));
    for (float x : {1.5f, -2.25f, 0.0f, 1e30f}) bv.push_back(qkgeom::bfloat16::from_float(x));
    std::vector<std::int64_t> const i64{-1, 2, std::numeric_limits<std::int64_t>::min()};
    std::vector<std::int32_t> const i32{-1, 2, 3};
    f.tensors["d"] = io::make_tensor(std::span<double const>(dv), {2, 2});
    f.tensors["f"] = io::make_tensor(std::span<float const>(fv), {2, 2});
    f.tensors["h"] = io::make_tensor(std::span<qkgeom::float16 const>(hv), {2, 2});
    f.tensors["b"] = io::make_tensor(std::span<qkgeom::bfloat16 const>(bv), {2, 2});
    f.tensors["i64"] = io::make_tensor(std::span<std::int64_t const>(i64), {3});
    f.tensors["i32"] = io::make_tensor(std::span<std::int32_t const>(i32), {3});
    std::int64_t const one = 7;
    f.tensors["scalar"] = io::make_tensor(std::span<std::int64_t const>(&one, 1), {});
    f.tensors["empty"] = io::make_tensor(std::span<float const>(), {0, 3});
    f.metadata["format"] = "pt";
    f.metadata["note"] = "\"quoted\" \xc3\xa9";
    io::write_safetensors(tmp.path / "x.safetensors", f);
    auto const g = io::read_safetensors(tmp.path / "x.safetensors");
    CHECK(g.metadata == f.metadata);
    REQUIRE(g.tensors.size() == f.tensors.size());
    for (auto const& [name, t] : f.tensors) {
        INFO(name);
        auto const& u = g.tensors.at(name);
        CHECK(u.type == t.type);
        CHECK(u.shape == t.shape);
        CHECK(u.data == t.data);
    }
    auto const m = io::npy_to_matrix(io::to_npy_array(g.tensors.at("h")));
    CHECK(m(1, 1) == static_cast<double>(hv[3].to_float()));
    CHECK(io::npy_to_matrix(io::to_npy_array(g.tensors.at("b")))(1, 1) == static_cast<double>(bv[3].to_float()));
    CHECK(io::npy_to_int64(io::to_npy_array(g.tensors.at("i64"))) == i64);
    // header length is a multiple of 8
    auto const raw = io::serialize_safetensors(f);
    CHECK(raw[0] % 8 == 0);
}

TEST_CASE("safetensors: malformed files fail with a message naming the problem", "[io][safetensors]") {
    bytes_t const buf(24, 0);
    auto hdr = [](char const* a, char const* b) {
        return std::string("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":") + a +
               "},\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":" + b + "}}";
    };
    CHECK_NOTHROW(io::parse_safetensors(st_bytes(hdr("[0,16]", "[16,24]"), buf), "ok.safetensors"));
    require_input_error([&] { (void)io::parse_safetensors(st_bytes(hdr("[0,16]", "[8,16]"), buf), "o.safetensors"); },
                        "overlapping tensors");
    require_input_error([&] { (void)io::parse_safetensors(st_bytes(hdr("[0,16]", "[16,32]"), buf), "r.safetensors"); },
                        "offset out of range");
    require_input_error([&] { (void)io::parse_safetensors(st_bytes(hdr("[0,16]", "[16,32]"), buf), "r.safetensors"); },
                        "r.safetensors: b.data_offsets:");
    require_input_error([&] { (void)io::parse_safetensors(st_bytes(hdr("[0,12]", "[16,24]"), buf), "l.safetensors"); },
                        "does not match shape");
    require_input_error([&] { (void)io::parse_safetensors(st_bytes(hdr("[16,0]", "[16,24]"), buf), "l.safetensors"); },
                        "begin offset after end offset");
    require_input_error([&] { (void)io::parse_safetensors(st_bytes(hdr("[0,16]", "[16,24]"), bytes_t(32, 0)), "t.safetensors"); },
                        "trailing bytes");
    require_input_error(
        [&] {
            (void)io::parse_safetensors(
                st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", bytes_t(16, 0)), "h.safetensors");
        },
        "hole in the data buffer");
    require_input_error(
        [&] {
            (void)io::parse_safetensors(
                st_bytes("{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", bytes_t(8, 0)), "d.safetensors");
        },
        "unknown or unsupported dtype");
    require_input_error(
        [&] {
            (void)io::parse_safetensors(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", bytes_t(8, 0)), "d.safetensors");
        },
        "lacks data_offsets");
    require_input_error(
        [&] {
            (void)io::parse_safetensors(
                st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", bytes_t(8, 0)), "d.safetensors");
        },
        "non-negative integers");
    require_input_error([&] { (void)io::parse_safetensors(st_bytes("[1]", {}), "a.safetensors"); }, "must be a JSON object");
    require_input_error([&] { (void)io::parse_safetensors(st_bytes("{\"a\":", {}), "a.safetensors"); }, "json:");
    require_input_error([&] { (void)io::parse_safetensors(st_bytes("{\"__metadata__\":{\"k\":1}}", {}), "a.safetensors"); },
                        "metadata values must be strings");
    // header size larger than the file; truncated files at every length
    auto const good = st_bytes(hdr("[0,16]", "[16,24]"), buf);
    require_input_error([&] { (void)io::parse_safetensors(bytes_t(good.begin(), good.begin() + 5), "s.safetensors"); },
                        "shorter than the 8-byte header size");
    require_input_error([&] { (void)io::parse_safetensors(bytes_t(good.begin(), good.begin() + 20), "s.safetensors"); },
                        "header size exceeds");
    for (std::size_t n = 0; n < good.size(); ++n) {
        INFO("length " << n);
        CHECK_THROWS_AS(io::parse_safetensors(bytes_t(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)), "s"),
                        qkgeom::input_error);
    }
}

// ---------------------------------------------------------------------------
// dataset layout
// ---------------------------------------------------------------------------

namespace {

io::manifest test_manifest() {
    io::manifest m;
    m.model = "tiny-llama";
    m.n_layers = 2;
    m.n_q_heads = {4, 4};
    m.n_kv_heads = {2, 2};
    m.head_dim = 3;
    m.buckets = {qkgeom::bucket_scheme::uniform, 4, 1.0};
    m.context_length = 64;
    m.seed = 1234;
    return m;
}

io::head_entry test_entry(io::manifest const& m, std::int64_t layer, std::int64_t head, qkgeom::kind k, std::int64_t n = 10) {
    io::head_entry e;
    e.layer = layer;
    e.head = head;
    e.k = k;
    e.vectors.resize(n, m.head_dim);
    std::mt19937 rng(static_cast<unsigned>(layer * 100 + head * 2 + static_cast<int>(k)));
    std::uniform_int_distribution<int> d(-64, 64);
    for (qkgeom::index_t i = 0; i < e.vectors.size(); ++i)
        e.vectors.data()[i] = d(rng) / 16.0;  // exactly representable in f16 and bf16
    for (std::int64_t i = 0; i < n; ++i) {
        e.position.values().push_back(i * 5);
        e.bucket.values().push_back(qkgeom::bucket_of(m.buckets, i * 5));
        e.example_id.values().push_back(i % 3);
    }
    return e;
}

}  // namespace

namespace {

/// Replaces `from` by `to` in the manifest text `base` and requires
/// parse_manifest to fail with a message containing `needle`.
void require_manifest_error(std::string const& base, std::string const& from, std::string const& to,
                            char const* needle) {
    std::string t = base;
    auto const at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    INFO(t);
    require_input_error([&] { (void)io::parse_manifest(t, "manifest.json"); }, needle);
}

}  // namespace

TEST_CASE("dataset: manifest round trip and validation", "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    auto const r = io::read_manifest(tmp.path);
    CHECK(r.model == m.model);
    CHECK(r.n_layers == 2);
    CHECK(r.n_q_heads == m.n_q_heads);
    CHECK(r.n_kv_heads == m.n_kv_heads);
    CHECK(r.head_dim == 3);
    CHECK(r.buckets == m.buckets);
    CHECK(r.context_length == 64);
    CHECK(r.seed == 1234);

    std::string const base =
        R"({"model":"m","n_layers":2,"n_q_heads":8,"n_kv_heads":2,"head_dim":64,"context_length":4096,"buckets":{"scheme":"log","width":16,"rate":2.5},"capture":{"seed":7}})";
    auto const p = io::parse_manifest(base);
    CHECK(p.n_q_heads == std::vector<std::int64_t>{8, 8});
    CHECK(p.buckets.scheme == qkgeom::bucket_scheme::log);
    CHECK(p.buckets.rate == 2.5);
    auto bad = [&](std::string const& from, std::string const& to, char const* needle) {
        require_manifest_error(base, from, to, needle);
    };
    bad("\"n_kv_heads\":2", "\"n_kv_heads\":3", "must be a multiple of n_kv_heads");
    bad("\"n_q_heads\":8", "\"n_q_heads\":[8]", "per-layer array length differs");
    bad("\"head_dim\":64", "\"head_dim\":0", "head_dim: must be >= 1");
    bad("\"head_dim\":64,", "", "head_dim: required manifest field is missing");
    bad("\"log\"", "\"cubic\"", "unknown bucket scheme");
    bad("\"rate\":2.5", "\"rate\":-1", "buckets.rate");
    bad("\"model\":\"m\"", "\"model\":3", "model name must be a string");
    bad("\"seed\":7", "\"seed\":-7", "capture.seed");
}

TEST_CASE("dataset: head round trip in both formats and every vector dtype", "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    int h = 0;
    for (auto fmt : {io::storage_format::npy, io::storage_format::safetensors, io::storage_format::npz}) {
        for (char const* dt : {"f32", "f64", "f16", "bf16"}) {
            for (auto k : {qkgeom::kind::query, qkgeom::kind::key}) {
                std::int64_t const layer = h % 2, head = (h / 2) % 2;
                ++h;
                auto e = test_entry(m, layer, head, k);
                if (h % 3 == 0) e.sliding_window = 16;
                io::write_head(tmp.path, e, fmt, dt);
                INFO("format " << static_cast<int>(fmt) << " dtype " << dt << " kind " << qkgeom::kind_name(k));
                auto const r = io::read_head(tmp.path, layer, head, k);
                CHECK(r.dtype == dt);
                CHECK(r.vectors == e.vectors);  // exact: values representable in every dtype
                CHECK(r.position == e.position);
                CHECK(r.bucket == e.bucket);
                CHECK(r.example_id == e.example_id);
                CHECK(r.sliding_window == e.sliding_window);
                // clean up so the next round can use the other format
                fs::remove_all(tmp.path / io::head_entry_name(layer, head, k));
                fs::remove(tmp.path / (io::head_entry_name(layer, head, k) + ".safetensors"));
                fs::remove(tmp.path / (io::head_entry_name(layer, head, k) + ".npz"));
            }
        }
    }
    CHECK(io::head_entry_name(3, 7, qkgeom::kind::query) == "l03h07q");
    CHECK(io::head_entry_name(12, 0, qkgeom::kind::key) == "l12h00k");
    CHECK(io::head_entry_name(123, 4, qkgeom::kind::key) == "l123h04k");
}

TEST_CASE("dataset: list_heads finds both forms", "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    io::write_head(tmp.path, m, test_entry(m, 1, 3, qkgeom::kind::query), io::storage_format::npy);
    io::write_head(tmp.path, m, test_entry(m, 0, 1, qkgeom::kind::key), io::storage_format::safetensors);
    io::write_head(tmp.path, m, test_entry(m, 0, 1, qkgeom::kind::query), io::storage_format::npy);
    fs::create_directories(tmp.path / "notes");
    fs::create_directories(tmp.path / "l1h2q");  // not canonical
    write_bytes(tmp.path / "l00h00x.safetensors", {});
    auto const ids = io::list_heads(tmp.path);
    REQUIRE(ids.size() == 3);
    CHECK(ids[0] == io::entry_id{0, 1, qkgeom::kind::query, io::storage_format::npy});
    CHECK(ids[1] == io::entry_id{0, 1, qkgeom::kind::key, io::storage_format::safetensors});
    CHECK(ids[2] == io::entry_id{1, 3, qkgeom::kind::query, io::storage_format::npy});
}

TEST_CASE("dataset: invalid heads fail naming file, field and value", "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    auto const e = test_entry(m, 0, 1, qkgeom::kind::query);
    fs::path const sub = tmp.path / "l00h01q";
    auto rewrite = [&](auto const& mutate) {
        io::write_head(tmp.path, m, e, io::storage_format::npy);
        mutate();
    };
    auto read = [&] { (void)io::read_head(tmp.path, 0, 1, qkgeom::kind::query); };

    SECTION("NaN in vectors") {
        rewrite([&] {
            auto v = e.vectors;
            v(4, 2) = std::nan("");
            auto a = io::read_npy(sub / "vectors.npy");
            std::vector<float> f(v.data(), v.data() + v.size());
            io::write_npy(sub / "vectors.npy", f, {v.rows(), v.cols()});
        });
        require_input_error(read, "vectors[row 4, col 2]: non-finite value");
        require_input_error(read, "vectors.npy");
    }
    SECTION("bucket inconsistent with position") {
        rewrite([&] {
            auto b = e.bucket.values();
            b[3] += 1;
            io::write_npy(sub / "bucket.npy", b, {static_cast<std::int64_t>(b.size())});
        });
        require_input_error(read, "bucket[3]: bucket inconsistent with position 15 under the uniform scheme (expected 3) (value 4)");
        require_input_error(read, "bucket.npy");
    }
    SECTION("negative position") {
        rewrite([&] {
            auto p = e.position.values();
            p[0] = -1;
            io::write_npy(sub / "position.npy", p, {static_cast<std::int64_t>(p.size())});
        });
        require_input_error(read, "position[0]: position must be >= 0 (value -1)");
    }
    SECTION("lengths disagree") {
        rewrite([&] {
            std::vector<std::int64_t> id(e.example_id.begin(), e.example_id.end() - 1);
            io::write_npy(sub / "example_id.npy", id, {static_cast<std::int64_t>(id.size())});
        });
        require_input_error(read, "example_id.length: length differs from the 10 rows of vectors (value 9)");
    }
    SECTION("head_dim mismatch") {
        rewrite([&] { io::write_npy(sub / "vectors.npy", std::vector<float>(20, 0.0f), {10, 2}); });
        require_input_error(read, "head dimension differs from manifest head_dim = 3");
    }
    SECTION("vectors rank and dtype") {
        rewrite([&] { io::write_npy(sub / "vectors.npy", std::vector<float>(30, 0.0f), {30}); });
        require_input_error(read, "vectors must be a rank-2 array");
        rewrite([&] { io::write_npy(sub / "vectors.npy", std::vector<std::int32_t>(30, 0), {10, 3}); });
        require_input_error(read, "vectors must be f32, f64, f16 or bf16");
    }
    SECTION("positions as floats") {
        rewrite([&] { io::write_npy(sub / "position.npy", std::vector<double>(10, 0.0), {10}); });
        require_input_error(read, "position: expected an integer dtype");
    }
    SECTION("truncated vectors file") {
        rewrite([&] {
            auto const b = io::serialize_npy(io::read_npy(sub / "vectors.npy"));
            write_bytes(sub / "vectors.npy", bytes_t(b.begin(), b.end() - 7));
        });
        require_input_error(read, "file truncated");
    }
    SECTION("missing entry and out-of-range head") {
        require_input_error(read, "head entry not found");
        require_input_error([&] { (void)io::read_head(tmp.path, 0, 2, qkgeom::kind::key); }, "head outside [0, n_kv_heads = 2)");
        require_input_error([&] { (void)io::read_head(tmp.path, 5, 0, qkgeom::kind::key); }, "layer outside");
    }
    SECTION("safetensors: missing tensor and NaN") {
        auto bad = e;
        bad.vectors(0, 0) = INFINITY;
        CHECK_THROWS_AS(io::write_head(tmp.path, m, bad, io::storage_format::safetensors), qkgeom::input_error);
        io::write_head(tmp.path, m, e, io::storage_format::safetensors);
        auto f = io::read_safetensors(tmp.path / "l00h01q.safetensors");
        f.tensors.erase("example_id");
        io::write_safetensors(tmp.path / "l00h01q.safetensors", f);
        require_input_error(read, "example_id: required tensor is missing");
        std::vector<float> v(30, 0.0f);
        v[5] = std::nan("");
        f.tensors["vectors"] = io::make_tensor(std::span<float const>(v), {10, 3});
        f.tensors["example_id"] = io::make_tensor(std::span<std::int64_t const>(e.example_id.values()), {10});
        io::write_safetensors(tmp.path / "l00h01q.safetensors", f);
        require_input_error(read, "l00h01q.safetensors: vectors[row 1, col 2]: non-finite value");
    }
}

// ---------------------------------------------------------------------------
// .npz (ZIP archives of .npy members)
// ---------------------------------------------------------------------------

namespace {

std::uint32_t rd(bytes_t const& b, std::size_t p, std::size_t n) {
    std::uint32_t v = 0;
    for (std::size_t i = n; i-- > 0;) v = (v << 8) | b[p + i];
    return v;
}
void wr(bytes_t& b, std::size_t p, std::uint32_t v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i, v >>= 8) b[p + i] = static_cast<unsigned char>(v & 0xFFu);
}

/// Offsets of the central directory entries of a comment-less, non-ZIP64 archive.
std::vector<std::size_t> central_entries(bytes_t const& z) {
    std::size_t const eocd = z.size() - 22;
    REQUIRE(rd(z, eocd, 4) == 0x06054b50u);
    std::vector<std::size_t> out;
    std::size_t p = rd(z, eocd + 16, 4);
    for (std::uint32_t i = 0; i < rd(z, eocd + 10, 2); ++i) {
        out.push_back(p);
        p += 46 + rd(z, p + 28, 2) + rd(z, p + 30, 2) + rd(z, p + 32, 2);
    }
    return out;
}

/// Replaces every occurrence of `from` by `to` (same length) in the bytes.
void replace_all(bytes_t& b, std::string const& from, std::string const& to) {
    REQUIRE(from.size() == to.size());
    int n = 0;
    for (auto it = std::search(b.begin(), b.end(), from.begin(), from.end()); it != b.end();
         it = std::search(it + 1, b.end(), from.begin(), from.end())) {
        std::copy(to.begin(), to.end(), it);
        ++n;
    }
    REQUIRE(n > 0);
}

template <class T>
io::npy_array arr(std::vector<T> const& v, std::vector<std::int64_t> shape, bool fortran = false) {
    return io::make_npy(std::span<T const>(v), std::move(shape), fortran);
}

/// One array of every dtype, plus 0-d, empty, Fortran-order and a compressible one.
io::npz_file every_dtype_npz() {
    io::npz_file f;
    f.add("f64", arr(std::vector<double>{0.0, -1.5, 1e-300, std::numeric_limits<double>::max(),
                                         -std::numeric_limits<double>::infinity(), 4.9e-324},
                     {2, 3}));
    f.add("f32", arr(std::vector<float>{0.0f, -1.5f, 1e-45f, 3.4e38f, 7.0f, -0.0f}, {3, 2}));
    std::vector<qkgeom::float16> h;
    for (std::uint16_t bits : {0x0000, 0x0001, 0x3C00, 0x7BFF, 0x8000, 0xFC00}) h.push_back(qkgeom::float16::from_bits(bits));
    f.add("f16", arr(h, {6}));
    std::vector<qkgeom::bfloat16> b;
    for (std::uint16_t bits : {0x3F80, 0x0001, 0xFF80, 0x7F7F}) b.push_back(qkgeom::bfloat16::from_bits(bits));
    f.add("bf16", arr(b, {2, 2}));
    f.add("i64", arr(std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), -1, 0,
                                               std::numeric_limits<std::int64_t>::max()},
                     {4}));
    f.add("i32", arr(std::vector<std::int32_t>{-2147483647 - 1, 2147483647}, {2}));
    f.add("i16", arr(std::vector<std::int16_t>{-32768, 32767}, {2}));
    f.add("i8", arr(std::vector<std::int8_t>{-128, 127}, {2}));
    f.add("u64", arr(std::vector<std::uint64_t>{0, 18446744073709551615ull}, {2}));
    f.add("u32", arr(std::vector<std::uint32_t>{0, 4294967295u}, {2}));
    f.add("u16", arr(std::vector<std::uint16_t>{0, 65535}, {2}));
    f.add("u8", arr(std::vector<std::uint8_t>{0, 255}, {2}));
    std::int64_t const scalar = 4096;
    f.add("scalar", io::make_npy(std::span<std::int64_t const>(&scalar, 1), {}));
    f.add("empty", arr(std::vector<float>{}, {0, 4}));
    f.add("fortran", arr(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, true));
    std::vector<float> rep(20000);
    for (std::size_t i = 0; i < rep.size(); ++i) rep[i] = static_cast<float>(i % 7);
    f.add("repetitive", arr(rep, {4000, 5}));
    return f;
}

void check_same(io::npz_file const& a, io::npz_file const& b) {
    REQUIRE(a.members.size() == b.members.size());
    for (std::size_t i = 0; i < a.members.size(); ++i) {
        INFO("member " << a.members[i].key);
        CHECK(a.members[i].key == b.members[i].key);
        CHECK(a.members[i].array.descr == b.members[i].array.descr);
        CHECK(a.members[i].array.shape == b.members[i].array.shape);
        CHECK(a.members[i].array.fortran_order == b.members[i].array.fortran_order);
        CHECK(a.members[i].array.data == b.members[i].array.data);  // bit-exact
    }
}

std::vector<io::npz_compression> compressions() {
    std::vector<io::npz_compression> c{io::npz_compression::stored};
    if (io::npz_deflate_available()) c.push_back(io::npz_compression::deflate);
    return c;
}

}  // namespace

TEST_CASE("npz: crc32 matches the reference check value and chains", "[io][npz]") {
    std::string const check = "123456789";
    auto const span = [](std::string const& s) {
        return std::span<unsigned char const>(reinterpret_cast<unsigned char const*>(s.data()), s.size());
    };
    CHECK(io::crc32(span(check)) == 0xCBF43926u);  // CRC-32/ISO-HDLC check value
    CHECK(io::crc32({}) == 0u);
    std::string const text = "The quick brown fox jumps over the lazy dog";
    CHECK(io::crc32(span(text)) == 0x414FA339u);
    for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{17}, text.size()})
        CHECK(io::crc32(span(text.substr(cut)), io::crc32(span(text.substr(0, cut)))) == io::crc32(span(text)));
}

TEST_CASE("npz: round trip of every dtype, stored and deflated, plain, ZIP64 and data descriptors", "[io][npz]") {
    auto const f = every_dtype_npz();
    INFO("deflate available: " << io::npz_deflate_available());
    for (auto c : compressions()) {
        for (bool zip64 : {false, true}) {
            for (bool dd : {false, true}) {
                io::npz_write_options opt;
                opt.compression = c;
                opt.force_zip64 = zip64;
                opt.data_descriptor = dd;
                INFO("method " << static_cast<int>(c) << " zip64 " << zip64 << " descriptor " << dd);
                auto const z = io::serialize_npz(f, opt);
                check_same(io::parse_npz(z, "x.npz"), f);
                CHECK(io::serialize_npz(f, opt) == z);  // deterministic (fixed timestamp)
                auto const info = io::list_npz(z, "x.npz");
                REQUIRE(info.size() == f.members.size());
                std::set<std::string> names;
                for (std::size_t i = 0; i < info.size(); ++i) {
                    CHECK(info[i].name == f.members[i].key + ".npy");
                    CHECK(info[i].method == static_cast<std::uint16_t>(c));
                    CHECK(info[i].zip64 == zip64);
                    CHECK(((info[i].flags & 0x8) != 0) == dd);
                    CHECK(info[i].size == io::serialize_npy(f.members[i].array).size());
                    CHECK(info[i].crc32 == io::crc32(io::serialize_npy(f.members[i].array)));
                    names.insert(info[i].name);
                }
                CHECK(names.size() == info.size());
                auto const& rep = info.back();
                if (c == io::npz_compression::deflate) CHECK(rep.compressed_size * 10 < rep.size);
                else CHECK(rep.compressed_size == rep.size);
                if (zip64) {  // ZIP64 end record + locator before the end record, whose fields are maxed
                    CHECK(rd(z, z.size() - 22 - 20, 4) == 0x07064b50u);
                    CHECK(rd(z, z.size() - 22 + 10, 2) == 0xFFFFu);
                    CHECK(rd(z, z.size() - 22 + 16, 4) == 0xFFFFFFFFu);
                }
            }
        }
    }
    // through files, and the accessors
    temp_dir tmp;
    io::write_npz(tmp.path / "a.npz", f, {});
    auto const r = io::read_npz(tmp.path / "a.npz");
    check_same(r, f);
    REQUIRE(r.find("f16") != nullptr);
    CHECK(r.find("f16") == r.find("f16.npy"));
    CHECK(r.find("nope") == nullptr);
    CHECK(io::npy_to_matrix(r.at("fortran"))(1, 0) == 2.0);
    CHECK(io::npy_to_int64(r.at("scalar")) == std::vector<std::int64_t>{4096});
    require_input_error([&] { (void)r.at("nope", "a.npz"); }, "a.npz: nope.npy: required member is missing");
    io::npz_file g;
    g.add("x", arr(std::vector<float>{1.0f}, {1}));
    CHECK_THROWS_AS(g.add("x.npy", arr(std::vector<float>{1.0f}, {1})), std::invalid_argument);
    if (!io::npz_deflate_available()) {
        io::npz_write_options opt;
        opt.compression = io::npz_compression::deflate;
        CHECK_THROWS_WITH(io::serialize_npz(f, opt), Contains("zlib"));
    }
    // an empty archive is the 22-byte end record alone (what np.savez() writes for no arrays)
    auto const empty = io::serialize_npz(io::npz_file{});
    CHECK(empty.size() == 22);
    CHECK(io::parse_npz(empty, "e.npz").members.empty());
}

TEST_CASE("npz: malformed archives fail naming file, member and value", "[io][npz]") {
    io::npz_file f;
    f.add("a", arr(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
    std::vector<std::int64_t> big(1000);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::int64_t>(i * i);
    f.add("b", arr(big, {1000}));
    auto const good = io::serialize_npz(f);
    auto const cd = central_entries(good);
    REQUIRE(cd.size() == 2);
    std::size_t const off_b = rd(good, cd[1] + 42, 4);
    auto parse = [](bytes_t const& z) { return [z] { (void)io::parse_npz(z, "x.npz"); }; };

    require_input_error(parse({}), "x.npz: signature: file truncated: too short for a ZIP archive");
    require_input_error(parse(to_bytes("hello, this is not an archive")), "not an .npz (ZIP) archive");
    // every truncation fails (the end record is what a truncated archive loses first)
    for (std::size_t n = 0; n < good.size(); n += (n < 64 || n + 64 > good.size()) ? 1 : 97) {
        INFO("length " << n);
        CHECK_THROWS_AS(io::parse_npz(bytes_t(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)), "x.npz"),
                        qkgeom::input_error);
    }
    require_input_error(parse(bytes_t(good.begin(), good.end() - 1)), "end of central directory: record not found");
    {
        auto z = good;
        z.push_back(0);  // trailing byte after the end record
        require_input_error(parse(z), "end of central directory: record not found");
    }
    {  // a flipped data byte: the CRC catches it
        auto z = good;
        z[off_b + 30 + 5 + 128 + 100] ^= 0x01;
        require_input_error(parse(z), "x.npz[b.npy]: crc32: CRC-32 mismatch: the archive records 0x");
    }
    {
        auto z = good;
        z[off_b] = 'Q';
        require_input_error(parse(z), "x.npz[b.npy]: local header signature: bad signature");
    }
    {
        auto z = good;
        z[cd[1]] = 'Q';
        require_input_error(parse(z), "x.npz: central directory entry 1 signature: bad signature");
    }
    {
        auto z = good;
        replace_all(z, "b.npy", "a.npy");
        require_input_error(parse(z), "x.npz[a.npy]: name: duplicate member name (value a.npy)");
    }
    {
        auto z = good;
        replace_all(z, "b.npy", "b.txt");
        require_input_error(parse(z), "x.npz[b.txt]: name: not a .npy member");
    }
    {
        auto z = good;
        wr(z, off_b + 8, 12, 2);
        wr(z, cd[1] + 10, 12, 2);
        require_input_error(parse(z), "x.npz[b.npy]: compression method: unsupported (supported: 0 stored, 8 deflate) (value 12)");
    }
    {
        auto z = good;
        wr(z, cd[0] + 8, 1, 2);
        require_input_error(parse(z), "x.npz[a.npy]: flags: encrypted members are not supported");
    }
    {
        auto z = good;
        std::uint32_t const crc = rd(z, cd[1] + 16, 4);
        wr(z, cd[1] + 16, crc ^ 1u, 4);
        require_input_error(parse(z), "x.npz[b.npy]: local header crc32: differs from the central directory's");
    }
    {
        auto z = good;
        wr(z, cd[0] + 20, rd(z, cd[0] + 20, 4) + 1, 4);
        wr(z, cd[0] + 24, rd(z, cd[0] + 24, 4) + 1, 4);
        require_input_error(parse(z), "x.npz[a.npy]: local header compressed_size: differs from the central directory's");
    }
    {
        auto z = good;
        wr(z, cd[1] + 20, 0x7FFFFFF0u, 4);
        wr(z, cd[1] + 24, 0x7FFFFFF0u, 4);
        require_input_error(parse(z), "x.npz[b.npy]: compressed_size: data runs into the central directory");
    }
    {
        auto z = good;
        wr(z, z.size() - 22 + 16, rd(z, z.size() - 22 + 16, 4) + 1, 4);
        require_input_error(parse(z), "x.npz: central directory: offset + size do not end where the end record starts");
    }
    {
        auto z = good;
        wr(z, z.size() - 22 + 8, 3, 2);
        wr(z, z.size() - 22 + 10, 3, 2);
        require_input_error(parse(z), "x.npz: entries: more entries than fit in the central directory");
    }
    {
        auto z = good;
        wr(z, z.size() - 22 + 4, 1, 2);
        require_input_error(parse(z), "multi-disk archives are not supported");
    }
    {  // a member whose content is not .npy (CRC fixed up so only the npy parser objects)
        auto z = good;
        std::size_t const data_a = 30 + 5;
        z[data_a + 1] = 'X';
        std::uint32_t const crc =
            io::crc32(std::span<unsigned char const>(z.data() + data_a, rd(z, cd[0] + 20, 4)));
        wr(z, 14, crc, 4);
        wr(z, cd[0] + 16, crc, 4);
        require_input_error(parse(z), "x.npz[a.npy]: magic: not a .npy file");
    }
    {  // data descriptor that disagrees with the central directory
        io::npz_write_options opt;
        opt.data_descriptor = true;
        auto z = io::serialize_npz(f, opt);
        auto const cdd = central_entries(z);
        std::size_t const desc = 30 + 5 + rd(z, cdd[0] + 20, 4);
        REQUIRE(rd(z, desc, 4) == 0x08074b50u);
        CHECK_NOTHROW(io::parse_npz(z, "x.npz"));
        z[desc + 4] ^= 0x10;
        require_input_error(parse(z), "x.npz[a.npy]: data descriptor crc32: differs from the central directory's");
    }
    {  // ZIP64: the end record says 0xFFFF but the locator is gone
        io::npz_write_options opt;
        opt.force_zip64 = true;
        auto z = io::serialize_npz(f, opt);
        z[z.size() - 22 - 20] = 'Q';
        require_input_error(parse(z), "zip64 end of central directory locator");
    }
    if (io::npz_deflate_available()) {  // corrupt deflate data: zlib or the CRC objects, naming the member
        io::npz_write_options opt;
        opt.compression = io::npz_compression::deflate;
        auto const zd = io::serialize_npz(f, opt);
        auto const cdd = central_entries(zd);
        std::size_t const ob = rd(zd, cdd[1] + 42, 4);
        std::size_t const clen = rd(zd, cdd[1] + 20, 4);
        int failures = 0;
        for (std::size_t k = 0; k < clen; k += 7) {
            auto z = zd;
            z[ob + 30 + 5 + k] ^= 0x5A;
            try {
                (void)io::parse_npz(z, "x.npz");
            } catch (qkgeom::input_error const& e) {
                INFO(e.what());
                CHECK_THAT(std::string(e.what()), Contains("x.npz[b.npy]"));
                ++failures;
            }
        }
        CHECK(failures == static_cast<int>((clen + 6) / 7));  // every corruption is detected
        // a declared size larger than the data inflates to
        auto z = zd;
        wr(z, cdd[1] + 24, rd(z, cdd[1] + 24, 4) + 1, 4);
        wr(z, ob + 22, rd(z, ob + 22, 4) + 1, 4);
        require_input_error(parse(z), "x.npz[b.npy]: size: inflated size differs from the size the archive records");
    }
}

TEST_CASE("dataset: npz entries, stored and deflated, listed and exclusive", "[io][dataset][npz]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    auto e = test_entry(m, 0, 1, qkgeom::kind::query);
    e.sliding_window = 32;
    for (auto c : compressions()) {
        io::write_head(tmp.path, m, e, io::storage_format::npz, "bf16", c);
        auto const info = io::list_npz(qkgeom::io::detail::read_file_bytes(tmp.path / "l00h01q.npz"));
        REQUIRE(info.size() == 5);
        CHECK(info[0].name == "vectors.npy");
        CHECK(info[4].name == "sliding_window.npy");
        CHECK(info[0].method == static_cast<std::uint16_t>(c));
        auto const r = io::read_head(tmp.path, 0, 1, qkgeom::kind::query);
        CHECK(r.dtype == "bf16");
        CHECK(r.vectors == e.vectors);
        CHECK(r.position == e.position);
        CHECK(r.bucket == e.bucket);
        CHECK(r.example_id == e.example_id);
        CHECK(r.sliding_window == 32);
    }
    auto const ids = io::list_heads(tmp.path);
    REQUIRE(ids.size() == 1);
    CHECK(ids[0] == io::entry_id{0, 1, qkgeom::kind::query, io::storage_format::npz});
    CHECK(std::string(io::storage_format_name(io::storage_format::npz)) == "npz");

    auto read = [&] { (void)io::read_head(tmp.path, 0, 1, qkgeom::kind::query); };
    {   // a second form put there by hand (write_head removes the other forms itself)
        temp_dir other;
        io::write_head(other.path, m, e, io::storage_format::npy);
        fs::copy(other.path / "l00h01q", tmp.path / "l00h01q", fs::copy_options::recursive);
    }
    require_input_error(read, "the entry exists in more than one storage form: l00h01q/ l00h01q.npz");
    CHECK(io::list_heads(tmp.path).size() == 2);
    fs::remove_all(tmp.path / "l00h01q");

    io::npz_file f = io::read_npz(tmp.path / "l00h01q.npz");
    f.members.erase(f.members.begin() + 3);  // example_id
    io::write_npz(tmp.path / "l00h01q.npz", f);
    require_input_error(read, "l00h01q.npz: example_id.npy: required member is missing");

    auto bad = e;
    bad.position.values()[2] = 1000;
    io::npz_file g = io::read_npz(tmp.path / "l00h01q.npz");
    g.add("example_id", arr(e.example_id.values(), {static_cast<std::int64_t>(e.example_id.size())}));
    g.members[1].array = arr(bad.position.values(), {static_cast<std::int64_t>(bad.position.size())});
    io::write_npz(tmp.path / "l00h01q.npz", g);
    require_input_error(read, "l00h01q.npz[position.npy]: position[2]: position beyond manifest context_length = 64 (value 1000)");
}

// ---------------------------------------------------------------------------
// manifest: rope, sliding windows, GQA group size, head sampling (issue 6)
// ---------------------------------------------------------------------------

namespace {

io::manifest full_manifest() {
    auto m = test_manifest();
    m.rope = qkgeom::rope_spec{qkgeom::rope_pairing::interleaved, 2, 500000.0, "llama3", 8.0};
    m.sliding_window = {std::nullopt, 16};
    m.heads = io::head_sampling{3, 99, qkgeom::layer_eligibility::all_layers};
    return m;
}

}  // namespace

TEST_CASE("dataset: manifest round trip with and without the issue 6 fields", "[io][dataset]") {
    temp_dir tmp;
    // without: an old-style manifest reads as "not recorded" and is written without the new keys
    auto const old = test_manifest();
    auto const old_text = io::dump_manifest(old);
    CHECK_THAT(old_text, !Contains("\"rope\"") && !Contains("\"sliding_window\"") && !Contains("head_count"));
    CHECK_THAT(old_text, Contains("\"gqa_group_size\": [\n    2,\n    2\n  ]"));
    auto const r0 = io::parse_manifest(old_text);
    CHECK(!r0.rope);
    CHECK(r0.sliding_window.empty());
    CHECK(!r0.heads);
    auto const legacy = io::parse_manifest(
        R"({"model":"m","n_layers":1,"n_q_heads":8,"n_kv_heads":2,"head_dim":64,"context_length":4096,"buckets":{"scheme":"uniform","width":16}})");
    CHECK(!legacy.rope);
    CHECK(!legacy.heads);
    CHECK(legacy.sliding_window.empty());

    // with
    auto const m = full_manifest();
    io::write_manifest(tmp.path, m);
    auto const r = io::read_manifest(tmp.path);
    REQUIRE(r.rope);
    CHECK(*r.rope == *m.rope);
    CHECK(r.sliding_window == m.sliding_window);
    REQUIRE(r.heads);
    CHECK(*r.heads == *m.heads);
    CHECK_NOTHROW(io::check_compatible(r, m));
    auto all = m;
    all.heads->count = std::nullopt;  // every eligible head: written as null
    auto const all_text = io::dump_manifest(all);
    CHECK_THAT(all_text, Contains("\"head_count\": null"));
    CHECK(!io::parse_manifest(all_text).heads->count);

    std::string const base = R"({"model":"m","n_layers":2,"n_q_heads":8,"n_kv_heads":2,"gqa_group_size":[4,4],"head_dim":64,)"
                             R"("context_length":4096,"buckets":{"scheme":"log","width":16,"rate":2.5},)"
                             R"("sliding_window":[null,4096],)"
                             R"("rope":{"pairing":"rotate_half","rotary_dim":32,"theta":10000,"scaling":"none","scaling_factor":1},)"
                             R"("capture":{"seed":7,"head_count":5,"head_seed":3,"eligibility":"full_attention_only"}})";
    auto const p = io::parse_manifest(base);
    CHECK(p.rope->rotary_dim == 32);
    CHECK(p.rope->theta == 10000.0);
    CHECK(p.sliding_window[1] == 4096);
    CHECK(p.heads->count == 5);
    CHECK(p.heads->eligibility == qkgeom::layer_eligibility::full_attention_only);
    auto bad = [&](std::string const& from, std::string const& to, char const* needle) {
        require_manifest_error(base, from, to, needle);
    };
    bad("\"rotate_half\"", "\"diagonal\"", "manifest.json: rope.pairing: must be \"rotate_half\" or \"interleaved\" (value \"diagonal\")");
    bad("\"rotary_dim\":32", "\"rotary_dim\":33", "rope.rotary_dim: must be an even integer in [0, head_dim = 64]");
    bad("\"rotary_dim\":32", "\"rotary_dim\":66", "rope.rotary_dim");
    bad("\"theta\":10000", "\"theta\":-1", "rope.theta: must be a finite number > 0 (value -1)");
    bad("\"theta\":10000,", "", "rope.theta: required");
    bad("\"pairing\":\"rotate_half\",", "", "rope.pairing: required");
    bad("\"scaling_factor\":1", "\"scaling_factor\":2", "rope.scaling_factor: must be 1 when rope.scaling is \"none\"");
    bad("\"scaling_factor\":1", "\"scaling_factor\":0", "rope.scaling_factor: must be a finite number > 0");
    bad("\"rope\":{", "\"rope\":[],\"x\":{", "rope: must be an object");
    bad("[null,4096]", "[null]", "sliding_window: per-layer array length differs from n_layers = 2 (value 1)");
    bad("[null,4096]", "[null,0]", "sliding_window[1]: must be an integer >= 1 or null (full attention) (value 0)");
    bad("[null,4096]", "4096", "sliding_window: must be an array");
    bad("[4,4]", "[4,2]", "gqa_group_size[1]: differs from n_q_heads / n_kv_heads = 8 / 2 (value 2)");
    bad("\"head_count\":5", "\"head_count\":-1", "capture.head_count: must be an integer >= 0 or null");
    bad("\"head_seed\":3", "\"head_seed\":\"3\"", "capture.head_seed: must be an integer >= 0");
    bad("\"full_attention_only\"", "\"some\"", "capture.eligibility: must be \"full_attention_only\" or \"all_layers\"");
    bad("\"head_count\":5,", "", "capture.head_count: required when capture.head_seed or capture.eligibility is given");

    // the manifest's per-layer sliding window is checked against every entry
    io::write_manifest(tmp.path, m);
    auto e = test_entry(m, 1, 0, qkgeom::kind::key);
    require_input_error([&] { io::write_head(tmp.path, m, e, io::storage_format::npy); },
                        "sliding_window: differs from the manifest's sliding_window[1] = 16 (value none (full attention))");
    e.sliding_window = 16;
    io::write_head(tmp.path, m, e, io::storage_format::npy);
    CHECK(io::read_head(tmp.path, 1, 0, qkgeom::kind::key).sliding_window == 16);
    auto e0 = test_entry(m, 0, 0, qkgeom::kind::key);
    e0.sliding_window = 16;
    require_input_error([&] { io::write_head(tmp.path, m, e0, io::storage_format::npz); },
                        "differs from the manifest's sliding_window[0] = null (full attention) (value 16)");
}

TEST_CASE("dataset: capture.rope_applied and capture.token_sampler (issue 15)", "[io][dataset]") {
    std::string const head = R"({"model":"m","n_layers":2,"n_q_heads":8,"n_kv_heads":2,"head_dim":64,)"
                             R"("context_length":4096,"buckets":{"scheme":"uniform","width":16},"capture":{"seed":3)";
    auto parse = [&](std::string const& capture_tail) { return io::parse_manifest(head + capture_tail + "}}"); };
    // absent: not recorded, and the tokens were qkgeom's
    auto const old = parse("");
    CHECK(old.rope_applied.empty());
    CHECK(old.token_sampler == "qkgeom");
    auto const old_text = io::dump_manifest(old);
    CHECK_THAT(old_text, Contains("\"token_sampler\": \"qkgeom\"") && !Contains("rope_applied"));
    // present: read, written, read back
    auto const m = parse(R"(,"rope_applied":[false,true],"token_sampler":"qk-sniffer")");
    CHECK(m.rope_applied == std::vector<bool>{false, true});
    CHECK(m.token_sampler == "qk-sniffer");
    auto const back = io::parse_manifest(io::dump_manifest(m));
    CHECK(back.rope_applied == m.rope_applied);
    CHECK(back.token_sampler == m.token_sampler);
    CHECK_NOTHROW(io::check_compatible(back, m));
    // bad values name the field and the value
    auto bad = [&](std::string const& tail, std::string const& what) {
        INFO(tail);
        CHECK_THROWS_AS(parse(tail), qkgeom::input_error);
        CHECK_THROWS_WITH(parse(tail), Contains(what));
    };
    bad(R"(,"rope_applied":true)", "capture.rope_applied: must be an array of n_layers booleans (value true)");
    bad(R"(,"rope_applied":[true])", "capture.rope_applied: per-layer array length differs from n_layers = 2 (value 1)");
    bad(R"(,"rope_applied":[true,1])", "capture.rope_applied[1]: must be true (captured after RoPE) or false (before RoPE) (value 1)");
    bad(R"(,"rope_applied":[null,true])", "capture.rope_applied[0]");
    bad(R"(,"token_sampler":5)", "capture.token_sampler: must be a non-empty string");
    bad(R"(,"token_sampler":"")", "capture.token_sampler: must be a non-empty string");
    // writing refuses what reading would refuse
    temp_dir tmp;
    auto w = m;
    w.rope_applied = {true, true, true};
    CHECK_THROWS_WITH(io::write_manifest(tmp.path, w), Contains("capture.rope_applied"));
    w = m;
    w.token_sampler.clear();
    CHECK_THROWS_WITH(io::write_manifest(tmp.path, w), Contains("capture.token_sampler"));
    CHECK(!fs::exists(tmp.path / "manifest.json"));
    // merging refuses captures that differ in either
    CHECK_THROWS_WITH(io::check_compatible(old, m),
                      Contains("manifests differ in capture.token_sampler: \"qkgeom\" vs \"qk-sniffer\""));
    auto same_sampler = old;
    same_sampler.token_sampler = "qk-sniffer";
    CHECK_THROWS_WITH(io::check_compatible(same_sampler, m),
                      Contains("manifests differ in capture.rope_applied: \"not recorded\" vs \"recorded\""));
    auto flipped = m;
    flipped.rope_applied = {false, false};
    CHECK_THROWS_WITH(io::check_compatible(m, flipped),
                      Contains("manifests differ in capture.rope_applied[1]: \"true\" vs \"false\""));
}

TEST_CASE("dataset: capture.heads records an explicit head plan (issue 15)", "[io][dataset]") {
    // 3 layers: 8 q heads over 2 kv heads, 4 over 4, 2 over 1.
    std::string const head = R"({"model":"m","n_layers":3,"n_q_heads":[8,4,2],"n_kv_heads":[2,4,1],"head_dim":8,)"
                             R"("context_length":256,"buckets":{"scheme":"uniform","width":16},"capture":{"seed":3)";
    auto parse = [&](std::string const& capture_tail) { return io::parse_manifest(head + capture_tail + "}}", "cap.json"); };
    // Not recorded: no list, every head planned.
    auto const none = parse("");
    CHECK(none.head_list.empty());
    CHECK_THAT(io::dump_manifest(none), !Contains("\"heads\""));
    CHECK(io::planned_heads(none).size() == 14u);
    // Listed out of order, skipping layer 1: read in the listed order with the derived key heads;
    // planned_heads is exactly that set, ascending.
    auto const m = parse(R"(,"heads":[[2,1],[0,7],[0,2]])");
    std::vector<qkgeom::head_id> const listed{{2, 1, 0}, {0, 7, 1}, {0, 2, 0}};
    CHECK(m.head_list == listed);
    std::vector<qkgeom::head_id> const plan{{0, 2, 0}, {0, 7, 1}, {2, 1, 0}};
    CHECK(io::planned_heads(m) == plan);
    // Round trip through the file: same list, same order, same plan.
    temp_dir tmp;
    io::write_manifest(tmp.path, m);
    auto const back = io::read_manifest(tmp.path);
    CHECK(back.head_list == listed);
    CHECK(io::planned_heads(back) == plan);
    CHECK_NOTHROW(io::check_compatible(back, m));
    // A list built in code with k_head unset (-1) is written with the derived key heads read back.
    auto code = none;
    code.head_list = {{1, 3, -1}, {0, 5, -1}};
    io::write_manifest(tmp.path, code);
    CHECK(io::read_manifest(tmp.path).head_list == std::vector<qkgeom::head_id>{{1, 3, 3}, {0, 5, 1}});
    CHECK(io::planned_heads(code) == std::vector<qkgeom::head_id>{{0, 5, 1}, {1, 3, 3}});
    // Refusals at parse, naming the file, the field and the value.
    auto bad = [&](std::string const& tail, std::string const& what) {
        INFO(tail);
        CHECK_THROWS_AS(parse(tail), qkgeom::input_error);
        CHECK_THROWS_WITH(parse(tail), Contains("cap.json: " + what));
    };
    bad(R"(,"heads":[[0,1],[1,0],[2,0],[3,0]])", "capture.heads[3]: layer outside [0, n_layers = 3) (value [3,0])");
    bad(R"(,"heads":[[-1,0]])", "capture.heads[0]: layer outside [0, n_layers = 3) (value [-1,0])");
    bad(R"(,"heads":[[0,1],[1,4]])", "capture.heads[1]: q_head outside [0, n_q_heads[1] = 4) (value [1,4])");
    bad(R"(,"heads":[[2,-1]])", "capture.heads[0]: q_head outside [0, n_q_heads[2] = 2) (value [2,-1])");
    bad(R"(,"heads":[[0,1],[1,2],[0,1]])", "capture.heads[2]: head listed twice (value [0,1])");
    bad(R"(,"heads":[[0,1,2]])", "capture.heads[0]: must be a pair of integers [layer, q_head] (value [0,1,2])");
    bad(R"(,"heads":[[0,1.5]])", "capture.heads[0]: must be a pair of integers");
    bad(R"(,"heads":[0,1])", "capture.heads[0]: must be a pair of integers");
    bad(R"(,"heads":{"0":1})", "capture.heads: must be an array of [layer, q_head] pairs");
    bad(R"(,"heads":[])", "capture.heads: lists no head");
    bad(R"(,"head_count":2,"heads":[[0,1]])", "capture.heads: an explicit head list and a head sampling");
    bad(R"(,"heads":[[0,1]],"head_seed":2)", "capture.heads: an explicit head list and a head sampling");
    CHECK_THROWS_WITH(parse(R"(,"heads":[[0,1]],"head_seed":2)"), Contains("(value capture.head_seed)"));
    CHECK_THROWS_WITH(parse(R"(,"eligibility":"all_layers","heads":[[0,1]])"), Contains("(value capture.eligibility)"));
    // Size bound: more entries than the 14 query heads is refused on the count, before any entry is read.
    std::string many = R"(,"heads":[)";
    for (int i = 0; i < 15; ++i) many += std::string(i ? "," : "") + "[0,0]";
    bad(many + "]", "capture.heads: more heads listed than the manifest's 14 query heads; length (value 15)");
    // Every head listed once is accepted (the bound is reachable).
    std::string all = R"(,"heads":[)";
    for (auto const& h : io::planned_heads(none))
        all += (all.back() == '[' ? "" : ",") + std::string("[") + std::to_string(h.layer) + "," + std::to_string(h.q_head) + "]";
    CHECK(io::planned_heads(parse(all + "]")) == io::planned_heads(none));
    // Writing refuses what reading refuses, and a k_head off the GQA mapping; nothing is written.
    temp_dir w;
    auto bad_write = [&](std::vector<qkgeom::head_id> list, bool sampling, std::string const& what) {
        auto x = none;
        x.head_list = std::move(list);
        if (sampling) x.heads = io::head_sampling{2, 0, qkgeom::layer_eligibility::all_layers};
        CHECK_THROWS_WITH(io::write_manifest(w.path, x), Contains(what));
        CHECK_THROWS_AS(io::planned_heads(x), std::invalid_argument);
        CHECK(!fs::exists(w.path / "manifest.json"));
    };
    bad_write({{0, 8, -1}}, false, "capture.heads[0]: q_head outside [0, n_q_heads[0] = 8)");
    bad_write({{0, 1, -1}, {0, 1, -1}}, false, "capture.heads[1]: head listed twice");
    bad_write({{0, 1, -1}}, true, "capture.heads: an explicit head list and a head sampling");
    bad_write({{0, 5, 0}}, false, "head_list[0].k_head must be -1 (derived) or key_head_of = 1 (value 0)");
    // Merging: a list against none, lists of different length or content, refused; the same set in another order is the same plan.
    CHECK_THROWS_WITH(io::check_compatible(none, m), Contains("manifests differ in capture.heads: \"not recorded\" vs \"recorded\""));
    auto shorter = m;
    shorter.head_list.pop_back();
    CHECK_THROWS_WITH(io::check_compatible(m, shorter), Contains("manifests differ in capture.heads.length: 3 vs 2"));
    auto other = m;
    other.head_list[1] = {0, 6, 1};
    CHECK_THROWS_WITH(io::check_compatible(m, other), Contains("manifests differ in capture.heads (ascending)[1]: [0, 7] vs [0, 6]"));
    auto reordered = m;
    std::reverse(reordered.head_list.begin(), reordered.head_list.end());
    CHECK_NOTHROW(io::check_compatible(m, reordered));
}

TEST_CASE("dataset: layout_of and sampled_heads follow the manifest", "[io][dataset]") {
    auto m = full_manifest();
    auto const layout = io::layout_of(m);
    CHECK(layout.head_dim == 3);
    REQUIRE(layout.layers.size() == 2);
    CHECK(layout.layers[0] == qkgeom::layer_layout{4, 2, std::nullopt});
    CHECK(layout.layers[1] == qkgeom::layer_layout{4, 2, 16});
    auto const heads = io::sampled_heads(m);
    CHECK(heads.size() == 3);
    CHECK(heads == qkgeom::sample_heads(layout, 3, 99, qkgeom::layer_eligibility::all_layers));
    m.heads->eligibility = qkgeom::layer_eligibility::full_attention_only;  // layer 1 has a window: not eligible
    for (auto const& h : io::sampled_heads(m)) CHECK(h.layer == 0);
    m.heads->count = std::nullopt;
    CHECK(io::sampled_heads(m).size() == 4);  // every eligible head
    CHECK(io::layout_of(test_manifest()).layers[1].sliding_window == std::nullopt);
    CHECK_THROWS_AS(io::sampled_heads(test_manifest()), std::invalid_argument);
    auto broken = test_manifest();
    broken.n_q_heads.pop_back();
    CHECK_THROWS_AS(io::layout_of(broken), std::invalid_argument);
}

TEST_CASE("dataset: read_capture reads one head as one value (rows, GQA, facts of the manifest)", "[io][dataset]") {
    temp_dir tmp;
    auto const m = full_manifest();  // layer 0 full attention, layer 1 window 16; 4 q heads read 2 kv heads
    io::write_manifest(tmp.path, m);
    // Layer 1: q head 3 reads k head 1 (query entry npy, key entry safetensors, both windowed).
    auto q1 = test_entry(m, 1, 3, qkgeom::kind::query, 12);
    auto k1 = test_entry(m, 1, 1, qkgeom::kind::key, 9);
    q1.sliding_window = 16;
    k1.sliding_window = 16;
    io::write_head(tmp.path, m, q1, io::storage_format::npy, "f16");
    io::write_head(tmp.path, m, k1, io::storage_format::safetensors, "bf16");
    // Layer 0: q head 1 reads k head 0 (npz), full attention.
    auto const q0 = test_entry(m, 0, 1, qkgeom::kind::query, 7);
    auto const k0 = test_entry(m, 0, 0, qkgeom::kind::key, 11);
    io::write_head(tmp.path, m, q0, io::storage_format::npz);
    io::write_head(tmp.path, m, k0, io::storage_format::npz, "f64");

    auto same = [](qkgeom::token_rows<qkgeom::row_matrix> const& r, io::head_entry const& e) {
        CHECK(r.vectors == e.vectors);  // exact: values representable in every dtype
        CHECK(r.position == e.position);
        CHECK(r.bucket == e.bucket);
        CHECK(r.example_id == e.example_id);
    };
    auto check_head = [&](qkgeom::head_id const& id, io::head_entry const& q, io::head_entry const& k,
                          std::int64_t window) {
        INFO("layer " << id.layer << " q_head " << id.q_head);
        auto const h = io::read_capture(tmp.path, m, id);
        CHECK(h.id == id);
        same(h.queries, q);
        same(h.keys, k);
        REQUIRE(h.facts.buckets.has_value());
        CHECK(*h.facts.buckets == m.buckets);
        CHECK(h.facts.context_length == 64);
        CHECK(h.facts.sliding_window == window);  // the layer's window, 0 = full attention
        CHECK(h.facts == io::facts_of(m, id.layer));
    };
    check_head({1, 3, 1}, q1, k1, 16);
    check_head({0, 1, 0}, q0, k0, 0);
    // The heads a capture holds: its head sample, or every head of every layer.
    CHECK(io::planned_heads(m) == io::sampled_heads(m));
    CHECK(io::planned_heads(test_manifest()) ==
          qkgeom::eligible_heads(io::layout_of(test_manifest()), qkgeom::layer_eligibility::all_layers));

    // A k_head that breaks the GQA mapping (q head 3 of layer 1 reads k head 1) is rejected before any file is read.
    for (std::int64_t bad_k : {0, 2}) {
        INFO("k_head " << bad_k);
        CHECK_THROWS_AS(io::read_capture(tmp.path, m, {1, 3, bad_k}), std::invalid_argument);
        CHECK_THROWS_WITH(io::read_capture(tmp.path, m, {1, 3, bad_k}),
                          Contains("qkgeom::io::read_capture") &&
                              Contains("k_head does not follow the GQA mapping of layer 1 q_head 3") &&
                              Contains("(value " + std::to_string(bad_k) + ")"));
    }
    // A head whose entries are missing: the reader names the entry.
    require_input_error([&] { (void)io::read_capture(tmp.path, m, {0, 2, 1}); }, "head entry not found");
}

TEST_CASE("dataset: read_capture rejects query and key entries with different sliding windows", "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();  // records no per-layer windows: the entries' windows are the only record
    io::write_manifest(tmp.path, m);
    auto q = test_entry(m, 0, 2, qkgeom::kind::query);
    auto k = test_entry(m, 0, 1, qkgeom::kind::key);
    q.sliding_window = 16;
    io::write_head(tmp.path, m, q, io::storage_format::npy);
    auto check_rejected = [&](std::string const& value) {
        try {
            (void)io::read_capture(tmp.path, m, {0, 2, 1});
            FAIL("expected qkgeom::input_error for the sliding window " << value);
        } catch (qkgeom::input_error const& e) {
            INFO("message: " << e.what());
            CHECK(fs::path(e.source()).filename() == "l00h01k");
            CHECK(e.field() == "sliding_window");
            CHECK(e.value() == value);
            CHECK_THAT(std::string(e.what()),
                       Contains("l00h01k: sliding_window: differs from the query entry's sliding window (value " +
                                value + ")"));
        }
    };
    io::write_head(tmp.path, m, k, io::storage_format::npy);  // key: full attention, query: 16
    check_rejected("none");
    fs::remove_all(tmp.path / "l00h01k");
    k.sliding_window = 8;
    io::write_head(tmp.path, m, k, io::storage_format::safetensors);  // key: 8, query: 16
    check_rejected("8");
    k.sliding_window = 16;
    fs::remove(tmp.path / "l00h01k.safetensors");
    io::write_head(tmp.path, m, k, io::storage_format::safetensors);
    auto const h = io::read_capture(tmp.path, m, {0, 2, 1});
    CHECK(h.facts.sliding_window == 16);
    CHECK(h.keys.position == k.position);
}

TEST_CASE("dataset: check_compatible names the first differing field and both values", "[io][dataset]") {
    auto const a = full_manifest();
    CHECK_NOTHROW(io::check_compatible(a, a));
    struct change {
        char const* field;
        std::function<void(io::manifest&)> mutate;
        char const* a_text;
        char const* b_text;
    };
    std::vector<change> const changes{
        {"model", [](io::manifest& m) { m.model = "other"; }, "\"tiny-llama\"", "\"other\""},
        {"n_layers", [](io::manifest& m) { m.n_layers = 3; }, "2", "3"},
        {"head_dim", [](io::manifest& m) { m.head_dim = 4; }, "3", "4"},
        {"n_q_heads[1]", [](io::manifest& m) { m.n_q_heads[1] = 8; }, "4", "8"},
        {"n_kv_heads[0]", [](io::manifest& m) { m.n_kv_heads[0] = 1; }, "2", "1"},
        {"buckets.scheme", [](io::manifest& m) { m.buckets.scheme = qkgeom::bucket_scheme::log; }, "\"uniform\"", "\"log\""},
        {"buckets.width", [](io::manifest& m) { m.buckets.width = 8; }, "4", "8"},
        {"buckets.rate", [](io::manifest& m) { m.buckets.rate = 2.5; }, "1", "2.5"},
        {"capture.seed", [](io::manifest& m) { m.seed = 1; }, "1234", "1"},
        {"context_length", [](io::manifest& m) { m.context_length = 128; }, "64", "128"},
        {"rope", [](io::manifest& m) { m.rope.reset(); }, "\"recorded\"", "\"not recorded\""},
        {"rope.pairing", [](io::manifest& m) { m.rope->pairing = qkgeom::rope_pairing::rotate_half; }, "\"interleaved\"", "\"rotate_half\""},
        {"rope.rotary_dim", [](io::manifest& m) { m.rope->rotary_dim = 0; }, "2", "0"},
        {"rope.theta", [](io::manifest& m) { m.rope->theta = 10000.0; }, "500000", "10000"},
        {"rope.scaling", [](io::manifest& m) { m.rope->scaling = "yarn"; }, "\"llama3\"", "\"yarn\""},
        {"rope.scaling_factor", [](io::manifest& m) { m.rope->scaling_factor = 4.0; }, "8", "4"},
        {"sliding_window", [](io::manifest& m) { m.sliding_window.clear(); }, "\"recorded\"", "\"not recorded\""},
        {"sliding_window[1]", [](io::manifest& m) { m.sliding_window[1].reset(); }, "16", "null"},
        {"capture.head_sampling", [](io::manifest& m) { m.heads.reset(); }, "\"recorded\"", "\"not recorded\""},
        {"capture.head_count", [](io::manifest& m) { m.heads->count.reset(); }, "3", "null"},
        {"capture.head_seed", [](io::manifest& m) { m.heads->seed = 98; }, "99", "98"},
        {"capture.eligibility", [](io::manifest& m) { m.heads->eligibility = qkgeom::layer_eligibility::full_attention_only; },
         "\"all_layers\"", "\"full_attention_only\""},
    };
    for (auto const& c : changes) {
        auto b = a;
        c.mutate(b);
        INFO("field " << c.field);
        std::string const ab = std::string("manifests differ in ") + c.field + ": " + c.a_text + " vs " + c.b_text;
        std::string const ba = std::string("manifests differ in ") + c.field + ": " + c.b_text + " vs " + c.a_text;
        CHECK_THROWS_WITH(io::check_compatible(a, b), Contains(ab));
        CHECK_THROWS_WITH(io::check_compatible(b, a), Contains(ba));
        CHECK_THROWS_AS(io::check_compatible(a, b), std::invalid_argument);
    }
}

// ---------------------------------------------------------------------------
// Issue 14 (reliability): non-regular files, allocation limits derived from
// what a file holds, messages that name their source, shards.
// ---------------------------------------------------------------------------
#if defined(__SANITIZE_ADDRESS__)
#define QKGEOM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QKGEOM_TEST_ASAN 1
#endif
#endif
#ifndef QKGEOM_TEST_ASAN
#define QKGEOM_TEST_ASAN 0
#endif

namespace {

/// Whether in_child's address-space limit is applied. AddressSanitizer
/// reserves terabytes of shadow memory and its allocator dies on an
/// allocation it cannot serve instead of throwing bad_alloc, so under ASan
/// the limit is not set: a read that did allocate a huge claim then aborts
/// (the child's status is not 0, the checks still fail), but the calibration
/// (a plain 512 MiB allocation fails under the limit) cannot run.
constexpr bool memory_limit_applied = !QKGEOM_TEST_ASAN;

/// Runs `f` in a forked child with a timeout and, when `headroom_mb` > 0 and
/// memory_limit_applied, an address-space limit of the child's current size
/// + headroom_mb MiB.
/// Returns 0 when f returned true, 1 when false, 2 for another exception,
/// 3 for std::bad_alloc, 100 + signal when the child was killed (SIGALRM:
/// the call hung).
template <class F>
int in_child(F&& f, std::size_t headroom_mb, unsigned timeout_s = 10) {
    std::fflush(nullptr);
    pid_t const pid = fork();
    if (pid == 0) {
        alarm(timeout_s);
        if (headroom_mb > 0 && memory_limit_applied) {
            long pages = 0;
            if (std::FILE* st = std::fopen("/proc/self/statm", "r")) {
                if (std::fscanf(st, "%ld", &pages) != 1) pages = 0;
                std::fclose(st);
            }
            rlim_t const lim = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) +
                               static_cast<rlim_t>(headroom_mb) * 1024 * 1024;
            rlimit r{lim, lim};
            setrlimit(RLIMIT_AS, &r);
        }
        int code = 2;
        try {
            code = f() ? 0 : 1;
        } catch (std::bad_alloc const&) {
            code = 3;
        } catch (...) {
            code = 2;
        }
        _exit(code);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

/// Whether f throws qkgeom::input_error whose message holds every needle.
template <class F>
bool input_error_with(F&& f, std::vector<std::string> const& needles) {
    try {
        f();
    } catch (qkgeom::input_error const& e) {
        std::string const w = e.what();
        for (auto const& n : needles)
            if (w.find(n) == std::string::npos) return false;
        return true;
    }
    return false;
}

void write_bytes(fs::path const& p, std::string const& b) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
}

std::string le(std::uint64_t v, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
    return s;
}

/// A .npy file with a given header dict and data bytes.
std::string npy_text(std::string const& dict, std::string const& data) {
    std::string h = dict;
    while ((10 + h.size() + 1) % 64 != 0) h += ' ';
    h += '\n';
    return std::string("\x93NUMPY\x01\x00", 8) + le(h.size(), 2) + h + data;
}

}  // namespace

TEST_CASE("issue 14: escape_text escapes control bytes and invalid UTF-8 only", "[io][errors]") {
    CHECK(qkgeom::escape_text("a\r\nb\tc") == "a\\r\\nb\\tc");
    CHECK(qkgeom::escape_text(std::string("x\x01\x7f", 3)) == "x\\x01\\x7f");
    CHECK(qkgeom::escape_text("\xff\xc3") == "\\xff\\xc3");             // invalid / truncated UTF-8
    CHECK(qkgeom::escape_text("caf\xc3\xa9 \\x41") == "caf\xc3\xa9 \\x41");  // valid UTF-8 and backslashes kept
    CHECK(qkgeom::escape_text(std::string("\0", 1)) == "\\x00");
    // every input_error message goes through it
    try {
        qkgeom::detail::fail_input("f\nile", "fi\reld", std::string("v\nal"), "pro\x01");
        FAIL("no throw");
    } catch (qkgeom::input_error const& e) {
        std::string const w = e.what();
        CHECK(w.find('\n') == std::string::npos);
        CHECK(w.find('\r') == std::string::npos);
        CHECK(w == "f\\nile: fi\\reld: pro\\x01 (value v\\nal)");
        CHECK(e.value() == "v\nal");  // the accessor keeps the raw value
    }
}

TEST_CASE("issue 14: a FIFO is never opened: no hang, the message names the path", "[io][nonregular]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    io::write_head(tmp.path, m, test_entry(m, 0, 1, qkgeom::kind::query), io::storage_format::npy);
    auto const vec = tmp.path / "l00h01q" / "vectors.npy";
    fs::remove(vec);
    REQUIRE(mkfifo(vec.c_str(), 0600) == 0);
    // in a child with an alarm: a hang would be reported as signal 14, not block the suite
    CHECK(in_child([&] { return input_error_with([&] { (void)io::read_npy(vec); }, {vec.string(), "FIFO", "not a regular file"}); }, 0, 10) == 0);
    CHECK(in_child([&] {
              return input_error_with([&] { (void)io::read_head(tmp.path, 0, 1, qkgeom::kind::query); },
                                      {vec.string(), "is a FIFO (named pipe), not a regular file"});
          }, 0, 10) == 0);
    auto const man = tmp.path / "manifest.json";
    fs::remove(man);
    REQUIRE(mkfifo(man.c_str(), 0600) == 0);
    CHECK(in_child([&] { return input_error_with([&] { (void)io::read_manifest(tmp.path); }, {man.string(), "FIFO"}); }, 0, 10) == 0);
    auto const shard = tmp.path / "s.qkm";
    REQUIRE(mkfifo(shard.c_str(), 0600) == 0);
    CHECK(in_child([&] { return input_error_with([&] { (void)qkgeom::load_moments(shard); }, {shard.string(), "FIFO"}); }, 0, 10) == 0);
}

TEST_CASE("issue 14: a directory in place of a file is named, never bad_alloc", "[io][nonregular]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    auto const man = tmp.path / "manifest.json";
    fs::remove(man);
    fs::create_directory(man);
    require_input_error([&] { (void)io::read_manifest(tmp.path); }, man.string() + ": file: is a directory, not a regular file");
    fs::remove(man);
    io::write_manifest(tmp.path, m);

    io::write_head(tmp.path, m, test_entry(m, 0, 1, qkgeom::kind::query), io::storage_format::npy);
    auto const vec = tmp.path / "l00h01q" / "vectors.npy";
    fs::remove(vec);
    fs::create_directory(vec);
    require_input_error([&] { (void)io::read_head(tmp.path, 0, 1, qkgeom::kind::query); },
                        vec.string() + ": file: is a directory, not a regular file");
    // the safetensors and npz forms: a directory named like the entry file is not "no .safetensors"
    for (std::string const ext : {".safetensors", ".npz"}) {
        auto const d = tmp.path / ("l00h02q" + ext);
        fs::create_directory(d);
        require_input_error([&] { (void)io::read_head(tmp.path, 0, 2, qkgeom::kind::query); },
                            d.string() + ": file: is a directory, not a regular file");
        auto const ids = io::list_heads(tmp.path);
        CHECK(std::count_if(ids.begin(), ids.end(), [](io::entry_id const& i) { return i.layer == 0 && i.head == 2; }) == 1);
        fs::remove(d);
    }
    // a file where the NumPy form needs a directory
    write_bytes(tmp.path / "l01h00q", "x");
    require_input_error([&] { (void)io::read_head(tmp.path, 1, 0, qkgeom::kind::query); }, "is not a directory");
    // readers of each format, and the shard reader
    CHECK_THROWS_WITH(io::read_npz(tmp.path), Contains("is a directory, not a regular file"));
    CHECK_THROWS_WITH(io::read_safetensors(tmp.path), Contains("is a directory, not a regular file"));
    CHECK_THROWS_WITH(qkgeom::load_moments(tmp.path), Contains("is a directory, not a regular file"));
}

TEST_CASE("issue 14: cannot open file says why", "[io][nonregular]") {
    temp_dir tmp;
    auto const a = tmp.path / "a.npy", b = tmp.path / "b.npy";
    fs::create_symlink(b, a);
    fs::create_symlink(a, b);
    require_input_error([&] { (void)io::read_npy(a); }, "Too many levels of symbolic links");
    require_input_error([&] { (void)io::read_npy(tmp.path / "none.npy"); }, "no such file");
    if (geteuid() != 0) {  // root reads anything
        auto const c = tmp.path / "c.npy";
        io::write_npy(c, std::vector<double>{1.0}, {1});
        fs::permissions(c, fs::perms::none);
        require_input_error([&] { (void)io::read_npy(c); }, "cannot open file: Permission denied");
    }
}

TEST_CASE("issue 14: sizes claimed beyond what the file holds fail before allocating", "[io][limits]") {
    // Each read runs in a child limited to +64 MiB of address space: an
    // allocation of the claimed size would end in bad_alloc (exit 3), not in
    // the input_error naming the field (exit 0).
    constexpr std::size_t mb = 64;
    // calibration: under this limit an allocation of 512 MiB does fail
    if (memory_limit_applied)
        CHECK(in_child([] {
                  std::vector<char> v(std::size_t{512} << 20, 1);
                  return v.back() == 1;
              }, mb) == 3);
    temp_dir tmp;
    // npy: shape (2^40,) of f8 in a 136-byte file
    auto const npy = tmp.path / "big.npy";
    write_bytes(npy, npy_text("{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }", "12345678"));
    CHECK(in_child([&] { return input_error_with([&] { (void)io::read_npy(npy); }, {npy.string(), "data", "8796093022208"}); }, mb) == 0);
    // npy_to_matrix / npy_to_int64 do not trust the data size
    io::npy_array a;
    a.descr = "<f8";
    a.shape = {1 << 20, 1 << 20};
    CHECK(in_child([&] { return input_error_with([&] { (void)io::npy_to_matrix(a, "a"); }, {"a: data: data size does not match shape"}); }, mb) == 0);
    a.descr = "<i8";
    a.shape = {std::int64_t{1} << 40};
    CHECK(in_child([&] { return input_error_with([&] { (void)io::npy_to_int64(a, "a"); }, {"data size does not match"}); }, mb) == 0);
    CHECK(io::element_count({std::int64_t{1} << 62, 4}) == -1);
    CHECK(io::element_count({3, -1}) == -1);
    CHECK(io::element_count({3, 4}) == 12);
    // safetensors: a tensor claiming 2^40 elements in a small file
    std::string const hdr = R"({"v":{"dtype":"F64","shape":[1099511627776],"data_offsets":[0,8796093022208]}})";
    auto const st = tmp.path / "big.safetensors";
    write_bytes(st, le(hdr.size(), 8) + hdr + "12345678");
    CHECK(in_child([&] { return input_error_with([&] { (void)io::read_safetensors(st); }, {"v.data_offsets", "offset out of range"}); }, mb) == 0);
    write_bytes(st, le(std::uint64_t{1} << 40, 8) + hdr);
    CHECK(in_child([&] { return input_error_with([&] { (void)io::read_safetensors(st); }, {"header_size", "100 MB"}); }, mb) == 0);
}

namespace {

/// Offsets of the first central directory entry and local header of an archive.
std::pair<std::size_t, std::size_t> zip_headers(bytes_t const& z) {
    std::size_t cd = 0;
    for (std::size_t p = 0; p + 4 <= z.size(); ++p)
        if (z[p] == 'P' && z[p + 1] == 'K' && z[p + 2] == 1 && z[p + 3] == 2) {
            cd = p;
            break;
        }
    return {cd, 0};
}

void put32(bytes_t& z, std::size_t at, std::uint64_t v) {
    for (int i = 0; i < 4; ++i) z[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>((v >> (8 * i)) & 0xFF);
}

std::uint64_t get32(bytes_t const& z, std::size_t at) {
    std::uint64_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint64_t>(z[at + static_cast<std::size_t>(i)]) << (8 * i);
    return v;
}

}  // namespace

TEST_CASE("issue 14: npz members claiming more than the archive holds", "[io][limits][npz]") {
    // incompressible data: 1 MiB of random bytes as u8
    std::mt19937 rng(7);
    std::vector<std::uint8_t> v(1 << 20);
    for (auto& x : v) x = static_cast<std::uint8_t>(rng());
    io::npz_file f;
    f.add("v", io::make_npy(std::span<std::uint8_t const>(v), {static_cast<std::int64_t>(v.size())}));
    SECTION("stored: the compressed size must equal the size") {
        auto z = io::serialize_npz(f);
        auto const [cd, lh] = zip_headers(z);
        put32(z, cd + 24, get32(z, cd + 24) + 1);  // central size + 1
        put32(z, lh + 22, get32(z, lh + 22) + 1);  // local size + 1
        require_input_error([&] { (void)io::parse_npz(z, "x.npz"); },
                            "x.npz[v.npy]: compressed_size: a stored member's compressed size must equal its size");
    }
    if (!io::npz_deflate_available()) return;
    io::npz_write_options opt;
    opt.compression = io::npz_compression::deflate;
    auto const zd = io::serialize_npz(f, opt);
    auto const [cd, lh] = zip_headers(zd);
    std::uint64_t const csize = get32(zd, cd + 20);
    SECTION("deflate: a size beyond 1032:1 of the compressed size") {
        auto z = zd;
        put32(z, cd + 24, csize * 1032 + 4096);
        put32(z, lh + 22, csize * 1032 + 4096);
        require_input_error([&] { (void)io::parse_npz(z, "x.npz"); }, "x.npz[v.npy]: size: larger than");
    }
    SECTION("deflate: a claimed size within 1032:1 is not allocated before inflating proves it") {
        auto z = zd;
        // ~150 MB: within 1032:1 and within the 200-fold bomb rule, beyond the 128 MB limit below
        std::uint64_t const claim = std::min<std::uint64_t>(csize * 150, 0xF0000000u);
        put32(z, cd + 24, claim);
        put32(z, lh + 22, claim);
        CHECK(in_child([&] { return input_error_with([&] { (void)io::parse_npz(z, "x.npz"); }, {"x.npz[v.npy]: size: inflated size differs"}); }, 128) == 0);
    }
    SECTION("deflate: a claim over 64 MiB beyond 200-fold is refused before inflating, naming the ratio") {
        auto z = zd;
        std::uint64_t const claim = std::min<std::uint64_t>(csize * 1000, 0xF0000000u);  // ~1 GB
        put32(z, cd + 24, claim);
        put32(z, lh + 22, claim);
        require_input_error([&] { (void)io::parse_npz(z, "x.npz"); }, "x.npz[v.npy]: size: deflated member of");
    }
}

TEST_CASE("issue 14: manifest limits, BOM, format and version fail at parse naming field and value", "[io][limits][dataset]") {
    auto const base = io::dump_manifest(test_manifest());
    auto fails_with = [&](std::string const& text, std::vector<std::string> const& needles) {
        return input_error_with([&] { (void)io::parse_manifest(text, "m.json"); }, needles);
    };
    auto replace = [&](std::string const& from, std::string const& to) {
        std::string t = base;
        auto const at = t.find(from);
        REQUIRE(at != std::string::npos);
        return t.replace(at, from.size(), to);
    };
    // 2^40 query heads: fails at parse (the check precedes any per-head allocation)
    CHECK(in_child([&] {
              return fails_with(replace("\"n_q_heads\": [\n    4,\n    4\n  ]", "\"n_q_heads\": 1099511627776"),
                                {"m.json: n_q_heads: more heads in one layer than the limit of 65536 (value 1099511627776)"});
          }, 64) == 0);
    CHECK(fails_with(replace("\"n_q_heads\": [\n    4,\n    4\n  ]", "\"n_q_heads\": [4, 70000]"), {"n_q_heads[1]", "70000"}));
    CHECK(fails_with(replace("\"n_layers\": 2", "\"n_layers\": 100000").replace(base.find("\"n_q_heads\""), 0, ""),
                     {"n_layers"}));  // per-layer arrays of length 2 vs 100000
    {
        std::string t = replace("\"n_layers\": 2", "\"n_layers\": 64");
        for (std::string const key : {"n_q_heads", "n_kv_heads", "gqa_group_size"}) {
            auto const at = t.find("\"" + key + "\"");
            auto const end = t.find(']', at);
            t.replace(at, end + 1 - at, "\"" + key + "\": " + (key == "n_q_heads" ? "32768" : key == "n_kv_heads" ? "1" : "32768"));
        }
        CHECK(fails_with(t, {"m.json: n_q_heads: more query heads over all layers than the limit of 1048576", "2097152"}));
    }
    CHECK(fails_with("\xEF\xBB\xBF" + base, {"m.json: json: starts with a UTF-8 byte-order mark; save it without BOM"}));
    CHECK(fails_with(replace("\"qkgeom-dataset\"", "\"other\""), {"m.json: format", "\"other\""}));
    CHECK(fails_with(replace("\"version\": 1", "\"version\": 2"), {"m.json: version", "unsupported manifest version", "(value 2)"}));
    // the file size limit is checked before reading
    temp_dir tmp;
    write_bytes(tmp.path / "manifest.json", base + std::string(io::manifest_max_bytes, ' '));
    CHECK_THROWS_WITH(io::read_manifest(tmp.path), Contains("file size") && Contains("16777216"));
}

TEST_CASE("issue 14: dump refuses what parse rejects (duplicate keys, invalid UTF-8, seeds >= 2^63)", "[io][json]") {
    qkgeom::json::object o{{"a", qkgeom::json::value(1)}, {"a", qkgeom::json::value(2)}};
    CHECK_THROWS_WITH(qkgeom::json::dump(qkgeom::json::value(o)), Contains("duplicate object key") && Contains("value a"));
    CHECK_THROWS_AS(qkgeom::json::dump(qkgeom::json::value(std::string("\xff"))), std::invalid_argument);
    auto m = test_manifest();
    m.seed = std::uint64_t{1} << 63;
    CHECK_THROWS_WITH(io::dump_manifest(m), Contains("seed must be < 2^63"));
    // what dump writes, parse reads
    auto const t = qkgeom::json::dump(qkgeom::json::value(std::string("caf\xc3\xa9\n")));
    CHECK(qkgeom::json::parse(t).as_string() == "caf\xc3\xa9\n");
}

TEST_CASE("issue 14: errors of a head entry name the entry, a key entry says which query head read it", "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    io::write_head(tmp.path, m, test_entry(m, 0, 1, qkgeom::kind::query), io::storage_format::npy);
    io::write_head(tmp.path, m, test_entry(m, 0, 0, qkgeom::kind::key), io::storage_format::npy);
    // an entry with no rows: refused by write_head and rejected by read_head, naming the entry
    auto empty = test_entry(m, 0, 0, qkgeom::kind::key, 0);
    require_input_error([&] { io::write_head(tmp.path, m, empty, io::storage_format::npy); },
                        "key entry l00h00k holds no rows: an entry needs at least one row");
    auto const kdir = tmp.path / "l00h00k";
    io::write_npy(kdir / "vectors.npy", std::vector<float>{}, {0, 3});
    io::write_npy(kdir / "position.npy", std::vector<std::int64_t>{}, {0});
    io::write_npy(kdir / "bucket.npy", std::vector<std::int64_t>{}, {0});
    io::write_npy(kdir / "example_id.npy", std::vector<std::int64_t>{}, {0});
    require_input_error([&] { (void)io::read_head(tmp.path, 0, 0, qkgeom::kind::key); },
                        (kdir / "vectors.npy").string() + ": vectors.shape[0]: key entry l00h00k holds no rows");
    require_input_error([&] { (void)io::read_capture(tmp.path, m, {0, 1, 0}); },
                        "key entry l00h00k (read by query head 1): " + (kdir / "vectors.npy").string());
}

TEST_CASE("issue 14: write_head checks the range, replaces the other forms, leaves no partial entry", "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    CHECK_THROWS_WITH(io::write_head(tmp.path, m, test_entry(m, 0, 2, qkgeom::kind::key), io::storage_format::npy),
                      Contains("head outside [0, n_kv_heads = 2)") && Contains("value 2"));
    CHECK_THROWS_WITH(io::write_head(tmp.path, m, test_entry(m, 2, 0, qkgeom::kind::query), io::storage_format::npy),
                      Contains("layer outside [0, n_layers = 2)"));
    CHECK(fs::is_empty(tmp.path / "") == false);  // only manifest.json
    CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 1);
    auto const e = test_entry(m, 1, 3, qkgeom::kind::query);
    for (auto f : {io::storage_format::npz, io::storage_format::npy, io::storage_format::safetensors,
                   io::storage_format::npy}) {
        io::write_head(tmp.path, m, e, f);
        auto const ids = io::list_heads(tmp.path);
        REQUIRE(ids.size() == 1);  // one form only, the last written
        CHECK(ids[0].format == f);
        CHECK(io::read_head(tmp.path, m, 1, 3, qkgeom::kind::query).vectors == e.vectors);
    }
    // an entry directory holding a foreign file is not removed
    write_bytes(tmp.path / "l01h03q" / "notes.txt", "mine");
    CHECK_THROWS_AS(io::write_head(tmp.path, m, e, io::storage_format::npz), qkgeom::io_error);
    CHECK(fs::exists(tmp.path / "l01h03q" / "notes.txt"));
    // no temporary files are left behind
    for (auto const& de : fs::recursive_directory_iterator(tmp.path))
        CHECK(de.path().filename().string().find(".tmp-") == std::string::npos);
    CHECK_THROWS_WITH(io::facts_of(m, 2), Contains("layer outside [0, n_layers = 2)"));
    CHECK_THROWS_AS(io::facts_of(m, -1), std::invalid_argument);
}

TEST_CASE("issue 14: stray_entries names entries outside the manifest, bounded", "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();  // 2 layers, 4 q heads, 2 kv heads
    io::write_manifest(tmp.path, m);
    io::write_head(tmp.path, m, test_entry(m, 1, 3, qkgeom::kind::query), io::storage_format::npy);
    io::write_head(tmp.path, m, test_entry(m, 1, 1, qkgeom::kind::key), io::storage_format::safetensors);
    fs::create_directory(tmp.path / "l02h00q");            // layer beyond n_layers
    write_bytes(tmp.path / "l00h02k.npz", "x");              // key head beyond n_kv_heads
    fs::create_directory(tmp.path / "l00h04q.safetensors");  // q head beyond n_q_heads, a directory
    write_bytes(tmp.path / "l0h1q.npz", "x");                // not a canonical name: ignored
    write_bytes(tmp.path / "notes.txt", "x");
    auto got = io::stray_entries(tmp.path, m);
    std::sort(got.begin(), got.end());
    CHECK(got == std::vector<std::string>{"l00h02k.npz", "l00h04q.safetensors", "l02h00q"});
    auto const bounded = io::stray_entries(tmp.path, m, 2);
    REQUIRE(bounded.size() == 3);
    CHECK(bounded[2] == "... and 1 more");
}

namespace {

/// FNV-1a 64 of the bytes, as the shard format's checksum.
std::uint64_t fnv(std::string const& s) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (char c : s) {
        h ^= static_cast<unsigned char>(c);
        h *= 0x100000001b3ull;
    }
    return h;
}

/// The shard with bytes [at, at + 8) replaced by v and the checksum recomputed.
std::string patched_shard(std::string s, std::size_t at, std::uint64_t v) {
    s.replace(at, 8, le(v, 8));
    s.replace(s.size() - 8, 8, le(fnv(s.substr(0, s.size() - 8)), 8));
    return s;
}

std::string shard_bytes(qkgeom::head_moments const& hm) {
    std::ostringstream os(std::ios::binary);
    qkgeom::write_moments(os, hm);
    return os.str();
}

/// A non-seekable stream over a string (as a pipe): tellg fails.
struct pipe_buf : std::streambuf {
    explicit pipe_buf(std::string s) : s_(std::move(s)) { setg(s_.data(), s_.data(), s_.data() + s_.size()); }
    pos_type seekoff(off_type, std::ios_base::seekdir, std::ios_base::openmode) override { return pos_type(-1); }
    std::string s_;
};

}  // namespace

TEST_CASE("issue 14: shard counts are bounded by the bytes the stream holds", "[io][limits][shards]") {
    // The issue's 72-byte shard: d = 4096 and one query bucket (a bucket of
    // d = 4096 holds 134 MB of co-moments once allocated).
    std::string const head = std::string(qkgeom::moments_magic.data(), 8) + le(1, 4) + le(0, 4) + le(0, 8) + le(0, 8) +
                             le(0, 8) + le(4096, 8);
    std::string const shard = head + le(1, 8) + std::string(16, '\0');
    REQUIRE(shard.size() == 72);
    CHECK(in_child([&] {
              std::istringstream in(shard);
              return input_error_with([&] { (void)qkgeom::read_moments(in, "s.qkm"); },
                                      {"s.qkm: q.n_buckets: more buckets than the 16 bytes left can hold", "(value 1)"});
          }, 64) == 0);
    // a non-seekable stream: the record is read as it arrives, so the truncation is found first
    CHECK(in_child([&] {
              pipe_buf pb(shard);
              std::istream in(&pb);
              return input_error_with([&] { (void)qkgeom::read_moments(in, "pipe"); }, {"pipe: q.buckets[0]", "truncated shard"});
          }, 64) == 0);
    // 2^60 buckets claimed
    std::istringstream in(head + le(std::uint64_t{1} << 60, 8) + std::string(16, '\0'));
    CHECK_THROWS_WITH(qkgeom::read_moments(in, "s.qkm"), Contains("q.n_buckets") && Contains("1152921504606846976"));
}

TEST_CASE("issue 14: a shard whose row count was edited is rejected even with the checksum recomputed", "[io][shards]") {
    // bucket 0 holds positions {0, 1, 1} (mean 2/3), bucket 1 positions {5, 6, 9, 9}
    Eigen::MatrixXd x(7, 2);
    x << 1, 2, 3, 4, 5, 7, 2, 2, 1, 0, 4, 4, 3, 1;
    std::vector<std::int64_t> const t{0, 1, 1, 5, 6, 9, 9}, b{0, 0, 0, 1, 1, 1, 1};
    qkgeom::head_moments hm(2, {0, 1, 0});
    hm.add(qkgeom::kind::query, x, t, b);
    std::string const good = shard_bytes(hm);
    std::size_t const rec = 8 * (6 + 2 * 2 + 3);
    std::size_t const n0 = 48 + 8 + 8, n1 = n0 + rec;  // offsets of the two buckets' n
    {
        std::istringstream in(good);
        CHECK(qkgeom::read_moments(in).q.count() == 7);  // the unedited shard reads
    }
    for (auto [at, n] : {std::pair<std::size_t, std::uint64_t>{n0, 4}, {n0, 2}, {n0, 1}, {n1, 3}, {n1, 2}, {n1, 1}}) {
        std::istringstream in(patched_shard(good, at, n));
        INFO("offset " << at << " n " << n);
        try {
            (void)qkgeom::read_moments(in, "s.qkm");
            FAIL("edited row count accepted");
        } catch (qkgeom::input_error const& e) {
            CHECK(e.source() == "s.qkm");
            CHECK(e.field().rfind(at == n0 ? "q.buckets[0]." : "q.buckets[1].", 0) == 0);
        }
    }
}

TEST_CASE("issue 14: write_moments refuses exactly what read_moments rejects", "[io][shards]") {
    Eigen::MatrixXd x(5, 2);
    x << 1, 2, 3, 4, 5, 7, 2, 2, 1, 0;
    std::vector<std::int64_t> const t{2, 3, 3, 7, 8}, b{0, 0, 0, 0, 0};
    qkgeom::head_moments hm(2, {3, 2, 1});
    hm.add(qkgeom::kind::key, x, t, b);
    std::string const good = shard_bytes(hm);
    std::size_t const rec0 = 48 + 8 + 8;  // k: q.n_buckets = 0 at 48, k.n_buckets at 56, bucket id at 64
    struct edit {
        char const* name;
        std::size_t at;  // offset inside the record, after the bucket id
        double value;    // as f64, or the integer for n / bucket
        bool integer;
    };
    edit const edits[] = {
        {"bucket", 0, -1, true},       {"n", 8, 0, true},        {"n", 8, 1, true},
        {"mean_t", 16, 9.5, false},    {"m2_t", 24, -1, false},  {"m2_t", 24, 1e6, false},
        {"t_min", 32, 2.5, false},     {"t_max", 40, 1.0, false}, {"c_xx", 48 + 32, -1, false},
        {"mean_t", 16, std::numeric_limits<double>::infinity(), false},
    };
    for (auto const& ed : edits) {
        INFO(ed.name << " = " << ed.value);
        std::uint64_t const bits = ed.integer ? static_cast<std::uint64_t>(static_cast<std::int64_t>(ed.value))
                                              : std::bit_cast<std::uint64_t>(ed.value);
        std::istringstream in(patched_shard(good, rec0 + ed.at, bits));
        std::string read_field;
        try {
            auto const back = qkgeom::read_moments(in, "s.qkm");
            FAIL("edited shard accepted");
        } catch (qkgeom::input_error const& e) {
            read_field = e.field();
        }
        // the same edit on the in-memory moments: write_moments refuses it, naming a field of the same bucket
        qkgeom::head_moments bad = hm;
        auto node = bad.k.buckets.extract(bad.k.buckets.begin());
        auto& m = node.mapped();
        std::string const f = ed.name;
        if (f == "bucket") node.key() = -1;
        else if (f == "n") m.n = static_cast<std::int64_t>(ed.value);
        else if (f == "mean_t") m.mean_t = ed.value;
        else if (f == "m2_t") m.m2_t = ed.value;
        else if (f == "t_min") m.t_min = ed.value;
        else if (f == "t_max") m.t_max = ed.value;
        else m.c_xx(0, 0) = ed.value;
        bad.k.buckets.insert(std::move(node));
        std::ostringstream os;
        CHECK_THROWS_WITH(qkgeom::write_moments(os, bad), Contains("k.buckets[0].") && Contains("qkgeom::write_moments"));
        CHECK(os.str().empty());  // nothing written
        CHECK(read_field.rfind("k.buckets[0].", 0) == 0);
        // save_moments leaves no file, and an existing file untouched
        temp_dir tmp;
        auto const p = tmp.path / "s.qkm";
        CHECK_THROWS_AS(qkgeom::save_moments(p, bad), std::invalid_argument);
        CHECK_FALSE(fs::exists(p));
        qkgeom::save_moments(p, hm);
        CHECK_THROWS_AS(qkgeom::save_moments(p, bad), std::invalid_argument);
        CHECK(qkgeom::load_moments(p).k.count() == 5);
        CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 1);
    }
}

TEST_CASE("issue 14: every shard reduced from data reads back (random sizes, positions, merges)", "[io][shards]") {
    std::mt19937_64 gen(14);
    for (int rep = 0; rep < 40; ++rep) {
        std::int64_t const d = 1 + static_cast<std::int64_t>(gen() % 6);
        std::int64_t const tmax = std::int64_t{1} << (gen() % 20);
        qkgeom::head_moments total(d, {1, 2, 1});
        int const parts = 1 + static_cast<int>(gen() % 4);
        for (int part = 0; part < parts; ++part) {
            std::int64_t const n = 1 + static_cast<std::int64_t>(gen() % 700);
            Eigen::MatrixXd x(n, d);
            std::normal_distribution<double> nd(gen() % 2 ? 1e4 : 0.0, gen() % 2 ? 1e-2 : 3.0);
            for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = nd(gen);
            std::vector<std::int64_t> t(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
            for (std::size_t i = 0; i < t.size(); ++i) {
                t[i] = static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(tmax));
                b[i] = t[i] / 64;
            }
            qkgeom::head_moments shard(d, {1, 2, 1});
            shard.add(gen() % 2 ? qkgeom::kind::query : qkgeom::kind::key, x, t, b);
            total += shard;
        }
        std::istringstream in(shard_bytes(total));
        auto const back = qkgeom::read_moments(in, "s.qkm");
        CHECK(back.q.count() + back.k.count() == total.q.count() + total.k.count());
    }
}

TEST_CASE("issue 14: bad shard magic is quoted escaped, merge_moment_files validates every file", "[io][shards]") {
    std::istringstream in(std::string("QK\r\nMOM\n") + std::string(64, '\0'));
    try {
        (void)qkgeom::read_moments(in, "s.qkm");
        FAIL("bad magic accepted");
    } catch (qkgeom::input_error const& e) {
        std::string const w = e.what();
        CHECK(w.find('\r') == std::string::npos);
        CHECK(w.find('\n') == std::string::npos);
        CHECK_THAT(w, Contains("(value QK\\r\\nMOM\\n)"));
    }
    temp_dir tmp;
    Eigen::MatrixXd x(4, 2);
    x << 1, 2, 3, 4, 5, 7, 2, 2;
    std::vector<std::int64_t> const t{2, 3, 3, 70}, b{0, 0, 0, 1};
    qkgeom::head_moments a(2, {0, 1, 0}), c(2, {0, 1, 0}), other(2, {0, 2, 1});
    a.add(qkgeom::kind::query, x.topRows(2), std::span(t).first(2), std::span(b).first(2));
    c.add(qkgeom::kind::query, x.bottomRows(2), std::span(t).last(2), std::span(b).last(2));
    other.add(qkgeom::kind::query, x, t, b);
    std::vector<fs::path> const files{tmp.path / "a.qkm", tmp.path / "c.qkm", tmp.path / "o.qkm"};
    qkgeom::save_moments(files[0], a);
    qkgeom::save_moments(files[1], c);
    qkgeom::save_moments(files[2], other);
    auto const merged = qkgeom::merge_moment_files(std::span(files).first(2));
    auto whole = a;
    whole += c;
    CHECK(merged.q.count() == 4);
    CHECK(merged.q.buckets.at(0).mean_t == whole.q.buckets.at(0).mean_t);
    CHECK(merged.q.buckets.at(0).c_xx == whole.q.buckets.at(0).c_xx);
    require_input_error([&] { (void)qkgeom::merge_moment_files(files); },
                        files[2].string() + ": q_head: shard of another head");
    CHECK_THROWS_AS(qkgeom::merge_moment_files(std::span<fs::path const>()), std::invalid_argument);
    write_bytes(tmp.path / "t.qkm", shard_bytes(a) + "x");
    require_input_error([&] { (void)qkgeom::load_moments(tmp.path / "t.qkm"); }, "trailing bytes");
}

TEST_CASE("issue 14: a head entry's safetensors header is limited to 1 MiB", "[io][limits][safetensors]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    io::write_head(tmp.path, m, test_entry(m, 0, 1, qkgeom::kind::query), io::storage_format::safetensors);
    auto const p = tmp.path / "l00h01q.safetensors";
    auto const b = io::detail::read_file_bytes(p);
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(b[static_cast<std::size_t>(i)]) << (8 * i);
    // the same header padded with spaces (valid JSON, allowed by the format) to 1 MiB + 8 bytes
    std::string const pad((std::size_t{1} << 20) + 8 - n, ' ');
    std::string const text(reinterpret_cast<char const*>(b.data()) + 8, n);
    std::string const body(reinterpret_cast<char const*>(b.data()) + 8 + n, b.size() - 8 - n);
    write_bytes(p, le(n + pad.size(), 8) + text + pad + body);
    CHECK(io::read_safetensors(p).tensors.size() == 4);  // the general reader accepts it
    require_input_error([&] { (void)io::read_head(tmp.path, 0, 1, qkgeom::kind::query); },
                        p.string() + ": header_size: header size above the limit of 1048576 bytes for this file (value 1048584)");
}

TEST_CASE("issue 14: duplicate object keys are found in large and nested objects, at the later occurrence",
          "[io][json]") {
    namespace json = qkgeom::json;
    // 300,000 distinct keys parse (the check sorts once per object)
    std::string big = "{";
    for (int i = 0; i < 300000; ++i) big += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
    auto const ok = json::parse(big + "}");
    REQUIRE(ok.as_object().size() == 300000);
    CHECK(ok.find("k299999")->as_int() == 299999);
    // the same key again at the end: named, at the byte offset of its second occurrence
    std::size_t const at = big.size() + 1;
    CHECK_THROWS_WITH(json::parse(big + ",\"k17\":0}", "m.json"),
                      Contains("duplicate object key \"k17\"") && Contains("byte " + std::to_string(at)));
    // keys are unique per object: the same key in two objects is fine, within one nested object it is not
    CHECK(json::parse(R"({"a":{"x":1},"b":{"x":2},"x":3})").as_object().size() == 3);
    CHECK_THROWS_WITH(json::parse(R"({"a":{"x":1,"y":2,"x":3}})"), Contains("duplicate object key \"x\"") &&
                                                                        Contains("byte 18"));
    CHECK_THROWS_WITH(json::parse(R"({"x":{"y":1,"z":{"x":1}},"x":2})"),
                      Contains("duplicate object key \"x\"") && Contains("byte 25"));
    // three copies: the first repeat (document order) is the one named
    CHECK_THROWS_WITH(json::parse(R"({"b":1,"a":1,"b":2,"a":2})"), Contains("duplicate object key \"b\"") &&
                                                                        Contains("byte 13"));
}

TEST_CASE("issue 14: a deflated npz member over 64 MiB that would inflate more than 200-fold is refused before "
          "inflating",
          "[io][npz]") {
    if (!io::npz_deflate_available()) return;
    io::npz_file f;
    // 72 MiB of zeros: deflate packs them ~1000-fold, a bomb by the rule of docs/dataset.md#limits
    f.add("vectors", arr(std::vector<float>(std::size_t{18} << 20, 0.0f), {std::int64_t{18} << 10, 1024}));
    io::npz_write_options opt;
    opt.compression = io::npz_compression::deflate;
    auto const z = io::serialize_npz(f, opt);
    REQUIRE(z.size() * 200 < (std::size_t{72} << 20));
    CHECK_THROWS_WITH((void)io::parse_npz(z, "bomb.npz"),
                      Contains("bomb.npz[vectors.npy]") && Contains("size") && Contains("200-fold"));
    // below the floor the same ratio is fine: 1 MiB of zeros reads back
    io::npz_file small;
    small.add("vectors", arr(std::vector<float>(std::size_t{1} << 18, 0.0f), {std::int64_t{1} << 8, 1024}));
    auto const zs = io::serialize_npz(small, opt);
    CHECK(io::npy_to_matrix(io::parse_npz(zs, "small.npz").at("vectors")).cwiseAbs().maxCoeff() == 0.0);
}

// ---------------------------------------------------------------------------
// Issue 18: the streaming .npy reader and read_capture_rows (rows kept in
// their stored precision) fail and read exactly as the whole-file forms.
// ---------------------------------------------------------------------------

namespace {

/// The message, source, field and value of the input_error `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (qkgeom::input_error const& e) {
        return e.source() + " | " + e.field() + " | " + e.value() + " | " + e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("issue 18: read_npy of every prefix and extension of a file fails as parse_npy of its bytes", "[io][npy]") {
    temp_dir tmp;
    std::vector<float> const v{1, 2, 3, 4, 5, 6};
    for (unsigned major : {1u, 2u}) {
        bytes_t const good = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f32_le(v), major);
        REQUIRE(io::parse_npy(good, "g.npy").data == f32_le(v));
        fs::path const p = tmp.path / "x.npy";
        for (std::size_t n = 0; n <= good.size() + 2; ++n) {
            bytes_t b(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(std::min(n, good.size())));
            b.resize(n, 0);  // n > size: trailing bytes
            write_bytes(p, b);
            INFO("version " << major << ", length " << n << " of " << good.size());
            std::string const want = error_of([&] { (void)io::parse_npy(b, p.string()); });
            CHECK(error_of([&] { (void)io::read_npy(p); }) == want);
            if (want.empty()) CHECK(io::read_npy(p).data == io::parse_npy(b, p.string()).data);
        }
    }
}

TEST_CASE("issue 18: read_capture_rows keeps f32 / f16 / bf16 rows as floats, exactly, heads with f64 in double",
          "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    qkgeom::head_id const id{0, 1, 0};  // query head 1 reads key head 0
    auto const q = test_entry(m, 0, 1, qkgeom::kind::query, 12);
    auto const k = test_entry(m, 0, 0, qkgeom::kind::key, 9);
    auto same = [](auto const& r, qkgeom::token_rows<qkgeom::row_matrix> const& want) {
        CHECK(r.vectors.template cast<double>() == want.vectors);
        CHECK(r.position == want.position);
        CHECK(r.bucket == want.bucket);
        CHECK(r.example_id == want.example_id);
    };
    for (auto fmt : {io::storage_format::npy, io::storage_format::safetensors, io::storage_format::npz})
        for (char const* qt : {"f32", "f16", "bf16", "f64"})
            for (char const* kt : {"f32", "bf16", "f64"}) {
                INFO("format " << io::storage_format_name(fmt) << ", query " << qt << ", key " << kt);
                io::write_head(tmp.path, m, q, fmt, qt);
                io::write_head(tmp.path, m, k, fmt, kt);
                auto const want = io::read_capture(tmp.path, m, id);
                auto const got = io::read_capture_rows(tmp.path, m, id);
                bool const single = std::string(qt) != "f64" && std::string(kt) != "f64";
                REQUIRE(got.index() == (single ? 0u : 1u));
                std::visit(
                    [&](auto const& h) {
                        CHECK(h.id == want.id);
                        CHECK(h.facts == want.facts);
                        same(h.queries, want.queries);
                        same(h.keys, want.keys);
                    },
                    got);
            }
    // Fortran-order vectors (C order in memory after the read).
    fs::path const sub = tmp.path / "l00h01q";
    io::write_head(tmp.path, m, q, io::storage_format::npy, "f32");
    io::write_head(tmp.path, m, k, io::storage_format::npy, "f32");
    std::vector<float> col_major;
    for (qkgeom::index_t j = 0; j < q.vectors.cols(); ++j)
        for (qkgeom::index_t i = 0; i < q.vectors.rows(); ++i) col_major.push_back(static_cast<float>(q.vectors(i, j)));
    io::write_npy(sub / "vectors.npy", col_major, {q.vectors.rows(), q.vectors.cols()}, true);
    auto const got = io::read_capture_rows(tmp.path, m, id);
    REQUIRE(got.index() == 0u);
    CHECK(std::get<0>(got).queries.vectors.cast<double>() == q.vectors);
}

TEST_CASE("issue 18: read_capture_rows fails as read_capture, message for message", "[io][dataset]") {
    temp_dir tmp;
    auto const m = test_manifest();
    io::write_manifest(tmp.path, m);
    qkgeom::head_id const id{0, 1, 0};
    auto const q = test_entry(m, 0, 1, qkgeom::kind::query, 13);
    auto const k = test_entry(m, 0, 0, qkgeom::kind::key, 12);
    auto check_same = [&] {
        std::string const want = error_of([&] { (void)io::read_capture(tmp.path, m, id); });
        INFO("read_capture: " << want);
        CHECK(!want.empty());
        CHECK(error_of([&] { (void)io::read_capture_rows(tmp.path, m, id); }) == want);
    };
    auto with_value = [&](io::head_entry e, qkgeom::index_t i, qkgeom::index_t j, double x) {
        e.vectors(i, j) = x;
        return e;
    };
    double const nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    for (auto fmt : {io::storage_format::npy, io::storage_format::safetensors, io::storage_format::npz})
        for (char const* dt : {"f32", "f16", "bf16"}) {
            INFO("format " << io::storage_format_name(fmt) << ", dtype " << dt);
            // write_head validates: the planted entry is written from its raw
            // arrays, in NumPy form (directory) or as an .npz archive.
            auto vec_array = [&](io::head_entry const& e) {
                std::vector<float> f(e.vectors.data(), e.vectors.data() + e.vectors.size());
                std::vector<std::int64_t> const shape{e.vectors.rows(), e.vectors.cols()};
                if (std::string(dt) == "f32") return io::make_npy(std::span<float const>(f), shape);
                if (std::string(dt) == "f16") {
                    std::vector<qkgeom::float16> h;
                    for (float x : f) h.push_back(qkgeom::float16::from_float(x));
                    return io::make_npy(std::span<qkgeom::float16 const>(h), shape);
                }
                std::vector<qkgeom::bfloat16> h;
                for (float x : f) h.push_back(qkgeom::bfloat16::from_float(x));
                return io::make_npy(std::span<qkgeom::bfloat16 const>(h), shape);
            };
            auto ints = [](std::vector<std::int64_t> const& v) {
                return io::make_npy(std::span<std::int64_t const>(v), {static_cast<std::int64_t>(v.size())});
            };
            auto put = [&](io::head_entry const& qe, io::head_entry const& ke) {
                io::write_head(tmp.path, m, q, fmt, dt);
                io::write_head(tmp.path, m, k, fmt, dt);
                for (auto const* e : {&qe, &ke}) {
                    if (e->vectors == (e == &qe ? q.vectors : k.vectors)) continue;
                    auto const name = io::head_entry_name(e->layer, e->head, e->k);
                    fs::remove_all(tmp.path / name);
                    fs::remove(tmp.path / (name + ".npz"));
                    fs::remove(tmp.path / (name + ".safetensors"));
                    io::npz_file z;
                    z.add("vectors", vec_array(*e));
                    z.add("position", ints(e->position.values()));
                    z.add("bucket", ints(e->bucket.values()));
                    z.add("example_id", ints(e->example_id.values()));
                    if (fmt == io::storage_format::npz) {
                        write_bytes(tmp.path / (name + ".npz"), io::serialize_npz(z));
                        continue;
                    }
                    fs::create_directories(tmp.path / name);
                    for (char const* a : {"vectors", "position", "bucket", "example_id"})
                        io::write_npy(tmp.path / name / (std::string(a) + ".npy"), z.at(a, "z"));
                }
            };
            put(with_value(q, 7, 2, nan), k);  // the first offender of the query rows
            check_same();
            put(with_value(with_value(q, 10, 0, -inf), 11, 1, nan), k);
            check_same();
            put(q, with_value(k, 11, 2, inf));  // the key entry: "key entry l00h00k (read by query head 1): ..."
            check_same();
        }
    // A NaN and an earlier failing check: the earlier check is reported, as before.
    io::write_head(tmp.path, m, q, io::storage_format::npy, "f32");
    io::write_head(tmp.path, m, k, io::storage_format::npy, "f32");
    fs::path const sub = tmp.path / "l00h01q";
    std::vector<float> f(q.vectors.data(), q.vectors.data() + q.vectors.size());
    f[7] = std::numeric_limits<float>::quiet_NaN();
    io::write_npy(sub / "vectors.npy", f, {q.vectors.rows(), q.vectors.cols()});
    check_same();  // the NaN alone
    std::vector<std::int64_t> short_ids(q.example_id.begin(), q.example_id.end() - 1);
    io::write_npy(sub / "example_id.npy", short_ids, {static_cast<std::int64_t>(short_ids.size())});
    check_same();  // the length first
    // Truncated and extended vectors files, a wrong dtype, a wrong rank.
    io::write_npy(sub / "example_id.npy", q.example_id.values(), {static_cast<std::int64_t>(q.example_id.size())});
    auto const bytes = io::serialize_npy(io::make_npy(std::span<float const>(f), {q.vectors.rows(), q.vectors.cols()}));
    for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{11}, std::size_t{70}, bytes.size() - 1,
                          bytes.size() + 4}) {
        bytes_t b(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(std::min(n, bytes.size())));
        b.resize(n, 0);
        write_bytes(sub / "vectors.npy", b);
        INFO("vectors.npy of " << n << " bytes");
        check_same();
    }
    io::write_npy(sub / "vectors.npy", std::vector<std::int32_t>(39, 1), {13, 3});
    check_same();
    io::write_npy(sub / "vectors.npy", f, {static_cast<std::int64_t>(f.size())});
    check_same();
}

}  // namespace qkgeom_tests_io_test
