"""lance-cdf's compiled parts (C extensions next to the module that uses each one).

Package metadata lives in pyproject.toml; this file only lists the extensions. Each is
optional: where no C compiler is present the install goes on and the module that uses it
runs its pure-Python path (slower, same results).
"""

from setuptools import Extension, setup

# (module, sources, extra libraries)
NATIVE: list[tuple[str, list[str], list[str]]] = [
    # the Avro encoder's last step: its parts joined record by record
    ("lance_cdf.avro._assemble", ["lance_cdf/avro/_assemble.c"], []),
    # planning's byte decoders: deletion files (zstd by dlopen) and Range row-ID sequences
    ("lance_cdf.format._decode", ["lance_cdf/format/_decode.c"], ["dl"]),
]

setup(
    ext_modules=[
        Extension(name, sources, libraries=libs, optional=True, extra_compile_args=["-O2"])
        for name, sources, libs in NATIVE
    ]
)
