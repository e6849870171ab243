# The compiled part of dyspec_nb, two pybind11 extensions with no libtorch dependency, so they build with only a C++
# compiler and pybind11: the DySpec tree builders (csrc/tree_builder.cpp) and the few-row products of a verification
# step (csrc/small_linear.cpp, OpenMP: the libgomp PyTorch loads). All metadata lives in pyproject.toml.
from setuptools import setup
from pybind11.setup_helpers import Pybind11Extension, build_ext

ext = Pybind11Extension("dyspec_nb._native", ["csrc/tree_builder.cpp"], cxx_std=17,
                        extra_compile_args=["-O3", "-ffp-contract=off"])
rows = Pybind11Extension("dyspec_nb._linear", ["csrc/small_linear.cpp"], cxx_std=17,
                         extra_compile_args=["-O3", "-fopenmp"], extra_link_args=["-fopenmp"])
setup(ext_modules=[ext, rows], cmdclass={"build_ext": build_ext})
