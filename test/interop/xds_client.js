// xds_client.js: an independent xDS judge. It resolves xds:///<model> with
// @grpc/grpc-js-xds (no code shared with isobar or grpc-go) against the
// bootstrap in GRPC_XDS_BOOTSTRAP_CONFIG and calls the interop backends'
// raw unary method /isobar.interop.Who/Name in a loop, one RPC at a time.
//
// Usage: node xds_client.js <target> <max_rpcs> <max_seconds>
//
// Output, one JSON object per line on stdout: {"ms":<unix ms>,"backend":"b0"}
// for an answered RPC, {"ms":...,"error":"..."} for a failed one, then
// {"done":true,"ok":N,"failed":M}. Bounded by max_rpcs and max_seconds.
'use strict';
const grpc = require('@grpc/grpc-js');
require('@grpc/grpc-js-xds').register();

const [target, maxRPCs, maxSeconds] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
if (!target || !(maxRPCs > 0) || !(maxSeconds > 0)) {
  process.stderr.write('usage: node xds_client.js <target> <max_rpcs> <max_seconds>\n');
  process.exit(2);
}
const method = '/isobar.interop.Who/Name';
const raw = (b) => b;
const client = new grpc.Client(target, grpc.credentials.createInsecure());
const end = Date.now() + maxSeconds * 1000;
let ok = 0, failed = 0;

function line(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

function next() {
  if (ok + failed >= maxRPCs || Date.now() >= end) {
    line({ done: true, ok, failed });
    client.close();
    return;
  }
  client.makeUnaryRequest(method, raw, raw, Buffer.alloc(0), { deadline: Date.now() + 2000 }, (err, reply) => {
    if (err) {
      failed++;
      line({ ms: Date.now(), error: `${grpc.status[err.code]}: ${err.details}` });
      // A failing channel answers at once; pace the retries.
      setTimeout(next, 20);
      return;
    }
    ok++;
    line({ ms: Date.now(), backend: reply.toString() });
    setImmediate(next);
  });
}
next();
