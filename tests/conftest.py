"""Shared pytest plugins: real test hosts (network namespaces + sshd), moto as a local server,
and a real Slurm test cluster."""

import pytest

pytest.register_assert_rewrite("tests.integration.helpers")

pytest_plugins = ["tests.hostfixtures", "tests.motofixtures", "tests.slurmfixtures"]
