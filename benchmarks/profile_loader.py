"""Where the Loader's CPU goes: ``perf record`` on the bench_loader workload, per stage.

Runs the Loader (RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize,
batch 64, one thread per core, local JPEGs as bench_loader.py writes them) under
``perf record`` (Debian's ``linux-perf``), then groups the samples' symbols into stages:
entropy decode, IDCT, colour conversion (and chroma upsampling), resize,
flip/normalize/CHW write, batching, hand-off to Python, file I/O, allocation, threads and
synchronisation, other. Prints each stage's share of all samples and the top symbols of
each, so a regression shows where it is. libjpeg-turbo has no symbols on Debian, so its
samples are split by a measurement instead: full-size decode against a 1/8-scale DCT
decode (which entropy-decodes the whole file but skips nearly all IDCT and colour work).

Run (from the repository root, after ``make build``)::

    .venv/bin/python benchmarks/profile_loader.py [--n 1000] [--epochs 5] [--data DIR]
    .venv/bin/python benchmarks/profile_loader.py --uint8     # the PILToTensor pipeline

perf needs ``kernel.perf_event_paranoid`` <= 2 for user-space samples of its own child
(the default); kernel symbols need <= 1 (or root) and are otherwise counted as unknown.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
logger = logging.getLogger("profile_loader")

# (stage, regular expression on "dso symbol"), first match wins. The libjpeg-turbo names
# are its own (jdhuff.c, jdphuff.c, jidct*.c, jdcolor.c, jdsample.c, jdmerge.c and their
# SIMD jsimd_* twins); ours are in cpp/src/image and cpp/src/pipeline.
STAGES: list[tuple[str, str]] = [
    ("entropy decode", r"decode_mcu|jpeg_fill_bit_buffer|jpeg_huff_decode|huff|process_restart"
                       r"|decompress_onepass|decompress_data|consume_data|start_pass_huff"),
    ("IDCT", r"idct"),
    ("colour conversion", r"ycc_rgb|rgb_convert|gray_rgb|null_convert|color_convert|cmyk"
                          r"|upsample|merged|h2v1|h2v2|sep_upsample"),
    ("other JPEG", r"libturbojpeg|libjpeg|jpeg_|tj[A-Z]|jinit|jcopy|jzero|ReadRegion|jpeg_region"
                   r"|DecodeJpeg|image::\(anonymous namespace\)::Run\b"),
    ("PNG decode", r"spng|inflate|adler32|crc32|libz"),
    ("resize", r"Resize|HorizontalLinear|VerticalLinear|AreaTaps|Taps\b|RowWriter|AccumulateRow"
               r"|RoundRowToU8"),
    ("flip/normalize/CHW", r"WriteRow|Pipeline::Apply|materialize_flip"),
    ("batching", r"Loader::Next|BufferPool|BufferLease|FinishSample|Loader::RunTask"
                 r"|Loader::WorkerLoop|Loader::Schedule"),
    ("hand-off to Python", r"nanobind|nb_|libtorch|libc10|_core\.cpython|dlpack|PyLoader"),
    ("Python", r"libpython|python3"),
    ("file I/O", r"FileStore|read$|pread|\[k\].*(read|vfs|copy_user|page|filemap|ext4|xfs)"
                 r"|copy_to_user|rep_movs"),
    ("allocation", r"malloc|free|_int_|calloc|realloc|mmap|munmap|brk|operator new"
                   r"|operator delete|clear_page|page_fault|do_anonymous"),
    ("threads/sync", r"futex|pthread|mutex|condition_variable|sched|schedule|__lll|spin"),
    ("memcpy/memset (unattributed)", r"memcpy|memmove|memset"),
]


def classify(line: str) -> str:
    # A library without symbols (Debian ships libjpeg-turbo stripped, and bookworm has no
    # -dbgsym for it): perf prints bare addresses, which say only which library.
    if re.search(r"\[\.\] 0x[0-9a-f]+$", line) and re.search(r"libjpeg|libturbojpeg", line):
        return "JPEG, no symbols (see the decode split below)"
    for stage, pattern in STAGES:
        if re.search(pattern, line):
            return stage
    return "other"


def decode_split(root: str, n: int, helpers: ModuleType) -> None:
    """Entropy decode against the rest of the JPEG decode, without symbols: a 1/8-scale
    DCT decode still entropy-decodes the whole file but does almost no IDCT, upsampling
    or colour conversion, so its time is close to the entropy-decode floor. `helpers` is
    the benchmark module dask_ddp_bench (``bench_loader.bench_helpers``)."""
    paths = sorted(str(p) for p in Path(root).rglob("*.jpg"))[:n]
    blobs = [Path(p).read_bytes() for p in paths]
    cores = os.cpu_count() or 1
    ms = {}
    for denom in (1, 8):
        helpers.decode_throughput(blobs[:16], cores, 1, denom)
        best = max(helpers.decode_throughput(blobs, cores, 3, denom) for _ in range(3))
        ms[denom] = 1e3 * cores / best
    logger.info(
        "JPEG decode split (%d files, CPU ms per image): full decode %.3f; entropy-decode floor "
        "(1/8-scale decode) %.3f = %.0f%%; IDCT + upsampling + colour conversion ~%.3f",
        len(blobs), ms[1], ms[8], 100 * ms[8] / ms[1], ms[1] - ms[8],
    )


def worker(args: argparse.Namespace) -> None:
    """The profiled process: the Loader over args.data for args.epochs epochs."""
    sys.path.insert(0, str(HERE))
    import bench_loader as bl  # noqa: E402 - imports benchenv first, as the benchmark does

    from dask_ddp.data import ImageFolder, Loader

    cores = os.cpu_count() or 1
    transform = bl.uint8_transform() if args.uint8 else bl.our_transform()
    loader = Loader(ImageFolder(args.data), bl.BATCH, transform=transform, num_threads=cores)
    # Start-up (imports) is not profiled: perf attaches when this says it is ready.
    print("ready", flush=True)  # noqa: T201 - the parent's protocol, on stdout
    sys.stdin.readline()
    n = 0
    t0 = time.perf_counter()
    for e in range(args.epochs):
        loader.set_epoch(e)
        for images, _ in loader:
            n += int(images.shape[0])
    dt = time.perf_counter() - t0
    logger.info("profiled: %d images in %.2f s = %.0f img/s (perf's sampling included)",
                n, dt, n / dt)
    # perf stops before this process tears down (interpreter shutdown runs the garbage
    # collector over torch's objects, which is no part of loading).
    print("done", flush=True)  # noqa: T201 - the parent's protocol, on stdout
    sys.stdin.readline()
    loader.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="images (default 1000)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--data", default=None, help="reuse/keep the generated images here")
    ap.add_argument("--uint8", action="store_true", help="profile the PILToTensor pipeline")
    ap.add_argument("--freq", type=int, default=999, help="perf samples per second per CPU")
    ap.add_argument("--top", type=int, default=4, help="symbols listed per stage")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.worker:
        worker(args)
        return
    perf = shutil.which("perf")
    if perf is None:
        sys.exit("perf is not installed: apt-get install -y linux-perf")
    tmp = tempfile.TemporaryDirectory(prefix="profile_loader_")
    root = args.data or os.path.join(tmp.name, "images")
    sys.path.insert(0, str(HERE))
    import bench_loader as bl  # noqa: E402

    helpers = bl.bench_helpers()  # before the profile: a missing build fails at once
    have = sum(f.endswith(".jpg") for _, _, fs in os.walk(root) for f in fs)
    if have < args.n:
        logger.info("writing %d JPEGs to %s", args.n, root)
        bl.make_dataset(root, args.n)
    data = os.path.join(tmp.name, "perf.data")
    cmd = [sys.executable, __file__, "--worker", "--data", root, "--epochs", str(args.epochs)]
    if args.uint8:
        cmd.append("--uint8")
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as w:
        assert w.stdin is not None and w.stdout is not None
        if w.stdout.readline().strip() != "ready":
            sys.exit("the profiled Loader did not start")
        rec = subprocess.Popen([perf, "record", "-F", str(args.freq), "-o", data, "-p", str(w.pid)])
        time.sleep(1.0)  # perf is attached
        w.stdin.write("go\n")
        w.stdin.flush()
        finished = w.stdout.readline().strip() == "done"
        rec.send_signal(signal.SIGINT)
        if rec.wait(timeout=60) not in (0, -signal.SIGINT):
            sys.exit("perf record failed")
        w.stdin.write("exit\n")
        w.stdin.flush()
        w.wait()
    if not finished:
        sys.exit("the profiled Loader did not finish")
    report = subprocess.run(
        [perf, "report", "-i", data, "--no-children", "--sort", "dso,sym", "--stdio", "-q",
         "--percent-limit", "0"],
        check=True, capture_output=True, text=True,
    ).stdout
    shares: dict[str, float] = defaultdict(float)
    tops: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(.*)$", line)
        if not m:
            continue
        pct, what = float(m.group(1)), " ".join(m.group(2).split())
        stage = classify(what)
        shares[stage] += pct
        tops[stage].append((pct, what))
    logger.info("\nper-stage share of CPU samples (%s pipeline):",
                "uint8" if args.uint8 else "float32")
    for stage, pct in sorted(shares.items(), key=lambda kv: -kv[1]):
        logger.info("  %-30s %6.1f%%", stage, pct)
        for p, what in sorted(tops[stage], reverse=True)[: args.top]:
            logger.info("      %5.1f%%  %s", p, what[:100])
    decode_split(root, args.n, helpers)
    tmp.cleanup()


if __name__ == "__main__":
    main()
