// Decoding in Node, as a Node program would do it: lines split from 16 KiB reads (Buffers),
// each parsed by JSON.parse, the payload decoded by Buffer.from(data, "base64").
//
//   node bench/peers/decode.js CORPUS
//
// Same rules as bench/decode_loop.lua: chunks cut before the clock starts, at least 3 passes
// and 1 second, the fastest pass reported. Prints one line: RESULT <json>.
"use strict";
const fs = require("fs");

const CHUNK = 16 * 1024;
const MIN_PASSES = 3;
const MIN_SECONDS = 1.0;

function onePass(chunks) {
  let frames = 0, bytes = 0, check = 0;
  let pending = null;
  for (const chunk of chunks) {
    const buf = pending ? Buffer.concat([pending, chunk]) : chunk;
    let start = 0;
    for (;;) {
      const nl = buf.indexOf(10, start);
      if (nl < 0) break;
      const frame = JSON.parse(buf.toString("utf8", start, nl));
      start = nl + 1;
      frames++;
      if (frame.t === "stdout" || frame.t === "stderr") {
        const data = Buffer.from(frame.data, "base64");
        bytes += data.length;
        check += data[0] + data[data.length - 1];
      }
    }
    pending = start < buf.length ? buf.subarray(start) : null;
  }
  return { frames, bytes, check };
}

const text = fs.readFileSync(process.argv[2]);
const chunks = [];
for (let i = 0; i < text.length; i += CHUNK) chunks.push(text.subarray(i, i + CHUNK));
let passes = 0, total = 0, best = Infinity, last;
while (passes < MIN_PASSES || total < MIN_SECONDS) {
  const t0 = process.hrtime.bigint();
  last = onePass(chunks);
  const dt = Number(process.hrtime.bigint() - t0) / 1e9;
  passes++;
  total += dt;
  if (dt < best) best = dt;
}
console.log("RESULT " + JSON.stringify({ passes, best_seconds: best, frames: last.frames,
  bytes: last.bytes, check: last.check }));
