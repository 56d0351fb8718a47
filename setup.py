"""Builds the C record walker (`laminar.log._records`) and the disk threads without the GIL
(`laminar.log._disk`); everything else is in pyproject.toml.

`pip install .` and `pip install -e .` compile them (gcc and the Python headers are needed:
Dockerfile.broker installs them in its build stage). Neither is optional: without the walker
the broker checks every appended record in Python (`laminar.log.records`), and it does not
start without the disk threads.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "laminar.log._records",
            sources=["broker/laminar/log/_records.c"],
            optional=False,
            extra_compile_args=["-std=c99", "-Wall", "-Wextra"],
        ),
        Extension(
            "laminar.log._disk",
            sources=["broker/laminar/log/_disk.c"],
            optional=False,
            extra_compile_args=["-std=gnu99", "-Wall", "-Wextra"],
        ),
    ]
)
