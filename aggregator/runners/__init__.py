"""The process runners: one gateway process (`server.py`), the control process of `--workers N`
(`supervisor.py`) and each of its workers (`worker.py`). They build a gateway (`assembly.py`),
serve it and shut it down; what a worker shares with the control lives in `workers/`."""
