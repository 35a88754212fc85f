// qkgeom — forwarding header (deprecated path, kept for one minor version:
// CHANGELOG.md, "Header layout"; removed in 0.3); use <qkgeom/beyond/rope_bands.hpp>.
// No header of the library includes it (tests/layering, lint.layering).
#pragma once

#include <qkgeom/beyond/rope_bands.hpp>  // IWYU pragma: export
