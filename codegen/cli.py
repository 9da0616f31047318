"""The codegen half of the `kvforge` command line: `generate` and `list` (no compiler, no GPU).

`kvforge.runtime.cli` adds the commands that need the runtime (compile, demo, cache) to the
same parser; `python -m kvforge.codegen.cli` runs the codegen commands alone.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from .errors import ConfigError
from .manifest import check_tree, render_tree, write_tree
from .matrix import filter_variants, load_matrix
from .shard import parse_shard, select_shard

console = Console(width=None if sys.stdout.isatty() else 200)


def select_variants(args) -> list:
    """The variants of args.matrix that pass --filter and --arch, then --shard (where the command
    has them). A filter or arch that matches nothing is an error; an empty shard is not (a small
    matrix over many build jobs leaves some empty)."""
    variants = filter_variants(load_matrix(args.matrix), getattr(args, "filter", None))
    arches = getattr(args, "arch", None)
    if arches:
        variants = [v for v in variants if v.arch in arches]
    if not variants:
        raise ConfigError("no variant matches the given matrix/filter/arch")
    return select_shard(variants, getattr(args, "shard", None))


def add_shard_option(parser) -> None:
    parser.add_argument("--shard", type=parse_shard, metavar="i/n",
                        help="only shard i of n (1-based; by a hash of the variant name, so shards stay put "
                             "when the matrix grows)")


def cmd_generate(args) -> int:
    variants = select_shard(load_matrix(args.matrix), args.shard)
    files = render_tree(variants)
    out = Path(args.out)
    if args.check:
        diff = check_tree(files, out)
        if diff:
            sys.stdout.write(diff)
            console.print(f"{out} is stale: run `kvforge generate --out {out}`", style="red", markup=False)
            return 1
        console.print(f"{out} is fresh ({len(variants)} variants, {len(files)} files)")
        return 0
    removed = write_tree(files, out)
    console.print(f"wrote {len(files)} files for {len(variants)} variants" + (f" (shard {args.shard})" if args.shard else "")
                  + f" to {out}"
                  + (f", removed {len(removed)} stale" if removed else ""))
    return 0


def cmd_list(args) -> int:
    for v in select_variants(args):
        print(v.name)
    return 0


def add_codegen_commands(sub) -> None:
    """`generate` and `list` on an argparse subparsers object."""
    g = sub.add_parser("generate", help="write sources, shared headers and manifest.json")
    g.add_argument("matrix", nargs="?", help="matrix TOML (default: the built-in matrix)")
    g.add_argument("--out", default="generated", help="output folder (default: generated)")
    g.add_argument("--check", action="store_true", help="exit 1 with a diff when --out is stale")
    add_shard_option(g)
    g.set_defaults(func=cmd_generate)

    ls = sub.add_parser("list", help="list variant names")
    ls.add_argument("matrix", nargs="?")
    ls.add_argument("--filter", help="glob on the variant name (a bare word matches a substring)")
    add_shard_option(ls)
    ls.set_defaults(func=cmd_list)


def build_parser(description: str | None = None) -> tuple[argparse.ArgumentParser, object]:
    """The parser with the codegen commands, and its subparsers object for more."""
    p = argparse.ArgumentParser(prog="kvforge", description=description or __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    add_codegen_commands(sub)
    return p, sub


def run(parser: argparse.ArgumentParser, argv: list[str] | None, check=None) -> int:
    """Parses argv (then `check(parser, args)`, which may call parser.error) and runs the command;
    a ConfigError exits 2 with its message."""
    args = parser.parse_args(argv)
    if check is not None:
        check(parser, args)
    try:
        return args.func(args)
    except ConfigError as err:
        console.print(f"config error: {err}", style="red", markup=False, highlight=False)
        return 2


def main(argv: list[str] | None = None) -> int:
    return run(build_parser()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
