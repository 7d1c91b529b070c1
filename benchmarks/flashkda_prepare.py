"""FlashKDA (MoonshotAI/FlashKDA, Moonshot's CUTLASS KDA forward) as a baseline of ops/kda: its source
prepared where git is, built where the GPU is (issue 30). Nothing of FlashKDA or CUTLASS is kept in
this repository: `prepare` recreates the folder that the GPU machine needs.

  python3 benchmarks/flashkda_prepare.py prepare OUT [--flashkda GIT] [--cutlass GIT] [--commit C]
      Writes OUT: FlashKDA at its release commit (setup.py, flash_kda/, csrc/, tests/, benchmarks/,
      LICENSE, README.md; not docs/) and, under OUT/cutlass/, only the CUTLASS headers that its two
      sources include, at the CUTLASS commit FlashKDA pins as its submodule, with CUTLASS's
      LICENSE.txt. The headers are the `nvcc -M` closure of csrc/smxx/fwd_launch.cu with setup.py's
      flags, for each architecture built, and the C++ compiler's `-M -MG` closure of
      csrc/flash_kda.cpp (torch's own headers are left out: the GPU machine has torch). setup.py's
      include directories stay where it expects them (cutlass/include, cutlass/tools/util/include,
      cutlass/examples/common), so the copy builds unchanged. OUT/FLASHKDA.json records both commits,
      every file's sha256 and their digest. GIT is a git directory holding the commits (bare or not);
      without one, the repository is cloned from GitHub into a temporary directory.
      --check-compile also compiles fwd_launch.cu against OUT alone (nvcc -c, minutes): the proof that
      the closure is complete.

  python3 benchmarks/flashkda_prepare.py build OUT [--cache DIR]
      On the GPU machine (torch, nvcc, ninja; no network): builds OUT with its own setup.py
      (`setup.py build_ext --inplace`, FLASH_KDA_CUDA_ARCHS=90a unless the environment sets it) in a
      copy under DIR ($FLASHKDA_BUILD_DIR, else <tempdir>/flashkda), writes DIR/BUILT.json, imports the
      result and runs one small call. A second run with the same OUT (same digest), torch and
      architectures finds BUILT.json and builds nothing. ops/kda/baselines.py looks in the same DIR.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RELEASE = "1ce47ea"  # MoonshotAI/FlashKDA's release commit (../shared/notes/kda.md); it pins CUTLASS 5c149f5
FLASHKDA_URL = "https://github.com/MoonshotAI/FlashKDA.git"
CUTLASS_URL = "https://github.com/NVIDIA/cutlass.git"
# setup.py's include_dirs, relative to FlashKDA's root (cutlass is its submodule)
CUTLASS_DIRS = ("include", "tools/util/include", "examples/common")
SOURCES = ("csrc/smxx/fwd_launch.cu", "csrc/flash_kda.cpp")
SKIP = ("docs/", "cutlass")  # FlashKDA's files not carried: its blog post and images; the submodule
# setup.py's nvcc flags that decide what the preprocessor sees (the rest: -O3, ptxas options, threads)
NVCC_PP_FLAGS = (
    "-std=c++17",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
)
MANIFEST = "FLASHKDA.json"
BUILT = "BUILT.json"
ENV = "FLASHKDA_BUILD_DIR"  # ops/kda/baselines.py reads the same variable and default


def build_dir() -> Path:
    """Where `build` puts FlashKDA and where the baseline looks for it."""
    return Path(os.environ.get(ENV) or Path(tempfile.gettempdir()) / "flashkda")


def git(gitdir: Path, *args: str, **kw) -> str:
    return subprocess.run(
        ["git", f"--git-dir={gitdir}", *args], check=True, capture_output=True, text=True, **kw
    ).stdout


def git_dir(path: str | None, url: str, tmp: Path, name: str, partial: bool) -> Path:
    """The git directory of `path` (a bare repository or a work tree), or a clone of `url` in `tmp`."""
    if path:
        p = Path(path)
        return p / ".git" if (p / ".git").exists() else p
    dest = tmp / f"{name}.git"
    cmd = ["git", "clone", "--bare", "--quiet", *(["--filter=blob:none"] if partial else []), url]
    subprocess.run([*cmd, str(dest)], check=True)
    return dest


def resolve(gitdir: Path, rev: str) -> str:
    return git(gitdir, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()


def submodule_commit(gitdir: Path, commit: str, path: str = "cutlass") -> str:
    """The commit a gitlink (submodule entry) of `commit` pins."""
    line = git(gitdir, "ls-tree", commit, path).split()
    if len(line) < 3 or line[1] != "commit":
        raise SystemExit(f"{commit}: no submodule at {path!r}")
    return line[2]


def tree_files(gitdir: Path, commit: str, paths=()) -> list[tuple[str, str]]:
    """(path, blob id) of the regular files of `commit` under `paths` (all when empty)."""
    out = git(gitdir, "ls-tree", "-r", "-z", commit, "--", *paths)
    files = []
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, kind, oid = meta.split()
        if kind == "blob" and mode in ("100644", "100755"):
            files.append((path, oid))
    return files


def extract(gitdir: Path, files: list[tuple[str, str]], dest: Path) -> None:
    """Write each blob to dest/path (one `git cat-file --batch` for all: a partial clone fetches them)."""
    proc = subprocess.Popen(
        ["git", f"--git-dir={gitdir}", "cat-file", "--batch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        for path, oid in files:
            proc.stdin.write(oid.encode() + b"\n")
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            if len(header) != 3:
                raise SystemExit(f"git cat-file: {path} ({oid}) is missing from {gitdir}")
            data = proc.stdout.read(int(header[2]))
            proc.stdout.read(1)  # the newline after each object
            out = dest / path
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
    finally:
        proc.stdin.close()
        proc.wait()


def parse_deps(text: str) -> list[str]:
    """The prerequisites of a make rule as `-M` writes them (continuations, escaped spaces)."""
    text = text.replace("\\\n", " ")
    deps: list[str] = []
    for line in text.splitlines():
        if ":" not in line:
            continue
        body = line.split(":", 1)[1] if not line.startswith((" ", "\t")) else line
        tokens = body.replace("\\ ", "\0").split()
        deps += [t.replace("\0", " ") for t in tokens]
    return deps


def kept(deps: list[str], root: Path) -> list[str]:
    """The deps that are files under root, as paths relative to it (sorted, unique)."""
    root = root.resolve()
    out = set()
    for d in deps:
        p = (root / d).resolve() if not os.path.isabs(d) else Path(d).resolve()
        if p.is_file() and p.is_relative_to(root):
            out.add(p.relative_to(root).as_posix())
    return sorted(out)


def include_flags(root: Path) -> list[str]:
    return [f"-I{root / 'cutlass' / d}" for d in CUTLASS_DIRS] + [f"-I{root / 'csrc'}"]


def closure(root: Path, archs: list[str], nvcc: str = "nvcc", cxx: str = "c++") -> list[str]:
    """FlashKDA's and CUTLASS's files its two sources read, relative to root (FlashKDA's tree with
    CUTLASS at root/cutlass)."""
    deps: list[str] = []
    for arch in archs:
        gencode = ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
        cmd = [nvcc, "-M", *NVCC_PP_FLAGS, *include_flags(root), *gencode, SOURCES[0]]
        deps += parse_deps(
            subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True).stdout
        )
    cuda = Path(shutil.which(nvcc) or nvcc).resolve().parent.parent / "include"
    # torch's headers are absent here: -MG lists a missing header instead of failing on it
    cmd = [cxx, "-M", "-MG", "-std=c++17", *include_flags(root), f"-I{cuda}", SOURCES[1]]
    deps += parse_deps(
        subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True).stdout
    )
    return kept(deps, root)


def digest(root: Path, files: list[str]) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.encode() + b"\0" + hashlib.sha256((root / f).read_bytes()).digest())
    return h.hexdigest()


def fresh(out: Path) -> None:
    """Empty `out` for a new tree: only a folder this script wrote (its manifest) or an empty one."""
    if out.exists():
        if any(out.iterdir()) and not (out / MANIFEST).is_file():
            raise SystemExit(f"{out} is not empty and holds no {MANIFEST}: not overwriting it")
        shutil.rmtree(out)
    out.mkdir(parents=True)


def prepare(args) -> Path:
    out = Path(args.out)
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    with tempfile.TemporaryDirectory(prefix="flashkda-prepare-") as t:
        tmp = Path(t)
        fk_git = git_dir(args.flashkda, FLASHKDA_URL, tmp, "flashkda", partial=False)
        fk = resolve(fk_git, args.commit)
        cut_git = git_dir(args.cutlass, CUTLASS_URL, tmp, "cutlass", partial=True)
        pinned = submodule_commit(fk_git, fk)
        cut = resolve(cut_git, args.cutlass_commit or pinned)
        full = tmp / "full"  # FlashKDA with all of CUTLASS's include directories, for the closure
        fk_files = [(p, o) for p, o in tree_files(fk_git, fk) if not p.startswith(SKIP)]
        extract(fk_git, fk_files, full)
        cut_files = tree_files(cut_git, cut, CUTLASS_DIRS)
        extract(cut_git, cut_files, full / "cutlass")
        headers = [f for f in closure(full, archs, args.nvcc, args.cxx) if f.startswith("cutlass/")]
        license_ = tree_files(cut_git, cut, ["LICENSE.txt"])
        fresh(out)
        extract(fk_git, fk_files, out)
        by_path = dict(cut_files)
        extract(
            cut_git,
            [(h[len("cutlass/") :], by_path[h[len("cutlass/") :]]) for h in headers] + license_,
            out / "cutlass",
        )
        files = sorted(p for p, _ in fk_files) + [f"cutlass/{p}" for p, _ in license_] + headers
        for d in CUTLASS_DIRS:  # setup.py names all three; one may hold no header that is included
            (out / "cutlass" / d).mkdir(parents=True, exist_ok=True)
    manifest = {
        "flashkda": {"url": FLASHKDA_URL, "commit": fk, "asked": args.commit},
        "cutlass": {"url": CUTLASS_URL, "commit": cut, "pinned_by_flashkda": pinned},
        "archs": archs,
        "closure": f"nvcc -M {' '.join(NVCC_PP_FLAGS)} (per arch) over {SOURCES[0]}; "
        f"c++ -M -MG over {SOURCES[1]}",
        "cutlass_headers": len(headers),
        "files": {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files},
        "bytes": sum((out / f).stat().st_size for f in files),
        "digest": digest(out, files),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    note = "" if cut == pinned else f" (FlashKDA pins {pinned[:7]})"
    print(
        f"{out}: FlashKDA {fk[:7]}, CUTLASS {cut[:7]}{note}: {len(fk_files)} FlashKDA files, "
        f"{len(headers)} CUTLASS headers, {manifest['bytes'] / 1e6:.1f} MB, digest {manifest['digest'][:12]}"
    )
    if args.check_compile:
        check_compile(out, archs, args.nvcc)
    return out


def check_compile(root: Path, archs: list[str], nvcc: str = "nvcc") -> None:
    """Compile FlashKDA's CUDA source against the prepared tree only (setup.py's flags)."""
    gencode = [g for a in archs for g in ("-gencode", f"arch=compute_{a},code=sm_{a}")]
    with tempfile.TemporaryDirectory() as t:
        cmd = [
            nvcc,
            "-c",
            "-O3",
            *NVCC_PP_FLAGS,
            *include_flags(root),
            *gencode,
            SOURCES[0],
            "-o",
            f"{t}/fwd_launch.o",
        ]
        start = time.time()
        subprocess.run(cmd, cwd=root, check=True)
        print(
            f"{root}: {SOURCES[0]} compiles against the prepared headers alone ({time.time() - start:.0f} s)"
        )


def _torch_stamp() -> str:
    import torch

    return f"torch {torch.__version__} cuda {torch.version.cuda}"


def build(args) -> Path:
    src = Path(args.out).resolve()
    manifest = json.loads((src / MANIFEST).read_text())
    cache = Path(args.cache) if args.cache else build_dir()
    archs = os.environ.get("FLASH_KDA_CUDA_ARCHS") or "90a"
    stamp = {
        "digest": manifest["digest"],
        "flashkda_commit": manifest["flashkda"]["commit"],
        "cutlass_commit": manifest["cutlass"]["commit"],
        "torch": _torch_stamp(),
        "archs": archs,
        "import_dir": "src",
    }
    built = cache / BUILT
    have = json.loads(built.read_text()) if built.is_file() else {}
    if {k: have.get(k) for k in stamp} == stamp and list((cache / "src").glob("flash_kda_C*.so")):
        print(
            f"{cache}: FlashKDA {stamp['flashkda_commit'][:7]} already built ({stamp['torch']}, sm_{archs})"
        )
    else:
        built.unlink(missing_ok=True)
        shutil.rmtree(cache / "src", ignore_errors=True)
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, cache / "src")
        env = {
            **os.environ,
            "FLASH_KDA_CUDA_ARCHS": archs,
            "FLASH_KDA_VERSION_SUFFIX": "+" + stamp["flashkda_commit"][:7],
        }
        start = time.time()
        with open(cache / "build.log", "w") as log:
            rc = subprocess.run(
                [sys.executable, "setup.py", "build_ext", "--inplace"],
                cwd=cache / "src",
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            ).returncode
        if rc:
            sys.stdout.write((cache / "build.log").read_text()[-6000:])
            raise SystemExit(
                f"FlashKDA's setup.py build_ext failed (rc {rc}); log: {cache / 'build.log'}"
            )
        seconds = time.time() - start
        built.write_text(json.dumps({**stamp, "seconds": round(seconds, 1)}, indent=1) + "\n")
        print(
            f"{cache}: FlashKDA {stamp['flashkda_commit'][:7]} built in {seconds:.0f} s ({stamp['torch']}, sm_{archs})"
        )
    smoke(cache / "src")
    return cache


SMOKE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import flash_kda
T, H, D = 64, 2, 128
dev = "cuda"
r = lambda *s: torch.randn(*s, device=dev).to(torch.bfloat16)
q, k, v, g = (r(1, T, H, D) for _ in range(4))
out = torch.empty_like(v)
hT = torch.empty(1, H, D, D, device=dev)
flash_kda.fwd(q, k, v, g, r(1, T, H), D ** -0.5, out, torch.zeros(H, device=dev),
              torch.zeros(H, D, device=dev), -5.0, initial_state=torch.zeros(1, H, D, D, device=dev),
              final_state=hT)
torch.cuda.synchronize()
assert torch.isfinite(out.float()).all() and torch.isfinite(hT).all(), "non-finite output"
print("flash_kda imports from", flash_kda.__file__, "and runs (T=64, H=2)")
"""


def smoke(where: Path) -> None:
    subprocess.run([sys.executable, "-c", SMOKE, str(where)], check=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write FlashKDA + the CUTLASS headers it includes to OUT")
    p.add_argument("out")
    p.add_argument(
        "--flashkda", help="git directory holding MoonshotAI/FlashKDA (default: clone it)"
    )
    p.add_argument("--cutlass", help="git directory holding NVIDIA/cutlass (default: clone it)")
    p.add_argument("--commit", default=RELEASE, help=f"FlashKDA commit (default {RELEASE})")
    p.add_argument("--cutlass-commit", help="CUTLASS commit (default: the one FlashKDA pins)")
    p.add_argument("--archs", default="90a", help="architectures of the closure (default 90a)")
    p.add_argument("--nvcc", default="nvcc")
    p.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    p.add_argument("--check-compile", action="store_true", help="compile the .cu against OUT alone")
    b = sub.add_parser("build", help="build OUT on this (GPU) machine, cached")
    b.add_argument("out")
    b.add_argument("--cache", help=f"build directory (default ${ENV} or <tempdir>/flashkda)")
    args = ap.parse_args(argv)
    (prepare if args.cmd == "prepare" else build)(args)


if __name__ == "__main__":
    main()
