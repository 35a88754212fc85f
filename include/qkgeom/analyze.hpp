// qkgeom — forwarding header (deprecated path, kept for one minor version:
// CHANGELOG.md, "Header layout"; removed in 0.3); use <qkgeom/analysis/analyze.hpp>.
// No header of the library includes it (tests/layering, lint.layering).
#pragma once

#include <qkgeom/analysis/analyze.hpp>  // IWYU pragma: export
