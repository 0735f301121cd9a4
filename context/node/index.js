// @symtrace/context: loads the Node-API addon (Rust crate
// symtrace-context-node) and re-exports its functions unchanged. enter and
// exit are the native functions themselves: no JS wrapper on the hot path.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { platformTag } = require("./platform.js");

// Where the addon may be, first match wins: an explicit path, the copy
// prebuilt for this platform that the packed package carries
// (prebuilds/<platform>-<arch>-<libc>/, put there by `npm pack` or
// `npm run build`), then the cargo outputs of a repository checkout. The cargo outputs do not end in .node, so
// require() cannot load them: process.dlopen can.
const tag = platformTag();
const candidates = [
  process.env.SYMTRACE_CONTEXT_ADDON,
  path.join(__dirname, "prebuilds", tag, "symtrace_context.node"),
  path.join(__dirname, "../../target/release/libsymtrace_context_node.so"),
  path.join(__dirname, "../../target/debug/libsymtrace_context_node.so"),
].filter(Boolean);

const addonPath = candidates.find((p) => fs.existsSync(p));
if (addonPath === undefined) {
  throw new Error(
    `@symtrace/context: no native addon for ${tag} (prebuilt: linux-x64-gnu); tried:\n  ` +
      candidates.join("\n  ") +
      "\nbuild it from source with `npm run build` in the package directory (needs cargo)",
  );
}

const addon = { exports: {} };
process.dlopen(addon, addonPath, os.constants.dlopen.RTLD_NOW);
const native = addon.exports;

module.exports = {
  enter: native.enter,
  exit: native.exit,
  set: native.set,
  clear: native.clear,
  current: native.current,
  publishProcess: native.publishProcess,
  addonPath,
};
