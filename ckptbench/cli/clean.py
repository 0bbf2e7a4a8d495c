"""``ckptbench clean DIR``: remove the scratch directories that killed runs of this host left in DIR."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ckptbench.cli.bench import ENDPOINT_URL_OPTION, storage_option_option
from ckptbench.cli.formats import emit, format_options
from ckptbench.cli.params import shown_path
from ckptbench.errors import TargetError
from ckptbench.units import format_size

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

#: ``--format csv``: one row per entry named like a scratch directory.
CSV_COLUMNS = ("path", "action", "state", "size_bytes", "owner_host", "owner_pid", "why_kept")


@click.command("clean", context_settings=_CONTEXT)
@click.argument("directory", metavar="DIR")
@click.option("--dry-run", is_flag=True, default=False, help="Say what would be removed; remove nothing.")
@ENDPOINT_URL_OPTION
@storage_option_option("region_name, profile, key, secret, as the runs that left the prefixes were given")
@format_options
def clean(directory: str, dry_run: bool, endpoint_url: str | None, storage_option: tuple[str, ...],
          output_format: str) -> None:
    """Remove the scratch directories (.ckptbench-scratch-*) that runs killed on this host left in DIR
    (SIGKILL, the OOM killer, a batch job's time limit), and list the others with why they were kept.

    Each scratch directory records the process that made it (host, pid namespace, boot, pid and its
    start time). Removed: those whose process is gone, on this host. Kept: those whose process still
    runs, those made on another host (on a shared filesystem their pids mean nothing here), and those
    without a record (made by an older ckptbench: remove them by hand once no run uses them).

    Only entries named .ckptbench-scratch-* directly in DIR are looked at. Removal follows no symbolic
    link (a link named like a scratch directory is kept, and a link inside one is removed, never what
    it points to) and stays on DIR's filesystem (a mount point inside is left alone).

    DIR may be an object-store location (s3://BUCKET/PREFIX): the scratch prefixes
    (ckptbench-scratch-*/) under it that record an owner the same way; removing one deletes its objects
    and aborts its open multipart uploads. Endpoint and credentials come from the AWS environment, or
    --endpoint-url and --storage-option as for bench.

    Exit status: 0, or 1 when a leftover could not be removed (why is logged), or 2 when DIR is not a
    directory.

    \b
    Examples:
      ckptbench clean /var/tmp --dry-run
      ckptbench clean /mnt/nvme --json
      ckptbench clean s3://bucket/bench --dry-run
      ckptbench clean s3://bucket/bench --endpoint-url http://rgw:7480 --storage-option profile=ckpt
    """
    from ckptbench.cli.bench import storage_options_from
    from ckptbench.errors import UsageError
    from ckptbench.storage import scheme_of
    from ckptbench.storage.local_target import NOT_REMOVED, remove_leftovers

    options = storage_options_from(endpoint_url, storage_option)
    if scheme_of(directory) != "file":  # object storage: its scratch prefixes
        from ckptbench.storage.object_target import remove_object_leftovers

        removed, kept = remove_object_leftovers(directory, options or None, dry_run=dry_run)
        path: Any = directory
    elif options:
        raise UsageError("--storage-option and --endpoint-url apply to object storage (s3://...), not to a directory")
    else:
        directory = directory.removeprefix("file://")  # as bench takes a directory
        path = Path(directory)
        if not directory:
            raise TargetError("the directory is empty", hint="give a directory path")
        if not os.path.isdir(path):
            what = "does not exist" if not os.path.lexists(path) else "is not a directory"
            raise TargetError(f"{shown_path(directory)} {what}", hint="give the directory a benchmark ran in")
        path = path.resolve()
        try:
            removed, kept = remove_leftovers(path, dry_run=dry_run)
        except OSError as exc:
            raise TargetError(f"{shown_path(directory)} cannot be read ({exc.strerror or exc})") from None
    entries = [{**f.to_dict(), "action": "would remove" if dry_run else "removed"} for f in removed]
    entries += [{**f.to_dict(), "action": "kept"} for f in kept]
    document = {"schema": "ckptbench.clean/1", "directory": str(path), "dry_run": dry_run, "entries": entries,
                "removed_bytes": sum(f.size_bytes or 0 for f in removed),
                "units": {"size_bytes": "bytes allocated on disk", "removed_bytes": "bytes"}}
    emit(document, output_format, _print, _rows)
    if any(f.state == NOT_REMOVED for f in kept):
        click.get_current_context().exit(1)


def _rows(doc: dict[str, Any]) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    rows = [{**e, "owner_host": (e["owner"] or {}).get("host"), "owner_pid": (e["owner"] or {}).get("pid")}
            for e in doc["entries"]]
    return CSV_COLUMNS, rows


def _print(doc: dict[str, Any]) -> None:
    if not doc["entries"]:
        click.echo(f"no scratch directories in {doc['directory']}")
        return
    for e in doc["entries"]:
        size = f" ({format_size(e['size_bytes'])})" if e["size_bytes"] is not None else ""
        owner = e["owner"]
        who = f", pid {owner['pid']} on {owner['host']}" if owner else ""
        why = f": {e['why_kept']}" if e["why_kept"] else ""
        click.echo(f"{e['action']:<12} {e['path']}{size}{who}{why}")
    verb = "would free" if doc["dry_run"] else "freed"
    click.echo(f"{verb} {format_size(doc['removed_bytes'])}")
