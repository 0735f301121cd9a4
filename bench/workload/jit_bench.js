// The JIT benchmark's Node.js service (bench/jit-overhead.sh): at start it
// loads a module of FUNCTIONS (argv[2]) small functions and calls each once
// (each call compiles it: two perf-map lines apiece under
// --perf-basic-prof --interpreted-frames-native-stack), then serves
// GET /work: executeHeavyTask → innerLoop, about 5 ms of CPU.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const http = require("http");

const n = Number(process.argv[2] || 50000);
const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "jit-bench-")), "many.js");
let src = "";
for (let i = 0; i < n; i++) src += `exports.f${i} = function f${i}(x) { return x * ${i} + 1; };\n`;
fs.writeFileSync(file, src);
const many = require(file);
let sink = 0;
for (let i = 0; i < n; i++) sink += many["f" + i](i);

function innerLoop(ms) {
  const end = process.hrtime.bigint() + BigInt(ms) * 1000000n;
  let s = 0;
  while (process.hrtime.bigint() < end) for (let i = 0; i < 1000; i++) s += Math.sqrt(i) * (i % 7);
  return s;
}

function executeHeavyTask() {
  return innerLoop(5);
}

http
  .createServer((req, res) => res.end(String(executeHeavyTask() + sink)))
  .listen(Number(process.argv[3] || 18990), "127.0.0.1", () => console.log("ready"));
