// The prebuilt addon's directory name for this process:
// <platform>-<arch>-<libc>, e.g. linux-x64-gnu (glibc) or linux-x64-musl.
"use strict";

function libc() {
  if (process.platform !== "linux") return "";
  // Node reports the glibc it runs on; musl builds report none. (The
  // report's network part is left out: it can take a reverse lookup.)
  if (!process.report) return "gnu";
  if ("excludeNetwork" in process.report) process.report.excludeNetwork = true;
  const report = process.report.getReport();
  const glibc = report && report.header && report.header.glibcVersionRuntime;
  return glibc ? "gnu" : "musl";
}

function platformTag() {
  const c = libc();
  return [process.platform, process.arch, c].filter(Boolean).join("-");
}

module.exports = { platformTag };
