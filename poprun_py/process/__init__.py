"""Local processes: supervising instances (:mod:`~poprun_py.process.supervise`, over the one
supervision core in :mod:`poprun_py.hostside.supervision`), process trees
(:mod:`~poprun_py.process.proctree`), the one signal path (:mod:`~poprun_py.process.signals`),
output routing and progress for hang detection (:mod:`~poprun_py.process.output`,
:mod:`~poprun_py.process.progress`), the launch's phases (:mod:`~poprun_py.process.phases`)
and short commands run for their output (:mod:`~poprun_py.process.commands`).

Example:

    >>> from poprun_py.process.commands import command_output
    >>> command_output(["echo", "hi"], RuntimeError, timeout=5)
    'hi\\n'
"""
