"""Static bearer tokens from a CSV file (`--token-auth-file`), as kube-apiserver reads them.

Format, one token per line: `token,user,uid[,"group1,group2"]` (extra columns ignored). Lines
with an empty token are skipped and a repeated token keeps its last line, both with a warning.
The file is re-read when it changes; a broken new version is logged and the previous tokens stay.
A lookup is one dictionary access (no await): this is local mode's alternative to TokenReview.
"""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path

from aggregator.model.userinfo import UserInfo
from aggregator.util.filewatch import PollingWatcher, stat_fingerprint
from aggregator.util.logs import fields

log = logging.getLogger(__name__)


class TokenFileError(ValueError):
    """The file cannot be used; the message names the file and the record."""


def parse_token_csv(text: str, *, source: str) -> dict[str, UserInfo]:
    """Upstream's `tokenfile.NewCSV`, minus its secrets in messages."""
    tokens: dict[str, UserInfo] = {}
    reader = csv.reader(io.StringIO(text), strict=True)
    record_number = 0
    try:
        for record in reader:
            if not record:
                continue  # Go's csv reader skips blank lines
            if len(record) < 3:
                raise TokenFileError(
                    f"token file '{source}' must have at least 3 columns (token, user name, user uid), "
                    f"found {len(record)}"
                )
            record_number += 1
            token, name, uid = record[0], record[1], record[2]
            if not token:
                log.warning(
                    "empty token has been found in token file",
                    extra=fields(file=source, record=record_number),
                )
                continue
            if token in tokens:
                log.warning(
                    "duplicate token has been found in token file",
                    extra=fields(file=source, record=record_number),
                )
            groups = tuple(record[3].split(",")) if len(record) >= 4 else ()
            tokens[token] = UserInfo(name, uid, groups)
    except csv.Error as err:
        raise TokenFileError(f"token file '{source}': line {reader.line_num}: {err}") from err
    return tokens


class TokenFile:
    """`TokenAuthenticator` over a token CSV file, reloaded on change; a Gateway component."""

    def __init__(self, path: str, *, interval: float = 1.0) -> None:
        self.path = path
        self._watcher = PollingWatcher(  # before the read: see PollingWatcher's baseline
            lambda: stat_fingerprint([path]), self.reload, interval=interval, name=f"token-file {path}"
        )
        self._tokens = parse_token_csv(self._read(), source=path)  # raises at start-up

    def _read(self) -> str:
        try:
            return Path(self.path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TokenFileError(f"token file '{self.path}': {err}") from err

    def __len__(self) -> int:
        return len(self._tokens)

    def authenticate_token(self, token: str) -> UserInfo | None:
        return self._tokens.get(token)

    def reload(self) -> None:
        try:
            tokens = parse_token_csv(self._read(), source=self.path)
        except TokenFileError as err:
            log.warning("token file not reloaded, keeping the previous tokens", extra=fields(reason=str(err)))
            return
        self._tokens = tokens
        log.info("token file reloaded", extra=fields(file=self.path, tokens=len(tokens)))

    async def start(self) -> None:
        self._watcher.start()

    async def stop(self) -> None:
        await self._watcher.stop()
