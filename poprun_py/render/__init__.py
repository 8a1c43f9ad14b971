"""From a plan to commands: Jinja2 templates (``templates/``, overridable with ``--templates``)
render each backend's argv lists and per-instance environments (:mod:`~poprun_py.render.job`);
:mod:`~poprun_py.render.k8s` renders a plan as the Kubernetes manifest of per-node mode.

Example:

    >>> from poprun_py.render.environment import TEMPLATES_DIR
    >>> {"instance.j2", "mpiexec.j2", "mpirun.j2"} <= {p.name for p in TEMPLATES_DIR.glob("*.j2")}
    True
"""
