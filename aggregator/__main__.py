"""`python -m aggregator` runs the same CLI as the `aggregator` console script."""

from aggregator.commands.cli import main

raise SystemExit(main())
