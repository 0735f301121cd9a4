// SymtraceContextManager registered with a real tracer provider: the
// published span follows the JS code that runs, across async continuations.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { EventEmitter } = require("node:events");
const { context, trace, ROOT_CONTEXT } = require("@opentelemetry/api");
const { NodeTracerProvider } = require("@opentelemetry/sdk-trace-node");
const { resourceFromAttributes } = require("@opentelemetry/resources");
const { current } = require("../index.js");
const { SymtraceContextManager, publishResource } = require("../otel.js");

const resource = resourceFromAttributes({ "service.name": "otel-test", "service.version": "1" });
const manager = new SymtraceContextManager({ resource });
const provider = new NodeTracerProvider({ resource });
provider.register({ contextManager: manager });
const tracer = trace.getTracer("otel-test");

function ids(span) {
  const sc = span.spanContext();
  return [sc.traceId, sc.spanId, sc.traceFlags];
}

const immediate = () => new Promise((resolve) => setImmediate(resolve));

test("startActiveSpan publishes the span inside and restores after", () => {
  assert.equal(current(), null);
  const seen = tracer.startActiveSpan("outer", (span) => {
    span.end();
    return { inside: current(), span: ids(span) };
  });
  assert.deepEqual(seen.inside, seen.span);
  assert.equal(seen.span[2], 1, "sampled");
  assert.equal(current(), null);
});

test("nested spans publish the innermost one", () => {
  tracer.startActiveSpan("outer", (outer) => {
    tracer.startActiveSpan("inner", (inner) => {
      assert.deepEqual(current(), ids(inner));
      assert.notDeepEqual(ids(inner), ids(outer));
      inner.end();
    });
    assert.deepEqual(current(), ids(outer));
    context.with(ROOT_CONTEXT, () => assert.equal(current(), null));
    assert.deepEqual(current(), ids(outer));
    outer.end();
  });
  assert.equal(current(), null);
});

test("an exception thrown inside with() still restores", () => {
  assert.throws(() =>
    tracer.startActiveSpan("throws", () => {
      throw new Error("boom");
    }),
  );
  assert.equal(current(), null);
});

test("concurrent async tasks each see their own span at every resume", async () => {
  const steps = 5;
  let resumes = 0;
  const task = (name) =>
    tracer.startActiveSpan(name, async (span) => {
      const mine = ids(span);
      assert.deepEqual(current(), mine);
      for (let i = 0; i < steps; i++) {
        await immediate();
        assert.deepEqual(current(), mine, `${name} after await ${i}`);
        resumes++;
      }
      span.end();
      return mine;
    });
  const [a, b] = await Promise.all([task("a"), task("b")]);
  assert.notDeepEqual(a, b);
  assert.equal(resumes, 2 * steps);
  assert.equal(current(), null);
  await immediate();
  assert.equal(current(), null);
});

test("setTimeout and promise continuations keep their span", async () => {
  const seen = {};
  let expected;
  let done;
  const finished = new Promise((resolve) => (done = resolve));
  tracer.startActiveSpan("callbacks", (span) => {
    expected = ids(span);
    Promise.resolve().then(() => (seen.then = current()));
    process.nextTick(() => (seen.nextTick = current()));
    setTimeout(() => {
      seen.timeout = current();
      span.end();
      done();
    }, 5);
  });
  // This code is outside the span, until the callbacks run.
  assert.equal(current(), null);
  await finished;
  assert.deepEqual(seen, { then: expected, nextTick: expected, timeout: expected });
  assert.equal(current(), null);
});

test("a bound EventEmitter's listeners run in its span", async () => {
  const emitter = new EventEmitter();
  let expected;
  tracer.startActiveSpan("emitter", (span) => {
    expected = ids(span);
    context.bind(context.active(), emitter);
    span.end();
  });
  const seen = new Promise((resolve) => emitter.on("event", () => resolve(current())));
  // Emitted from a callback of no span.
  setImmediate(() => emitter.emit("event"));
  assert.deepEqual(await seen, expected);
  assert.equal(current(), null);
});

// The payload of this process's OTEP 4719 context, as the agent reads it:
// the OTEL_CTX mapping's header, then the protobuf it points to (latin1).
function processContext() {
  const fs = require("node:fs");
  const line = fs
    .readFileSync("/proc/self/maps", "utf8")
    .split("\n")
    .find((l) => l.includes("OTEL_CTX"));
  assert.ok(line, "an OTEL_CTX mapping");
  const start = Number.parseInt(line.split("-")[0], 16);
  const fd = fs.openSync("/proc/self/mem", "r");
  try {
    const header = Buffer.alloc(32);
    fs.readSync(fd, header, 0, 32, start);
    assert.equal(header.toString("latin1", 0, 8), "OTEL_CTX");
    const size = header.readUInt32LE(12);
    const payload = Buffer.alloc(size);
    fs.readSync(fd, payload, 0, size, Number(header.readBigUInt64LE(24)));
    return payload.toString("latin1");
  } finally {
    fs.closeSync(fd);
  }
}

test("publishResource takes a Resource or plain attributes and checks bounds", () => {
  publishResource(resource);
  assert.match(processContext(), /otel-test/);
  publishResource({ "service.name": "plain", nested: { skipped: true }, list: ["skipped"] });
  const plain = processContext();
  assert.match(plain, /plain/);
  assert.doesNotMatch(plain, /nested|list/, "only scalar attributes");
  publishResource({});
  assert.match(processContext(), /unknown_service:node/);
  assert.throws(() => publishResource({ "service.name": "x".repeat(5000) }), TypeError);
  assert.match(processContext(), /unknown_service:node/, "a refused resource changes nothing");
});

test("without a resource option the first span's resource is published", () => {
  const { execFileSync } = require("node:child_process");
  const script = `
    const { trace } = require("@opentelemetry/api");
    const { NodeTracerProvider } = require("@opentelemetry/sdk-trace-node");
    const { resourceFromAttributes } = require("@opentelemetry/resources");
    const { SymtraceContextManager } = require(${JSON.stringify(require.resolve("../otel.js"))});
    const resource = resourceFromAttributes({ "service.name": "from-the-provider" });
    new NodeTracerProvider({ resource }).register({ contextManager: new SymtraceContextManager() });
    const fs = require("node:fs");
    const before = fs.readFileSync("/proc/self/maps", "utf8").includes("OTEL_CTX");
    trace.getTracer("t").startActiveSpan("s", (span) => span.end());
    const after = fs.readFileSync("/proc/self/maps", "utf8").includes("OTEL_CTX");
    console.log(JSON.stringify({ before, after }));
  `;
  const out = JSON.parse(execFileSync(process.execPath, ["-e", script], { encoding: "utf8" }));
  assert.deepEqual(out, { before: false, after: true });
});

test("disable() clears the published span and stops publishing", async () => {
  let inside;
  let resumed;
  const task = tracer.startActiveSpan("disabled", async (span) => {
    assert.deepEqual(current(), ids(span));
    manager.disable();
    inside = current();
    await immediate();
    resumed = current();
    span.end();
  });
  assert.equal(inside, null, "disable() cleared the span it was in");
  await task;
  assert.equal(resumed, null, "the continuation no longer publishes");
  assert.equal(current(), null);
});
