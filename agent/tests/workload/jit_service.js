// Test workload for JIT frames (issue #24): a CPU-bound HTTP service.
// GET /work runs executeHeavyTask, which burns three times as long in
// innerLoop as in lighterLoop; GET /stats answers how long each ran (ns).
// Run with: node --perf-basic-prof --interpreted-frames-native-stack
"use strict";
const http = require("http");

const spent = { innerLoop: 0n, lighterLoop: 0n };

function innerLoop(ms) {
  const start = process.hrtime.bigint();
  const end = start + BigInt(ms) * 1000000n;
  let s = 0;
  while (process.hrtime.bigint() < end) {
    for (let i = 0; i < 2000; i++) s += Math.sqrt(i) * (i % 7);
  }
  spent.innerLoop += process.hrtime.bigint() - start;
  return s;
}

function lighterLoop(ms) {
  const start = process.hrtime.bigint();
  const end = start + BigInt(ms) * 1000000n;
  let s = 0;
  while (process.hrtime.bigint() < end) {
    for (let i = 0; i < 2000; i++) s += Math.sqrt(i) * (i % 5);
  }
  spent.lighterLoop += process.hrtime.bigint() - start;
  return s;
}

function executeHeavyTask() {
  let s = 0;
  for (let k = 0; k < 5; k++) {
    s += innerLoop(30);
    s += lighterLoop(10);
  }
  return s;
}

const server = http.createServer((req, res) => {
  if (req.url === "/stats") {
    res.end(JSON.stringify({ innerLoop: Number(spent.innerLoop), lighterLoop: Number(spent.lighterLoop) }));
    return;
  }
  res.end(String(executeHeavyTask()));
});
server.listen(0, "127.0.0.1", () => {
  console.log(`listening ${server.address().port}`);
});
