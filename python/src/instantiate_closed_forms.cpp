// qkgeom Python extension — PCA, planar rotation and Householder decomposition
// (method §2–4), instantiated once for the whole module (declared extern in
// qkgeom/extern_templates.hpp).
#include <qkgeom/extern_templates.hpp>
#include <qkgeom/plasticity.hpp>

template qkgeom::head_analysis qkgeom::detail::closed_forms<void>(qkgeom::head_moments const&,
                                                                  qkgeom::analysis_options const&);
