"""The R2 adapter offline: settings, transfer mode, presigned URLs checked against an
independent SigV4 computation, and the exact requests behind delete, head and lifecycle."""

from __future__ import annotations

import hashlib
import hmac
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlsplit

import boto3
import pytest
from aws_lambda_powertools.utilities.parameters.exceptions import (
    GetParameterError,
    TransformParameterError,
)
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.stub import Stubber
from pydantic import SecretStr, ValidationError

from seedkeeper.adapters import aws
from seedkeeper.adapters import r2 as r2_module
from seedkeeper.adapters.r2 import (
    R2,
    DeleteReport,
    ObjectFacts,
    R2Settings,
    TransferMode,
    backup_key,
    transfer_mode,
)
from seedkeeper.errors import R2Unavailable, R2Unconfigured, translate_r2_error

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

ACCOUNT = "0123456789abcdef0123456789abcdef"
ENDPOINT = f"https://{ACCOUNT}.r2.cloudflarestorage.com"
BUCKET = "seedkeeper-backups"
ACCESS_KEY = "AKIDR2EXAMPLEKEY"
SECRET_KEY = "r2-secret-access-key-example"  # noqa: S105 - a fake
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:r2-keys-AbCdEf"  # noqa: S105 - a name
KEY = "backups/snap-1.sqsh"


@pytest.fixture
def client() -> S3Client:
    """R2's client configuration, without retries so a connection failure surfaces at once."""
    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        region_name="auto",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=aws.R2.config()
        .merge(aws.R2_DIALECT)
        .merge(Config(retries={"total_max_attempts": 1})),
    )


@pytest.fixture
def stub(client: S3Client) -> Iterator[Stubber]:
    with Stubber(client) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


@pytest.fixture
def r2(client: S3Client) -> R2:
    return R2(client, BUCKET)


def configured(**overrides: Any) -> R2Settings:
    fields: dict[str, Any] = {
        "bucket": BUCKET,
        "account_id": ACCOUNT,
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
    }
    return R2Settings(**{**fields, **overrides})


# --- backup keys -------------------------------------------------------------------------


def test_backup_key_puts_the_archive_under_the_backup_prefix() -> None:
    assert (
        backup_key("res-checkout-0123456789ab-cafe")
        == "backups/res-checkout-0123456789ab-cafe.sqsh"
    )


@pytest.mark.parametrize("backup_id", ["", "../x", "a/b", ".hidden", "-opt", "x\n", "é", "x" * 129])
def test_backup_key_refuses_anything_but_an_identifier(backup_id: str) -> None:
    with pytest.raises(ValueError, match="not a backup id"):
        backup_key(backup_id)


# --- settings and transfer mode ----------------------------------------------------------

# Each dimension: its settings, and whether they leave that requirement missing.
BUCKETS: dict[str, tuple[dict[str, Any], bool]] = {
    "no bucket": ({}, True),
    "bucket": ({"bucket": BUCKET}, False),
}
LOCATIONS: dict[str, tuple[dict[str, Any], bool]] = {
    "no location": ({}, True),
    "account": ({"account_id": ACCOUNT}, False),
    "endpoint": ({"endpoint": "http://127.0.0.1:5000"}, False),
    "account and endpoint": ({"account_id": ACCOUNT, "endpoint": "http://127.0.0.1:5000"}, False),
}
CREDENTIALS: dict[str, tuple[dict[str, Any], bool]] = {
    "no credentials": ({}, True),
    "access key only": ({"access_key_id": ACCESS_KEY}, True),
    "secret key only": ({"secret_access_key": SECRET_KEY}, True),
    "both keys": ({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}, False),
    "secret arn": ({"secret_arn": SECRET_ARN}, False),
    "secret arn and one key": ({"secret_arn": SECRET_ARN, "access_key_id": ACCESS_KEY}, False),
}


@pytest.mark.parametrize(
    ("bucket", "location", "credentials"),
    list(itertools.product(BUCKETS, LOCATIONS, CREDENTIALS)),
)
def test_transfer_mode_names_every_missing_setting(
    bucket: str, location: str, credentials: str
) -> None:
    (bucket_fields, no_bucket) = BUCKETS[bucket]
    (location_fields, no_location) = LOCATIONS[location]
    (credential_fields, no_credentials) = CREDENTIALS[credentials]
    settings = R2Settings(**bucket_fields, **location_fields, **credential_fields)

    mode = transfer_mode(settings)

    expected = tuple(
        name
        for name, absent in [
            ("bucket", no_bucket),
            ("account_id or endpoint", no_location),
            ("credentials", no_credentials),
        ]
        if absent
    )
    assert mode == TransferMode("unconfigured" if expected else "presigned", expected)


def test_settings_come_from_the_environment_and_an_empty_variable_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SEEDKEEPER_R2_BUCKET", BUCKET)
    monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", "http://127.0.0.1:5000")
    monkeypatch.setenv("SEEDKEEPER_R2_SECRET_ARN", SECRET_ARN)
    monkeypatch.setenv("SEEDKEEPER_R2_ACCOUNT_ID", "")
    monkeypatch.setenv("SEEDKEEPER_R2_PRESIGN_EXPIRY", "3600")

    settings = R2Settings()

    assert (settings.bucket, settings.endpoint, settings.secret_arn) == (
        BUCKET,
        "http://127.0.0.1:5000",
        SECRET_ARN,
    )
    assert settings.account_id is None
    assert settings.presign_expiry == 3600
    assert transfer_mode(settings) == TransferMode("presigned", ())


@pytest.mark.parametrize("expiry", [0, -1, 604801])
def test_a_presign_expiry_outside_r2s_limit_is_refused_naming_the_field(expiry: int) -> None:
    with pytest.raises(ValidationError) as raised:
        R2Settings(presign_expiry=expiry)
    assert [error["loc"] for error in raised.value.errors()] == [("presign_expiry",)]


@pytest.mark.parametrize("expiry", [1, 900, 604800])
def test_a_presign_expiry_within_the_limit_is_kept(expiry: int) -> None:
    assert R2Settings(presign_expiry=expiry).presign_expiry == expiry


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("bucket", "Upper-Case"),
        ("bucket", "ab"),
        ("bucket", "-leading-hyphen"),
        ("account_id", "not-an-account"),
        ("account_id", "evil.example.com/"),
        ("endpoint", "ftp://127.0.0.1"),
        ("endpoint", "http://user:password@127.0.0.1"),
        ("endpoint", "http://127.0.0.1:5000/path"),
        ("access_key_id", ""),
        ("secret_access_key", ""),
        ("secret_arn", ""),
    ],
)
def test_malformed_settings_are_refused_naming_the_field(field: str, value: str) -> None:
    fields: dict[str, Any] = {field: value}
    with pytest.raises(ValidationError) as raised:
        R2Settings(**fields)
    assert [error["loc"] for error in raised.value.errors()] == [(field,)]


def test_settings_are_immutable() -> None:
    settings = configured()
    with pytest.raises(ValidationError):
        settings.bucket = "another-bucket"  # type: ignore[misc]


def test_secrets_never_appear_in_the_settings_repr_str_or_json() -> None:
    settings = configured(secret_arn=None)
    for shown in (repr(settings), str(settings), settings.model_dump_json()):
        assert ACCESS_KEY not in shown
        assert SECRET_KEY not in shown


def test_a_validation_error_beside_secrets_does_not_quote_them() -> None:
    with pytest.raises(ValidationError) as raised:
        configured(presign_expiry=0)
    assert ACCESS_KEY not in str(raised.value)
    assert SECRET_KEY not in str(raised.value)


# --- building the client -----------------------------------------------------------------


def test_from_settings_refuses_an_unconfigured_target_naming_what_is_missing() -> None:
    with pytest.raises(R2Unconfigured) as raised:
        R2.from_settings(R2Settings(access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY))
    assert raised.value.missing == ("bucket", "account_id or endpoint")
    assert str(raised.value) == "R2 is not configured: missing bucket, account_id or endpoint"


def credential_of(url: str) -> str:
    return dict(parse_qsl(urlsplit(url).query))["X-Amz-Credential"].split("/")[0]


def test_from_settings_takes_the_keys_from_the_secret_when_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, str]] = []

    def get_secret(name: str, transform: str) -> dict[str, str]:
        asked.append((name, transform))
        return {"access_key_id": "AKIDFROMSECRET", "secret_access_key": "from-secret"}

    monkeypatch.setattr(r2_module, "get_secret", get_secret)

    r2 = R2.from_settings(configured(secret_arn=SECRET_ARN))

    assert credential_of(r2.presign_get(KEY, 60)) == "AKIDFROMSECRET"
    assert asked == [(SECRET_ARN, "json")]


def test_from_settings_uses_the_static_keys_without_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(r2_module, "get_secret", pytest.fail)
    assert credential_of(R2.from_settings(configured()).presign_get(KEY, 60)) == ACCESS_KEY


@pytest.mark.parametrize(
    "secret",
    [
        {"access_key_id": ACCESS_KEY},
        {"access_key_id": ACCESS_KEY, "secret_access_key": ""},
        {"access_key_id": 12345, "secret_access_key": SECRET_KEY},
        [ACCESS_KEY, SECRET_KEY],
    ],
)
def test_a_secret_without_both_keys_leaves_r2_unconfigured_without_quoting_it(
    monkeypatch: pytest.MonkeyPatch, secret: object
) -> None:
    monkeypatch.setattr(r2_module, "get_secret", lambda name, transform: secret)
    with pytest.raises(R2Unconfigured) as raised:
        R2.from_settings(configured(secret_arn=SECRET_ARN)).presign_get(KEY, 60)
    assert raised.value.missing == ("credentials",)
    assert ACCESS_KEY not in str(raised.value)
    assert SECRET_KEY not in str(raised.value)


def test_a_secret_that_is_not_json_leaves_r2_unconfigured_and_drops_the_parse_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def get_secret(name: str, transform: str) -> object:
        raise TransformParameterError("Expecting value") from ValueError(SECRET_KEY)

    monkeypatch.setattr(r2_module, "get_secret", get_secret)
    with pytest.raises(R2Unconfigured) as raised:
        R2.from_settings(configured(secret_arn=SECRET_ARN)).presign_get(KEY, 60)
    assert raised.value.missing == ("credentials",)
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__


def test_an_unreadable_secret_is_r2_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def get_secret(name: str, transform: str) -> object:
        raise GetParameterError("AccessDeniedException")

    monkeypatch.setattr(r2_module, "get_secret", get_secret)
    with pytest.raises(R2Unavailable) as raised:
        R2.from_settings(configured(secret_arn=SECRET_ARN)).head(KEY)
    assert raised.value.code == "SecretUnreadable"
    assert isinstance(raised.value.__cause__, GetParameterError)


def test_the_secret_is_read_and_the_client_built_when_an_operation_first_needs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A function's request that touches no object (a seed's poll) reads no secret and
    builds no client; one that does builds them once; a failed read is not kept."""
    asked: list[str] = []

    def get_secret(name: str, transform: str) -> object:
        asked.append(name)
        if len(asked) == 1:
            raise GetParameterError("ThrottlingException")
        return {"access_key_id": "AKIDFROMSECRET", "secret_access_key": "from-secret"}

    built: list[str] = []
    build = r2_module._s3_client

    def s3_client(*args: Any, **kwargs: Any) -> Any:
        built.append(args[0])
        return build(*args, **kwargs)

    monkeypatch.setattr(r2_module, "get_secret", get_secret)
    monkeypatch.setattr(r2_module, "_s3_client", s3_client)

    r2 = R2.from_settings(configured(secret_arn=SECRET_ARN))
    assert (asked, built) == ([], [])
    with pytest.raises(R2Unavailable):
        r2.presign_get(KEY, 60)
    assert (asked, built) == ([SECRET_ARN], [])

    assert credential_of(r2.presign_get(KEY, 60)) == "AKIDFROMSECRET"
    assert credential_of(r2.presign_head(KEY, 60)) == "AKIDFROMSECRET"
    assert (asked, built) == ([SECRET_ARN, SECRET_ARN], [ENDPOINT])


def test_the_client_speaks_r2s_dialect() -> None:
    s3 = r2_module._s3_client(ENDPOINT, SecretStr(ACCESS_KEY), SecretStr(SECRET_KEY))
    config: Any = s3.meta.config  # botocore's stubs do not declare the options
    assert s3.meta.endpoint_url == ENDPOINT
    assert s3.meta.region_name == "auto"
    assert config.signature_version == "s3v4"
    assert config.s3 == {"addressing_style": "path"}
    assert config.request_checksum_calculation == "when_required"
    assert config.response_checksum_validation == "when_required"


def test_a_chunk_smaller_than_r2s_minimum_part_is_refused(client: S3Client) -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        R2(client, BUCKET, chunk_size=5 * 1024 * 1024 - 1)


# --- presigned URLs ----------------------------------------------------------------------


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def sigv4_query_signature(method: str, url: str, secret_key: str) -> str:
    """SigV4 for a presigned URL, computed from the AWS specification, not from botocore."""
    parts = urlsplit(url)
    fields = [(k, v) for k, v in parse_qsl(parts.query) if k != "X-Amz-Signature"]
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(fields)
    )
    canonical_request = "\n".join(
        [method, parts.path, canonical_query, f"host:{parts.netloc}\n", "host", "UNSIGNED-PAYLOAD"]
    )
    query = dict(fields)
    scope = query["X-Amz-Credential"].split("/", 1)[1]
    string_to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            query["X-Amz-Date"],
            scope,
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    key = f"AWS4{secret_key}".encode()
    for part in scope.split("/"):
        key = _hmac(key, part)
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


@pytest.mark.parametrize(("method", "expires_in"), [("GET", 1), ("GET", 900), ("HEAD", 604800)])
def test_a_presigned_url_is_path_style_and_signed_for_its_method_and_expiry(
    r2: R2, method: str, expires_in: int
) -> None:
    presign = r2.presign_get if method == "GET" else r2.presign_head

    url = presign(KEY, expires_in)

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    assert f"{parts.scheme}://{parts.netloc}" == ENDPOINT
    assert parts.path == f"/{BUCKET}/{KEY}"
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert query["X-Amz-Expires"] == str(expires_in)
    assert query["X-Amz-SignedHeaders"] == "host"
    assert (
        query["X-Amz-Credential"] == f"{ACCESS_KEY}/{query['X-Amz-Date'][:8]}/auto/s3/aws4_request"
    )
    assert query["X-Amz-Signature"] == sigv4_query_signature(method, url, SECRET_KEY)
    other = "HEAD" if method == "GET" else "GET"
    assert query["X-Amz-Signature"] != sigv4_query_signature(other, url, SECRET_KEY)


@pytest.mark.parametrize("expires_in", [0, 604801])
def test_an_expiry_r2_would_refuse_is_refused_before_signing(r2: R2, expires_in: int) -> None:
    with pytest.raises(ValueError, match="expires_in"):
        r2.presign_get(KEY, expires_in)


# --- head ----------------------------------------------------------------------------------


def test_head_returns_size_and_unquoted_etag(r2: R2, stub: Stubber) -> None:
    stub.add_response(
        "head_object",
        {"ContentLength": 42, "ETag": '"9b2cf535f27731c974343645a3985328-3"'},
        {"Bucket": BUCKET, "Key": KEY},
    )
    assert r2.head(KEY) == ObjectFacts(KEY, 42, "9b2cf535f27731c974343645a3985328-3")


@pytest.mark.parametrize(("code", "status"), [("404", 404), ("NoSuchKey", 404)])
def test_head_of_a_missing_object_is_none(r2: R2, stub: Stubber, code: str, status: int) -> None:
    stub.add_client_error("head_object", service_error_code=code, http_status_code=status)
    assert r2.head(KEY) is None


@pytest.mark.parametrize(("code", "status"), [("403", 403), ("SlowDown", 503), ("500", 500)])
def test_any_other_head_failure_is_r2_unavailable(
    r2: R2, stub: Stubber, code: str, status: int
) -> None:
    stub.add_client_error("head_object", service_error_code=code, http_status_code=status)
    with pytest.raises(R2Unavailable) as raised:
        r2.head(KEY)
    assert raised.value.code == code
    assert raised.value.__cause__ is not None


def refuse_connection(**kwargs: Any) -> None:
    raise EndpointConnectionError(endpoint_url=ENDPOINT)


def test_a_connection_failure_is_r2_unavailable_without_the_url(r2: R2, client: S3Client) -> None:
    client.meta.events.register("before-send.s3.HeadObject", refuse_connection)
    with pytest.raises(R2Unavailable) as raised:
        r2.head(KEY)
    assert raised.value.code == "EndpointConnectionError"
    assert ENDPOINT not in str(raised.value)


def test_translation_uses_the_code_never_the_message() -> None:
    error = ClientError(
        {"Error": {"Code": "InternalError", "Message": f"key {ACCESS_KEY} failed"}}, "HeadObject"
    )
    translated = translate_r2_error(error)
    assert isinstance(translated, R2Unavailable)
    assert str(translated) == "InternalError"


# --- delete --------------------------------------------------------------------------------


def batch_request(keys: list[str]) -> dict[str, Any]:
    return {"Bucket": BUCKET, "Delete": {"Objects": [{"Key": k} for k in keys], "Quiet": True}}


def test_delete_of_nothing_sends_nothing(r2: R2, stub: Stubber) -> None:
    assert r2.delete([]) == DeleteReport((), ())


def test_delete_sends_batches_of_at_most_1000_quiet_and_reports_per_key_errors(
    r2: R2, stub: Stubber
) -> None:
    keys = [f"backups/b{i:04}.sqsh" for i in range(2500)]
    stub.add_response("delete_objects", {}, batch_request(keys[:1000]))
    stub.add_response(
        "delete_objects",
        {"Errors": [{"Key": keys[1500], "Code": "AccessDenied"}]},
        batch_request(keys[1000:2000]),
    )
    stub.add_response("delete_objects", {}, batch_request(keys[2000:]))

    report = r2.delete([*keys, keys[0]])  # a repeated key is deleted once

    assert report.failed == (keys[1500],)
    assert report.deleted == tuple(key for key in keys if key != keys[1500])


def test_a_refused_batch_falls_back_to_one_deletion_per_key(r2: R2, stub: Stubber) -> None:
    keys = ["backups/a.sqsh", "backups/b.sqsh", "backups/c.sqsh"]
    stub.add_client_error(
        "delete_objects", service_error_code="NotImplemented", http_status_code=501
    )
    stub.add_response("delete_object", {}, {"Bucket": BUCKET, "Key": keys[0]})
    stub.add_client_error(
        "delete_object",
        service_error_code="InternalError",
        http_status_code=500,
        expected_params={"Bucket": BUCKET, "Key": keys[1]},
    )
    stub.add_response("delete_object", {}, {"Bucket": BUCKET, "Key": keys[2]})

    assert r2.delete(keys) == DeleteReport(deleted=(keys[0], keys[2]), failed=(keys[1],))


def test_an_unanswered_batch_is_reported_failed_without_a_thousand_retries(
    r2: R2, client: S3Client
) -> None:
    single: list[object] = []
    client.meta.events.register("before-send.s3.DeleteObjects", refuse_connection)
    client.meta.events.register("before-send.s3.DeleteObject", lambda **kw: single.append(kw))

    assert r2.delete(["backups/a.sqsh", "backups/b.sqsh"]) == DeleteReport(
        deleted=(), failed=("backups/a.sqsh", "backups/b.sqsh")
    )
    assert single == []


# --- lifecycle -----------------------------------------------------------------------------

EXPIRE = {
    "ID": "seedkeeper-backups-expire",
    "Filter": {"Prefix": "backups/"},
    "Status": "Enabled",
    "Expiration": {"Days": 365},
}
DAYS = 31  # the default park retention's checkpoint days
CHECKPOINTS = {
    "ID": "seedkeeper-checkpoints-expire",
    "Filter": {"Prefix": "checkpoints/"},
    "Status": "Enabled",
    "Expiration": {"Days": DAYS},
}
ABORT = {
    "ID": "seedkeeper-abort-incomplete-multipart",
    "Filter": {"Prefix": ""},
    "Status": "Enabled",
    "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
}
FOREIGN = {
    "ID": "Default Multipart Abort Rule",
    "Filter": {},
    "Status": "Enabled",
    "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7},
}


def given_rules(stub: Stubber, rules: list[dict[str, Any]] | None) -> None:
    if rules is None:
        stub.add_client_error(
            "get_bucket_lifecycle_configuration",
            service_error_code="NoSuchLifecycleConfiguration",
            http_status_code=404,
            expected_params={"Bucket": BUCKET},
        )
    else:
        stub.add_response(
            "get_bucket_lifecycle_configuration", {"Rules": rules}, {"Bucket": BUCKET}
        )


@pytest.mark.parametrize(
    "rules",
    [
        [EXPIRE, CHECKPOINTS, ABORT],
        [FOREIGN, ABORT, CHECKPOINTS, EXPIRE],
        # Other spellings of the same rules: a legacy top-level Prefix, an empty Filter.
        [
            {
                "ID": EXPIRE["ID"],
                "Prefix": "backups/",
                "Status": "Enabled",
                "Expiration": {"Days": 365},
            },
            {**ABORT, "Filter": {}},
            CHECKPOINTS,
        ],
    ],
)
def test_lifecycle_with_our_rules_has_no_problems(
    r2: R2, stub: Stubber, rules: list[dict[str, Any]]
) -> None:
    given_rules(stub, rules)
    assert r2.lifecycle_problems(DAYS) == []


def test_a_bucket_without_lifecycle_lacks_our_rules(r2: R2, stub: Stubber) -> None:
    given_rules(stub, None)
    assert r2.lifecycle_problems(DAYS) == [
        "lifecycle rule seedkeeper-backups-expire is missing",
        "lifecycle rule seedkeeper-checkpoints-expire is missing",
        "lifecycle rule seedkeeper-abort-incomplete-multipart is missing",
    ]


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        (
            [{**EXPIRE, "Expiration": {"Days": 30}}, CHECKPOINTS, ABORT],
            "lifecycle rule seedkeeper-backups-expire: expiration days is 30, expected 365",
        ),
        (
            [{**EXPIRE, "Status": "Disabled"}, CHECKPOINTS, ABORT],
            "lifecycle rule seedkeeper-backups-expire: status is 'Disabled', expected 'Enabled'",
        ),
        (
            [{**EXPIRE, "Filter": {"Prefix": ""}}, CHECKPOINTS, ABORT],
            "lifecycle rule seedkeeper-backups-expire: prefix is '', expected 'backups/'",
        ),
        (
            [EXPIRE, CHECKPOINTS, {**ABORT, "Expiration": {"Days": 1}}],
            "lifecycle rule seedkeeper-abort-incomplete-multipart: expiration days is 1,"
            " expected None",
        ),
        (
            [EXPIRE, CHECKPOINTS, {**ABORT, "Filter": {"ObjectSizeGreaterThan": 1024}}],
            "lifecycle rule seedkeeper-abort-incomplete-multipart: other filter conditions is"
            " ['ObjectSizeGreaterThan'], expected []",
        ),
        (
            [EXPIRE, CHECKPOINTS, FOREIGN],
            "lifecycle rule seedkeeper-abort-incomplete-multipart is missing",
        ),
    ],
)
def test_a_missing_or_wrong_rule_is_a_problem(
    r2: R2, stub: Stubber, rules: list[dict[str, Any]], problem: str
) -> None:
    given_rules(stub, rules)
    assert r2.lifecycle_problems(DAYS) == [problem]


def test_apply_lifecycle_replaces_our_rules_by_id_and_keeps_the_others(
    r2: R2, stub: Stubber
) -> None:
    stale = {**EXPIRE, "Expiration": {"Days": 30}}
    given_rules(stub, [FOREIGN, stale])
    stub.add_response(
        "put_bucket_lifecycle_configuration",
        {},
        {
            "Bucket": BUCKET,
            "LifecycleConfiguration": {"Rules": [FOREIGN, EXPIRE, CHECKPOINTS, ABORT]},
        },
    )
    r2.apply_lifecycle(DAYS)


def test_apply_lifecycle_on_a_bare_bucket_puts_our_rules(r2: R2, stub: Stubber) -> None:
    given_rules(stub, None)
    stub.add_response(
        "put_bucket_lifecycle_configuration",
        {},
        {"Bucket": BUCKET, "LifecycleConfiguration": {"Rules": [EXPIRE, CHECKPOINTS, ABORT]}},
    )
    r2.apply_lifecycle(DAYS)


def test_a_refused_lifecycle_read_is_r2_unavailable(r2: R2, stub: Stubber) -> None:
    stub.add_client_error(
        "get_bucket_lifecycle_configuration",
        service_error_code="AccessDenied",
        http_status_code=403,
    )
    with pytest.raises(R2Unavailable) as raised:
        r2.lifecycle_problems(DAYS)
    assert raised.value.code == "AccessDenied"
