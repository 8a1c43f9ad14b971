"""From the command line to a plan: the I/O edge before the pure core. Reads cluster specs
(:mod:`~poprun_py.prepare.specfile`), input globs and manifests
(:mod:`~poprun_py.prepare.inputs`) and this machine's topology
(:mod:`~poprun_py.prepare.discover`), then plans (:mod:`~poprun_py.prepare.job`).

Example:

    >>> from poprun_py.prepare.job import LaunchOptions, prepare
    >>> prepare(LaunchOptions(hosts="localhost", program=("true",)), environ={}).backend
    'local'
"""
