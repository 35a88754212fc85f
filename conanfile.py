# Conan 2 recipe for qkgeom (header-only). From the repository root:
#   conan create . -s compiler.cppstd=20 --build=missing
# builds nothing of its own, packages include/ and runs test_package/.
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
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
    exports_sources = ("include/*", "cmake/*", "CMakeLists.txt", "LICENSE", "adapters/CMakeLists.txt")
    default_options = {"boost/*:header_only": True}

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
        basic_layout(self)

    def requirements(self):
        # Headers of both appear in qkgeom's public headers: transitive by nature.
        self.requires("eigen/[>=3.4 <6]", transitive_headers=True)
        self.requires("boost/[>=1.74 <2]", transitive_headers=True)

    def package_id(self):
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

    def package(self):
        copy(self, "LICENSE", src=self.source_folder, dst=os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", src=os.path.join(self.source_folder, "include"),
             dst=os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "qkgeom")
        self.cpp_info.set_property("cmake_target_name", "qkgeom::qkgeom")
        self.cpp_info.set_property("pkg_config_name", "qkgeom")
        self.cpp_info.requires = ["eigen::eigen3", "boost::headers"]
