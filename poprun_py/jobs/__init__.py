"""Detached jobs: ``launch --detach`` hands the job to a supervisor on its first host (this
machine for the local backend), which runs it with every rule of an attached launch and
records it; ``jobs``, ``logs``, ``stop`` and ``wait`` find it again from any process.

- :mod:`~poprun_py.jobs.record`: the job record and its state machine (pure);
- :mod:`~poprun_py.hostside.hostops`: what runs on the supervisor's host to list, follow, stop
  and wait for jobs (standard library only: shipped by the one bundler);
- :mod:`~poprun_py.jobs.place`: where a job's supervisor lives, and how to reach it;
- :mod:`~poprun_py.jobs.registry`: this machine's list of the jobs it launched;
- :mod:`~poprun_py.jobs.supervisor`: the supervisor's start (handshake, detaching itself);
- :mod:`~poprun_py.jobs.detach`: the client side of ``launch --detach``.

Example::

    $ poprun-py launch -c clusters/testhosts-4.yaml --detach python examples/train.py
    testhosts-4-20261201-120501-3f2a
    $ poprun-py logs --follow testhosts-4-20261201-120501-3f2a
    $ poprun-py wait testhosts-4-20261201-120501-3f2a; echo $?
"""
