import pytest

# (before the import: the guard's asserts in `classify` are rewritten by pytest)
pytest.register_assert_rewrite("tests.support.classify")

from tests.support.classify import SERVICE_PLUGINS  # noqa: E402

# the service fixtures; `classify`: every test marked unit or integration, and the guard of
# unit-only runs (`make test-unit`); `schedule`: how a run with workers shares them out;
# `short_jvms`: the JVMs the tests start spend less CPU compiling
pytest_plugins = [
    f"tests.support.{name}" for name in (*SERVICE_PLUGINS, "classify", "schedule", "short_jvms")
]
