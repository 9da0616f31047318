"""The `kvforge` command: the codegen commands (generate, list) plus those that need the runtime:
compile, plan, demo and cache."""
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
    variants, skipped = partition(select_variants(args))
    return _build_and_report(variants, skipped, args.jobs, args.debug,
                             f" (shard {args.shard} of the selection)" if args.shard else "",
                             explicit=bool(args.matrix or args.filter), arches=args.arch)


def _build_and_report(variants, skipped, jobs: int, debug: bool, title_note: str, explicit: bool, arches) -> int:
    """Compile `variants` in `jobs` processes (0: all cores) and print the resources table, the skipped groups
    and each failure; 1 when a build failed or the skips fail the command (`skips_fail`)."""
    jobs = jobs or os.cpu_count() or 1
    results, failures = {}, []
    with Progress(console=console, transient=True) as progress, ProcessPoolExecutor(jobs) as pool:
        task = progress.add_task(f"NVRTC x{jobs}", total=len(variants))
        # the longest builds first: the pool's last minutes are not one seesaw kernel beside an idle worker
        futures = {pool.submit(_compile_one, v.config.model_dump(mode="json"), debug): v
                   for v in sorted(variants, key=build_weight, reverse=True)}
        for fut in as_completed(futures):
            v = futures[fut]
            try:
                results[v.name] = fut.result()
            except Exception as err:  # noqa: BLE001 - reported per variant below
                failures.append((v.name, err))
            progress.advance(task)
    title = f"{len(results)} variants compiled" + (" (debug barriers)" if debug else "")
    table = Table(title=title + title_note)
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
    fail = skips_fail(skipped, built=len(variants), explicit=explicit, arches=arches)
    if fail:
        console.print(f"FAILED: {fail}", style="red", markup=False, highlight=False)
    return 1 if failures or fail else 0


def cmd_plan(args) -> int:
    """The variants a plan object (MLADecode / GQADecode) of these arguments loads on the named device, computed
    here without it: their names, and with --compile their builds (a build farm fills the cache serving machines
    then run from with KVFORGE_DISABLE_JIT=1)."""
    from kvforge.codegen.errors import ConfigError
    from kvforge.codegen.plan_args import CLI_NAMES, check_fp8_arch, check_plan_args
    from kvforge.codegen.select import plan_choices
    from kvforge.codegen.variant import Variant

    from .kv_format import planned_format

    family = {"mla": "mla_decode", "gqa": "gqa_decode"}[args.family]
    try:
        if family == "mla_decode":
            if args.kv_heads not in (None, 1) or args.head_dim not in (None, 576):
                raise ValueError("--kv-heads/--head-dim: MLA has one latent KV head of 576 (512 + 64 rope)")
            kv_heads, head_dim = 1, 576
        else:
            if args.kv_heads is None or args.head_dim is None:
                raise ValueError("--kv-heads and --head-dim are required for gqa")
            kv_heads, head_dim = args.kv_heads, args.head_dim
        check_plan_args(family, CLI_NAMES, heads=args.heads, kv_heads=kv_heads, head_dim=head_dim,
                        page_size=args.page_size, s_q=args.s_q, max_batch=args.max_batch, dtype=args.dtype)
        kv = planned_format(family, args.fp8, args.scale_block, head_dim)
        cuda = not args.arch.startswith("gfx")
        if cuda and (args.sms is None or args.sms < 1):
            raise ValueError("--sms: the device's SM count is required for NVIDIA arches (132 on an H100/H200 SXM, "
                             "108 on an A100)")
        if kv is not None:
            check_fp8_arch(args.arch, "--fp8", "--arch")
        configs = plan_choices(family, args.arch, args.sms or 0, args.dtype, args.page_size, num_q_heads=args.heads,
                               num_kv_heads=kv_heads, head_dim=head_dim, s_q=args.s_q, max_batch=args.max_batch,
                               scale_mode=kv.scale_mode if kv else "none",
                               scale_block_size=kv.scale_block_size if kv else None)
    except (ValueError, ConfigError) as err:
        console.print(f"kvforge plan: {err}", style="red", markup=False, highlight=False)
        return 2
    variants = [Variant(c) for c in configs]
    for v in variants:
        console.print(v.name, markup=False, highlight=False)
    if args.out:
        from kvforge.codegen.manifest import render_tree, write_tree

        files = render_tree(variants)
        write_tree(files, Path(args.out))
        console.print(f"wrote {len(files)} files for {len(variants)} variants to {args.out}", markup=False)
    if not args.compile:
        return 0
    buildable, skipped = partition(variants)
    return _build_and_report(buildable, skipped, args.jobs, args.debug, " (the plan's variants)", explicit=True,
                             arches=None)


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

    pl = sub.add_parser("plan", help="list (and with --compile build) the variants MLADecode / GQADecode load for "
                        "these arguments on the named device, without it: what a build farm compiles ahead of time")
    pl.add_argument("family", choices=["mla", "gqa"])
    pl.add_argument("--heads", type=int, required=True, help="query heads (Hq)")
    pl.add_argument("--kv-heads", type=int, help="gqa: KV heads (Hkv)")
    pl.add_argument("--head-dim", type=int, help="gqa: head dim (64, 128, 256, ...)")
    pl.add_argument("--page-size", type=int, required=True)
    pl.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    pl.add_argument("--s-q", type=int, default=1, help="query tokens per sequence")
    pl.add_argument("--max-batch", type=int, required=True)
    pl.add_argument("--fp8", choices=["per_tensor", "block", "fp8_ds_mla"], help="an fp8 cache in this layout")
    pl.add_argument("--scale-block", type=int, help="--fp8 block: the scale block size")
    pl.add_argument("--arch", required=True, help="the device: sm_80, sm_86, sm_89, sm_90, gfx90a, gfx942")
    pl.add_argument("--sms", type=int, help="the device's SM count (NVIDIA arches)")
    pl.add_argument("--out", help="also write their sources, C launchers and manifest into this folder (as generate)")
    pl.add_argument("--compile", action="store_true", help="also build them into the cache")
    pl.add_argument("--jobs", type=int, default=0, help="--compile: parallel processes (default: all cores)")
    pl.add_argument("--debug", action="store_true", help="--compile: bounded, trapping barrier waits")
    pl.set_defaults(func=cmd_plan)

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
