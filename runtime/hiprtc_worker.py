"""Subprocess body of a hiprtc compile (python -m kvforge.runtime.hiprtc_worker SRC OUT ARCH [OPT...]).

Kept out of the caller's process because ROCm 5.2's comgr aborts the process on targets it does
not know. Exit 0: OUT holds the code object; exit 1: stderr holds the hiprtc log."""
import sys


def main() -> int:
    src_path, out_path, arch, *opts = sys.argv[1:]
    from hip import hiprtc

    src = open(src_path, "rb").read()
    err, prog = hiprtc.hiprtcCreateProgram(src, src_path.encode(), 0, [], [])
    if err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
        print(f"hiprtcCreateProgram: {err}", file=sys.stderr)
        return 1
    args = [f"--offload-arch={arch}".encode(), *(o.encode() for o in opts)]
    (err,) = hiprtc.hiprtcCompileProgram(prog, len(args), args)
    _, size = hiprtc.hiprtcGetProgramLogSize(prog)
    log = bytearray(size)
    if size:
        hiprtc.hiprtcGetProgramLog(prog, log)
    if err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
        print(f"hiprtcCompileProgram: {err}\n{log.decode(errors='replace')}", file=sys.stderr)
        return 1
    _, size = hiprtc.hiprtcGetCodeSize(prog)
    code = bytearray(size)
    hiprtc.hiprtcGetCode(prog, code)
    with open(out_path, "wb") as f:
        f.write(bytes(code))
    return 0


if __name__ == "__main__":
    sys.exit(main())
