"""Builds the C record walker (`laminar.log._records`); everything else is in pyproject.toml.

`pip install .` and `pip install -e .` compile it (gcc and the Python headers are needed:
Dockerfile.broker installs them in its build stage). It is not optional: without it the
broker checks every appended record in Python (`laminar.log.records`).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "laminar.log._records",
            sources=["broker/laminar/log/_records.c"],
            optional=False,
            extra_compile_args=["-std=c99", "-Wall", "-Wextra"],
        )
    ]
)
