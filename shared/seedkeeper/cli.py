"""The `seedkeeper` command: operator tools over the same modules the functions use."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

import boto3
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.table import Table

from seedkeeper import __version__
from seedkeeper.config import StoreSettings
from seedkeeper.errors import SeedkeeperError
from seedkeeper.infra import create_table, load_template
from seedkeeper.models import SlotId
from seedkeeper.record import Absent, Classified, Malformed, SlotRecord, Supported, Unsupported


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console()
    try:
        settings = StoreSettings(
            **{
                name: value
                for name, value in {
                    "table": args.table,
                    "dynamodb_endpoint": args.endpoint_url,
                }.items()
                if value is not None
            }
        )
    except ValidationError as invalid:
        for error in invalid.errors():
            field = ".".join(str(part) for part in error["loc"])
            console.print(
                f"[red]{field}[/red]: {error['msg']} (--{field} or SEEDKEEPER_{field.upper()})"
            )
        return 2
    try:
        if args.command == "table-create":
            create_table(
                boto3.client("dynamodb", endpoint_url=settings.dynamodb_endpoint),
                settings.table,
                load_template(),
            )
            console.print(f"created table [bold]{settings.table}[/bold] from template.yaml")
            return 0
        classified = settings.lifecycle().read(args.slot)
    except SeedkeeperError as error:
        console.print(f"[red]store error[/red]: {type(error).__name__} {error}")
        return 1
    console.print(_describe(classified))
    return 0 if isinstance(classified, Supported) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seedkeeper", description=__doc__)
    parser.add_argument("--version", action="version", version=f"seedkeeper {__version__}")
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--table", help="lifecycle table name (default: $SEEDKEEPER_TABLE)")
    store.add_argument(
        "--endpoint-url",
        help="DynamoDB endpoint, for a local stand-in (default: $SEEDKEEPER_DYNAMODB_ENDPOINT)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser(
        "slot", parents=[store], help="show a slot's lifecycle record as the code classifies it"
    )
    show.add_argument("slot", type=_slot_id, help="the slot id")
    commands.add_parser(
        "table-create",
        parents=[store],
        help="create the lifecycle table as template.yaml declares it",
    )
    return parser


def _slot_id(value: str) -> str:
    try:
        return TypeAdapter(SlotId).validate_python(value)
    except ValidationError as invalid:
        raise argparse.ArgumentTypeError(invalid.errors()[0]["msg"]) from invalid


def _describe(classified: Classified) -> Table | str:
    if isinstance(classified, Absent):
        return f"slot {classified.slot}: [yellow]absent[/yellow] (no lifecycle record)"
    if isinstance(classified, Unsupported):
        return (
            f"slot {classified.slot}: [yellow]unsupported[/yellow] (schema {classified.schema}, "
            "written by a newer deployment; retained, never rewritten)"
        )
    if isinstance(classified, Malformed):
        return (
            f"slot {classified.slot}: [red]malformed[/red] ({classified.error}; "
            "retained, never rewritten)"
        )
    return _record_table(classified.record)


def _record_table(record: SlotRecord) -> Table:
    table = Table(title=f"slot {record.slot}", show_header=False)
    table.add_column("fact", style="bold")
    table.add_column("value")
    seed = record.seed
    rows = {
        "state": record.state.value,
        "rev": str(record.rev),
        "owner": _claim(record),
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
    for fact, value in rows.items():
        table.add_row(fact, value)
    return table


def _claim(record: SlotRecord) -> str:
    owner = record.owner
    if owner is None:
        return "unclaimed"
    return f"run {owner.run}, thread {owner.thread}, {owner.repository}@{owner.ref}"


def _when(epoch_seconds: int) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


if __name__ == "__main__":
    sys.exit(main())
