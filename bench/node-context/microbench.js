// Microbenchmark of @symtrace/context: ns per op of enter+exit, set+clear,
// and of context.with() through SymtraceContextManager vs OpenTelemetry's
// plain AsyncLocalStorageContextManager.
//
//   NODE_PATH=/opt/symtrace-node/node_modules node bench/node-context/microbench.js [OPS]
//
// OPS (argv or env OPS, default 5000000) per round; 5 rounds after a
// warm-up; prints the median and every round. SYMTRACE_CONTEXT_PACKAGE:
// the package directory (default this repository's context/node).
"use strict";
const path = require("path");
const { ROOT_CONTEXT, trace } = require("@opentelemetry/api");
const { AsyncLocalStorageContextManager } = require("@opentelemetry/context-async-hooks");

const packageDir =
  process.env.SYMTRACE_CONTEXT_PACKAGE || path.join(__dirname, "../../context/node");
const native = require(path.join(packageDir, "index.js"));
const { SymtraceContextManager } = require(path.join(packageDir, "otel.js"));

const OPS = Number(process.argv[2] || process.env.OPS || 5e6);
const ROUNDS = 5;
const TRACE = "0af7651916cd43dd8448eb211c80319c";
const SPAN = "b7ad6b7169203331";

// Each loop is its own function so that V8 optimizes each on its own.
function enterExit(n) {
  const { enter, exit } = native;
  for (let i = 0; i < n; i++) exit(enter(TRACE, SPAN, 1));
}

function setClear(n) {
  const { set, clear } = native;
  for (let i = 0; i < n; i++) {
    set(TRACE, SPAN, 1);
    clear();
  }
}

// A context holding a span, as startActiveSpan makes.
const spanContext = trace.setSpan(
  ROOT_CONTEXT,
  trace.wrapSpanContext({ traceId: TRACE, spanId: SPAN, traceFlags: 1 }),
);
let sink = 0;
const body = () => sink++;
const withLoop = (manager) => (n) => {
  for (let i = 0; i < n; i++) manager.with(spanContext, body);
};

function measure(loop) {
  loop(Math.min(OPS, 1e6)); // warm-up
  const rounds = [];
  for (let r = 0; r < ROUNDS; r++) {
    const start = process.hrtime.bigint();
    loop(OPS);
    rounds.push(Number(process.hrtime.bigint() - start) / OPS);
  }
  const median = [...rounds].sort((a, b) => a - b)[ROUNDS >> 1];
  return { median, rounds };
}

const plain = new AsyncLocalStorageContextManager().enable();
const symtrace = new SymtraceContextManager().enable();
const cases = [
  ["enter+exit", enterExit],
  ["set+clear", setClear],
  ["with() AsyncLocalStorageContextManager", withLoop(plain)],
  ["with() SymtraceContextManager", withLoop(symtrace)],
];

console.log(`node ${process.version}, addon ${native.addonPath}`);
console.log(`${OPS} ops per round, ${ROUNDS} rounds; ns per op`);
console.log(`${"case".padEnd(40)} ${"median".padStart(8)}  rounds`);
for (const [name, loop] of cases) {
  const { median, rounds } = measure(loop);
  console.log(
    `${name.padEnd(40)} ${median.toFixed(1).padStart(8)}  ${rounds.map((x) => x.toFixed(1)).join(" ")}`,
  );
}
if (native.current() !== null || sink === 0) throw new Error("benchmark left a span published");
