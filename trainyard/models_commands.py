"""`trainyard models init | publish | update | ls | search | show | download | alias |
webhook | deprecate`: the user's side of the model repository, built on the SDK
(`trainyard.client.AsyncClient`), and the metadata files they read.

A metadata file is YAML, or JSON when its name ends in .json, read as `trainyard submit` reads
a manifest, and checked against the metadata's schema before anything is sent, so that every
mistake is one line naming the file and each bad field (with its line, in YAML).
"""

from __future__ import annotations

import argparse
import asyncio
import math
from pathlib import Path
from typing import Any, get_args

from controlplane.models.errors import InvalidMetadata
from controlplane.models.metadata import (
    ARRAY_KINDS,
    DataKind,
    DType,
    ModelMetadata,
    validate_metadata,
)
from controlplane.models.updates import validate_update
from controlplane.settings import Settings
from trainyard import render
from trainyard.api import UsageError
from trainyard.client import Visibility
from trainyard.commands import Handler, client_for, output_options, print_json, target_options
from trainyard.config import TOKEN_ENV
from trainyard.manifest_file import located, read_mapping

DEFAULT_METADATA_FILE = "model.yaml"
DEFAULT_LIMIT = 50
MAX_LIMIT = 200
"""The most versions one page of a search holds (the API's bound)."""


def add_model_commands(commands: Any) -> None:
    """Add `models` and its subcommands to the top-level subparsers (`add_subparsers()`'s
    result). Their errors reach the front door (`cli.main`), which prints one line and exits with
    the documented code."""
    target = target_options(
        f"a file holding the bearer token, - for standard input (else ${TOKEN_ENV}, else login's)"
    )
    output = output_options()
    group = commands.add_parser(
        "models",
        help="publish, find and download trained models",
        description="The model repository: versions of trained models with their metadata "
        "(after DLHub's), found by search, named as NAME (the latest version), NAME:3 or "
        "NAME@ALIAS, each TENANT/-prefixed for another tenant's public model.",
    )
    models = group.add_subparsers(title="commands", required=True, metavar="COMMAND")

    def add(name: str, summary: str, description: str, handler: Handler, *parents: Any) -> Any:
        command = models.add_parser(name, help=summary, description=description, parents=parents)
        command.set_defaults(handler=handler)
        return command

    init = add(
        "init",
        "write a metadata file to fill in",
        "Write a metadata template (YAML, commented) holding every field of the schema: replace "
        "each <...> (title, creators, framework, servable), edit the others if you like, then "
        "publish with --metadata FILE. An existing file is kept unless --force (exit code 2).",
        cmd_init,
    )
    init.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        default=DEFAULT_METADATA_FILE,
        help=f"where to write it (default {DEFAULT_METADATA_FILE})",
    )
    init.add_argument("--force", action="store_true", help="replace FILE if it exists")
    publish = add(
        "publish",
        "publish a model's next version",
        "Publish ARTIFACT (a file, streamed, its sha256 checked by the server) or a file of a "
        "completed job's results (--from-job), with the metadata in FILE, as the next version "
        "of model NAME; print its reference (tenant/name:version). The metadata is checked "
        "first: a wrong field is named, with its line (exit code 2). Publishing the same file "
        "with the same metadata again prints the version it made.",
        cmd_publish,
        target,
    )
    publish.add_argument("name", metavar="NAME", help="the model's name")
    publish.add_argument("artifact", metavar="ARTIFACT", nargs="?", help="the file to publish")
    publish.add_argument(
        "--metadata", metavar="FILE", required=True, help="the metadata (YAML or JSON)"
    )
    publish.add_argument(
        "--public", action="store_true", help="every tenant may see it (default: yours only)"
    )
    publish.add_argument(
        "--from-job",
        metavar="JOB",
        help="publish a file of this completed job's stored results instead of ARTIFACT; its "
        "provenance (job, attempt, checkpoint, data sha256) is filled in",
    )
    publish.add_argument(
        "--checkpoint",
        type=int,
        metavar="STEP",
        help="with --from-job: the checkpoint the job saved at STEP, not its results",
    )
    publish.add_argument(
        "--results-file",
        metavar="PATH",
        help="with --from-job: the file, relative to the job's results (server default model.pt)",
    )
    update = add(
        "update",
        "change a version's description, domains, tags, citation or metrics",
        "Change what may change of a published version: description, domains, tags and "
        "citation (each replaced), and metrics to add (one recorded never changes). FILE "
        "holds any of those fields; the options win over it. At least one is needed.",
        cmd_update,
        target,
    )
    update.add_argument("reference", metavar="REF", help="the version: NAME, NAME:N, NAME@ALIAS")
    update.add_argument("--metadata", metavar="FILE", help="the fields to change (YAML or JSON)")
    update.add_argument("--description", metavar="TEXT", help="the new description")
    update.add_argument("--tags", metavar="A,B", help="the new tags, comma separated")
    update.add_argument("--domains", metavar="A,B", help="the new domains, comma separated")
    update.add_argument(
        "--doi", metavar="DOI", help="the citation's DOI (its text, if any, is kept)"
    )
    update.add_argument(
        "--metric",
        action="append",
        metavar="NAME=VALUE",
        help="a metric to add (repeatable)",
    )
    listing = add(
        "ls",
        "list model versions, or one model's",
        "Without NAME, every version you may see (yours and other tenants' public ones), "
        "newest first. With NAME ([TENANT/]NAME), that model's versions, newest first, with "
        "the aliases naming each and which is latest.",
        cmd_ls,
        target,
        output,
    )
    listing.add_argument("name", metavar="NAME", nargs="?", help="a model: [TENANT/]NAME")
    listing.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"at most N versions (1 to {MAX_LIMIT}; default {DEFAULT_LIMIT})",
    )
    search = add(
        "search",
        "search model versions",
        "Find the versions QUERY matches among yours and other tenants' public ones, best "
        "first (docs/user-guide.md, 'Model search queries': free text, name~part, "
        "framework:pytorch, "
        "metrics.accuracy>=0.9, created>=2026-01-01, AND, OR, NOT, parentheses; '' matches "
        "every one); then how many match, their counts by framework, domain, tenant and "
        "license, and the command for the next page. A bad query is exit code 2, with what "
        "is wrong and its column.",
        cmd_search,
        target,
        output,
    )
    search.add_argument("query", metavar="QUERY", help="the query (quote it for the shell)")
    search.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"versions per page (1 to {MAX_LIMIT}; default {DEFAULT_LIMIT})",
    )
    search.add_argument("--cursor", metavar="C", help="the page after the one that gave C")
    show = add(
        "show",
        "one version's metadata, artifact and aliases",
        "Show a version: title, creators, license, citation, domains, tags, framework, "
        "servable (entry point, input, output, requirements), metrics, provenance (job, "
        "attempt, checkpoint step, data sha256), artifact sha256 and size, visibility, "
        "deprecation and the aliases naming it.",
        cmd_show,
        target,
        output,
    )
    show.add_argument(
        "reference", metavar="REF", help="[TENANT/]NAME, NAME:N or NAME@ALIAS (NAME: latest)"
    )
    download = add(
        "download",
        "download a version's artifact",
        "Download a version's artifact to FILE (default NAME-vN, in the current directory; "
        "in DIR when FILE is a directory), checking its size and sha256 before it is put in "
        "place: a download that breaks off or arrives corrupted leaves no file. Print the "
        "sha256 and the path, as sha256sum does. An existing file is kept unless --force "
        "(exit code 2).",
        cmd_download,
        target,
    )
    download.add_argument(
        "reference", metavar="REF", help="[TENANT/]NAME, NAME:N or NAME@ALIAS (NAME: latest)"
    )
    download.add_argument("-o", "--output", metavar="FILE", help="where to write it")
    download.add_argument("--force", action="store_true", help="replace FILE if it exists")
    alias = add(
        "alias",
        "point an alias at a version, or remove it",
        "Point ALIAS of the model at the version REF names (setting it, or moving it from "
        "the version it named), or with --remove take ALIAS off the model NAME. 'latest' is "
        "derived (the highest version not deprecated): it is never set.",
        cmd_alias,
        target,
    )
    alias.add_argument(
        "reference", metavar="REF", help="the version (NAME:N ...); with --remove, the model"
    )
    alias.add_argument("alias", metavar="ALIAS", help="e.g. production")
    alias.add_argument("--remove", action="store_true", help="remove ALIAS from model REF")
    webhook = add(
        "webhook",
        "notify a model's events to a URL, or stop",
        "POST the model's events (versions published, updated or deprecated, aliases set or "
        "removed) to URL from now on, signed with your tenant's webhook secret and retried as a "
        "job's notifications are; or with --remove, stop. The URL's host must be public (or "
        "in the operator's TRAINYARD_WEBHOOK_ALLOW_NETWORKS).",
        cmd_webhook,
        target,
    )
    webhook.add_argument("name", metavar="NAME", help="the model")
    webhook.add_argument("url", metavar="URL", nargs="?", help="where to POST its events")
    webhook.add_argument("--remove", action="store_true", help="stop notifying")
    deprecate = add(
        "deprecate",
        "deprecate a version",
        "Deprecate a version, saying why: it stays downloadable by its number but is no "
        "longer latest. A version an alias names is refused: move the alias first.",
        cmd_deprecate,
        target,
    )
    deprecate.add_argument("reference", metavar="REF", help="the version: NAME:N or NAME@ALIAS")
    deprecate.add_argument("--reason", metavar="TEXT", required=True, help="why, for its users")


def metadata_template(file: str) -> str:
    """What `models init` writes to `file`: every field of the schema, commented, with a
    placeholder `<...>` where a person must write something; every other field holds a valid
    value (its default), so that a file with its placeholders replaced is valid. The choices
    are the schema's own, so that the template cannot fall behind it."""
    frameworks = ", ".join(get_args(ModelMetadata.model_fields["framework"].annotation))
    arrays = ", ".join(sorted(ARRAY_KINDS))
    return f"""\
# A model version's metadata: replace each <...>, edit the rest if you like, then
#   trainyard models publish NAME ARTIFACT --metadata {file}
# Once published, only description, domains, tags, citation and new metrics may change
# (trainyard models update). The schema: GET /v1/schemas/model-metadata.

# A short title, one line.
title: <title>
# What the model does, for people (a | and indented lines below it for several lines).
description: ""
# Who made it, credited in order. affiliation and orcid (e.g. 0000-0002-1825-0097) are optional.
creators:
  - name: <your name>
    affiliation: null
    orcid: null
# An SPDX license identifier (MIT, Apache-2.0, CC-BY-4.0, ...); NOASSERTION: not stated.
license: NOASSERTION
# How to cite it: {{doi: 10.1000/xyz123, text: "A. Author (2026). Title."}}, or one of them.
citation: null
# Scientific or application domains, e.g. [materials science]: counted in search results.
domains: []
# Free keywords for search, e.g. [resnet, classification].
tags: []
# What it is built with: {frameworks}.
framework: <framework>
# How to run it.
servable:
  # What a replica imports and calls: module:function, or module:Class.method.
  entry_point: <module:function>
  # What the entry point takes. type, one of:
  #   {", ".join(get_args(DataKind))}
  # and for {arrays} only: dtype, one of
  #   {", ".join(get_args(DType))}
  # and shape, each dimension's size, null for one of any size: [null, 3, 224, 224].
  input:
    type: <type>
    dtype: null
    shape: null
    description: ""
  # What it returns, described the same way.
  output:
    type: <type>
    dtype: null
    shape: null
    description: ""
  # The Python packages it needs, as in requirements.txt: e.g. [torch>=2.1, numpy].
  requirements: []
# How well it does, by metric name (letters, digits and _): e.g. {{accuracy: 0.93}}.
metrics: {{}}
# provenance, the training job it came from, is filled in by publish --from-job: never here.
"""


def read_metadata(file: str) -> dict[str, Any]:
    """A metadata document as JSON to send (only the fields the file gives); UsageError
    naming the file and every bad field otherwise."""
    name, text, value = read_mapping(file, "metadata")
    try:
        document = validate_metadata(value)
    except InvalidMetadata as exc:
        raise _invalid(name, file, text, exc) from None
    return document.model_dump(mode="json", exclude_unset=True)


def read_update(file: str) -> dict[str, Any]:
    """The mutable fields a file gives, to send as an update; UsageError naming the file and
    every bad (or immutable) field otherwise."""
    name, text, value = read_mapping(file, "metadata")
    try:
        update = validate_update(value)
    except InvalidMetadata as exc:
        raise _invalid(name, file, text, exc) from None
    return update.model_dump(mode="json", exclude_unset=True)


def _invalid(name: str, file: str, text: str, exc: InvalidMetadata) -> UsageError:
    """One line naming every bad field, with its line in a YAML file."""
    yaml_text = None if file.endswith(".json") else text
    problems = [
        located(
            error.path,
            [int(part) if part.isdigit() else part for part in error.path.split(".")],
            error.message,
            yaml_text,
        )
        for error in exc.errors
    ]
    return UsageError(f"{name}: invalid metadata: {'; '.join(problems)}")


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise UsageError(f"--limit must be between 1 and {MAX_LIMIT}")
    return limit


def _words(text: str) -> list[str]:
    """`a, b` as ['a', 'b']; '' as none (clearing the field)."""
    return [word.strip() for word in text.split(",") if word.strip()]


def _metric(text: str) -> tuple[str, float]:
    name, equals, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not equals or not name or not math.isfinite(number):
        raise UsageError(f"--metric must be NAME=NUMBER, e.g. accuracy=0.93, not {text!r}")
    return name, number


async def cmd_init(args: argparse.Namespace, settings: Settings) -> int:
    await asyncio.to_thread(_write_template, Path(args.file), args.force)
    print(f"wrote {args.file}: replace each <...> in it, then publish with --metadata {args.file}")
    return 0


def _write_template(path: Path, force: bool) -> None:
    try:
        with path.open("w" if force else "x") as file:
            file.write(metadata_template(str(path)))
    except FileExistsError:
        raise UsageError(f"{path} exists: --force replaces it") from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc}") from exc


async def cmd_publish(args: argparse.Namespace, settings: Settings) -> int:
    if (args.artifact is None) == (args.from_job is None):
        raise UsageError("publish takes either ARTIFACT (a file) or --from-job JOB, not both")
    if args.from_job is None and (args.checkpoint is not None or args.results_file is not None):
        raise UsageError("--checkpoint and --results-file choose a file of --from-job JOB")
    metadata = await asyncio.to_thread(read_metadata, args.metadata)
    visibility: Visibility = "public" if args.public else "private"
    async with client_for(args, settings) as client:
        if args.from_job is not None:
            version = await client.publish_model_from_job(
                args.name,
                args.from_job,
                metadata,
                checkpoint_step=args.checkpoint,
                results_file=args.results_file,
                visibility=visibility,
            )
        else:
            version = await client.publish_model(
                args.name, args.artifact, metadata, visibility=visibility
            )
    print(version["reference"])
    return 0


async def cmd_update(args: argparse.Namespace, settings: Settings) -> int:
    update = await asyncio.to_thread(read_update, args.metadata) if args.metadata else {}
    if args.description is not None:
        update["description"] = args.description
    if args.tags is not None:
        update["tags"] = _words(args.tags)
    if args.domains is not None:
        update["domains"] = _words(args.domains)
    metrics = dict(_metric(text) for text in args.metric or [])
    if metrics:
        update["metrics"] = {**update.get("metrics", {}), **metrics}
    if not update and args.doi is None:
        raise UsageError(
            "update needs something to change: --metadata, --description, --tags, --domains, "
            "--doi or --metric"
        )
    async with client_for(args, settings) as client:
        reference = args.reference
        if args.doi is not None:
            # A citation is replaced whole: the version's text (or the file's) stays with the
            # new DOI. Its number, so that the version updated is the one read.
            current = await client.model_version(reference)
            reference = current["reference"]
            cited = update.get("citation") or current["metadata"].get("citation") or {}
            update["citation"] = {**cited, "doi": args.doi}
        try:
            validate_update(update)
        except InvalidMetadata as exc:
            raise UsageError(str(exc)) from None
        version = await client.update_model(reference, update)
    print(f"{version['reference']} updated")
    return 0


async def cmd_ls(args: argparse.Namespace, settings: Settings) -> int:
    if args.name is None:
        # Every version the caller may see: the empty query's, newest first.
        return await _search(args, settings, "", None)
    limit = _limit(args.limit)
    async with client_for(args, settings) as client:
        model = await client.model(args.name)
    if args.output == "json":
        print_json(model)
    else:
        print(render.model_versions(model, limit))
    return 0


async def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    return await _search(args, settings, args.query, args.cursor)


async def _search(
    args: argparse.Namespace, settings: Settings, query: str, cursor: str | None
) -> int:
    limit = _limit(args.limit)
    async with client_for(args, settings) as client:
        page = await client.models(query, limit=limit, cursor=cursor)
    if args.output == "json":
        print_json(page)
    else:
        print(render.search_page(page, _next_page(query, page, limit)))
    return 0


def _next_page(query: str, page: dict[str, Any], limit: int) -> list[str] | None:
    """The command line that shows the page after `page`; None on the last page."""
    if not page["next_cursor"]:
        return None
    sized = [] if limit == DEFAULT_LIMIT else ["--limit", str(limit)]
    return ["trainyard", "models", "search", query, "--cursor", page["next_cursor"], *sized]


async def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        version = await client.model_version(args.reference)
        model = await client.model(f"{version['tenant']}/{version['name']}")
    named = [alias for alias, number in model["aliases"].items() if number == version["version"]]
    aliases = ["latest", *named] if model["latest"] == version["version"] else named
    if args.output == "json":
        print_json({"version": version, "aliases": aliases})
    else:
        print(render.version_view(version, aliases))
    return 0


async def cmd_download(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        version = await client.model_version(args.reference)
        default = f"{version['name']}-v{version['version']}"
        target = await asyncio.to_thread(_download_target, args.output, default, args.force)
        # By its number: the file is the version just read, whatever an alias names by now.
        await client.download_model(version["reference"], target)
    print(f"{version['artifact_sha256']}  {render.printable(str(target))}")
    return 0


def _download_target(output: str | None, default: str, force: bool) -> Path:
    target = Path(output or default)
    if target.is_dir():
        target = target / default
    if target.exists() and not force:
        raise UsageError(f"{target} exists: --force replaces it")
    return target


async def cmd_alias(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        if args.remove:
            await client.remove_model_alias(args.reference, args.alias)
            print(f"removed alias {args.alias} of {args.reference}")
            return 0
        moved = await client.set_model_alias(args.reference, args.alias)
    previous = moved["previous"]
    was = "" if previous in (None, moved["version"]) else f" (was version {previous})"
    print(f"{moved['alias']} names version {moved['version']}{was}")
    return 0


async def cmd_webhook(args: argparse.Namespace, settings: Settings) -> int:
    if args.remove == (args.url is not None):
        raise UsageError("webhook takes either URL or --remove, not both")
    async with client_for(args, settings) as client:
        if args.remove:
            await client.remove_model_webhook(args.name)
            print(f"{render.printable(args.name)}'s events are no longer notified")
            return 0
        await client.set_model_webhook(args.name, args.url)
    print(f"{render.printable(args.name)}'s events go to {render.printable(args.url)}")
    return 0


async def cmd_deprecate(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        version = await client.deprecate_model(args.reference, args.reason)
    print(f"{version['reference']} deprecated: {render.printable(version['deprecated'])}")
    return 0
