"""MkDocs hook: the reference pages, generated at build time from the code itself.

- `reference/api/<function>.md` and `<function>.openapi.json`: each function URL's OpenAPI
  document, as its Powertools resolver generates it (`functions/<name>/app.py`'s `app`,
  loaded as the local gateway loads it), rendered as routes and schemas.
- `reference/answers.md`: the answer table (`seedkeeper.api.answers.REFUSALS`), every
  reason token and its status. The executor guide's refusals page must describe each
  token: a token missing there is a warning (so `mkdocs build --strict` fails).
- `reference/cli.md`: `seedkeeper --help` and every subcommand's help
  (`seedkeeper_tools.cli._parser()`).
- `reference/clients/python.md`, `reference/clients/typescript.md`: the clients' own
  READMEs (`clients/*/README.md`), their links to files outside the site made plain text.

Nothing generated is committed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from seedkeeper.api.answers import OUTCOMES, REFUSALS
from seedkeeper_tools.cli import _parser
from seedkeeper_tools.local.gateway import load_function_module

log = logging.getLogger("mkdocs.hooks.reference")

# Each function URL: its folder under functions/ and what it is for. The idle sweep has no
# URL (EventBridge Scheduler invokes it), so no document.
FUNCTIONS = {
    "seed": "the executor: seed, poll, resume, keep alive",
    "receipt": "the executor: a receipt of the slot's checkpoint",
    "slot_evidence": "the executor: what is known of a slot",
    "rotation": "the resident or operator: record, inspect and delete snapshots",
    "checkpoint": "the slot task alone (its task role): its start, its record, its checkpoint",
}
REFUSALS_PAGE = "executor/refusals.md"
CLIENTS = ("python", "typescript")
COLUMNS = "90"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = Path(config.config_file_path).parent
    for name, purpose in FUNCTIONS.items():
        document = json.loads(load_function_module(name).app.get_openapi_json_schema())
        files.append(
            File.generated(
                config,
                f"reference/api/{name}.openapi.json",
                content=json.dumps(document, indent=2) + "\n",
            )
        )
        files.append(
            File.generated(
                config, f"reference/api/{name}.md", content=_api_page(name, purpose, document)
            )
        )
    files.append(File.generated(config, "reference/answers.md", content=_answers_page(config)))
    files.append(File.generated(config, "reference/cli.md", content=_cli_page()))
    for client in CLIENTS:
        files.append(
            File.generated(
                config, f"reference/clients/{client}.md", content=_client_page(root, client)
            )
        )
    return files


# -- the function URLs -------------------------------------------------------------------


def _api_page(name: str, purpose: str, document: dict[str, Any]) -> str:
    lines = [
        f"# The {name.replace('_', '-')} function",
        "",
        f"Called by {purpose}. Generated from the OpenAPI document its resolver builds "
        f"(`functions/{name}/app.py`): [{name}.openapi.json]({name}.openapi.json). Every "
        "request is SigV4-signed (`AWS_IAM`, service `lambda`); a refusal's body is "
        "[`ErrorAnswer`](#erroranswer), its token one of [the answer table](../answers.md).",
        "",
    ]
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            lines += [f"## `{method.upper()} {path}`", ""]
            if operation.get("description"):
                lines += [operation["description"].strip(), ""]
            for parameter in operation.get("parameters", []):
                lines.append(
                    f"- {parameter['in']} parameter `{parameter['name']}`: "
                    f"{_type(parameter.get('schema', {}))}"
                )
            body = operation.get("requestBody", {}).get("content", {})
            for content_type, media in body.items():
                lines.append(f"- request body (`{content_type}`): {_type(media.get('schema', {}))}")
            lines += ["", "| status | answer | body |", "|---|---|---|"]
            for status, response in operation.get("responses", {}).items():
                media_types: list[dict[str, Any]] = list(response.get("content", {}).values())
                schema = media_types[0].get("schema", {}) if media_types else {}
                answer = _type(schema) if schema else "-"
                lines.append(f"| {status} | {response.get('description', '')} | {answer} |")
            lines.append("")
    schemas = document.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
    for schema_name, schema in sorted(schemas.items()):
        lines += [f"### {schema_name}", ""]
        if schema.get("description"):
            lines += [_cell(schema["description"]), ""]
        properties = schema.get("properties")
        if not properties:
            lines += [f"{_type(schema)}", ""]
            continue
        required = set(schema.get("required", []))
        lines += ["| field | type | required | constraints |", "|---|---|---|---|"]
        for field, spec in properties.items():
            needed = "yes" if field in required else ""
            lines.append(f"| `{field}` | {_type(spec)} | {needed} | {_constraints(spec)} |")
        if schema.get("additionalProperties") is False:
            lines += ["", "No other field is accepted."]
        lines.append("")
    return "\n".join(lines) + "\n"


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        target = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{target}](#{target.lower()})"
    for combinator in ("anyOf", "oneOf", "allOf"):
        if combinator in schema:
            return " or ".join(_type(part) for part in schema[combinator])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if (
        kind == "object"
        and "additionalProperties" in schema
        and isinstance(schema["additionalProperties"], dict)
    ):
        return f"object of {_type(schema['additionalProperties'])}"
    return str(kind)


def _constraints(schema: dict[str, Any]) -> str:
    found = []
    # The constraint keywords the functions' models produce.
    for key in ("pattern", "minLength", "maxLength", "minimum", "maximum", "maxItems", "default"):
        if key in schema:
            found.append(f"{key} `{schema[key]}`")
    for part in schema.get("anyOf", []):
        inner = _constraints(part)
        if inner:
            found.append(inner)
    # Inside a code span a pipe is no cell boundary (Python-Markdown's tables), and an
    # escape would show: only line breaks are taken out.
    return ", ".join(found).replace("\n", " ")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- the answer table --------------------------------------------------------------------


def _answers_page(config: MkDocsConfig) -> str:
    described = (Path(config.docs_dir) / REFUSALS_PAGE).read_text()
    for token in REFUSALS:
        if f"`{token}`" not in described:
            log.warning("docs/%s does not describe the reason token `%s`", REFUSALS_PAGE, token)
    lines = [
        "# The answer table",
        "",
        "Every refusal of every function has one body, "
        '`{"error": token, "detail", "fields"}`, and each token one status. Generated from '
        "`seedkeeper.api.answers` (`shared/seedkeeper/api/answers.py`); what each token "
        f"means for an executor: [refusals](../{REFUSALS_PAGE}).",
        "",
        "| token | status |",
        "|---|---|",
    ]
    lines += [
        f"| `{token}` | {status.value} {status.phrase} |" for token, status in REFUSALS.items()
    ]
    lines += [
        "",
        "## Answers that are not refusals",
        "",
        "| outcome | status |",
        "|---|---|",
    ]
    lines += [
        f"| `{name}` | {', '.join(f'{s.value} {s.phrase}' for s in status.may_be)} |"
        for name, status in OUTCOMES.items()
    ]
    return "\n".join(lines) + "\n"


# -- the command line --------------------------------------------------------------------


def _cli_page() -> str:
    lines = [
        "# The `seedkeeper` command",
        "",
        "Generated from the command's own help (`seedkeeper_tools.cli`). What each command is "
        "for, with examples: [the operator guide](../operator/cli.md).",
        "",
    ]
    # argparse wraps to $COLUMNS: the same width whoever builds the site.
    with patch.dict(os.environ, {"COLUMNS": COLUMNS}):
        for name, parser in _parsers(_parser(), "seedkeeper"):
            text = parser.format_help().replace(str(Path.home()), "~")
            lines += [f"## `{name}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def _parsers(
    parser: argparse.ArgumentParser, name: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


# -- the clients' own READMEs ------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\((?!https?://|#|mailto:)([^)]+)\)")


def _client_page(root: Path, client: str) -> str:
    text = (root / "clients" / client / "README.md").read_text()
    # Its links are relative to clients/<client>/, outside the site: kept as their text.
    text = _LINK.sub(lambda match: f"{match[1]} (`clients/{client}/{match[2]}`)", text)
    return (
        text.rstrip()
        + f"\n\n---\n\n*Generated from `clients/{client}/README.md` when the site is built.*\n"
    )
