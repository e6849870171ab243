# Reserved for the compiled extension (pybind11 sources in csrc/); all metadata lives in pyproject.toml.
from setuptools import setup

setup()
