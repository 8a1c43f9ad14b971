"""``python -m poprun_py`` runs the command line.

Example:

    $ python -m poprun_py plan --hosts h1,h2 --replicas 4 train.py
"""

from poprun_py.cli import main

main()
