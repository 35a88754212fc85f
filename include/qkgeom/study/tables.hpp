// qkgeom — forwarding header (deprecated path, kept for one minor version:
// CHANGELOG.md, "Header layout"; removed in 0.3); use <qkgeom/report/study_tables.hpp>.
// No header of the library includes it (tests/layering, lint.layering).
#pragma once

#include <qkgeom/report/study_tables.hpp>  // IWYU pragma: export
#include <qkgeom/run/study_spec.hpp>  // IWYU pragma: export (the old header brought the study file in)
