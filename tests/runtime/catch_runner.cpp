// The Catch2 v2 implementation, compiled once (without optimisation:
// qkgeom_test_main) for both test programs, qkgeom_tests and
// qkgeom_torch_tests; each has its own main, which calls catch_run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int catch_run(int argc, char* argv[]);
int catch_run(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
