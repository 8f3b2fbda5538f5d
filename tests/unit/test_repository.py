"""The pure parts of the archive's `.git` defence: what a config may hold, what we write
in its place, and what counts as a credential (shared by the restore and publish)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from seedkeeper_task.restore.repository import (
    FETCH_REFSPEC,
    ConfigEntry,
    RepositoryFormat,
    UnsafeRepository,
    credential_findings,
    parse_config_list,
    render_config,
    repository_format,
    safe_config,
    without_credentials,
)

ORIGIN = "https://git.example.com/acme/widgets.git"


def read_back(text: str, tmp_path: Path) -> list[ConfigEntry]:
    """What git itself reads from `text`."""
    config = tmp_path / "config"
    config.write_text(text)
    listed = subprocess.run(
        ["git", "config", "--file", str(config), "--no-includes", "--null", "--list"],
        check=True,
        capture_output=True,
        text=True,
        env={"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": str(tmp_path)},
    ).stdout
    return parse_config_list(listed)


def test_the_null_listing_keeps_newlines_and_bare_keys() -> None:
    listed = "core.bare\nfalse\0alias.two\nline one\nline two\0core.flag\0"
    assert parse_config_list(listed) == [
        ("core.bare", "false"),
        ("alias.two", "line one\nline two"),
        ("core.flag", None),
    ]


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        (("core.worktree", "/elsewhere"), "core.worktree"),
        (("include.path", "/etc/gitconfig"), "include"),
        (("includeif.gitdir:/.path", "x"), "includeif"),
        (("extensions.partialclone", "origin"), "extensions.partialclone"),
        (("extensions.objectformat", "md5"), "extensions.objectformat"),
        (("core.repositoryformatversion", "2"), "repositoryformatversion"),
    ],
)
def test_a_config_that_points_elsewhere_or_needs_more_is_refused(
    entry: ConfigEntry, named: str
) -> None:
    with pytest.raises(UnsafeRepository, match=named):
        repository_format([("core.bare", "false"), entry])


def test_the_format_keeps_the_extensions_needed_to_read_and_drops_worktree_config() -> None:
    entries: list[ConfigEntry] = [
        ("core.repositoryformatversion", "1"),
        ("extensions.objectformat", "SHA256"),
        ("extensions.worktreeconfig", "true"),
        ("core.fsmonitor", "touch /tmp/x"),
    ]
    assert repository_format(entries) == RepositoryFormat(
        "1", (("extensions.objectformat", "sha256"),)
    )
    assert repository_format([]) == RepositoryFormat("0")


def test_the_safe_config_names_the_origin_for_fetch_and_push_and_the_branch_tracking(
    tmp_path: Path,
) -> None:
    written = safe_config(RepositoryFormat("0"), origin=ORIGIN, branch='odd"branch\\name')
    assert read_back(render_config(written), tmp_path) == [
        ("core.repositoryformatversion", "0"),
        ("core.bare", "false"),
        ("remote.origin.url", ORIGIN),
        ("remote.origin.fetch", FETCH_REFSPEC),
        ('branch.odd"branch\\name.remote', "origin"),
        ('branch.odd"branch\\name.merge', 'refs/heads/odd"branch\\name'),
    ]
    assert [key for key, _ in safe_config(RepositoryFormat("0"), origin=None, branch="main")] == [
        "core.repositoryformatversion",
        "core.bare",
    ]


def test_rendered_values_read_back_verbatim_whatever_they_hold(tmp_path: Path) -> None:
    hostile: list[ConfigEntry] = [
        ("remote.origin.url", 'https://h/x ; # not a comment\n[core]\n\tfsmonitor = "x"\\'),
        ("remote.origin.fetch", "  leading and trailing spaces\t"),
        ('url.https://h/"quoted" sub.insteadof', "https://other/"),
        ("core.flag", None),
    ]
    assert read_back(render_config(hostile), tmp_path) == hostile


def test_credentials_are_named_by_key_never_by_value() -> None:
    token = "ghp_secret"  # noqa: S105 - test data
    entries: list[ConfigEntry] = [
        ("remote.origin.url", f"https://resident:{token}@git.example.com/w.git"),
        ("remote.origin.pushurl", f"https://{token}@git.example.com/w.git"),
        ("remote.origin.fetch", FETCH_REFSPEC),
        ("http.extraheader", f"Authorization: Bearer {token}"),
        ("http.https://git.example.com/.extraheader", f"Authorization: Basic {token}"),
        ("http.sslverify", "true"),
        ("credential.helper", "store"),
        (f"url.https://resident:{token}@git.example.com/.insteadof", "https://git.example.com/"),
        ("remote.mirror.url", "git@github.com:acme/widgets.git"),  # scp-like: a username only
    ]
    found = credential_findings(entries)
    assert found == [
        "remote.origin.url",
        "remote.origin.pushurl",
        "http.extraheader",
        "http.https://git.example.com/.extraheader",
        "credential.helper",
        "url.https://***@git.example.com/.insteadof",
    ]
    assert token not in repr(found)
    scrubbed = without_credentials(entries)
    assert scrubbed == [
        ("remote.origin.url", "https://git.example.com/w.git"),
        ("remote.origin.pushurl", "https://git.example.com/w.git"),
        ("remote.origin.fetch", FETCH_REFSPEC),
        ("http.sslverify", "true"),
        ("remote.mirror.url", "git@github.com:acme/widgets.git"),
    ]
    assert credential_findings(scrubbed) == []
