// Runs ONNX models with onnxruntime-node (CPU execution provider, one thread) for the conformance
// adapters: node ort_run.js JOBS.json. Each job names a model, raw little-endian input files with
// their type and dims, and the outputs to write (raw data, dims in the job's result file).
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require(path.join(__dirname, 'node_modules', 'onnxruntime-node'));

const ARRAYS = {
  float32: (b) => new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4),
  float16: (b) => new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2),
  bool: (b) => new Uint8Array(b.buffer, b.byteOffset, b.byteLength),
  int32: (b) => new Int32Array(b.buffer, b.byteOffset, b.byteLength / 4),
  int64: (b) => new BigInt64Array(b.buffer, b.byteOffset, b.byteLength / 8),
};

async function runJob(job) {
  const inference = await ort.InferenceSession.create(job.model, {
    executionProviders: ['cpu'], intraOpNumThreads: 1, interOpNumThreads: 1,
  });
  const feeds = {};
  for (const x of job.inputs) {
    const raw = fs.readFileSync(x.file);
    const buf = new Uint8Array(raw.byteLength);
    buf.set(raw);
    feeds[x.name] = new ort.Tensor(x.type, ARRAYS[x.type](buf), x.dims);
  }
  const result = await inference.run(feeds);
  const dims = {};
  for (const o of job.outputs) {
    const t = result[o.name];
    const d = t.data;
    fs.writeFileSync(o.file, Buffer.from(d.buffer, d.byteOffset, d.byteLength));
    dims[o.name] = { dims: t.dims, type: t.type };
  }
  await inference.release();
  return dims;
}

(async () => {
  const jobs = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  for (const job of jobs) {
    try {
      fs.writeFileSync(job.result, JSON.stringify({ ok: true, outputs: await runJob(job) }));
    } catch (e) {
      fs.writeFileSync(job.result, JSON.stringify({ ok: false, error: String(e.message || e).split('\n')[0] }));
    }
  }
})();
