"""Fakes at the seams, shipped for users' and our own unit tests (as ``fabric.testing`` does):
a backend and a provider (:mod:`~poprun_py.testing.fakes`), and an agent stream with the real
agent behind it (:mod:`~poprun_py.testing.streams`).

Example:

    >>> import poprun_py.testing
    >>> poprun_py.testing.__name__
    'poprun_py.testing'
"""
