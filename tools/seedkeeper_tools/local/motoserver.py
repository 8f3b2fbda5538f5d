"""An embedded moto server whose requests are atomic and, given credentials, signed.

DynamoDB applies each conditional write atomically. moto's backends check a condition and
then write without taking a lock, so under threads that atomicity would rest on when the
interpreter happens to switch threads. This server handles one request at a time: requests
still interleave freely, and each one is atomic, the guarantee the lifecycle module relies on.

moto itself takes any request. Given credentials, the server answers only what DynamoDB
and R2 would: requests SigV4-signed with them, in the Authorization header or as a
presigned URL (the local stack's store is on a loopback port its slot sandboxes can find).
Given read-only credentials too, it takes those as R2 takes an Object Read token: for
reading an object (GET, HEAD), never for a write, a delete or anything of the bucket's, and
never for DynamoDB.
The body is read and checked before the one-at-a-time lock is taken, so a client that
stalls or sends too much holds up only itself.

Given an interval, it also does what DynamoDB's TTL does: it deletes the items whose TTL
attribute has passed. Nothing of a request outlives it but its effect on the data: moto's
dashboard would keep every item it ever built.

`python -m seedkeeper_tools.local.motoserver` is the local stack's store process (`main`),
where moto also does less work per request (`make_moto_cheaper`), as it does in the tests.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from http import HTTPStatus
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from moto.core.model_instances import reset_model_data
from moto.dynamodb.comparisons import ConditionExpressionParser
from moto.dynamodb.models import DynamoDBBackend, dynamodb_backends
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.exceptions import HTTPException
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wsgi import get_input_stream

from seedkeeper.domain.checkpoints import MAX_CHECKPOINT_BYTES
from seedkeeper.observability import logger
from seedkeeper_tools.local.principals import LocalCredentials
from seedkeeper_tools.local.sigv4 import (
    QUERY_CREDENTIALS,
    S3,
    signed_scope,
    signing_key_id,
    verify,
    verify_presigned,
)

R2_REGION = "auto"  # R2 has one region, the one seedkeeper.adapters.r2 signs for
# The stack's R2 parts are 16 MiB, and DynamoDB takes requests of at most 16 MB.
MAX_BODY = 64 * 1024 * 1024
# A presigned PUT (a slot task's checkpoint) is one object of up to S3's and R2's single
# PUT limit; it is spooled to a file past MAX_BODY rather than held in memory.
MAX_PRESIGNED_BODY = MAX_CHECKPOINT_BYTES
_SPOOL_CHUNK = 1024 * 1024
# A client that stops sending for this long has its connection closed.
REQUEST_TIMEOUT = 30.0
# What each refusal is called, as S3 names it.
_ERROR_CODES = {
    HTTPStatus.FORBIDDEN: "AccessDenied",
    HTTPStatus.BAD_REQUEST: "IncompleteBody",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "EntityTooLarge",
}
_RAW_HEADERS = "seedkeeper.raw_headers"
# The transaction the store is running: moto copies each table it names, to roll it back.
_TRANSACTION: ContextVar[list[dict[str, Any]] | None] = ContextVar("transaction", default=None)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class AtomicMotoServer:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        credentials: LocalCredentials | None = None,
        read_only: LocalCredentials | None = None,
        region: str = "us-east-1",
        expire_every: float | None = None,
    ) -> None:
        """Without credentials any request is served (the test suite's own stores); with
        them only signed ones, DynamoDB's for `region` and R2's for its one region, and with
        `read_only` ones too, object reads signed with those. With `expire_every`, expired
        items are deleted every that many seconds."""
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        app = DomainDispatcherApplication(create_backend_app)
        self._one_at_a_time = threading.Lock()

        def atomic(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            with self._one_at_a_time:
                try:
                    # Materialise the body inside the lock: the response is computed lazily.
                    return list(app(environ, start_response))
                finally:
                    # moto keeps every model it builds (each item, each transaction's copy
                    # of a table) for its dashboard: the store would grow with each request.
                    reset_model_data()

        wsgi: WsgiApp = atomic
        handler: type[MotoRequestHandler] = MotoRequestHandler
        if credentials is not None:
            wsgi = _SignedOnly(
                atomic, credentials, {"dynamodb": region, S3: R2_REGION}, read_only=read_only
            )
            handler = _BoundedRequestHandler
        self._server: BaseWSGIServer = make_server(
            host, port, wsgi, threaded=True, request_handler=handler
        )
        self._threads = [threading.Thread(target=self._server.serve_forever, daemon=True)]
        self._stopping = threading.Event()
        if expire_every is not None:
            expiring = threading.Thread(target=self._expire, args=(expire_every,), daemon=True)
            self._threads.append(expiring)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> AtomicMotoServer:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join()

    def _expire(self, every: float) -> None:
        while not self._stopping.wait(every):
            with self._one_at_a_time:
                expire_items(time.time())


def expire_items(now: float) -> None:
    """Deletes what DynamoDB's TTL deletes, in every table whose TTL is enabled: each item
    whose TTL attribute is a Number (epoch seconds) before `now`; an attribute of any other
    type is ignored, as DynamoDB ignores it."""
    backends = (backend for regions in dynamodb_backends.values() for backend in regions.values())
    for backend in backends:
        for table in backend.tables.values():
            if table.ttl.get("TimeToLiveStatus") != "ENABLED":
                continue
            attribute = table.ttl["AttributeName"]
            for item in table.all_items():
                expires = item.attrs.get(attribute)
                if expires is not None and expires.type == "N" and float(expires.value) < now:
                    table.delete_item(item.hash_key, item.range_key)


@functools.cache  # once per process: a second call would wrap moto's methods again
def make_moto_cheaper() -> None:
    """The store's per-request work, cut where moto repeats itself: each request's
    condition was lexed and parsed twice, and each transaction copied whole tables. Each
    change keeps what moto answers.

    It changes moto's classes for the whole process: the local stack's store process, and
    the test suite's processes, whose moto is the local stack's."""
    _lex_each_condition_once()
    _parse_each_condition_once_per_request()
    _copy_only_what_transactions_touch()


def _lex_each_condition_once() -> None:
    """A condition's tokens depend on its text alone, and the stack sends a few dozen texts:
    each is lexed once (lexing was most of parsing)."""
    lex = ConditionExpressionParser._lex_condition_expression

    @functools.lru_cache(maxsize=256)
    def lexed(expression: str) -> tuple[Any, ...]:
        return tuple(lex(ConditionExpressionParser(expression, None, None)))

    def lex_once(parser: ConditionExpressionParser) -> deque[Any]:
        assert parser.condition_expression is not None  # parse() lexes only a condition
        return deque(lexed(parser.condition_expression))

    ConditionExpressionParser._lex_condition_expression = lex_once  # type: ignore[method-assign,assignment]


def _parse_each_condition_once_per_request() -> None:
    """An update's condition is parsed to check its names and values are used, then again
    to apply it: the second parse, of the same condition, names and values, reuses the
    first's tree and what it found. One is kept per thread: the server runs each request on
    a thread of its own, and an in-process mock_aws may serve several threads at once."""
    parse = ConditionExpressionParser.parse
    kept = threading.local()

    def parse_once(parser: ConditionExpressionParser) -> Any:
        # what was asked, the tree, the names and values it found
        last: dict[str, Any] = kept.__dict__
        asked = copy.deepcopy(
            (
                parser.condition_expression,
                parser.expression_attribute_names,
                parser.expression_attribute_values,
            )
        )
        if last.get("asked") != asked:
            tree = parse(parser)
            last.update(
                asked=asked,
                tree=tree,
                names=list(parser.expr_attr_names_found),
                values=list(parser.expr_attr_values_found),
            )
            return tree
        parser.expr_attr_names_found.extend(last["names"])
        parser.expr_attr_values_found.extend(last["values"])
        return last["tree"]

    ConditionExpressionParser.parse = parse_once  # type: ignore[method-assign,assignment]


def _copy_only_what_transactions_touch() -> None:
    """moto rolls a failed transaction back to a deep copy of each table it names, made once
    for each of its operations: with the thousands of records a day leaves in the lifecycle
    table, every slot's birth copied the whole table twice, under the lock that makes each
    request atomic. Requests being atomic, nothing but the transaction changes a table
    meanwhile, so a copy that shares the items the transaction does not name, and copies
    those it names, rolls it back exactly as well. (Where requests are not atomic, an
    in-process mock_aws under threads, moto's own whole copy would undo other writes too.)"""
    transact = DynamoDBBackend.transact_write_items

    def transact_write_items(
        backend: DynamoDBBackend, transact_items: list[dict[str, Any]]
    ) -> None:
        running = _TRANSACTION.set(transact_items)
        try:
            transact(backend, transact_items)
        finally:
            _TRANSACTION.reset(running)

    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign,assignment]
    Table.__deepcopy__ = _copy_for_rollback  # type: ignore[attr-defined]


def _copy_for_rollback(table: Table, memo: dict[int, Any]) -> Table:
    """The table as a rollback needs it: the running transaction's items copied, the others
    shared. Outside a transaction (a backup), every item copied, as copy.deepcopy does."""
    clone = copy.copy(table)
    memo[id(table)] = clone
    transaction = _TRANSACTION.get()
    if transaction is None:
        clone.__dict__.update(copy.deepcopy(table.__dict__, memo))
        return clone
    ranged = table.range_key_attr is not None
    clone.items = defaultdict(dict)
    for hash_value, rows in table.items.items():
        clone.items[hash_value] = dict(rows) if ranged else rows
    for hash_value, range_value in _keys_named(table, transaction):
        if not ranged and hash_value in table.items:
            clone.items[hash_value] = copy.deepcopy(table.items[hash_value])
        elif ranged and range_value in table.items.get(hash_value, {}):
            item = table.items[hash_value][range_value]
            clone.items[hash_value][range_value] = copy.deepcopy(item)
    return clone


def _keys_named(
    table: Table, transaction: list[dict[str, Any]]
) -> Iterator[tuple[DynamoType, DynamoType | None]]:
    """The (hash, range) keys of `table`'s items that the transaction's operations name."""
    for operation in transaction:
        for kind, request in operation.items():
            key = request.get("Item" if kind == "Put" else "Key") or {}
            if request.get("TableName") != table.name or table.hash_key_attr not in key:
                continue
            range_value = key.get(table.range_key_attr) if table.range_key_attr else None
            yield (
                DynamoType(key[table.hash_key_attr]),
                DynamoType(range_value) if range_value is not None else None,
            )


class _BoundedRequestHandler(MotoRequestHandler):
    """Every socket read bounded; the headers kept as they arrived, since the WSGI environ
    folds repeated ones together and a signature check must see each copy."""

    timeout = REQUEST_TIMEOUT

    def make_environ(self) -> dict[str, Any]:
        environ = super().make_environ()
        environ[_RAW_HEADERS] = list(self.headers.items())
        return environ


class _SignedOnly:
    """WSGI middleware: passes on only requests signed with `credentials`, for a service
    in `regions` (service → the one region its signatures may name), or object reads signed
    with `read_only`; refuses the rest."""

    def __init__(
        self,
        app: WsgiApp,
        credentials: LocalCredentials,
        regions: Mapping[str, str],
        *,
        read_only: LocalCredentials | None = None,
    ) -> None:
        self._app = app
        self._credentials = credentials
        self._read_only = read_only
        self._regions = dict(regions)

    def _signer(
        self, key: str | None, environ: dict[str, Any], service: str
    ) -> LocalCredentials | tuple[HTTPStatus, str]:
        """The credentials the request says signed it, when they may make it: the read-only
        ones for an object's GET or HEAD on R2 alone (no query: nothing of the bucket's)."""
        if key == self._credentials.access_key:
            return self._credentials
        if self._read_only is None or key != self._read_only.access_key:
            return self._credentials  # checked as the store's, so refused as a bad signature
        path = environ.get("PATH_INFO", "")
        reads_an_object = (
            service == S3
            and environ["REQUEST_METHOD"] in {"GET", "HEAD"}
            and len([part for part in path.split("/") if part]) >= 2
            and not _bucket_query(environ)
        )
        if not reads_an_object:
            return HTTPStatus.FORBIDDEN, "read-only-token"
        return self._read_only

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        refused = self._refusal(environ)
        if refused is not None:
            status, why = refused
            logger.info("local store refused a request", why=why)
            return _refuse(environ, start_response, status)
        return self._app(environ, start_response)

    def _refusal(self, environ: dict[str, Any]) -> tuple[HTTPStatus, str] | None:
        """Why the request is refused, or None with its body read into the environ."""
        # The target exactly as sent: the decoded PATH_INFO is not what the client signed.
        target: str = environ.get("RAW_URI", "")
        if not target.startswith("/"):
            return HTTPStatus.BAD_REQUEST, "not-origin-form"
        headers: list[tuple[str, str]] = environ[_RAW_HEADERS]
        host = next((value for name, value in headers if name.lower() == "host"), "")
        url = f"http://{host}{target}"
        now = datetime.now(UTC)
        query_names = {
            unquote(pair.partition("=")[0]) for pair in urlsplit(target).query.split("&")
        }
        authorization = environ.get("HTTP_AUTHORIZATION")
        if query_names & QUERY_CREDENTIALS:
            if authorization is not None:
                return HTTPStatus.FORBIDDEN, "two-signatures"  # which one counts?
            credentials = self._signer(_presigned_key(target), environ, S3)
            if isinstance(credentials, tuple):
                return credentials
            why = verify_presigned(
                method=environ["REQUEST_METHOD"],
                url=url,
                headers=headers,
                access_key=credentials.access_key,
                secret_key=credentials.secret_key,
                region=self._regions[S3],
                now=now,
            )
            if why is not None:
                return HTTPStatus.FORBIDDEN, why
            spooled = _spool_body(environ, MAX_PRESIGNED_BODY)
            return spooled if isinstance(spooled, tuple) else None
        scope = signed_scope(authorization or "")
        if scope is None:
            return HTTPStatus.FORBIDDEN, "unsigned"
        service, _ = scope
        if service not in self._regions:
            return HTTPStatus.FORBIDDEN, "wrong-scope"
        credentials = self._signer(signing_key_id(authorization or ""), environ, service)
        if isinstance(credentials, tuple):
            return credentials
        body = _read_body(environ)
        if isinstance(body, tuple):
            return body
        why = verify(
            method=environ["REQUEST_METHOD"],
            url=url,
            headers=headers,
            body=body,
            access_key=credentials.access_key,
            secret_key=credentials.secret_key,
            region=self._regions[service],
            now=now,
            service=service,
        )
        return (HTTPStatus.FORBIDDEN, why) if why else None


def _presigned_key(target: str) -> str | None:
    """The access key a presigned URL's X-Amz-Credential names."""
    for pair in urlsplit(target).query.split("&"):
        name, _, value = pair.partition("=")
        if unquote(name) == "X-Amz-Credential":
            return unquote(value).split("/", 1)[0]
    return None


def _bucket_query(environ: dict[str, Any]) -> bool:
    """Whether the request asks for something of the bucket's (a subresource such as
    `?lifecycle`, `?acl`, `?uploads`), not the object's bytes: any query name that is not a
    presigned URL's own."""
    names = {
        unquote(pair.partition("=")[0])
        for pair in urlsplit(environ.get("RAW_URI", "")).query.split("&")
        if pair
    }
    return bool(names - QUERY_CREDENTIALS - {"x-id"})


def _read_body(environ: dict[str, Any]) -> bytes | tuple[HTTPStatus, str]:
    """The whole body (at most MAX_BODY, which a signature covers), put back in the environ
    for moto to read again; or why it could not be read."""
    spooled = _spool_body(environ, MAX_BODY)
    if isinstance(spooled, tuple):
        return spooled
    body = spooled.read()
    spooled.seek(0)
    return body


def _spool_body(environ: dict[str, Any], limit: int) -> IO[bytes] | tuple[HTTPStatus, str]:
    """The whole body (at most `limit`), read before moto's one-at-a-time lock is taken
    (a slow client never holds it) and put back in the environ, in memory up to MAX_BODY
    and in a file past it; or why it could not be read."""
    spool = tempfile.SpooledTemporaryFile(max_size=MAX_BODY)  # noqa: SIM115 - moto reads it
    try:
        stream = get_input_stream(environ, max_content_length=limit)
        while chunk := stream.read(_SPOOL_CHUNK):
            spool.write(chunk)
    except HTTPException as framing:  # too large, or the client went away mid-body
        spool.close()
        if framing.code == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:
            return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body-too-large"
        return HTTPStatus.BAD_REQUEST, "incomplete-body"
    except OSError:  # the client stalled past the timeout
        spool.close()
        return HTTPStatus.BAD_REQUEST, "incomplete-body"
    environ["CONTENT_LENGTH"] = str(spool.tell())
    spool.seek(0)
    environ["wsgi.input"] = spool
    return spool


def _refuse(
    environ: dict[str, Any], start_response: Callable[..., Any], status: HTTPStatus
) -> list[bytes]:
    """A refusal in the protocol of the service asked: DynamoDB's JSON, else S3's XML."""
    code = _ERROR_CODES[status]
    if "HTTP_X_AMZ_TARGET" in environ:
        content_type = "application/x-amz-json-1.0"
        body = json.dumps({"__type": code, "message": status.phrase}).encode()
    else:
        content_type = "application/xml"
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{status.phrase}</Message></Error>"
        ).encode()
    start_response(
        f"{status.value} {status.phrase}",
        [("Content-Type", content_type), ("Content-Length", str(len(body)))],
    )
    return [] if environ["REQUEST_METHOD"] == "HEAD" else [body]


def main() -> None:
    """The local stack's store process. Its settings come on stdin, one JSON object (the
    store's keys are never in an argument: any user can read those); it writes its endpoint
    to the descriptor its one argument names, and closes it; it serves until stdin closes,
    as it does when the stack stops or dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the stack's to act on
    settings = json.loads(sys.stdin.readline())
    make_moto_cheaper()
    read_only = settings.get("read_only")
    server = AtomicMotoServer(
        credentials=LocalCredentials(settings["access_key"], settings["secret_key"]),
        read_only=LocalCredentials(read_only["access_key"], read_only["secret_key"])
        if read_only
        else None,
        region=settings["region"],
        expire_every=settings["expire_every"],
    ).start()
    with os.fdopen(int(sys.argv[1]), "w") as ready:
        ready.write(server.endpoint)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
