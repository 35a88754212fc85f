// qkgeom tests — a fresh directory under the system temp dir, removed (with
// everything in it) on destruction. Shared by the tests that write files.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>

namespace qkgeom_test {

struct temp_dir {
    std::filesystem::path path;
    /// \param[in] prefix the start of the directory's name (a tick and a counter follow: unique per process).
    explicit temp_dir(std::string const& prefix = "qkgeom_test_") {
        static std::atomic<int> counter{0};
        auto const stamp = std::chrono::steady_clock::now().time_since_epoch().count();
        path = std::filesystem::temp_directory_path() /
               (prefix + std::to_string(stamp) + "_" + std::to_string(counter++));
        std::filesystem::create_directories(path);
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    temp_dir(temp_dir const&) = delete;
    temp_dir& operator=(temp_dir const&) = delete;
};

}  // namespace qkgeom_test
