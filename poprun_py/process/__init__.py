"""Local processes: spawning and supervising instances (:mod:`~poprun_py.process.supervise`),
process trees (:mod:`~poprun_py.process.proctree`) and short commands run for their output
(:mod:`~poprun_py.process.commands`).

Example:

    >>> from poprun_py.process.commands import command_output
    >>> command_output(["echo", "hi"], RuntimeError, timeout=5)
    'hi\\n'
"""
