// Throughput of the example OpenTelemetry service with and without
// SymtraceContextManager: starts agent/tests/workload/otel_service.js twice
// (SYMTRACE_CONTEXT=1 and =0, node --perf-basic-prof), then for ROUNDS
// rounds drives each in turn for DURATION seconds with CLIENTS concurrent
// keep-alive clients on GET /fast, and prints the requests/s of each.
//
//   node bench/node-context/throughput.js [ROUNDS [DURATION [CLIENTS]]]
//
// Or env ROUNDS (default 3), DURATION (s, default 10), CLIENTS (default 4);
// FAST_WORK (iterations per half request, default 20000) sizes /fast.
// NODE_PATH (default /opt/symtrace-node/node_modules) and
// SYMTRACE_CONTEXT_PACKAGE are passed to the services.
"use strict";
const http = require("http");
const path = require("path");
const { spawn } = require("child_process");

const [rounds, duration, clients] = [
  ["ROUNDS", 3],
  ["DURATION", 10],
  ["CLIENTS", 4],
].map(([name, fallback], i) => Number(process.argv[2 + i] || process.env[name] || fallback));

const service = path.join(__dirname, "../../agent/tests/workload/otel_service.js");
const nodePath = process.env.NODE_PATH || "/opt/symtrace-node/node_modules";

// Starts a service; resolves with its port once it prints "listening PORT".
function start(name, mode) {
  const env = { ...process.env, NODE_PATH: nodePath, PORT: "0", SYMTRACE_CONTEXT: mode };
  const args = ["--perf-basic-prof", service];
  console.log(
    `${name}: NODE_PATH=${nodePath} PORT=0 SYMTRACE_CONTEXT=${mode} FAST_WORK=${env.FAST_WORK ?? 20000} ` +
      `${process.execPath} ${args.join(" ")}`,
  );
  const child = spawn(process.execPath, args, { env, stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    let out = "";
    child.on("exit", (code) => reject(new Error(`${name} exited (${code}) before listening`)));
    child.stdout.on("data", (chunk) => {
      out += chunk;
      const m = /^listening (\d+)$/m.exec(out);
      if (m) resolve({ name, child, port: Number(m[1]), requests: 0, seconds: 0 });
    });
  });
}

function get(agent, port) {
  return new Promise((resolve, reject) => {
    http
      .get({ agent, host: "127.0.0.1", port, path: "/fast" }, (res) => {
        res.on("data", () => {});
        res.on("end", () => (res.statusCode === 200 ? resolve() : reject(new Error(`HTTP ${res.statusCode}`))));
      })
      .on("error", reject);
  });
}

// Seconds each variant is driven before the rounds.
const WARMUP = 3;

// CLIENTS loops, each one request at a time on its own kept-alive socket,
// for `seconds` (DURATION); returns the number of requests answered.
async function drive(port, seconds = duration) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: clients });
  const end = Date.now() + seconds * 1000;
  let done = 0;
  await Promise.all(
    Array.from({ length: clients }, async () => {
      while (Date.now() < end) {
        await get(agent, port);
        done++;
      }
    }),
  );
  agent.destroy();
  return done;
}

async function main() {
  console.log(
    `${rounds} rounds of ${duration} s per variant after ${WARMUP} s of warm-up, ${clients} clients, GET /fast`,
  );
  const variants = [await start("symtrace", "1"), await start("plain", "0")];
  try {
    // Warm-up, not counted: V8 compiles the hot paths of both first.
    for (const v of variants) await drive(v.port, WARMUP);
    for (let r = 1; r <= rounds; r++) {
      for (const v of variants) {
        const start = process.hrtime.bigint();
        const n = await drive(v.port);
        const seconds = Number(process.hrtime.bigint() - start) / 1e9;
        v.requests += n;
        v.seconds += seconds;
        console.log(`round ${r} ${v.name.padEnd(8)} ${(n / seconds).toFixed(0).padStart(7)} req/s`);
      }
    }
  } finally {
    for (const v of variants) v.child.kill();
  }
  const [sym, plain] = variants.map((v) => v.requests / v.seconds);
  console.log(`total    symtrace ${sym.toFixed(0).padStart(7)} req/s`);
  console.log(`total    plain    ${plain.toFixed(0).padStart(7)} req/s`);
  console.log(`symtrace vs plain: ${(((sym - plain) / plain) * 100).toFixed(1)}%`);
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
