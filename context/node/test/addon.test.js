// The addon through index.js: publishing, nesting, validation, workers.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { Worker } = require("node:worker_threads");
const ctx = require("../index.js");

const A = ["0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1];
const B = ["4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 0];
const C = ["11111111111111111111111111111111", "2222222222222222", 3];

test("index.js exports the native functions and the addon path", () => {
  for (const name of ["enter", "exit", "set", "clear", "current", "publishProcess"]) {
    assert.equal(typeof ctx[name], "function", name);
  }
  assert.match(ctx.addonPath, /\.(so|node)$/);
});

test("enter/exit nest and restore", () => {
  ctx.clear();
  assert.equal(ctx.current(), null);
  const a = ctx.enter(...A);
  assert.deepEqual(ctx.current(), A);
  const b = ctx.enter(...B);
  assert.deepEqual(ctx.current(), B);
  ctx.exit(b);
  assert.deepEqual(ctx.current(), A);
  ctx.exit(a);
  assert.equal(ctx.current(), null);
});

test("enter without flags publishes flags 0; upper-case hex reads back lower-case", () => {
  ctx.clear();
  const t = ctx.enter(A[0].toUpperCase(), A[1].toUpperCase());
  assert.deepEqual(ctx.current(), [A[0], A[1], 0]);
  ctx.exit(t);
  // TypeScript's optional argument, passed as undefined.
  const u = ctx.enter(A[0], A[1], undefined);
  assert.deepEqual(ctx.current(), [A[0], A[1], 0]);
  ctx.exit(u);
});

test("all-zero IDs publish no span", () => {
  ctx.set(...A);
  const t = ctx.enter("0".repeat(32), "0".repeat(16));
  assert.equal(ctx.current(), null);
  ctx.exit(t);
  assert.deepEqual(ctx.current(), A);
  ctx.clear();
});

test("exiting an outer token forgets inner ones; stale tokens are no-ops", () => {
  ctx.clear();
  const a = ctx.enter(...A);
  const b = ctx.enter(...B);
  ctx.exit(a); // the exit of b never came
  assert.equal(ctx.current(), null);
  ctx.set(...C);
  ctx.exit(b); // forgotten
  assert.deepEqual(ctx.current(), C);
  ctx.exit(a); // already exited
  assert.deepEqual(ctx.current(), C);
  ctx.exit(12345); // never given
  ctx.exit(-1);
  assert.deepEqual(ctx.current(), C);
  ctx.clear();
});

test("set and clear publish without saving", () => {
  ctx.set(...A);
  assert.deepEqual(ctx.current(), A);
  ctx.set(...B);
  assert.deepEqual(ctx.current(), B);
  ctx.clear();
  assert.equal(ctx.current(), null);
});

test("bad IDs and flags throw TypeError and publish nothing", () => {
  ctx.set(...C);
  const bad = [
    [A[0].slice(1), A[1]], // trace ID too short
    [A[0] + "0", A[1]], // trace ID too long
    [A[0], A[1] + "00"], // span ID too long
    [A[0], A[1].slice(2)], // span ID too short
    ["g" + A[0].slice(1), A[1]], // not hex
    [A[0], "zz" + A[1].slice(2)], // not hex
    [123, A[1]], // not a string
    [A[0], null],
    [], // missing
    [A[0], A[1], 256], // flags over 255
    [A[0], A[1], -1],
    [A[0], A[1], "1"],
    [A[0], A[1], null],
  ];
  for (const args of bad) {
    for (const f of [ctx.enter, ctx.set]) {
      assert.throws(() => f(...args), TypeError, `${f.name}(${JSON.stringify(args)})`);
    }
  }
  assert.deepEqual(ctx.current(), C);
  assert.throws(() => ctx.exit("x"), TypeError);
  ctx.clear();
});

test("publishProcess accepts a resource within bounds and rejects larger ones", () => {
  ctx.publishProcess("addon-test", { "service.version": "1.2.3", "process.pid": process.pid, ok: true });
  const many = {};
  for (let i = 0; i < 129; i++) many[`k${i}`] = "v";
  assert.throws(() => ctx.publishProcess("addon-test", many), TypeError);
  assert.throws(() => ctx.publishProcess("addon-test", { big: "x".repeat(4097) }), TypeError);
  assert.throws(() => ctx.publishProcess("addon-test", { ["k".repeat(257)]: "v" }), TypeError);
  assert.throws(() => ctx.publishProcess("addon-test", "not an object"), TypeError);
  assert.throws(() => ctx.publishProcess(), TypeError);
});

test("a worker thread publishes its own context", async () => {
  ctx.set(...A);
  const worker = new Worker(
    `
    const { parentPort, workerData } = require("node:worker_threads");
    const ctx = require(workerData.index);
    const before = ctx.current();
    const token = ctx.enter(...workerData.ids);
    parentPort.postMessage({ before, inside: ctx.current() });
    // Stay inside the span until the main thread has looked.
    parentPort.once("message", () => { ctx.exit(token); parentPort.close(); });
    `,
    { eval: true, workerData: { index: require.resolve("../index.js"), ids: B } },
  );
  const seen = await new Promise((resolve, reject) => {
    worker.once("message", resolve);
    worker.once("error", reject);
  });
  assert.equal(seen.before, null, "a new thread starts with no span");
  assert.deepEqual(seen.inside, B);
  assert.deepEqual(ctx.current(), A, "the worker's enter left the main thread alone");
  worker.postMessage("done");
  assert.equal(await new Promise((resolve) => worker.once("exit", resolve)), 0);
  assert.deepEqual(ctx.current(), A);
  ctx.clear();
});
