#!/usr/bin/env node
// Puts the addon where the package loads it from on this platform:
// prebuilds/<platform>-<arch>-<libc>/symtrace_context.node. Run by `npm pack`
// and `npm publish` (the `prepack` script), so the tarball carries the
// addon and installing it needs no compiler.
//
// The addon is $SYMTRACE_CONTEXT_PREBUILT when set (an addon built
// elsewhere, e.g. by CI for another platform), else the output of
// `cargo build --release -p symtrace-context-node` in this repository.
"use strict";
const { execFileSync } = require("child_process");
const fs = require("fs");
const path = require("path");
const { platformTag } = require("../platform.js");

const root = path.join(__dirname, "..");
let source = process.env.SYMTRACE_CONTEXT_PREBUILT;
if (!source) {
  execFileSync("cargo", ["build", "--release", "-p", "symtrace-context-node"], {
    cwd: root,
    stdio: "inherit",
  });
  const target = process.env.CARGO_TARGET_DIR || path.join(root, "../../target");
  source = path.join(target, "release/libsymtrace_context_node.so");
}
const dir = path.join(root, "prebuilds", platformTag());
fs.mkdirSync(dir, { recursive: true });
fs.copyFileSync(source, path.join(dir, "symtrace_context.node"));
console.log(`prebuild: ${source} -> ${path.relative(root, dir)}/symtrace_context.node`);
