"""Bearer tokens: the static token file and TokenReview (cached, coalesced, never logged or kept)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import aiohttp
import pytest

from aggregator.auth.tokenfile import TokenFile, TokenFileError, parse_token_csv
from aggregator.auth.tokenreview import TokenReviewAuthenticator
from aggregator.model.userinfo import UserInfo
from tests.auth.conftest import Reviewed, StartReviewed, add_test_routes
from tests.conftest import StartGateway
from tests.support.pki import PKI
from tests.support.polling import until, until_async

UNAUTHORIZED = (
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
    b'"reason":"Unauthorized","code":401}\n'
)
SECRET = "s3cr3t-token-value-0123456789"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- the token file ----------------------------------------------------------------------------------


def test_token_csv_format(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    tokens = parse_token_csv(
        'tok1,alice,uid-1,"devs,ops"\n'
        "\n"
        "tok2,bob,uid-2\n"
        ",nobody,uid-3\n"
        "tok1,alice2,uid-4,solo,ignored-column\n",
        source="tokens.csv",
    )
    assert tokens == {
        "tok1": UserInfo("alice2", "uid-4", ("solo",)),
        "tok2": UserInfo("bob", "uid-2", ()),
    }
    messages = [r.getMessage() for r in caplog.records]
    assert "empty token has been found in token file" in messages
    assert "duplicate token has been found in token file" in messages
    assert all("tok1" not in str(getattr(r, "fields", "")) for r in caplog.records)


def test_token_csv_errors_name_the_problem_not_the_token() -> None:
    with pytest.raises(
        TokenFileError, match=r"must have at least 3 columns \(token, user name, user uid\), found 2"
    ):
        parse_token_csv("tok1,alice\n", source="tokens.csv")
    with pytest.raises(TokenFileError, match=r"tokens\.csv") as err:
        parse_token_csv('tok1,"alice\n', source="tokens.csv")
    assert "tok1" not in str(err.value)


async def test_token_file_users_and_bad_tokens(start_gateway: StartGateway, pki: PKI, tmp_path: Path) -> None:
    csv_file = tmp_path / "tokens.csv"
    csv_file.write_text(f'{SECRET},carol,uid-c,"devs,ops"\n')
    server = await start_gateway(token_auth_file=str(csv_file))
    add_test_routes(server)
    assert f"bearer tokens (file {csv_file})" in server.gateway.auth_summary
    async with aiohttp.ClientSession() as session:

        async def call(token: str) -> tuple[int, bytes]:
            async with session.get(
                server.url + "/whoami", ssl=pki.client_context(None), headers=bearer(token)
            ) as r:
                return r.status, await r.read()

        status, body = await call(SECRET)
        assert (status, json.loads(body)) == (
            200,
            {"name": "carol", "groups": ["devs", "ops", "system:authenticated"]},
        )
        assert await call("wrong-token") == (401, UNAUTHORIZED)

        # the file is re-read on change: the old token stops working, the new one starts
        csv_file.write_text("newtoken,dave,uid-d\n")

        async def new_token_works() -> bool:
            return (await call("newtoken"))[0] == 200

        await until_async(new_token_works, what="the new token file in force")
        assert json.loads((await call("newtoken"))[1])["name"] == "dave"
        assert await call(SECRET) == (401, UNAUTHORIZED)


async def test_broken_token_file_keeps_the_previous_tokens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    csv_file = tmp_path / "tokens.csv"
    csv_file.write_text("tok,alice,1\n")
    tokens = TokenFile(str(csv_file))
    csv_file.write_text("just-one-column\n")
    caplog.set_level(logging.WARNING)
    tokens.reload()
    assert tokens.authenticate_token("tok") == UserInfo("alice", "1")
    assert "token file not reloaded, keeping the previous tokens" in caplog.text
    csv_file.write_text("tok\n")
    with pytest.raises(TokenFileError):
        TokenFile(str(csv_file))


# --- TokenReview -------------------------------------------------------------------------------------


def token_authenticator(reviewed: Reviewed) -> TokenReviewAuthenticator:
    authenticator = reviewed.server.gateway.authenticator
    assert authenticator is not None
    found = [t for t in authenticator.tokens if isinstance(t, TokenReviewAuthenticator)]
    assert len(found) == 1
    return found[0]


async def wait_for_authn_misses(reviewed: Reviewed, count: float) -> None:
    await until(
        lambda: reviewed.metric("aggregator_authentication_cache_total", result="miss") >= count,
        what=f"{count:g} authentication cache misses",
    )


async def test_token_review_user_reaches_the_request(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    reviewed.reviews.add_user(SECRET, "erin", uid="u-1", groups=("qa",), extra={"scopes": ["a", "b"]})
    status, body = await reviewed.call("/whoami", cert=None, headers=bearer(SECRET))
    assert (status, json.loads(body)) == (200, {"name": "erin", "groups": ["qa", "system:authenticated"]})
    assert reviewed.reviews.token_reviews == [{"token": SECRET}]
    # and that user is the one authorized
    assert reviewed.reviews.access_reviews[-1]["user"] == "erin"
    assert reviewed.reviews.access_reviews[-1]["extra"] == {"scopes": ["a", "b"]}
    assert reviewed.reviews.access_reviews[-1]["uid"] == "u-1"


async def test_concurrent_identical_tokens_make_one_review_cached_for_the_ttl(
    start_reviewed: StartReviewed,
) -> None:
    ttl = 5.0  # long enough for the second burst to land inside it on a loaded machine
    reviewed = await start_reviewed(authentication_token_webhook_cache_ttl=ttl)
    reviewed.reviews.add_user(SECRET, "erin")
    reviewed.reviews.hold()
    first = asyncio.gather(*(reviewed.call("/whoami", cert=None, headers=bearer(SECRET)) for _ in range(100)))
    await wait_for_authn_misses(reviewed, 100)
    await reviewed.reviews.wait_for_waiting(1)  # the review's task has started and reached the fake
    assert reviewed.metric("aggregator_webhook_reviews_in_flight", kind="tokenreview") == 1
    reviewed.reviews.release()
    assert [s for s, _ in await first] == [200] * 100
    reviewed_at = time.monotonic()
    assert len(reviewed.reviews.token_reviews) == 1

    second = await asyncio.gather(
        *(reviewed.call("/whoami", cert=None, headers=bearer(SECRET)) for _ in range(100))
    )
    assert [s for s, _ in second] == [200] * 100
    assert time.monotonic() - reviewed_at < ttl, "second burst must land inside the TTL for this test"
    assert len(reviewed.reviews.token_reviews) == 1
    assert reviewed.metric("aggregator_authentication_cache_total", result="hit") == 100

    # the TTL itself must pass for the cached review to expire: time, not an event
    await asyncio.sleep(max(0.0, ttl + 0.05 - (time.monotonic() - reviewed_at)))
    assert (await reviewed.call("/whoami", cert=None, headers=bearer(SECRET)))[0] == 200
    assert len(reviewed.reviews.token_reviews) == 2


async def test_rejected_token_is_401_and_cached(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    assert await reviewed.call("/whoami", cert=None, headers=bearer("unknown")) == (401, UNAUTHORIZED)
    assert await reviewed.call("/whoami", cert=None, headers=bearer("unknown")) == (401, UNAUTHORIZED)
    assert len(reviewed.reviews.token_reviews) == 1


async def test_rejection_with_an_error_is_401_and_not_cached(
    start_reviewed: StartReviewed, caplog: pytest.LogCaptureFixture
) -> None:
    reviewed = await start_reviewed()
    reviewed.reviews.token_errors["expired"] = "[invalid bearer token, token has expired]"
    caplog.set_level(logging.INFO, logger="aggregator.auth.authn")
    assert await reviewed.call("/whoami", cert=None, headers=bearer("expired")) == (401, UNAUTHORIZED)
    assert await reviewed.call("/whoami", cert=None, headers=bearer("expired")) == (401, UNAUTHORIZED)
    assert len(reviewed.reviews.token_reviews) == 2
    reasons = [str(getattr(r, "fields", {}).get("reason", "")) for r in caplog.records]
    assert reasons == ["bearer token: [invalid bearer token, token has expired]"] * 2


async def test_failed_token_review_is_401_and_the_next_request_reviews_again(
    start_reviewed: StartReviewed,
) -> None:
    reviewed = await start_reviewed()
    reviewed.reviews.add_user(SECRET, "erin")
    reviewed.reviews.fail_with(403, "Forbidden", "cannot create tokenreviews")
    assert await reviewed.call("/whoami", cert=None, headers=bearer(SECRET)) == (401, UNAUTHORIZED)
    reviewed.reviews.recover()
    assert (await reviewed.call("/whoami", cert=None, headers=bearer(SECRET)))[0] == 200
    assert len(reviewed.reviews.token_reviews) == 2


async def test_the_token_is_never_logged_or_kept(
    start_reviewed: StartReviewed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    reviewed = await start_reviewed()
    reviewed.reviews.add_user(SECRET, "erin")
    reviewed.reviews.token_errors["other-" + SECRET] = "token lookup failed"
    assert (await reviewed.call("/whoami", cert=None, headers=bearer(SECRET)))[0] == 200
    assert (await reviewed.call("/whoami", cert=None, headers=bearer("other-" + SECRET)))[0] == 401
    reviewed.reviews.fail_with(403, "Forbidden", "nope")
    assert (await reviewed.call("/whoami", cert=None, headers=bearer("third-" + SECRET)))[0] == 401
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in json.dumps(getattr(record, "fields", {}), default=str)
    keys = token_authenticator(reviewed).cached_keys()
    assert len(keys) == 1
    assert all(len(k) == 32 and SECRET.encode() not in k for k in keys)
    status, metrics = await reviewed.call("/metrics", cert="admin")
    assert status == 200 and SECRET.encode() not in metrics


# --- --api-audiences ---------------------------------------------------------------------------------

AUDIENCES = ["https://gateway.example", "aggregator"]


async def test_api_audiences_are_sent_and_the_answer_must_name_one(
    start_reviewed: StartReviewed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aggregator.auth")
    reviewed = await start_reviewed(api_audiences=AUDIENCES)
    assert "bearer tokens (TokenReview, cached 10s, audiences https://gateway.example,aggregator)" in (
        reviewed.server.gateway.auth_summary
    )
    reviewed.reviews.add_user("for-us", "erin", audiences=["aggregator", "other"])
    reviewed.reviews.add_user("implicit", "frank")  # no audiences in the answer: the API audiences
    reviewed.reviews.add_user("for-someone-else", "mallory", audiences=["https://vault.example"])

    status, body = await reviewed.call("/whoami", cert=None, headers=bearer("for-us"))
    assert (status, json.loads(body)["name"]) == (200, "erin")
    assert reviewed.reviews.token_reviews[-1] == {"token": "for-us", "audiences": AUDIENCES}
    assert (await reviewed.call("/whoami", cert=None, headers=bearer("implicit")))[0] == 200

    # Authenticated by the reviewer, but not for this gateway: 401, and cached like any rejection.
    for _ in range(2):
        assert await reviewed.call("/whoami", cert=None, headers=bearer("for-someone-else")) == (
            401,
            UNAUTHORIZED,
        )
    assert [r["token"] for r in reviewed.reviews.token_reviews].count("for-someone-else") == 1
    (line,) = [r for r in caplog.records if r.getMessage().startswith("token rejected")]
    assert getattr(line, "fields", {})["audiences"] == "https://vault.example"


async def test_audiences_are_checked_before_the_answers_error(start_reviewed: StartReviewed) -> None:
    """Upstream decides the audiences first: a non-matching answer is a plain (cached) rejection."""
    reviewed = await start_reviewed(api_audiences=AUDIENCES)
    reviewed.reviews.token_errors["expired"] = "token has expired"
    reviewed.reviews.token_errors["expired-elsewhere"] = "token has expired"
    reviewed.reviews.token_audiences["expired-elsewhere"] = ["https://vault.example"]
    for token, reviews in (("expired", 2), ("expired-elsewhere", 1)):
        for _ in range(2):
            assert (await reviewed.call("/whoami", cert=None, headers=bearer(token)))[0] == 401
        # an error is never cached; an answer for other audiences is a rejection, cached
        assert [r["token"] for r in reviewed.reviews.token_reviews].count(token) == reviews


async def test_the_cache_key_covers_the_audiences(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed(api_audiences=AUDIENCES)
    authenticator = token_authenticator(reviewed)
    other = TokenReviewAuthenticator(
        authenticator.webhook,
        ttl=10,
        metrics=reviewed.server.gateway.metrics.auth,
        audiences=("aggregator",),
    )
    other._hmac_key = authenticator._hmac_key
    assert other.cache_key(SECRET) != authenticator.cache_key(SECRET)
    other.audiences = tuple(AUDIENCES)
    assert other.cache_key(SECRET) == authenticator.cache_key(SECRET)
