"""`mars deploy generate|add-agent|add-user|revoke`: the sites file edited, every file
generated again, and what to copy and reload said."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from console.deploy import sitesfile
from console.deploy.files import DEFAULT_PREFIX, DEFAULT_STATE
from console.deploy.generate import DeployError, Generated, Layout, generate
from console.deploy.sitesfile import SitesFile


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="deploy_cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("sites", help="the sites file (YAML; see deploy/README.md)")
        sp.add_argument("-o", "--out", required=True, help="output directory (kept secrets too)")
        sp.add_argument(
            "--prefix", default=DEFAULT_PREFIX,
            help=f"where a bundle installs on its machine (default {DEFAULT_PREFIX})",
        )  # fmt: skip
        sp.add_argument("--state", default=DEFAULT_STATE, help=f"state dir ({DEFAULT_STATE})")
        sp.add_argument(
            "--in-place", action="store_true",
            help="bundles name their own files where generated (trying it on one machine)",
        )  # fmt: skip
        return sp

    common(sub.add_parser("generate", help="every machine's files from the sites file"))
    aa = common(sub.add_parser("add-agent", help="a new agent at a site (or the cloud)"))
    aa.add_argument("name")
    aa.add_argument("--site", help="its site (default: a cloud agent at the hub)")
    au = common(sub.add_parser("add-user", help="a new user (or admin)"))
    au.add_argument("name")
    au.add_argument("--admin", action="store_true")
    rv = common(sub.add_parser("revoke", help="remove an agent, user or admin"))
    rv.add_argument("name")


def _edited(sites: SitesFile, args: argparse.Namespace) -> SitesFile:
    data = sites.model_dump(mode="json")
    if args.deploy_cmd == "add-agent":
        if args.name in sites.agents():
            raise ValueError(f"agent {args.name} already exists")
        if args.site:
            for s in data["sites"]:
                if s["name"] == args.site:
                    s["agents"].append(args.name)
                    break
            else:
                raise ValueError(f"no site {args.site} in the sites file")
        else:
            data["cloud_agents"].append(args.name)
    elif args.deploy_cmd == "add-user":
        data["admins" if args.admin else "users"].append(args.name)
    elif args.deploy_cmd == "revoke":
        found = False
        for key in ("cloud_agents", "users", "admins"):
            if args.name in data[key]:
                data[key].remove(args.name)
                found = True
        for s in data["sites"]:
            if args.name in s["agents"]:
                s["agents"].remove(args.name)
                found = True
        if not found:
            raise ValueError(f"no agent, user or admin {args.name} in the sites file")
    return SitesFile.model_validate(data)


def run(args: argparse.Namespace) -> int:
    path = Path(args.sites)
    try:
        sites = sitesfile.load(path)
        edited = _edited(sites, args)
    except ValueError as exc:
        print(f"mars deploy: {exc}", file=sys.stderr)
        return 2
    layout = Layout(
        Path(args.out),
        prefix=None if args.in_place else args.prefix,
        state=None if args.in_place else args.state,
    )
    try:
        made = generate(edited, layout)
    except DeployError as exc:
        print(f"mars deploy: {exc}", file=sys.stderr)
        return 2
    if edited != sites:
        sitesfile.dump(edited, path)
    _report(made, edited, args)
    return 0


def _report(made: Generated, sites: SitesFile, args: argparse.Namespace) -> None:
    for what in made.created:
        print(f"created {what}")
    for what in made.removed:
        print(f"removed {what}")
    print(f"wrote {len(made.bundles)} bundles under {made.out}")
    if args.deploy_cmd == "generate":
        print("install: see deploy/README.md (each bundle goes to its machine's prefix)")
        return
    name = args.name
    site = sites.site_of(name)
    servers = f"the leaf server of site {site.name}" if site else "every hub node"
    if args.deploy_cmd == "revoke":
        print(
            f"{name} revoked: copy the new nats.conf files to the hub nodes and site leaf "
            "servers and run `systemctl reload mars-nats` there; its connections close then"
        )
        return
    kind = "agents" if args.deploy_cmd == "add-agent" else "users"
    print(
        f"copy {made.out}/{kind}/{name} to its machine, the new nats.conf to {servers}, "
        "and run `systemctl reload mars-nats` there"
    )
