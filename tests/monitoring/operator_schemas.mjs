// Validates the monitoring component's Prometheus Operator objects against the Operator's API
// (its Go types, as JSON schemas compiled by @kubernetes-models/prometheus-operator: types,
// required fields, enums and patterns such as a rule's `for` duration; fields the types do not
// name are not reported, as the API server prunes them rather than refusing).
//
//   node operator_schemas.mjs INSTALL_DIR < objects.json
//
// INSTALL_DIR holds the node_modules that `npm ci` made from operator-schemas/ (.ci/install).
// stdin is a JSON array of objects; those of other API groups are left to kubernetes-validate.
// Prints one `ok KIND/NAME` or `ERROR KIND/NAME: why` line per object; exits 1 when any failed.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const GROUP = "monitoring.coreos.com/";
const [installDir] = process.argv.slice(2);
if (!installDir) {
  console.error("usage: node operator_schemas.mjs INSTALL_DIR < objects.json");
  process.exit(2);
}
const models = join(installDir, "node_modules/@kubernetes-models/prometheus-operator");
const objects = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const object of objects) {
  const apiVersion = object.apiVersion ?? "";
  if (!apiVersion.startsWith(GROUP)) continue;
  const version = apiVersion.slice(GROUP.length);
  const name = `${object.kind}/${object.metadata?.name}`;
  let Model;
  try {
    const file = join(models, GROUP, version, `${object.kind}.js`);
    Model = (await import(pathToFileURL(file).href))[object.kind];
  } catch (error) {
    console.log(`ERROR ${name}: the Operator has no ${apiVersion} ${object.kind} (${error.message})`);
    failed++;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`ok ${name}`);
  } catch (error) {
    console.log(`ERROR ${name}: ${error.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
