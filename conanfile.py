# Conan 2 recipe for qkgeom (header-only). From the repository root:
#   conan create . -s compiler.cppstd=20 --build=missing
# builds nothing of its own, packages include/ and runs test_package/.
#   conan create . -s compiler.cppstd=20 --build=missing -o "qkgeom/*:with_program=True"
# also builds and packages the qkgeom program (bin/qkgeom) with CMake.
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load, rm, rmdir
from conan.tools.layout import basic_layout
from conan.tools.scm import Version

required_conan_version = ">=2.0"


class QkgeomConan(ConanFile):
    name = "qkgeom"
    description = "Position vs content geometry of transformer attention heads (header-only C++20)"
    license = "MIT"
    url = "https://github.com/qkgeom/qkgeom"
    homepage = "https://github.com/qkgeom/qkgeom"
    topics = ("header-only", "transformer", "attention", "geometry", "statistics", "eigen")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    no_copy_source = True
    exports_sources = ("include/*", "src/*", "cmake/*", "CMakeLists.txt", "LICENSE", "adapters/CMakeLists.txt",
                       "app/*")
    # with_program: also build and package the qkgeom program (demo, synth,
    # analyze) as bin/qkgeom; the library stays header-only either way.
    options = {"with_program": [True, False]}
    default_options = {"with_program": False}

    @property
    def _min_cppstd(self):
        return 20

    @property
    def _compilers_minimum_version(self):
        return {"gcc": "12", "clang": "14", "apple-clang": "15", "msvc": "193"}

    def set_version(self):
        # Single source of truth: project(qkgeom VERSION x.y.z ...) in CMakeLists.txt.
        content = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        match = re.search(r"project\(\s*qkgeom\s+VERSION\s+(\d+\.\d+\.\d+)", content)
        if not match:
            raise ConanInvalidConfiguration("qkgeom: no 'project(qkgeom VERSION x.y.z' in CMakeLists.txt")
        self.version = match.group(1)

    def layout(self):
        if self.options.with_program:
            cmake_layout(self)
        else:
            basic_layout(self)

    def requirements(self):
        # Eigen's headers appear in qkgeom's public headers: transitive by nature.
        # (Boost is a test-only dependency of qkgeom's own tests: not required here.)
        self.requires("eigen/[>=3.4 <6]", transitive_headers=True)
        if self.options.with_program:
            # The program reads deflated .npz members with zlib. Private to the
            # executable (visible=False): the packaged headers are consumed
            # without zlib, as before (stored .npz only, docs/building.md).
            # A header-library's dependencies default to "unrelated_mode";
            # zlib is compiled into bin/qkgeom, so its version counts.
            self.requires("zlib/[>=1.2.11 <2]", visible=False, package_id_mode="minor_mode")

    def package_id(self):
        # Header-only: one package for every configuration. With the program
        # the package holds a compiled executable: settings and options count.
        if not self.info.options.with_program:
            self.info.clear()

    def validate(self):
        # package_id() clears self.info, so validate against self.settings.
        check_min_cppstd(self, self._min_cppstd)
        compiler = str(self.settings.compiler)
        minimum_version = self._compilers_minimum_version.get(compiler)
        if minimum_version is None:
            self.output.warning(f"{self.ref} requires C++{self._min_cppstd}; compiler '{compiler}' is unknown "
                                "to this recipe, assuming it supports C++20 concepts and ranges.")
        elif Version(self.settings.compiler.version) < minimum_version:
            raise ConanInvalidConfiguration(
                f"{self.ref} requires C++{self._min_cppstd} (concepts, ranges): {compiler} >= {minimum_version}, "
                f"got {self.settings.compiler.version}.")

    def generate(self):
        if not self.options.with_program:
            return  # header-only: nothing is configured or built
        CMakeDeps(self).generate()
        tc = CMakeToolchain(self)
        tc.cache_variables["QKGEOM_BUILD_PROGRAM"] = True
        tc.cache_variables["QKGEOM_BUILD_TESTS"] = False
        tc.cache_variables["QKGEOM_BUILD_EXAMPLES"] = False
        tc.cache_variables["QKGEOM_BUILD_BENCHMARKS"] = False
        tc.cache_variables["QKGEOM_BUILD_TORCH_ADAPTER"] = False
        tc.cache_variables["QKGEOM_BUILD_PYTHON"] = False  # the Python package installs with pip (docs/python.md)
        tc.cache_variables["QKGEOM_WITH_ZLIB"] = True
        tc.cache_variables["CMAKE_DISABLE_FIND_PACKAGE_xtensor"] = True
        tc.generate()

    def build(self):
        if self.options.with_program:
            cmake = CMake(self)
            cmake.configure()
            cmake.build()

    def package(self):
        copy(self, "LICENSE", src=self.source_folder, dst=os.path.join(self.package_folder, "licenses"))
        if not self.options.with_program:
            copy(self, "*.hpp", src=os.path.join(self.source_folder, "include"),
                 dst=os.path.join(self.package_folder, "include"))
            # qkgeom::compiled (optional compiled part): the module and its source,
            # where `cmake --install` puts them.
            share = os.path.join(self.package_folder, "share", "qkgeom")
            copy(self, "qkgeomCompiled.cmake", src=os.path.join(self.source_folder, "cmake"), dst=share)
            copy(self, "qkgeom_compiled.cpp", src=os.path.join(self.source_folder, "src"),
                 dst=os.path.join(share, "src"))
            return
        # `cmake --install`: include/, bin/qkgeom, share/qkgeom/*.cmake,
        # share/pkgconfig/qkgeom.pc, share/doc/qkgeom/LICENSE. CMakeDeps and
        # PkgConfigDeps generate the config from package_info(), so the
        # installed ones go, except qkgeomProgramTargets*.cmake (qkgeom::program),
        # which package_info() hands to CMakeDeps as a build module.
        CMake(self).install()
        share = os.path.join(self.package_folder, "share")
        rm(self, "qkgeomConfig*.cmake", os.path.join(share, "qkgeom"))
        rm(self, "qkgeomTargets*.cmake", os.path.join(share, "qkgeom"))
        rmdir(self, os.path.join(share, "pkgconfig"))
        rmdir(self, os.path.join(share, "doc"))

    def package_info(self):
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "qkgeom")
        self.cpp_info.set_property("cmake_target_name", "qkgeom::qkgeom")
        self.cpp_info.set_property("pkg_config_name", "qkgeom")
        self.cpp_info.requires = ["eigen::eigen3"]
        # qkgeom::compiled: a static library the consumer's project builds from
        # share/qkgeom/src/qkgeom_compiled.cpp on first use (docs/building.md).
        modules = [os.path.join("share", "qkgeom", "qkgeomCompiled.cmake")]
        if self.options.with_program:
            # bin/qkgeom; find_package(qkgeom) also gives the imported
            # executable qkgeom::program (the exported target file, relocatable).
            self.cpp_info.bindirs = ["bin"]
            modules.append(os.path.join("share", "qkgeom", "qkgeomProgramTargets.cmake"))
        else:
            self.cpp_info.bindirs = []
        self.cpp_info.set_property("cmake_build_modules", modules)
