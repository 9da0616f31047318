"""The `kvforge` command: the codegen commands (generate, list) plus those that need the runtime:
compile, demo and cache."""
from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from rich.progress import Progress
from rich.table import Table

from kvforge.codegen.cli import add_shard_option, console, run, select_variants
from kvforge.codegen.cli import build_parser as codegen_parser

from .availability import partition, skips_fail
from .build import build_weight


def _compile_one(config_json: dict, debug: bool):
    from kvforge.codegen.variant import variant_from_dict

    from .build import build_variant

    k = build_variant(variant_from_dict(config_json), debug=debug)
    return k.name, k.arch, k.compile_seconds, k.cache_hit, k.resources


def cmd_compile(args) -> int:
    selected = select_variants(args)
    variants, skipped = partition(selected)
    jobs = args.jobs or os.cpu_count() or 1
    results, failures = {}, []
    with Progress(console=console, transient=True) as progress, ProcessPoolExecutor(jobs) as pool:
        task = progress.add_task(f"NVRTC x{jobs}", total=len(variants))
        # the longest builds first: the pool's last minutes are not one seesaw kernel beside an idle worker
        futures = {pool.submit(_compile_one, v.config.model_dump(mode="json"), args.debug): v
                   for v in sorted(variants, key=build_weight, reverse=True)}
        for fut in as_completed(futures):
            v = futures[fut]
            try:
                results[v.name] = fut.result()
            except Exception as err:  # noqa: BLE001 - reported per variant below
                failures.append((v.name, err))
            progress.advance(task)
    title = f"{len(results)} variants compiled" + (" (debug barriers)" if args.debug else "")
    table = Table(title=title + (f" (shard {args.shard} of the selection)" if args.shard else ""))
    for col in ("variant", "arch", "compile s", "regs", "spills st/ld B", "static smem B", "dynamic smem B"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    by_name = {v.name: v for v in variants}
    for name in sorted(results):
        _, arch, seconds, hit, res = results[name]
        table.add_row(name, arch, f"{seconds:.2f}" + (" (cached)" if hit else ""), str(res.registers),
                      f"{res.spill_store_bytes}/{res.spill_load_bytes}", str(res.static_smem_bytes),
                      str(by_name[name].main_kernel.dynamic_smem_bytes))
    console.print(table)
    for group in skipped:
        console.print(group.line(), markup=False, highlight=False)
    for name, err in failures:
        console.print(f"FAILED {name}:\n{err}", style="red", markup=False, highlight=False)
    fail = skips_fail(skipped, built=len(variants), explicit=bool(args.matrix or args.filter), arches=args.arch)
    if fail:
        console.print(f"FAILED: {fail}", style="red", markup=False, highlight=False)
    return 1 if failures or fail else 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args.matrix, Path(args.out))


def cmd_cache(args) -> int:
    from .cache import KernelCache
    from .cache_transfer import transfer

    cache = KernelCache()
    if args.action == "clear":
        console.print(f"removed {cache.clear()} entries from {cache.root}")
    elif args.action == "info":
        console.print(f"cache dir: {cache.root}\nentries: {len(cache.entries())}\nbytes: {cache.size_bytes()}")
    else:
        other = KernelCache(Path(args.dir))
        src, dst = (cache, other) if args.action == "export" else (other, cache)
        if args.action == "import" and not (src.root / "kernels").is_dir():
            console.print(f"cache import: {src.root} holds no exported cache (no kernels/ folder)", style="red",
                          markup=False)
            return 1
        report = transfer(src, dst)
        console.print(f"{args.action}ed {report.copied} entries from {src.root} to {dst.root} "
                      f"({report.present} already there, {len(report.rejected)} corrupt)", markup=False)
        for path in report.rejected:
            console.print(f"rejected (fails its checksum or names another entry): {path}", markup=False)
        return 1 if args.action == "import" and report.rejected else 0
    return 0


def build_parser():
    p, sub = codegen_parser(__doc__)
    c = sub.add_parser("compile", help="compile every variant (NVRTC, hiprtc/clang; no GPU needed) and report "
                       "resources; variants whose compiler is missing here are skipped, one line per group, and "
                       "fail the command only when asked for by --arch, or when an explicit MATRIX/--filter "
                       "selects nothing that can be built")
    c.add_argument("matrix", nargs="?")
    c.add_argument("--filter")
    c.add_argument("--arch", nargs="+", help="only variants targeting these arches")
    c.add_argument("--jobs", type=int, default=0, help="parallel processes (default: all cores)")
    c.add_argument("--debug", action="store_true", help="build with bounded, trapping barrier waits")
    add_shard_option(c)
    c.set_defaults(func=cmd_compile)

    d = sub.add_parser("demo", help="the main job: generate, compile, and on a GPU run, check and time")
    d.add_argument("matrix", nargs="?")
    d.add_argument("--out", default="generated")
    d.set_defaults(func=cmd_demo)

    k = sub.add_parser("cache", help="inspect, clear, export or import the compile cache")
    k.add_argument("action", choices=["info", "clear", "export", "import"],
                   help="export DIR: copy every valid entry into DIR; import DIR: merge DIR's valid entries "
                        "(each checked, written atomically, never over a valid entry)")
    k.add_argument("dir", nargs="?", help="the folder to export to or import from")
    k.set_defaults(func=cmd_cache)
    return p


def _check_cache_args(parser, args) -> None:
    if getattr(args, "command", None) == "cache":
        if args.action in ("export", "import") and not args.dir:
            parser.error(f"cache {args.action} needs DIR: kvforge cache {args.action} DIR")
        if args.action in ("info", "clear") and args.dir:
            parser.error(f"cache {args.action} takes no DIR (got {args.dir!r})")


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), argv, check=_check_cache_args)


if __name__ == "__main__":
    sys.exit(main())
