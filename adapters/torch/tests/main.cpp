// Catch2 main of the LibTorch adapter tests. `--cuda-or-skip` (first
// argument) returns 77 — CTest's SKIP_RETURN_CODE for torch.cuda — with a
// message when no CUDA device is available, and runs the remaining arguments
// otherwise.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <torch/cuda.h>

#include <cstdio>
#include <string_view>
#include <vector>

int main(int argc, char* argv[]) {
    std::vector<char*> args(argv, argv + argc);
    if (argc > 1 && std::string_view(argv[1]) == "--cuda-or-skip") {
        if (!torch::cuda::is_available()) {
            std::puts("SKIPPED: torch.cuda needs a CUDA device; torch::cuda::is_available() is false");
            return 77;
        }
        args.erase(args.begin() + 1);
    }
    return Catch::Session().run(static_cast<int>(args.size()), args.data());
}
