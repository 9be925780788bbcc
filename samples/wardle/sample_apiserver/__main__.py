"""`python -m sample_apiserver --secure-port ... --requestheader-client-ca-file ...`"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from aggregator.tls.pem import PEMError
from aggregator.util.logs import configure_logging
from aggregator.util.runtime import new_event_loop
from sample_apiserver.options import OptionsError, build_parser, options_from_args, validate
from sample_apiserver.server import serve


def main(argv: Sequence[str] | None = None) -> int:
    options = options_from_args(build_parser().parse_args(argv))
    try:
        validate(options)
    except OptionsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    configure_logging(options.log_format, options.verbosity)
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(serve(options))
    except (OSError, PEMError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
