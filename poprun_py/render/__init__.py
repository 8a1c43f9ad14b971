"""From a plan to commands: Jinja2 templates (``templates/``, overridable with ``--templates``)
render each backend's argv lists and per-instance environments.

Example:

    >>> from poprun_py.render.environment import TEMPLATES_DIR
    >>> {"instance.j2", "mpiexec.j2", "mpirun.j2"} <= {p.name for p in TEMPLATES_DIR.glob("*.j2")}
    True
"""
