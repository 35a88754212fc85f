// Catch2 main of the LibTorch adapter tests. `--cuda-or-skip` (first
// argument) returns 77 — CTest's SKIP_RETURN_CODE for torch.cuda — with a
// message when no CUDA device is available, and runs the remaining arguments
// otherwise. The Catch2 session: tests/runtime/catch_runner.cpp.
#include <torch/cuda.h>

#include <cstdio>
#include <string_view>
#include <vector>

int catch_run(int argc, char* argv[]);

int main(int argc, char* argv[]) {
    std::vector<char*> args(argv, argv + argc);
    if (argc > 1 && std::string_view(argv[1]) == "--cuda-or-skip") {
        if (!torch::cuda::is_available()) {
            std::puts("SKIPPED: torch.cuda needs a CUDA device; torch::cuda::is_available() is false");
            return 77;
        }
        args.erase(args.begin() + 1);
    }
    return catch_run(static_cast<int>(args.size()), args.data());
}
