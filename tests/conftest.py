import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
pytest.register_assert_rewrite("classify")

from classify import SERVICE_PLUGINS  # noqa: E402  (tests/ on sys.path first)

# the service fixtures; `classify`: every test marked unit or integration, and the guard of
# unit-only runs (`make test-unit`); `schedule`: how a run with workers shares them out;
# `short_jvms`: the JVMs the tests start spend less CPU compiling
pytest_plugins = [*SERVICE_PLUGINS, "classify", "schedule", "short_jvms"]
