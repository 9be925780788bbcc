"""`python -m aggregator.workers <fd>`: one worker process (`worker.py`), started by the supervisor."""

import sys

from aggregator.workers.worker import main

sys.exit(main())
