"""``python -m ortserve.supervisor RUN_DIR``: the supervisor process, exec'd by ``ortserve serve
--workers N`` (see ``supervisor.py``)."""

from ortserve.supervisor.supervisor import supervisor_main

supervisor_main()
