"""The provider registry: an explicit map from name to factory; implementations load lazily.

Example:

    >>> sorted(PROVIDERS)
    ['aws', 'local', 'static']
    >>> get_provider("static").name
    'static'
    >>> get_provider("gcp")
    Traceback (most recent call last):
    ...
    poprun_py.errors.UnknownNameError: unknown provider 'gcp'; choose one of: aws, local, static
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from poprun_py.errors import UnknownNameError

if TYPE_CHECKING:
    from poprun_py.providers.base import Provider


def _local() -> Provider:
    from poprun_py.providers.local import LocalProvider

    return LocalProvider()


def _static() -> Provider:
    from poprun_py.providers.static import StaticProvider

    return StaticProvider()


def _aws() -> Provider:
    from poprun_py.providers.aws import AwsProvider

    return AwsProvider()


PROVIDERS: dict[str, Callable[[], Provider]] = {
    "local": _local,
    "static": _static,
    "aws": _aws,
}


def get_provider(name: str) -> Provider:
    """Create the provider called ``name``; UnknownNameError lists the valid names."""
    if name not in PROVIDERS:
        raise UnknownNameError("provider", name, list(PROVIDERS))
    return PROVIDERS[name]()
