// validate_k8s.js: validates Kubernetes objects against the Kubernetes
// OpenAPI schemas bundled in npm's kubernetes-models (offline; no cluster).
//
// Usage: node validate_k8s.js < objects.json
// Input: a JSON array of {"source": "...", "object": {...}}. Each object is
// looked up by apiVersion and kind (kubernetes-models/<group>/<version>/<Kind>,
// the core group as kubernetes-models/<version>/<Kind>); an unknown kind is
// an error, not a pass. Prints one line per object, "ok <source> <kind>
// <name>" or "INVALID <source> <kind> <name>: <errors>", and exits 1 when
// any object is invalid.
'use strict';
const fs = require('fs');

const input = JSON.parse(fs.readFileSync(0, 'utf8'));
let bad = 0;
for (const { source, object } of input) {
  const kind = object.kind || '?';
  const name = (object.metadata && object.metadata.name) || '?';
  const [group, version] = (object.apiVersion || '').includes('/')
    ? object.apiVersion.split('/')
    : [null, object.apiVersion];
  const mod = group ? `kubernetes-models/${group}/${version}/${kind}` : `kubernetes-models/${version}/${kind}`;
  let Model;
  try {
    Model = require(mod)[kind];
  } catch (e) {
    bad++;
    console.log(`INVALID ${source} ${kind} ${name}: no schema for apiVersion ${object.apiVersion} kind ${kind}`);
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`ok ${source} ${kind} ${name}`);
  } catch (e) {
    bad++;
    const detail = e.errors ? JSON.stringify(e.errors.map((x) => `${x.instancePath} ${x.message}`)) : e.message;
    console.log(`INVALID ${source} ${kind} ${name}: ${detail}`);
  }
}
process.exit(bad ? 1 : 0);
