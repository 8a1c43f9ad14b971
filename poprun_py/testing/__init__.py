"""Fakes at the seams, shipped for users' and our own unit tests (as ``fabric.testing`` does).

Example:

    >>> import poprun_py.testing
    >>> poprun_py.testing.__name__
    'poprun_py.testing'
"""
