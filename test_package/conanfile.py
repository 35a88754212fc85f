import os

from conan import ConanFile
from conan.errors import ConanException
from conan.tools.build import can_run
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout


class QkgeomTestConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    @property
    def _with_program(self):
        # qkgeom's option `with_program`: the package then holds bin/qkgeom.
        return bool(self.dependencies["qkgeom"].options.get_safe("with_program", False))

    def generate(self):
        CMakeDeps(self).generate()
        tc = CMakeToolchain(self)
        # With the program, find_package(qkgeom) must give qkgeom::program
        # (the package's cmake_build_modules); test_package/CMakeLists.txt
        # fails otherwise.
        tc.cache_variables["QKGEOM_REQUIRE_PROGRAM"] = self._with_program
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if not can_run(self):
            return
        self.run(os.path.join(self.cpp.build.bindir, "test_package"), env="conanrun")
        if self._with_program:
            # The packaged program itself: --help, and a one-layer demo that
            # must write summary.txt (as test_package/check_program.cmake).
            exe = "qkgeom.exe" if self.settings.os == "Windows" else "qkgeom"
            program = os.path.join(self.dependencies["qkgeom"].cpp_info.bindirs[0], exe)
            self.run(f'"{program}" --help', env="conanrun")
            out = os.path.join(self.build_folder, "program_demo")
            self.run(f'"{program}" demo --layers 1 -o "{out}" --no-pictures', env="conanrun")
            if not os.path.isfile(os.path.join(out, "summary.txt")):
                raise ConanException(f"qkgeom demo wrote no {out}/summary.txt")
