"""Running a prepared plan: preflight on every host, staging, then the backend's lifecycle, driven
by one launcher for every backend (:mod:`~poprun_py.launch.launcher`).

Example:

    >>> from poprun_py.launch.launcher import RunSettings
    >>> RunSettings().sync
    False
"""
