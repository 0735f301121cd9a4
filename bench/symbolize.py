#!/usr/bin/env python3
"""Side-by-side symbolization benchmark (issue #4; see docs/BENCHMARKS.md).

  bench/symbolize.py BINARY [--count 100000] [--runs 3] [--tools a,b,...]

Draws COUNT addresses uniformly over the bytes of the binary's sized FUNC
symbols in executable sections (seed 42, random order), then times each tool
from process start to last answer (median of RUNS, page cache warm), all with
inline frames and demangled names:

  llvm-symbolizer-19 --inlines     binutils addr2line -f -i -C
  eu-addr2line -f -i -C (1,000 addresses only: it costs ms per address)
  addr2line crate CLI (cargo install addr2line --features bin)
  blazecli symbolize elf (cargo install blazecli; addresses as argv)
  ours: dwarf  = first request, no index (straight from DWARF)
        index  = a process opening the prebuilt index and answering
        warm   = lookups/s in a warm process (in-process loop)
        build  = index build time, size, peak RSS
"""
import argparse, os, random, re, resource, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = os.path.join(ROOT, "target/release/examples/symbolize")


def functions(binary):
    out = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    seen, fns = set(), []
    for line in out.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW":
            a, s = int(p[0], 16), int(p[1], 16)
            if s > 0 and a not in seen:
                seen.add(a)
                fns.append((a, s))
    return sorted(fns)


def sample(binary, count):
    fns = functions(binary)
    prefix, total = [], 0
    for a, s in fns:
        prefix.append(total)
        total += s
    import bisect
    rng = random.Random(42)
    out = []
    for _ in range(count):
        r = rng.randrange(total)
        i = bisect.bisect_right(prefix, r) - 1
        out.append(fns[i][0] + (r - prefix[i]))
    return out


def timed(cmd, stdin_path):
    """Wall seconds and peak RSS (MiB) of one run."""
    with open(stdin_path) as f:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t = time.perf_counter()
        p = subprocess.run(cmd, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {p.stderr[-2000:]}")
    return wall, p.stderr


def median_run(cmd, stdin_path, runs):
    walls, err = [], ""
    for _ in range(runs):
        w, err = timed(cmd, stdin_path)
        walls.append(w)
    return statistics.median(walls), err


def peak_rss(cmd, stdin_path):
    with open(stdin_path) as f:
        p = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, stdin=f, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    return int(p.stderr.strip().splitlines()[-1]) / 1024


def dwarf_bytes(binary):
    out = subprocess.run(["readelf", "-S", "-W", binary], capture_output=True, text=True).stdout
    total = 0
    for m in re.finditer(r"\]\s+(\.debug_\S+)\s+\S+\s+[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)", out):
        total += int(m.group(2), 16)
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tools", default="llvm,binutils,eu,crate,blazecli,dwarf,index,warm")
    a = ap.parse_args()
    tools = a.tools.split(",")
    tmp = tempfile.mkdtemp(prefix="symbench-")
    addrs = sample(a.binary, a.count)
    addr_file = os.path.join(tmp, "addrs")
    with open(addr_file, "w") as f:
        f.write("".join(f"{x:#x}\n" for x in addrs))
    small_file = os.path.join(tmp, "addrs-1k")
    with open(small_file, "w") as f:
        f.write("".join(f"{x:#x}\n" for x in addrs[:1000]))
    dwarf = dwarf_bytes(a.binary)
    print(f"binary {a.binary}: {os.path.getsize(a.binary)/1e6:.0f} MB, DWARF {dwarf/1e6:.0f} MB, "
          f"{len(functions(a.binary))} functions, {a.count} addresses, median of {a.runs}")
    rows = []

    def row(name, n, wall, extra=""):
        rows.append((name, n, wall, n / wall, extra))
        print(f"{name:<34} {n:>7} addr {wall:8.3f} s {n / wall:>12,.0f} addr/s {extra}", flush=True)

    index_path = os.path.join(tmp, "index")
    t = time.perf_counter()
    build = subprocess.run(["/usr/bin/time", "-f", "%M", OURS, "build", a.binary, index_path],
                           capture_output=True, text=True, check=True)
    build_s = time.perf_counter() - t
    rss = int(build.stderr.strip().splitlines()[-1]) / 1024
    size = os.path.getsize(index_path)
    print(f"index build: {build_s:.2f} s, {size/1e6:.1f} MB = {100*size/dwarf:.1f}% of the DWARF, "
          f"peak RSS {rss:.0f} MiB", flush=True)
    t = time.perf_counter()
    subprocess.run([OURS, "build", a.binary, index_path, "--threads", "1"], capture_output=True, check=True)
    print(f"index build on one thread: {time.perf_counter() - t:.2f} s", flush=True)

    if "llvm" in tools and shutil.which("llvm-symbolizer-19"):
        w, _ = median_run(["llvm-symbolizer-19", f"--obj={a.binary}", "--inlines"], addr_file, a.runs)
        row("llvm-symbolizer-19 --inlines", a.count, w, f"RSS {peak_rss(['llvm-symbolizer-19', f'--obj={a.binary}', '--inlines'], addr_file):.0f} MiB")
    if "binutils" in tools:
        w, _ = median_run(["addr2line", "-f", "-i", "-C", "-e", a.binary], addr_file, a.runs)
        row("binutils addr2line -f -i -C", a.count, w)
    if "eu" in tools and shutil.which("eu-addr2line"):
        w, _ = median_run(["eu-addr2line", "-f", "-i", "-C", "-e", a.binary], small_file, 1)
        row("eu-addr2line -f -i -C (1k)", 1000, w)
    crate = shutil.which("addr2line", path=os.path.expanduser("~/.cargo/bin"))
    if "crate" in tools and crate:
        w, _ = median_run([crate, "-f", "-i", "-C", "-e", a.binary], addr_file, a.runs)
        row("addr2line crate CLI -f -i -C", a.count, w)
    if "blazecli" in tools and shutil.which("blazecli"):
        # blazecli takes addresses as arguments (the reference's method).
        script = f'ulimit -s 65536; exec blazecli symbolize elf --path {a.binary} $(cat {addr_file})'
        w, _ = median_run(["bash", "-c", script], "/dev/null", a.runs)
        row("blazecli symbolize elf (argv)", a.count, w)
    if "dwarf" in tools:
        cmd = [OURS, "dwarf", a.binary]
        w, _ = median_run(cmd, addr_file, a.runs)
        row("ours, no index (first request)", a.count, w, f"RSS {peak_rss(cmd, addr_file):.0f} MiB")
        cmd = [OURS, "dwarf", a.binary, "--threads", "2"]
        w, _ = median_run(cmd, addr_file, a.runs)
        row("ours, no index, 2 threads", a.count, w, f"RSS {peak_rss(cmd, addr_file):.0f} MiB")
    if "index" in tools:
        cmd = [OURS, "index", index_path]
        w, _ = median_run(cmd, addr_file, a.runs)
        row("ours, prebuilt index (new process)", a.count, w, f"RSS {peak_rss(cmd, addr_file):.0f} MiB")
    if "warm" in tools:
        _, err = timed([OURS, "index", index_path, "--warm", "20"], addr_file)
        for label, what in (("batches", "warm batches"), ("one by one", "warm one by one")):
            m = re.search(what + r": (\d+) addresses/s", err)
            print(f"{'ours, warm, ' + label:<34} {int(m.group(1)):>20,} addr/s", flush=True)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
