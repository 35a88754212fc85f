// qkgeom — explicit instantiation declarations of the heavy analysis engines
// (optional, for faster builds of programs with several translation units).
//
// The library is header-only and its heavy parts are templates instantiated
// on use, so a translation unit that only includes the headers stays cheap.
// A translation unit that *calls* analyze_head or attention_plasticity
// instantiates the whole engine (tens of seconds of CPU with -O2 -g). To
// compile it once per program instead of once per calling translation unit:
//   - include this header (after <qkgeom/plasticity.hpp>) in the translation
//     units that call the analyses: the engines are then not instantiated
//     there;
//   - in one translation unit per engine (or one for all), write the explicit
//     instantiation definitions, e.g.
//       #include <qkgeom/plasticity.hpp>
//       template qkgeom::plasticity_result qkgeom::detail::evaluate_plasticity<void>(
//           qkgeom::householder_result const&, qkgeom::detail::key_store const&,
//           qkgeom::detail::query_store const&, qkgeom::capture_facts const&,
//           qkgeom::plasticity_options const&);
//     as the qkgeom program does (app/instantiate_*.cpp).
// Header-only use without this header keeps working unchanged.
#pragma once

#include <qkgeom/analyze.hpp>
#include <qkgeom/attention_plasticity.hpp>

namespace qkgeom {

// The plasticity engine (method §5–6) for validated rows.
extern template plasticity_result detail::evaluate_plasticity<void>(householder_result const&,
                                                                    detail::key_store const&,
                                                                    detail::query_store const&,
                                                                    capture_facts const&, plasticity_options const&);

// PCA, planar rotation and Householder decomposition of a head's moments (method §2–4).
extern template head_analysis detail::closed_forms<void>(head_moments const&, analysis_options const&);

}  // namespace qkgeom
