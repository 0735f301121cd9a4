// Decodes a gzipped pprof profile with DataDog's pprof-format (npm), an
// implementation independent of symtrace, and prints what it holds as JSON:
// sample types, per-stack values with function names (leaf first, inline
// frames expanded), and the mappings' build-IDs.
"use strict";
const fs = require("fs");
const zlib = require("zlib");
const { Profile } = require("pprof-format");

const raw = zlib.gunzipSync(fs.readFileSync(process.argv[2]));
const p = Profile.decode(raw);
const str = (i) => p.stringTable.strings[Number(i)];
const functions = new Map(p.function.map((f) => [Number(f.id), f]));
const locations = new Map(p.location.map((l) => [Number(l.id), l]));
const stacks = p.sample.map((s) => ({
  values: s.value.map(Number),
  frames: s.locationId.flatMap((id) => {
    const loc = locations.get(Number(id));
    if (!loc) throw new Error("sample refers to missing location " + id);
    return loc.line.map((ln) => {
      const f = functions.get(Number(ln.functionId));
      if (!f) throw new Error("line refers to missing function " + ln.functionId);
      return { name: str(f.name), file: str(f.filename), line: Number(ln.line) };
    });
  }),
}));
console.log(JSON.stringify({
  sample_types: p.sampleType.map((t) => str(t.type) + "/" + str(t.unit)),
  period_type: p.periodType ? str(p.periodType.type) + "/" + str(p.periodType.unit) : null,
  period: Number(p.period),
  mappings: p.mapping.map((m) => ({ file: str(m.filename), build_id: str(m.buildId) })),
  stacks,
}));
