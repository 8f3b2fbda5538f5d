"""The one module that talks to R2 (Cloudflare's object store, reached through the S3 API):
it presigns, heads, deletes and uploads snapshot archives, and keeps the bucket's retention
backstop. Slot tasks never hold R2 credentials: they get presigned URLs from here.

Nothing here logs, and no error raised here carries a URL, an access key or a secret.
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import Field, SecretStr, StringConstraints
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.adapters import aws
from seedkeeper.domain.models import IDENTIFIER_PATTERN
from seedkeeper.errors import R2Unavailable, R2Unconfigured, translate_r2_error

if TYPE_CHECKING:
    from boto3.session import Session
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import LifecycleRuleOutputTypeDef, LifecycleRuleTypeDef

BACKUP_PREFIX = "backups/"

_MAX_PRESIGN_EXPIRY = 7 * 24 * 3600  # R2 refuses presigned URLs valid for longer
_MIB = 1024 * 1024
_CHUNK_SIZE = 16 * _MIB
_MIN_CHUNK_SIZE = 5 * _MIB  # S3 and R2 refuse smaller parts (except the last)
_DELETE_BATCH = 1000  # DeleteObjects takes at most this many keys

# HEAD has no body, so a missing object is a bare 404; other calls name it.
_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})

_EXPIRE_RULE_ID = "seedkeeper-backups-expire"
_CHECKPOINTS_RULE_ID = "seedkeeper-checkpoints-expire"
_ABORT_RULE_ID = "seedkeeper-abort-incomplete-multipart"
CHECKPOINT_PREFIX = "checkpoints/"


def lifecycle_rules(checkpoint_days: int) -> tuple[LifecycleRuleTypeDef, ...]:
    """The retention backstop: an archive whose deletion was owed and never happened goes
    after a year; a checkpoint once its park retention is over (`checkpoint_days`, from
    `seedkeeper.domain.checkpoints.lifecycle_days`); parts of an upload that died after a
    day."""
    return (
        {
            "ID": _EXPIRE_RULE_ID,
            "Filter": {"Prefix": BACKUP_PREFIX},
            "Status": "Enabled",
            "Expiration": {"Days": 365},
        },
        {
            "ID": _CHECKPOINTS_RULE_ID,
            "Filter": {"Prefix": CHECKPOINT_PREFIX},
            "Status": "Enabled",
            "Expiration": {"Days": checkpoint_days},
        },
        {
            "ID": _ABORT_RULE_ID,
            "Filter": {"Prefix": ""},
            "Status": "Enabled",
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
        },
    )


def backup_key(backup_id: str) -> str:
    """The object key of an archive. The id is checked here because it becomes a key."""
    if not re.fullmatch(IDENTIFIER_PATTERN, backup_id):
        raise ValueError("not a backup id")
    return f"{BACKUP_PREFIX}{backup_id}.sqsh"


class R2Settings(BaseSettings):
    """Where R2 is and whose keys reach it: an R2 token that may write (`access_key_id`,
    `secret_access_key`, or the secret `secret_arn` holding them) and a read-only one
    (`read_*`). Reads (HEAD, presigned GETs) use the read-only token when there is one, else
    the other; writes (presigned PUTs, deletes, uploads) only the one that may write. A
    function that only reads is given only the read-only token (template.yaml). Every field
    is optional: without R2 a deployment still runs, cold; `transfer_mode` names what is
    missing. An empty variable is unset."""

    model_config = SettingsConfigDict(
        env_prefix="SEEDKEEPER_R2_", extra="ignore", frozen=True, env_ignore_empty=True
    )

    bucket: (
        Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")] | None
    ) = None
    # Becomes a host name, so only what Cloudflare issues: 32 lower-case hex digits.
    account_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")] | None = None
    # Overrides the account endpoint (the local moto server): scheme and host only.
    endpoint: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/?#@]+/?$")] | None = None
    access_key_id: Annotated[SecretStr, Field(min_length=1)] | None = None
    secret_access_key: Annotated[SecretStr, Field(min_length=1)] | None = None
    # Deployed: a Secrets Manager secret, JSON {"access_key_id": ..., "secret_access_key": ...};
    # when set it is the source of the keys.
    secret_arn: Annotated[str, StringConstraints(min_length=1)] | None = None
    read_access_key_id: Annotated[SecretStr, Field(min_length=1)] | None = None
    read_secret_access_key: Annotated[SecretStr, Field(min_length=1)] | None = None
    read_secret_arn: Annotated[str, StringConstraints(min_length=1)] | None = None
    presign_expiry: int = Field(default=900, ge=1, le=_MAX_PRESIGN_EXPIRY)


@dataclass(frozen=True)
class TransferMode:
    mode: Literal["presigned", "unconfigured"]
    missing: tuple[str, ...]


@dataclass(frozen=True)
class _Keys:
    access_key_id: SecretStr
    secret_access_key: SecretStr


Credentials = _Keys | str  # a str is the ARN of the secret holding the keys


@dataclass(frozen=True)
class _Target:
    """Configured R2: the bucket, its endpoint, and each token's keys or the secret that
    holds them (at least one of the two)."""

    bucket: str
    endpoint: str
    writer: Credentials | None
    reader: Credentials | None


def _credentials(
    secret_arn: str | None, access_key_id: SecretStr | None, secret_access_key: SecretStr | None
) -> Credentials | None:
    if secret_arn:
        return secret_arn
    if access_key_id is None or secret_access_key is None:
        return None
    return _Keys(access_key_id, secret_access_key)


def _target(settings: R2Settings) -> _Target | tuple[str, ...]:
    """The configured target, or the names of the missing settings. Reads nothing remote."""
    endpoint = settings.endpoint or (
        f"https://{settings.account_id}.r2.cloudflarestorage.com" if settings.account_id else None
    )
    writer = _credentials(settings.secret_arn, settings.access_key_id, settings.secret_access_key)
    reader = _credentials(
        settings.read_secret_arn, settings.read_access_key_id, settings.read_secret_access_key
    )
    if settings.bucket is None or endpoint is None or (writer is None and reader is None):
        missing = {
            "bucket": settings.bucket is None,
            "account_id or endpoint": endpoint is None,
            "credentials": writer is None and reader is None,
        }
        return tuple(name for name, absent in missing.items() if absent)
    return _Target(settings.bucket, endpoint, writer, reader)


def transfer_mode(settings: R2Settings) -> TransferMode:
    """Whether archives can move through presigned URLs, decided from settings alone."""
    target = _target(settings)
    if isinstance(target, _Target):
        return TransferMode("presigned", ())
    return TransferMode("unconfigured", target)


def get_secret(name: str, transform: Literal["json"]) -> object:
    """Powertools' `get_secret`, read by a Secrets Manager client of the process's session
    with its budget (Powertools would build its own, with boto's defaults). Powertools'
    parameters are imported here, when a secret is first read: a request that touches no
    object (a seed's poll) never loads them."""
    from aws_lambda_powertools.utilities.parameters import SecretsProvider  # noqa: PLC0415

    secrets = SecretsProvider(boto3_client=aws.client(aws.session(), "secretsmanager"))
    return secrets.get(name, transform=transform)


def _keys_from_secret(secret_arn: str) -> _Keys:
    from aws_lambda_powertools.utilities.parameters.exceptions import (  # noqa: PLC0415
        GetParameterError,
        TransformParameterError,
    )

    try:
        value = get_secret(secret_arn, transform="json")
    except TransformParameterError:
        # Not JSON. The parse error keeps the secret's text: it must not ride along as a cause.
        raise R2Unconfigured(("credentials",)) from None
    except GetParameterError as error:
        raise R2Unavailable("SecretUnreadable") from error
    # Checked by hand: a validation error would quote the offending value.
    fields = value if isinstance(value, dict) else {}
    access_key_id, secret_access_key = fields.get("access_key_id"), fields.get("secret_access_key")
    if not (isinstance(access_key_id, str) and access_key_id):
        raise R2Unconfigured(("credentials",))
    if not (isinstance(secret_access_key, str) and secret_access_key):
        raise R2Unconfigured(("credentials",))
    return _Keys(SecretStr(access_key_id), SecretStr(secret_access_key))


def _s3_client(
    endpoint: str,
    access_key_id: SecretStr,
    secret_access_key: SecretStr,
    session: Session | None = None,
    budget: aws.Budget = aws.R2,
) -> S3Client:
    """An R2 client, from `session` (None: the process's). Explicit keys: no AWS session
    token mixes in."""
    return aws.r2_client(
        session or aws.session(),
        endpoint,
        access_key_id.get_secret_value(),
        secret_access_key.get_secret_value(),
        budget=budget,
    )


@dataclass(frozen=True)
class ObjectFacts:
    key: str
    size: int
    etag: str  # as S3 returns it, quotes stripped
    sha256: str | None = None  # hex; only when asked for and the store kept the checksum


@dataclass(frozen=True)
class PresignedPut:
    """A PUT of exactly one body: the URL and the headers its signature covers, which the
    uploader must send as they are (the store refuses a body that does not match them)."""

    url: str
    headers: dict[str, str]


@dataclass(frozen=True)
class DeleteReport:
    deleted: tuple[str, ...]  # a key that did not exist counts as deleted (S3 semantics)
    failed: tuple[str, ...]


class R2:
    """The bucket's operations, over injectable S3 clients, or what builds one when an
    operation first needs it: `client` for everything, or only for what writes when a
    read-only `reader` is given for what reads."""

    def __init__(
        self,
        client: S3Client | Callable[[], S3Client],
        bucket: str,
        *,
        reader: S3Client | Callable[[], S3Client] | None = None,
        chunk_size: int = _CHUNK_SIZE,
    ) -> None:
        if chunk_size < _MIN_CHUNK_SIZE:
            raise ValueError(f"chunk_size must be at least {_MIN_CHUNK_SIZE} bytes")
        self._client = client
        self._reader = reader
        self._bucket = bucket
        self._chunk_size = chunk_size

    @classmethod
    def from_settings(
        cls, settings: R2Settings, session: Session | None = None, *, budget: aws.Budget = aws.R2
    ) -> R2:
        """The configured bucket (R2Unconfigured at once when settings are missing). Its
        client is built from `session` (None: the process's), within the functions' budget
        unless told another (the tools'), when an operation first needs it, and the keys
        are read from the secret, when one is set, then too: a function's request that
        touches no object (a seed's poll) reads no secret and builds no client. Their
        errors (R2Unconfigured, R2Unavailable) are that operation's."""
        target = _target(settings)
        if not isinstance(target, _Target):
            raise R2Unconfigured(target)

        def connecting(credentials: Credentials | None) -> Callable[[], S3Client]:
            def connect() -> S3Client:
                if credentials is None:  # a read-only deployment asked to write
                    raise R2Unconfigured(("credentials that may write",))
                keys = (
                    credentials
                    if isinstance(credentials, _Keys)
                    else _keys_from_secret(credentials)
                )
                return _s3_client(
                    target.endpoint, keys.access_key_id, keys.secret_access_key, session, budget
                )

            return connect

        reader = connecting(target.reader) if target.reader is not None else None
        return cls(connecting(target.writer), target.bucket, reader=reader)

    @cached_property
    def _s3(self) -> S3Client:
        """The client that may write. Not cached when building fails: the next operation
        tries again."""
        client = self._client
        return client() if callable(client) else client

    @cached_property
    def _s3_reading(self) -> S3Client:
        """The read-only client, when there is one; else the one that may write."""
        reader = self._reader
        if reader is None:
            return self._s3
        return reader() if callable(reader) else reader

    def presign_get(self, key: str, expires_in: int) -> str:
        """A URL that reads the object (ranges too) without credentials until it expires."""
        return self._presign("get_object", key, expires_in)

    def presign_head(self, key: str, expires_in: int) -> str:
        """A URL for HEAD only: the signature covers the method."""
        return self._presign("head_object", key, expires_in)

    def presign_put(
        self, key: str, expires_in: int, *, size: int, sha256: str, md5: str
    ) -> PresignedPut:
        """A URL that writes one body of `size` bytes with this SHA-256 and MD5 (hex): the
        length, `Content-MD5` and `x-amz-checksum-sha256` are signed headers, so the store
        refuses any other body (R2: `BadDigest`)."""
        headers = {
            "Content-Length": str(size),
            "Content-MD5": base64.b64encode(bytes.fromhex(md5)).decode(),
            "x-amz-checksum-sha256": base64.b64encode(bytes.fromhex(sha256)).decode(),
        }
        params = {
            "ContentLength": size,
            "ContentMD5": headers["Content-MD5"],
            "ChecksumSHA256": headers["x-amz-checksum-sha256"],
        }
        return PresignedPut(self._presign("put_object", key, expires_in, params), headers)

    def _presign(
        self,
        operation: Literal["get_object", "head_object", "put_object"],
        key: str,
        expires_in: int,
        params: Mapping[str, object] | None = None,
    ) -> str:
        if not 1 <= expires_in <= _MAX_PRESIGN_EXPIRY:
            raise ValueError(f"expires_in must be 1..{_MAX_PRESIGN_EXPIRY} seconds")
        # A URL can do what its signer's token may: a GET or HEAD the read-only one's.
        s3 = self._s3 if operation == "put_object" else self._s3_reading
        return s3.generate_presigned_url(
            operation,
            Params={"Bucket": self._bucket, "Key": key, **(params or {})},
            ExpiresIn=expires_in,
        )

    def head(self, key: str, *, checksum: bool = False) -> ObjectFacts | None:
        """The object's size and etag (and with `checksum`, its SHA-256 when the store kept
        one for the whole object); None only when R2 answers that it does not exist."""
        try:
            if checksum:
                response = self._s3_reading.head_object(
                    Bucket=self._bucket, Key=key, ChecksumMode="ENABLED"
                )
            else:
                response = self._s3_reading.head_object(Bucket=self._bucket, Key=key)
        except (ClientError, BotoCoreError) as error:
            if isinstance(error, ClientError) and _code(error) in _NOT_FOUND_CODES:
                return None
            raise translate_r2_error(error) from error
        return ObjectFacts(
            key=key,
            size=response["ContentLength"],
            etag=response["ETag"].strip('"'),
            sha256=_whole_object_sha256(response.get("ChecksumSHA256")),
        )

    def delete(self, keys: Sequence[str]) -> DeleteReport:
        """Delete the keys, reporting each one's fate (a repeated key once) instead of raising."""
        unique = list(dict.fromkeys(keys))
        deleted: list[str] = []
        failed: list[str] = []
        for start in range(0, len(unique), _DELETE_BATCH):
            batch_deleted, batch_failed = self._delete_batch(unique[start : start + _DELETE_BATCH])
            deleted += batch_deleted
            failed += batch_failed
        return DeleteReport(tuple(deleted), tuple(failed))

    def _delete_batch(self, batch: list[str]) -> tuple[list[str], list[str]]:
        try:
            response = self._s3.delete_objects(
                Bucket=self._bucket,
                Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
            )
        except ClientError:
            # R2 answered and refused the batch, e.g. the checksum header newer botocore puts
            # on DeleteObjects: the same deletions one object at a time need no checksum.
            return self._delete_each(batch)
        except BotoCoreError:
            # No answer at all: a thousand single deletions would wait on the same dead link.
            return [], batch
        refused = {error["Key"] for error in response.get("Errors", []) if "Key" in error}
        deleted = [key for key in batch if key not in refused]
        return deleted, [key for key in batch if key in refused]

    def _delete_each(self, batch: list[str]) -> tuple[list[str], list[str]]:
        deleted: list[str] = []
        failed: list[str] = []
        for key in batch:
            try:
                self._s3.delete_object(Bucket=self._bucket, Key=key)
            except (ClientError, BotoCoreError):
                failed.append(key)
            else:
                deleted.append(key)
        return deleted, failed

    def upload(
        self, key: str, path: Path, progress: Callable[[int], None] | None = None
    ) -> ObjectFacts:
        """Upload a file in equal parts and return what R2 then reports for it.

        `progress` gets byte counts as parts go out (negative when a retried part rewinds),
        one call at a time although parts travel on several threads.
        """
        # boto3's transfer manager, imported here: only the tools upload, never a function.
        from boto3.s3.transfer import (  # noqa: PLC0415
            ProgressCallbackInvoker,
            TransferConfig,
            create_transfer_manager,
        )

        # Equal parts (R2 requires every part but the last to be the same size); the classic
        # transfer client, whose part size and checksums are the ones configured here.
        transfer = TransferConfig(
            multipart_threshold=self._chunk_size,
            multipart_chunksize=self._chunk_size,
            preferred_transfer_client="classic",
        )
        subscribers = [ProgressCallbackInvoker(_one_at_a_time(progress))] if progress else None
        try:
            with create_transfer_manager(self._s3, transfer) as manager:
                manager.upload(str(path), self._bucket, key, subscribers=subscribers).result()
        except (ClientError, BotoCoreError) as error:
            raise translate_r2_error(error) from error
        facts = self.head(key)
        if facts is None or facts.size != path.stat().st_size:
            raise R2Unavailable("UploadNotVisible")
        return facts

    def bucket_exists(self) -> bool:
        """Whether the configured bucket is there: tells a missing object (a bare 404 on
        HEAD) from a missing or misnamed bucket (the same bare 404)."""
        try:
            self._s3.head_bucket(Bucket=self._bucket)
        except (ClientError, BotoCoreError) as error:
            if isinstance(error, ClientError) and _code(error) in _NOT_FOUND_CODES | {
                "NoSuchBucket"
            }:
                return False
            raise translate_r2_error(error) from error
        return True

    def create_bucket(self) -> bool:
        """Create the bucket (R2's location is "auto"); False if it was already ours."""
        try:
            self._s3.create_bucket(
                Bucket=self._bucket,
                CreateBucketConfiguration={"LocationConstraint": "auto"},  # type: ignore[typeddict-item]
            )
        except ClientError as error:
            if _code(error) == "BucketAlreadyOwnedByYou":
                return False
            raise translate_r2_error(error) from error
        except BotoCoreError as error:
            raise translate_r2_error(error) from error
        return True

    def lifecycle_problems(self, checkpoint_days: int) -> list[str]:
        """What keeps the bucket's lifecycle from being the retention backstop; [] if nothing."""
        found = {rule.get("ID"): rule for rule in self._lifecycle_rules()}
        problems: list[str] = []
        for expected in lifecycle_rules(checkpoint_days):
            rule_id = expected.get("ID")
            rule = found.get(rule_id)
            if rule is None:
                problems.append(f"lifecycle rule {rule_id} is missing")
                continue
            actual_effect = _effect(rule)
            for aspect, wanted in _effect(expected).items():
                if actual_effect[aspect] != wanted:
                    problems.append(
                        f"lifecycle rule {rule_id}: {aspect} is {actual_effect[aspect]!r},"
                        f" expected {wanted!r}"
                    )
        return problems

    def apply_lifecycle(self, checkpoint_days: int) -> None:
        """Put Seedkeeper's rules, replacing earlier versions by ID and keeping others."""
        rules = lifecycle_rules(checkpoint_days)
        ours = {rule.get("ID") for rule in rules}
        kept = [rule for rule in self._lifecycle_rules() if rule.get("ID") not in ours]
        try:
            self._s3.put_bucket_lifecycle_configuration(
                Bucket=self._bucket, LifecycleConfiguration={"Rules": [*kept, *rules]}
            )
        except (ClientError, BotoCoreError) as error:
            raise translate_r2_error(error) from error

    def _lifecycle_rules(self) -> list[LifecycleRuleOutputTypeDef]:
        try:
            return self._s3.get_bucket_lifecycle_configuration(Bucket=self._bucket)["Rules"]
        except (ClientError, BotoCoreError) as error:
            if isinstance(error, ClientError) and _code(error) == "NoSuchLifecycleConfiguration":
                return []
            raise translate_r2_error(error) from error


def _whole_object_sha256(checksum: str | None) -> str | None:
    """A stored SHA-256 as hex; None for none, or a multipart upload's composite (`...-N`)."""
    if not checksum or "-" in checksum:
        return None
    try:
        return base64.b64decode(checksum, validate=True).hex()
    except ValueError:
        return None


def _code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def _effect(rule: LifecycleRuleTypeDef | LifecycleRuleOutputTypeDef) -> dict[str, object]:
    """What a rule does, however the store spells it (a legacy top-level Prefix, an empty
    Filter for the whole bucket), so two spellings of one rule compare equal."""
    rule_filter = dict(rule.get("Filter", {}))
    prefix = rule_filter.pop("Prefix", rule.get("Prefix", ""))
    expiration: Mapping[str, object] = rule.get("Expiration", {})
    abort: Mapping[str, object] = rule.get("AbortIncompleteMultipartUpload", {})
    return {
        "status": rule.get("Status"),
        "prefix": prefix,
        "other filter conditions": sorted(rule_filter),
        "expiration days": expiration.get("Days"),
        "expiration date": expiration.get("Date"),
        "abort incomplete multipart days": abort.get("DaysAfterInitiation"),
    }


def _one_at_a_time(progress: Callable[[int], None]) -> Callable[[int], None]:
    lock = threading.Lock()

    def report(amount: int) -> None:
        with lock:
            progress(amount)

    return report
