// qkgeom Python extension — the plasticity engine (method §5–6), instantiated once for
// the whole module (declared extern in qkgeom/extern_templates.hpp).
#include <qkgeom/extern_templates.hpp>
#include <qkgeom/plasticity.hpp>

template qkgeom::plasticity_result qkgeom::detail::evaluate_plasticity<void>(
    qkgeom::householder_result const&, qkgeom::detail::key_store const&, qkgeom::detail::query_store const&,
    qkgeom::capture_facts const&, qkgeom::plasticity_options const&);
