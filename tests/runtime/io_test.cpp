// Runtime tests of the dataset I/O layer: .npy, safetensors, JSON and the
// dataset layout (round-trips, and every malformed input fails with an
// input_error whose message names the problem).
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/io/json.hpp>
#include <qkgeom/io/npy.hpp>
#include <qkgeom/io/safetensors.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace io = qkgeom::io;
using Catch::Matchers::Contains;
using bytes_t = std::vector<unsigned char>;

/// A fresh directory under the temp dir, removed on destruction.
struct temp_dir {
    fs::path path;
    temp_dir() {
        static std::atomic<int> counter{0};
        auto const stamp = std::chrono::steady_clock::now().time_since_epoch().count();
        path = fs::temp_directory_path() /
               ("qkgeom_io_test_" + std::to_string(stamp) + "_" + std::to_string(counter++));
        fs::create_directories(path);
    }
    ~temp_dir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    temp_dir(temp_dir const&) = delete;
    temp_dir& operator=(temp_dir const&) = delete;
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
    bytes_t out(8);
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<unsigned char>((header.size() >> (8 * i)) & 0xFF);
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), buffer.begin(), buffer.end());
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
        e.position.push_back(i * 5);
        e.bucket.push_back(qkgeom::bucket_of(m.buckets, i * 5));
        e.example_id.push_back(i % 3);
    }
    return e;
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
        std::string t = base;
        auto const at = t.find(from);
        REQUIRE(at != std::string::npos);
        t.replace(at, from.size(), to);
        INFO(t);
        require_input_error([&] { (void)io::parse_manifest(t, "manifest.json"); }, needle);
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
    for (auto fmt : {io::storage_format::npy, io::storage_format::safetensors}) {
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
    CHECK(ids[0] == io::head_id{0, 1, qkgeom::kind::query, io::storage_format::npy});
    CHECK(ids[1] == io::head_id{0, 1, qkgeom::kind::key, io::storage_format::safetensors});
    CHECK(ids[2] == io::head_id{1, 3, qkgeom::kind::query, io::storage_format::npy});
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
            auto b = e.bucket;
            b[3] += 1;
            io::write_npy(sub / "bucket.npy", b, {static_cast<std::int64_t>(b.size())});
        });
        require_input_error(read, "bucket[3]: bucket inconsistent with position 15 under the uniform scheme (expected 3) (value 4)");
        require_input_error(read, "bucket.npy");
    }
    SECTION("negative position") {
        rewrite([&] {
            auto p = e.position;
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
        f.tensors["example_id"] = io::make_tensor(std::span<std::int64_t const>(e.example_id), {10});
        io::write_safetensors(tmp.path / "l00h01q.safetensors", f);
        require_input_error(read, "l00h01q.safetensors: vectors[row 1, col 2]: non-finite value");
    }
}
