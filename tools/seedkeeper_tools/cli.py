"""The `seedkeeper` command: operator tools over the same modules the functions use.

Configuration comes from the environment (`SEEDKEEPER_TABLE`, `SEEDKEEPER_R2_*`, the usual
AWS variables); `--table` and `--endpoint-url` override the table's.
"""

from __future__ import annotations

import argparse
import errno
import os
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as EndpointUnreachable
from pydantic import TypeAdapter, ValidationError
from pydantic_settings import BaseSettings
from rich.console import Console
from rich.filesize import decimal
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from seedkeeper import __version__
from seedkeeper.adapters import aws
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.config import StoreSettings, snapshots
from seedkeeper.domain.checkpoints import IdleSettings, RetentionSettings, lifecycle_days
from seedkeeper.domain.models import BranchRef, ResourceName, SlotId
from seedkeeper.domain.outcomes import Payment, Recorded, SnapshotStatus
from seedkeeper.domain.record import (
    Absent,
    Classified,
    Malformed,
    SeedFailed,
    SlotRecord,
    State,
    Supported,
    Unsupported,
)
from seedkeeper.domain.snapshots import LockfileHash, Snapshot
from seedkeeper.errors import SeedkeeperError, StoreError, translate_client_error
from seedkeeper_tools.demo import run_demo
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.listing import Listing, SlotListing
from seedkeeper_tools.local.docker import DEFAULT_IMAGE
from seedkeeper_tools.local.principals import LocalCredentials
from seedkeeper_tools.local.stack import LocalStack
from seedkeeper_tools.publish import publish
from seedkeeper_tools.sam_env import serve_sam_env, write_local_template

Command = Callable[[argparse.Namespace], int]
# Without a terminal the output is read by tools or copied (the seed handle): as wide as
# its longest line, never cut or wrapped at Rich's default 80 columns. COLUMNS still rules.
_PIPED_WIDTH = 1_000_000
# Why a port cannot be listened on: in use, privileged, not this machine's.
_BIND_ERRORS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL})


def _console() -> Console:
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = _PIPED_WIDTH
    return console


console = _console()


class PortUnavailable(SeedkeeperError):
    """`seedkeeper local` cannot listen on the port it was given."""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a command; an ordinary failure is one line and a nonzero exit, never a
    traceback. Every text printed with markup has what came from outside escaped."""
    args = _parser().parse_args(argv)
    command: Command = args.run
    try:
        return command(args)
    except KeyboardInterrupt:
        console.print("interrupted", markup=False)
        return 130  # 128 + SIGINT, as a shell reports it
    except ValidationError as invalid:
        for error in invalid.errors():
            where = _invalid_setting(invalid.title, error["loc"])
            console.print(f"[red]{escape(where)}[/red]: {escape(error['msg'])}")
        return 2
    except SeedkeeperError as error:
        console.print(f"[red]{type(error).__name__}[/red]: {escape(_explain(error, args))}")
        return 1
    except BotoCoreError as error:  # raised by a client the store adapters do not wrap
        console.print(escape(_unreachable(error) or f"{type(error).__name__}: {error}"))
        return 1


def _invalid_setting(title: str, loc: tuple[int | str, ...]) -> str:
    """What to fix: the environment variable a settings class reads the field from (its
    env_prefix and the field's name), else the field's dotted location."""
    field = ".".join(str(part) for part in loc)
    settings = _settings_class(title)
    if settings is None or not loc or loc[0] not in settings.model_fields:
        return field
    info = settings.model_fields[str(loc[0])]
    alias = info.validation_alias or info.alias
    variable = (
        alias
        if isinstance(alias, str)
        else f"{settings.model_config.get('env_prefix', '')}{loc[0]}"
    )
    return ".".join([variable.upper(), *map(str, loc[1:])])


def _settings_class(title: str) -> type[BaseSettings] | None:
    """The settings class a ValidationError's title names (its class name)."""
    pending = BaseSettings.__subclasses__()
    while pending:
        settings = pending.pop()
        if settings.__name__ == title:
            return settings
        pending += settings.__subclasses__()
    return None


def _explain(error: SeedkeeperError, args: argparse.Namespace) -> str:
    """The error's line, naming the endpoint that did not answer or the missing table."""
    cause = error.__cause__
    unreachable = _unreachable(cause) if isinstance(cause, BotoCoreError) else None
    if unreachable:
        return unreachable
    # Only DynamoDB's table answers this code, to a command that names a table.
    missing = _code(cause) == "ResourceNotFoundException" and hasattr(args, "table")
    if isinstance(error, StoreError) and missing:
        return (
            f"the table {_store(args).table} does not exist (ResourceNotFoundException):"
            " `seedkeeper table-create` creates it"
        )
    return str(error)


def _unreachable(error: BotoCoreError) -> str | None:
    """The endpoint a connection failed to reach or to hear from, as scheme and host only (a
    request's URL may carry a presigned query); None for an error of no connection."""
    url = urlsplit(str(error.kwargs.get("endpoint_url", "")))
    if not url.netloc:
        return None
    failed = "could not reach" if isinstance(error, EndpointUnreachable) else "no answer from"
    return f"{failed} {url.scheme}://{url.netloc} ({type(error).__name__})"


def _code(error: BaseException | None) -> str | None:
    """An AWS error's code: errors are told apart by it, never by their text."""
    return error.response.get("Error", {}).get("Code") if isinstance(error, ClientError) else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seedkeeper", description=__doc__)
    parser.add_argument("--version", action="version", version=f"seedkeeper {__version__}")
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument(
        "--table",
        type=_valid(Annotated[str, StoreSettings.model_fields["table"]]),
        help="lifecycle table name (default: $SEEDKEEPER_TABLE)",
    )
    store.add_argument(
        "--endpoint-url",
        help="DynamoDB endpoint, for a local stand-in (default: $SEEDKEEPER_DYNAMODB_ENDPOINT)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    slot = commands.add_parser(
        "slot", parents=[store], help="show a slot's lifecycle record as the code classifies it"
    )
    slot.add_argument("slot", type=_valid(SlotId), help="the slot id")
    slot.set_defaults(run=_show_slot)

    status = commands.add_parser(
        "status",
        parents=[store],
        help="every slot's record by state, with why it is retained or lost (Scans the"
        " whole table)",
    )
    status.add_argument(
        "--state",
        action="append",
        type=_states,
        default=[],
        metavar="STATE[,STATE...]",
        help=f"only these states, repeatable ({', '.join(State)}); records this code"
        " cannot read are always shown",
    )
    status.set_defaults(run=_show_status)

    table = commands.add_parser(
        "table-create", parents=[store], help="create the table as template.yaml declares it"
    )
    table.set_defaults(run=_create_table)

    publishing = commands.add_parser(
        "publish", parents=[store], help="archive a checkout (and deps), upload to R2, rotate"
    )
    publishing.add_argument("--resource", required=True, type=_valid(ResourceName))
    publishing.add_argument("--checkout", required=True, type=Path, help="a git checkout")
    publishing.add_argument("--deps", type=Path, help="the dependency tree to archive")
    # Checked here, as the snapshot will be: not after the archives are uploaded.
    publishing.add_argument(
        "--lockfile-hash", type=_valid(LockfileHash), help="the key of the dependency archive"
    )
    publishing.add_argument(
        "--ref", type=_valid(BranchRef), help="the branch to record (default: the checkout's)"
    )
    publishing.add_argument(
        "--scrub-credentials",
        action="store_true",
        help="archive a copy of .git/config without the credentials found in it (the "
        "checkout is left as it is); without it, such a checkout is refused",
    )
    publishing.set_defaults(run=_publish)

    resources = commands.add_parser("snapshots", help="inspect or delete a resource's snapshots")
    actions = resources.add_subparsers(dest="action", required=True)
    for action, run, text in [
        ("show", _show_snapshots, "both generations, the seed handle, pending deletions"),
        ("delete", _delete_snapshots, "remove the records, then delete the objects they named"),
    ]:
        sub = actions.add_parser(action, parents=[store], help=text)
        sub.add_argument("resource", type=_valid(ResourceName))
        sub.set_defaults(run=run)

    bucket = commands.add_parser("r2-bucket-create", help="create the R2 bucket if it is missing")
    bucket.set_defaults(run=_create_bucket)

    lifecycle = commands.add_parser(
        "r2-lifecycle",
        help="the bucket's retention backstop (backups/ after 365 days, checkpoints/ after"
        " the park retention)",
    )
    mode = lifecycle.add_mutually_exclusive_group(required=True)
    mode.add_argument("--apply", action="store_true", help="set the rules, keeping others")
    mode.add_argument("--check", action="store_true", help="verify the rules; exit 1 if wrong")
    lifecycle.set_defaults(run=_r2_lifecycle)
    local = commands.add_parser("local", help="run all of Seedkeeper on this machine")
    local.add_argument("--port", type=_port, default=8787, help="0: any free port")
    local.add_argument(
        "--data-dir",
        type=Path,
        default=default_data_dir(),
        help="slot workspaces and task logs (default: outside any repository, %(default)s)",
    )
    local.add_argument(
        "--idle-window",
        type=_idle_window,
        default=None,
        help="seconds a slot may idle (default: SEEDKEEPER_IDLE_WINDOW, else 1800)",
    )
    local.add_argument("--sweep-interval", type=float, default=30.0, help="seconds")
    local.add_argument(
        "--runtime",
        choices=("process", "docker"),
        default="process",
        help="slot tasks as local processes, or as containers of the slot image (`make image`)",
    )
    local.add_argument(
        "--slot-image", default=DEFAULT_IMAGE, help="the slot image, for --runtime docker"
    )
    local.add_argument(
        "--standby",
        type=_count,
        default=0,
        metavar="N",
        help="keep N blank standby slots started ahead (docs/concepts/standby.md)",
    )
    local.add_argument(
        "--preseed",
        type=_preseed,
        action="append",
        default=[],
        metavar="RESOURCE=N",
        help="keep N standby slots holding RESOURCE's current generation (repeatable)",
    )
    local.add_argument(
        "--sam-env",
        type=Path,
        metavar="PATH",
        help="write a `sam local invoke --env-vars` file pointing every function at this "
        "stack, whose store is relayed to Docker's bridge while it runs (Linux, Docker)",
    )
    local.set_defaults(run=_local)

    sam_template = commands.add_parser(
        "sam-template",
        help="write the template `sam build` builds the functions from for `sam local invoke`",
    )
    sam_template.add_argument("path", type=Path, help="where, e.g. build/sam-local/template.json")
    sam_template.set_defaults(run=_sam_template)

    demo = commands.add_parser("demo", help="run the whole protocol locally, checked step by step")
    demo.set_defaults(run=_demo)
    return parser


# A local stack's standbys, each pool: they are processes or containers on this machine.
MAX_LOCAL_STANDBYS = 16


def _count(value: str) -> int:
    if not value.isdigit() or int(value) > MAX_LOCAL_STANDBYS:
        raise argparse.ArgumentTypeError(f"a count from 0 to {MAX_LOCAL_STANDBYS}, not {value!r}")
    return int(value)


def _preseed(value: str) -> tuple[str, int]:
    resource, equals, count = value.partition("=")
    try:
        TypeAdapter(ResourceName).validate_python(resource)
    except ValidationError:
        raise argparse.ArgumentTypeError(
            f"RESOURCE=N, a resource's name and a count, not {value!r}"
        ) from None
    if not equals:
        raise argparse.ArgumentTypeError(f"RESOURCE=N: no count in {value!r}")
    return resource, _count(count)


def _local(args: argparse.Namespace) -> int:
    credentials = LocalCredentials(
        os.environ.get("SEEDKEEPER_LOCAL_ACCESS_KEY_ID", "seedkeeper-local"),
        os.environ.get("SEEDKEEPER_LOCAL_SECRET_ACCESS_KEY", "seedkeeper-local-secret"),
    )
    idle_window = args.idle_window or IdleSettings().idle_window
    stack = LocalStack(
        data_dir=args.data_dir,
        port=args.port,
        idle_window=idle_window,
        credentials=credentials,
        sweep_interval=args.sweep_interval,
        task_runtime=args.runtime,
        slot_image=args.slot_image,
        standbys=args.standby,
        preseeded=dict(args.preseed),
    )
    stopping = threading.Event()
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, lambda *_: stopping.set())
    try:
        _start(stack)
        with serve_sam_env(args.sam_env, os.environ) if args.sam_env else nullcontext():
            store = stack.store_environment()
            console.print(f"Seedkeeper is listening on [bold]{escape(stack.url)}[/bold]")
            console.print(
                f"sign requests (SigV4, service lambda) with access key "
                f"{credentials.access_key}; Ctrl-C stops everything"
            )
            console.print(
                f"store (moto: DynamoDB and R2) {store['SEEDKEEPER_DYNAMODB_ENDPOINT']}, "
                f"table and bucket {store['SEEDKEEPER_TABLE']}; idle window {idle_window} s; "
                f"data in {stack.data_dir}",
                markup=False,
            )
            console.print("for `seedkeeper publish`, `status`, `snapshots` against it, paste:")
            exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in store.items())
            console.print(f"export {exports}", markup=False, highlight=False, soft_wrap=True)
            stopping.wait()
    finally:
        stack.stop()
    console.print("stopped: gateway, slot tasks, store")
    return 0


def _start(stack: LocalStack) -> None:
    """Starts the stack; a port it cannot listen on is named (the caller stops what did
    start: the store starts first)."""
    try:
        stack.start()
    except OSError as failed:
        if failed.errno not in _BIND_ERRORS:
            raise
        raise PortUnavailable(
            f"cannot listen on 127.0.0.1:{stack.port}: {failed.strerror} (--port chooses another)"
        ) from failed


def default_data_dir() -> Path:
    """Outside any repository (a clone's working tree would list the workspaces): the user's
    state directory."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "seedkeeper"


def _sam_template(args: argparse.Namespace) -> int:
    write_local_template(args.path)
    console.print(
        f"wrote {args.path}: `sam build -t {args.path}` builds the functions from it", markup=False
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    return run_demo()


def _valid(annotation: Any) -> Callable[[str], str]:
    adapter: TypeAdapter[str] = TypeAdapter(annotation)

    def parse(value: str) -> str:
        try:
            return adapter.validate_python(value)
        except ValidationError as invalid:
            raise argparse.ArgumentTypeError(invalid.errors()[0]["msg"]) from invalid

    return parse


def _port(value: str) -> int:
    """A TCP port, or 0 for any free one."""
    port = int(value) if value.isascii() and value.isdigit() else -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port: 0..65535 (0: any free one)")
    return port


def _idle_window(value: str) -> int:
    """Seconds, within the code's bounds: from 1 (a demo's) to a week; a deployment's
    `IdleWindowSeconds` starts at 60."""
    try:
        return IdleSettings(idle_window=int(value)).idle_window
    except (ValueError, ValidationError) as invalid:
        errors = invalid.errors() if isinstance(invalid, ValidationError) else None
        raise argparse.ArgumentTypeError(errors[0]["msg"] if errors else str(invalid)) from None


def _states(value: str) -> list[State]:
    names = [name.strip() for name in value.split(",")]
    unknown = [name for name in names if name not in {state.value for state in State}]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown state {', '.join(map(repr, unknown))} (states: {', '.join(State)})"
        )
    return [State(name) for name in names]


def _store(args: argparse.Namespace) -> StoreSettings:
    overrides = {"table": args.table, "dynamodb_endpoint": args.endpoint_url}
    return StoreSettings(**{name: value for name, value in overrides.items() if value})


def _r2() -> R2:
    """R2 with the tools' patience (uploads), or R2Unconfigured naming what is missing."""
    return R2.from_settings(R2Settings(), budget=aws.TOOLS)


def _show_slot(args: argparse.Namespace) -> int:
    classified = _store(args).lifecycle().read(args.slot)
    console.print(_describe(classified))
    return 0 if isinstance(classified, Supported) else 1


def _show_status(args: argparse.Namespace) -> int:
    states = {state for chosen in args.state for state in chosen}
    table = _store(args).table_resource(budget=aws.TOOLS)
    listing = SlotListing(table).scan(states)
    if listing.slots:
        console.print(_slot_table(listing, now=int(time.time())))
    console.print(_status_summary(listing), markup=False)
    return 0


def _create_table(args: argparse.Namespace) -> int:
    settings = _store(args)
    client = aws.client(
        aws.session(), "dynamodb", budget=aws.TOOLS, endpoint_url=settings.dynamodb_endpoint
    )
    try:
        create_table(client, settings.table, load_template())
    except ClientError as error:
        # As r2-bucket-create: what was asked for is there (whether it is as the template
        # declares it, table-create never checked).
        if _code(error) == "ResourceInUseException":
            console.print(f"the table {settings.table} already exists", markup=False)
            return 0
        raise translate_client_error(error) from error
    console.print(f"created table [bold]{escape(settings.table)}[/bold] from template.yaml")
    return 0


def _publish(args: argparse.Namespace) -> int:
    r2 = _r2()
    service = snapshots(_store(args), R2Settings())
    with Progress(
        "{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=console
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def advance(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done)

        recorded = publish(
            resource=args.resource,
            checkout=args.checkout,
            snapshots=service,
            r2=r2,
            deps=args.deps,
            lockfile_hash=args.lockfile_hash,
            ref=args.ref,
            progress=advance,
            scrub_credentials=args.scrub_credentials,
            scrubbed=lambda removed: console.print(
                f"scrubbed from the archive: {', '.join(removed)}", markup=False
            ),
        )
    console.print(_recorded(recorded))
    return 0


def _show_snapshots(args: argparse.Namespace) -> int:
    console.print(_status(snapshots(_store(args), R2Settings()).status(args.resource)))
    return 0


def _delete_snapshots(args: argparse.Namespace) -> int:
    payment = snapshots(_store(args), R2Settings()).delete(args.resource)
    console.print(_payment(payment))
    return 0 if not payment.pending else 1


def _create_bucket(args: argparse.Namespace) -> int:
    created = _r2().create_bucket()
    console.print("created the bucket" if created else "the bucket already exists")
    return 0


def _r2_lifecycle(args: argparse.Namespace) -> int:
    r2 = _r2()
    # Checkpoints go a day after their park retention ends (SEEDKEEPER_PARK_RETENTION).
    days = lifecycle_days(RetentionSettings())
    if args.apply:
        r2.apply_lifecycle(days)
    problems = r2.lifecycle_problems(days)
    for problem in problems:
        console.print(f"[red]lifecycle[/red]: {escape(problem)}")
    if not problems:
        console.print(
            f"lifecycle: backups/ expire after 365 days, checkpoints/ after {days} days;"
            " incomplete uploads abort after 1 day"
        )
    return 1 if problems else 0


def _describe(classified: Classified) -> Table | str:
    if isinstance(classified, Absent):
        return f"slot {escape(classified.slot)}: [yellow]absent[/yellow] (no lifecycle record)"
    if isinstance(classified, Unsupported):
        return (
            f"slot {escape(classified.slot)}: [yellow]unsupported[/yellow] "
            f"(schema {escape(str(classified.schema))}, "
            "written by a newer deployment; retained, never rewritten)"
        )
    if isinstance(classified, Malformed):
        return (
            f"slot {escape(classified.slot)}: [red]malformed[/red] ({escape(classified.error)}; "
            "retained, never rewritten)"
        )
    return _facts(f"slot {classified.record.slot}", _slot_facts(classified.record))


def _slot_facts(record: SlotRecord) -> dict[str, str]:
    seed, owner = record.seed, record.owner
    return {
        "state": record.state.value,
        "rev": str(record.rev),
        "owner": f"run {owner.run}, thread {owner.thread}, {owner.repository}@{owner.ref}"
        if owner
        else "unclaimed",
        "seed": f"{seed.resource} {seed.ref} {seed.sha[:12]} ({seed.checkout_backup_id})"
        if seed
        else "cold",
        "origin": record.origin or "-",
        "attempt": str(record.attempt),
        "incarnation": record.incarnation or "-",
        "idle deadline": _when(record.idle_deadline),
        "operations": ", ".join(
            f"#{e.ordinal} {e.kind} {e.status}" + (f" ({e.outcome})" if e.outcome else "")
            for e in record.window.entries
        )
        or "-",
        "checkpoint": record.checkpoint.key if record.checkpoint else "-",
        "result": record.result.model_dump_json() if record.result else "-",
        "retained": record.retained_reason or "-",
        "updated": _when(record.updated_at),
    }


# Records this code cannot read: listed (in red) after every state, never left out.
_UNREADABLE = ("unsupported", "malformed")
_LISTED_ORDER = [*State, *_UNREADABLE]
_SLOT_COLUMNS = (
    "slot",
    "state",
    "reason",
    "attempt",
    "incarnation",
    "idle deadline",
    "checkpoint",
    "expires",
    "detail",
)


def _listed_state(classified: Classified) -> str:
    if isinstance(classified, Supported):
        return classified.state.value
    return "unsupported" if isinstance(classified, Unsupported) else "malformed"


def _slot_table(listing: Listing, *, now: int) -> Table:
    table = Table(title="slots")
    for column in _SLOT_COLUMNS:
        table.add_column(column)
    rows = [_slot_row(classified, now) for classified in listing.slots]
    # Grouped by state, then by reason; store values go in as Text, never read as markup.
    for row in sorted(rows, key=lambda row: (_LISTED_ORDER.index(row[1]), row[2], row[0])):
        table.add_row(*map(Text, row), style="red" if row[1] in _UNREADABLE else None)
    return table


def _slot_row(classified: Classified, now: int) -> list[str]:
    """The cells of `_SLOT_COLUMNS`."""
    state = _listed_state(classified)
    if isinstance(classified, Unsupported):
        detail = f"schema {classified.schema}: a newer deployment's; retained, never rewritten"
        return [classified.slot, state, "-", "-", "-", "-", "-", "-", detail]
    if isinstance(classified, Malformed):
        return [classified.slot, state, "-", "-", "-", "-", "-", "-", classified.error]
    assert isinstance(classified, Supported)  # a Scan returns no absent item
    record = classified.record
    checkpoint, loss, expires = record.checkpoint, record.loss, record.expires_at
    return [
        record.slot,
        state,
        loss.reason if loss is not None else record.retained_reason or "-",
        str(record.attempt),
        record.incarnation or "-",
        # An ended record (it expires) has no task: its idle deadline means nothing now.
        "-" if expires is not None else _relative(record.idle_deadline, now),
        f"{decimal(checkpoint.size)}, expires {_relative(checkpoint.expires_at, now)}"
        if checkpoint is not None
        else "-",
        _relative(expires, now) if expires is not None else "-",
        _detail(record),
    ]


def _detail(record: SlotRecord) -> str:
    """What was lost, or why the seed failed."""
    if record.loss is not None:
        return record.loss.detail
    if isinstance(record.result, SeedFailed):
        failed = record.result
        return f"{failed.reason} at {failed.step}: {failed.detail}"
    return "-"


def _status_summary(listing: Listing) -> str:
    counts = Counter(_listed_state(classified) for classified in listing.slots)
    per_state = ", ".join(f"{state} {counts[state]}" for state in _LISTED_ORDER if counts[state])
    total, pages = len(listing.slots), listing.pages
    return (
        f"{per_state or 'no slots'}: {total} slot{'s' if total != 1 else ''}"
        f" (read the whole table: {pages} Scan page{'s' if pages != 1 else ''},"
        f" {listing.scanned} items)"
    )


def _relative(epoch_seconds: int, now: int) -> str:
    """`in 2d 3h` or `5m 10s ago`: the largest unit and the next."""
    left = abs(epoch_seconds - now)
    amounts = [
        (left // 86_400, "d"),
        (left % 86_400 // 3_600, "h"),
        (left % 3_600 // 60, "m"),
        (left % 60, "s"),
    ]
    largest = next((i for i, (amount, _) in enumerate(amounts) if amount), len(amounts) - 1)
    spelled = " ".join(f"{amount}{unit}" for amount, unit in amounts[largest : largest + 2])
    return f"in {spelled}" if epoch_seconds >= now else f"{spelled} ago"


def _status(status: SnapshotStatus) -> Table:
    handle = status.seed_handle
    present = status.objects.present
    return _facts(
        f"resource {status.resource}",
        {
            "current": _generation(status.current),
            "retired": _generation(status.retired),
            "seed handle": handle.model_dump_json() if handle else "-",
            "deps": ", ".join(
                f"{e.lockfile_hash[:12]} → {e.archive.backup_id}" for e in status.deps
            )
            or "-",
            "pending deletions": ", ".join(status.pending_deletions) or "-",
            "objects": f"{status.objects.recorded} recorded, "
            + (f"{present} present in R2" if present is not None else "R2 not configured"),
        },
    )


def _recorded(recorded: Recorded) -> Table:
    return _facts(
        f"resource {recorded.resource}",
        {
            "rotated": "yes" if recorded.rotated else "no (already current)",
            "current": _generation(recorded.current),
            "retired": _generation(recorded.retired),
            "deleted": ", ".join(recorded.payment.deleted) or "-",
            "still owed": ", ".join(recorded.payment.pending) or "-",
        },
    )


def _payment(payment: Payment) -> Table:
    return _facts(
        "deletion",
        {
            "deleted": ", ".join(payment.deleted) or "-",
            "still owed": ", ".join(payment.pending) or "-",
        },
    )


def _generation(snapshot: Snapshot | None) -> str:
    if snapshot is None:
        return "-"
    deps = f" + {snapshot.deps.backup_id}" if snapshot.deps else ""
    return (
        f"#{snapshot.generation} {snapshot.ref} {snapshot.sha[:12]} "
        f"{snapshot.checkout.backup_id}{deps} ({_when(snapshot.created_at)})"
    )


def _facts(title: str, rows: dict[str, str]) -> Table:
    """Store values, never read as markup."""
    table = Table(title=escape(title), show_header=False)
    table.add_column("fact", style="bold")
    table.add_column("value")
    for fact, value in rows.items():
        table.add_row(fact, escape(value))
    return table


def _when(epoch_seconds: int) -> str:
    """A UTC date, or the number as recorded when it is no date this platform can show (a
    record written by another tool, or before the API bounded it)."""
    try:
        return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return str(epoch_seconds)


if __name__ == "__main__":
    sys.exit(main())
