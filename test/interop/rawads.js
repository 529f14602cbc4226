// rawads.js: a raw ADS client in Node (@grpc/grpc-js, @grpc/proto-loader,
// the Envoy protos bundled with @grpc/grpc-js-xds) that sends isobar's
// xDS server bad input on purpose, for TestBadADSInput:
//   1. subscribes to the Cluster of <model>, then NACKs the response twice;
//   2. sends two requests with a nonce it was never sent;
//   3. subscribes to a Cluster that does not exist, next to the real one.
// It prints one JSON line per step and {"done":true} at the end, then
// exits. Bounded: it gives up after 20 s.
//
// Usage: node rawads.js <host:port> <model>
'use strict';
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [addr, model] = [process.argv[2], process.argv[3]];
if (!addr || !model) {
  process.stderr.write('usage: node rawads.js <host:port> <model>\n');
  process.exit(2);
}
const deps = path.join(path.dirname(require.resolve('@grpc/grpc-js-xds/package.json')), 'deps');
const def = protoLoader.loadSync('envoy/service/discovery/v3/ads.proto', {
  keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  includeDirs: ['envoy-api', 'xds', 'googleapis', 'protoc-gen-validate'].map((d) => path.join(deps, d)),
});
const pkg = grpc.loadPackageDefinition(def);
const ADS = pkg.envoy.service.discovery.v3.AggregatedDiscoveryService;
const client = new ADS(addr, grpc.credentials.createInsecure());
const CDS = 'type.googleapis.com/envoy.config.cluster.v3.Cluster';
const cluster = 'isobar/' + model;
const node = { id: 'interop-raw', user_agent_name: 'gRPC Node raw-ads', cluster: 'interop' };
const line = (o) => process.stdout.write(JSON.stringify(o) + '\n');

const timer = setTimeout(() => { line({ error: 'timeout' }); process.exit(1); }, 20000);
const call = client.StreamAggregatedResources();
let step = 0;
call.on('data', (resp) => {
  line({ got: resp.type_url, version: resp.version_info, nonce: resp.nonce, resources: resp.resources.length });
  if (step === 0) {
    step = 1;
    const nack = { type_url: CDS, resource_names: [cluster], version_info: '', response_nonce: resp.nonce,
      error_detail: { code: 3, message: 'interop: deliberate NACK' } };
    call.write(nack);
    call.write(nack);
    line({ step: 'nack x2' });
    for (let i = 0; i < 2; i++) {
      call.write({ type_url: CDS, resource_names: [cluster], version_info: resp.version_info, response_nonce: 'forged-nonce' });
    }
    line({ step: 'forged nonce x2' });
    call.write({ type_url: CDS, resource_names: [cluster, 'isobar/no-such-model'], version_info: resp.version_info, response_nonce: '' });
    line({ step: 'unknown name' });
    // Let the server read them before the stream closes.
    setTimeout(() => { line({ done: true }); clearTimeout(timer); call.end(); client.close(); process.exit(0); }, 1500);
  }
});
call.on('error', (e) => { line({ error: e.message }); process.exit(1); });
call.write({ node, type_url: CDS, resource_names: [cluster] });
