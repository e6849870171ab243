# The compiled part of dyspec_nb: the DySpec tree builders in C++ (csrc/), a pybind11 extension with no libtorch
# dependency, so it builds with only a C++ compiler and pybind11. All metadata lives in pyproject.toml.
from setuptools import setup
from pybind11.setup_helpers import Pybind11Extension, build_ext

ext = Pybind11Extension("dyspec_nb._native", ["csrc/tree_builder.cpp"], cxx_std=17,
                        extra_compile_args=["-O3", "-ffp-contract=off"])
setup(ext_modules=[ext], cmdclass={"build_ext": build_ext})
