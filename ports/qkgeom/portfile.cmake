# Overlay port for qkgeom (header-only). It builds the checkout this port
# lives in (ports/qkgeom/ -> repository root), so `vcpkg install qkgeom
# --overlay-ports=<repo>/ports` packages the working tree. For a release port,
# replace the next line with:
#
#   vcpkg_from_github(
#       OUT_SOURCE_PATH SOURCE_PATH
#       REPO qkgeom/qkgeom
#       REF "v${VERSION}"
#       SHA512 <sha512 of the release tarball>
#       HEAD_REF main
#   )
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

# Header-only: one (release) configuration is enough. The optional program
# is a tool, built in release only as well.
set(VCPKG_BUILD_TYPE release)

# Features: `program` builds and installs the qkgeom program (bin/qkgeom ->
# tools/qkgeom/qkgeom, and the imported executable qkgeom::program in the
# package config); `zlib` (pulled in by `program`) enables deflated .npz
# members. Without a feature its option is OFF, so nothing is found by chance.
vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
    FEATURES
        program QKGEOM_BUILD_PROGRAM
        zlib    QKGEOM_WITH_ZLIB
)

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        ${FEATURE_OPTIONS}
        -DQKGEOM_BUILD_TESTS=OFF
        -DQKGEOM_BUILD_EXAMPLES=OFF
        -DQKGEOM_BUILD_BENCHMARKS=OFF
        -DQKGEOM_BUILD_TORCH_ADAPTER=OFF
        -DQKGEOM_BUILD_PYTHON=OFF  # the Python package installs with pip (docs/python.md)
        # The optional xtensor bridge is not part of the installed package;
        # keep an xtensor that happens to be installed from being probed.
        -DCMAKE_DISABLE_FIND_PACKAGE_xtensor=ON
)
vcpkg_cmake_install()

# qkgeomConfig.cmake is installed to share/qkgeom (QKGEOM_INSTALL_CMAKEDIR).
# With the program, the fixup also rewrites qkgeom::program's location in
# qkgeomProgramTargets-release.cmake from bin/ to tools/qkgeom/ (TOOLS_PATH),
# where vcpkg_copy_tools puts the executable.
vcpkg_cmake_config_fixup(PACKAGE_NAME qkgeom CONFIG_PATH share/qkgeom TOOLS_PATH tools/qkgeom)

if("program" IN_LIST FEATURES)
    # bin/qkgeom -> tools/qkgeom/qkgeom; AUTO_CLEAN removes the emptied bin/.
    vcpkg_copy_tools(TOOL_NAMES qkgeom AUTO_CLEAN)
endif()

# qkgeom.pc is arch-independent and installed to share/pkgconfig; make its
# prefix relative to the file.
vcpkg_fixup_pkgconfig()

# No library is compiled (the program, if any, is in tools/): no lib/, and no
# debug tree (release-only build). The
# LICENSE that CMake installs to share/doc/qkgeom becomes share/qkgeom/copyright.
file(REMOVE_RECURSE
    "${CURRENT_PACKAGES_DIR}/lib"
    "${CURRENT_PACKAGES_DIR}/debug"
    "${CURRENT_PACKAGES_DIR}/share/doc")

vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
