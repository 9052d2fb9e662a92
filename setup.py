"""lance-cdf's one compiled part: planning's byte readers (lance_cdf/format/_decode.c).

Package metadata lives in pyproject.toml; this file only declares the extension. It is
optional: where no C compiler is present the install goes on and lance_cdf.format parses
with protobuf alone (same results, slower on tables with long histories).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "lance_cdf.format._decode",
            ["lance_cdf/format/_decode.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
