"""``python -m ortserve``: the same as the ``ortserve`` command."""

from ortserve.cli.main import main

raise SystemExit(main())
