#!/usr/bin/env python3
"""Runs README.md's code blocks as written and fails loudly when one does not work.

  scripts/check_readme.py [--only c,rust]     every snippet (C, Rust, Go, Python, sh)
  scripts/check_readme.py --two-commands      only the commands of "## Two commands",
                                              one after the other, in README order

The text of every block is taken from README.md verbatim. How each is run:
  - A fenced `sh` block followed (in the same section) by a block of another
    language is that block's setup: it runs with bash -e, LIBSSA set to this
    checkout (README says "`$LIBSSA` is this checkout"), in the block's fresh
    empty folder when it uses $LIBSSA, else in the checkout.
    A line holding only an inline `command` right before a block is its setup
    too; it runs in the checkout (it uses paths relative to it).
  - c: a complete program, written to the file name its setup compiles (`x.c`).
  - rust: the body of `main` of a fresh crate made by `cargo init` before the
    setup runs; the harness below gives it k, v (65536 tokens) q and out.
  - go: the body of `main` of a fresh module made by `go mod init`; same data.
  - python: run with python3 in the fresh folder after its setup.
  - other sh blocks run in the checkout; "Two commands" runs only with
    --two-commands (it is CI's first step, scripts/run_tests.sh among them).
C, Rust and Go programs must print "heavy H, draws D, ... window-only heads W"
with H > 0, D > 0 and W == 0 (sparse decode selected and sampled), and must not
load libssa.so from LD_LIBRARY_PATH (it is unset; Rust must not load it at all).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUST_HARNESS = """#![allow(unused_mut, unused_variables)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (n, nkv, nq, d) = (65536usize, 2usize, 8usize, 64usize);
    let mut x: u32 = 12345;
    let mut rnd = move || {
        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
        (x >> 8) as f32 / 16777216.0 - 0.5
    };
    let k: Vec<f32> = (0..n * nkv * d).map(|_| rnd()).collect();
    let v: Vec<f32> = (0..n * nkv * d).map(|_| rnd()).collect();
    let q: Vec<f32> = (0..nq * d).map(|_| rnd()).collect();
    let mut out = vec![0f32; nq * d];
    // ---- README snippet ----
%s
    // ---- end of README snippet ----
    Ok(())
}
"""

GO_HARNESS = """package main

import (
	"fmt"

	"libssa/ssa"
)

var _ = fmt.Sprint

func main() {
	const n, nkv, nq, d = 65536, 2, 8, 64
	x := uint32(12345)
	rnd := func() float32 { x = x*1664525 + 1013904223; return float32(x>>8)/16777216 - 0.5 }
	k := make([]float32, n*nkv*d)
	v := make([]float32, n*nkv*d)
	for i := range k {
		k[i] = rnd()
	}
	for i := range v {
		v[i] = rnd()
	}
	q := make([]float32, nq*d)
	for i := range q {
		q[i] = rnd()
	}
	out := make([]float32, nq*d)
	// ---- README snippet ----
%s
	// ---- end of README snippet ----
}
"""


class Block:
    def __init__(self, lang, text, section, line, before):
        self.lang, self.text, self.section, self.line = lang, text, section, line
        self.before = before  # the lines between the previous block (or heading) and this one


def parse(path):
    blocks, section, before = [], "", []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^```(\S*)\s*$", line)
        if m:
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if j == len(lines):
                sys.exit("README.md:%d: unterminated code block" % (start))
            blocks.append(Block(m.group(1), "\n".join(lines[start:j]) + "\n", section, start, before))
            before = []
            i = j + 1
            continue
        if line.startswith("#"):
            section = line.lstrip("#").strip()
            before = []
        else:
            before.append(line)
        i += 1
    return blocks


def inline_setup(block):
    """Inline `command` lines right before a block (a line holding only one)."""
    cmds = []
    for line in block.before:
        m = re.match(r"^`([^`]+)`$", line.strip())
        if m:
            cmds.append(m.group(1))
    return cmds


def fail(block, what, out=""):
    sys.stderr.write(out[-6000:] if out else "")
    sys.exit("\ncheck_readme: README.md:%d (%s block in \"%s\"): %s" % (block.line, block.lang, block.section, what))


def run(block, cmd, cwd, env, what):
    t0 = time.time()
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print("   %s (%.0f s)" % (what, time.time() - t0))
    if p.returncode != 0:
        fail(block, "%s failed with exit code %d" % (what, p.returncode), p.stdout)
    return p.stdout


def check_sparse(block, out):
    heavy = re.search(r"heavy (\d+)", out)
    draws = re.search(r"draws (\d+)", out)
    window = re.search(r"window-only heads (\d+)", out)
    if not (heavy and draws and window):
        fail(block, "the program did not print 'heavy H, draws D, ..., window-only heads W'", out)
    if int(heavy.group(1)) == 0 or int(draws.group(1)) == 0 or int(window.group(1)) != 0:
        fail(block, "the decode it shows is not sparse (heavy %s, draws %s, window-only heads %s)"
             % (heavy.group(1), draws.group(1), window.group(1)), out)
    print("   " + out.strip().splitlines()[-1])


def base_env():
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    env["LIBSSA"] = ROOT
    return env


def setup_dir(setup, work):
    return work if "$LIBSSA" in setup.text or "${LIBSSA}" in setup.text else ROOT


def run_setup(block, setup, work, env):
    if setup is not None:
        run(block, ["bash", "-ec", setup.text], setup_dir(setup, work), env,
            "setup: sh block at README.md:%d" % setup.line)
    for cmd in inline_setup(block):
        run(block, ["bash", "-ec", cmd], ROOT, env, "setup: " + cmd)


def check_c(block, setup, work, env):
    if setup is None:
        fail(block, "a C program needs an sh block before it that compiles it")
    m = re.search(r"(\S+\.c)\b", setup.text)
    if not m:
        fail(block, "its sh block names no .c file to compile")
    where = setup_dir(setup, work)
    if where != work:
        fail(block, "its sh block must build in a folder of the user's ($LIBSSA for the checkout)")
    with open(os.path.join(work, m.group(1)), "w") as f:
        f.write(block.text)
    out = run(block, ["bash", "-ec", setup.text], work, env, "sh block at README.md:%d with %s" % (setup.line, m.group(1)))
    check_sparse(block, out)


def check_rust(block, setup, work, env):
    run(block, ["cargo", "init", "--offline", "--quiet", "--name", "readme_snippet"], work, env, "cargo init")
    run_setup(block, setup, work, env)
    with open(os.path.join(work, "src", "main.rs"), "w") as f:
        f.write(RUST_HARNESS % block.text)
    env = dict(env, CARGO_TARGET_DIR=os.path.join(ROOT, "build-readme", "cargo-target"))
    out = run(block, ["cargo", "run", "--offline", "--quiet", "--release"], work, env, "cargo run")
    check_sparse(block, out)
    exe = os.path.join(env["CARGO_TARGET_DIR"], "release", "readme_snippet")
    ldd = subprocess.run(["ldd", exe], stdout=subprocess.PIPE, text=True).stdout
    if "libssa" in ldd:
        fail(block, "the Rust program loads libssa dynamically; ssa-sys should link libssa.a", ldd)


def check_go(block, setup, work, env):
    run(block, ["go", "mod", "init", "readmesnippet"], work, env, "go mod init")
    run_setup(block, setup, work, env)
    with open(os.path.join(work, "main.go"), "w") as f:
        f.write(GO_HARNESS % block.text)
    # A build cache of the check's own, as on a fresh machine: a machine's Go cache
    # can keep the binding's package built with the link flags of a libssa installed
    # elsewhere (seen after that install was removed: ld cannot find -lssa).
    env = dict(env, GOFLAGS="-mod=mod", GOPROXY="off", GOCACHE=os.path.join(ROOT, "build-readme", "go-cache"))
    if "PKG_CONFIG_PATH" not in env:
        # The setup's `export` lives in its own shell: take it from there.
        m = re.search(r"export PKG_CONFIG_PATH=(\S+)", (setup.text if setup else "") + "\n".join(inline_setup(block)))
        if m:
            env["PKG_CONFIG_PATH"] = m.group(1)
    out = run(block, ["go", "run", "."], work, env, "go run")
    check_sparse(block, out)


def check_python(block, setup, work, env):
    run_setup(block, setup, work, env)
    path = os.path.join(work, "snippet.py")
    with open(path, "w") as f:
        f.write(block.text)
    out = run(block, [os.environ.get("PYTHON", "python3"), path], work, env, "python3 snippet.py")
    if out.strip():
        print("   " + out.strip().splitlines()[-1])


CHECKS = {"c": check_c, "rust": check_rust, "go": check_go, "python": check_python}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--two-commands", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated languages to run (default: all)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    blocks = parse(os.path.join(ROOT, "README.md"))
    env = base_env()

    if args.two_commands:
        two = [b for b in blocks if b.section == "Two commands" and b.lang == "sh"]
        if len(two) != 1:
            sys.exit("check_readme: README.md has no single sh block under '## Two commands'")
        for cmd in [l.split("#")[0].strip() for l in two[0].text.splitlines()]:
            if not cmd:
                continue
            t0 = time.time()
            print("==== README command: %s" % cmd, flush=True)
            rc = subprocess.call(["bash", "-c", cmd], cwd=ROOT, env=env)
            print("==== %s: exit %d after %.0f s" % (cmd, rc, time.time() - t0), flush=True)
            if rc != 0:
                fail(two[0], "'%s' failed with exit code %d" % (cmd, rc))
        return

    ran = 0
    for i, b in enumerate(blocks):
        if b.section == "Two commands" or b.lang == "" or (only and b.lang not in only):
            continue
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        if b.lang == "sh" and nxt is not None and nxt.section == b.section and nxt.lang != "sh" and not nxt.before_prose():
            continue  # the setup of the next block
        prev = blocks[i - 1] if i > 0 else None
        setup = prev if (prev is not None and prev.lang == "sh" and prev.section == b.section
                         and not b.before_prose() and b.lang != "sh") else None
        print("== README.md:%d: %s block in \"%s\"" % (b.line, b.lang, b.section), flush=True)
        work = tempfile.mkdtemp(prefix="readme_")
        try:
            if b.lang in CHECKS:
                CHECKS[b.lang](b, setup, work, env)
            elif b.lang == "sh":
                run(b, ["bash", "-ec", b.text], ROOT, env, "sh block")
            else:
                fail(b, "no way to run a '%s' block: teach scripts/check_readme.py" % b.lang)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        ran += 1
    if ran == 0:
        sys.exit("check_readme: no runnable blocks found in README.md")
    print("== README: %d snippets ran as written" % ran)


def _before_prose(self):
    """Prose between the previous block and this one (then they are not a pair)."""
    return any(l.strip() for l in self.before)


Block.before_prose = _before_prose

if __name__ == "__main__":
    main()
