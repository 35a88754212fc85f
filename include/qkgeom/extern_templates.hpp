// qkgeom — deprecated (kept for one minor version, see CHANGELOG): the heavy
// engines are instantiated once by the compiled part instead (the CMake target
// qkgeom::compiled, docs/building.md "Compile model"), which declares them
// extern itself. This header now only includes the analyses; explicit
// instantiation definitions written against it still compile.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/plasticity/attention_plasticity.hpp>
