"""Validates Turnstile's custom resources the way kubernetes-validate --strict validates the
built-in kinds: with the same jsonschema validator (Draft 2020-12), against the
openAPIV3Schema of their CustomResourceDefinition (made strict: no property the schema does not
name, unless it says x-kubernetes-preserve-unknown-fields), with `metadata` checked against
kubernetes-validate's own strict ObjectMeta schema of the Kubernetes version asked for.
CEL rules (x-kubernetes-validations) are not evaluated here.

Run with the Python of kubernetes-validate's venv (tests/checks/manifest_checks.rs does):
  python validate_custom_resources.py K8S_VERSION CRD_FILE... -- MANIFEST...
Prints one INFO or ERROR line per custom resource; exits 1 when any failed. Objects of other
API groups are left to kubernetes-validate.
"""

import copy
import json
import sys

import importlib_resources
import jsonschema
import yaml
from referencing import Registry, Resource

from kubernetes_validate import utils

OBJECT_META = "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def strict(node):
    """The CRD schema as JSON Schema: nullable, int-or-string, closed objects."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "$defs"):
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = strict(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = strict(value)
        elif key.startswith("x-kubernetes-") or key == "nullable":
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        out.get("type") in ("object", ["object", "null"])
        and "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def definitions(version):
    """kubernetes-validate's strict definitions for `version` (its newest not newer)."""
    wanted = utils.major_minor(version)
    chosen = [v for v in utils.all_versions() if utils.major_minor(v) <= wanted]
    if not chosen or utils.major_minor(version) > utils.latest_version():
        raise SystemExit("FATAL kubernetes-validate has no schemas for Kubernetes %s" % version)
    path = "kubernetes-json-schema/v%s-local-strict/_definitions.json" % chosen[-1]
    ref = importlib_resources.files("kubernetes_validate").joinpath(path)
    return utils.major_minor(chosen[-1]), json.loads(ref.read_text())


def main(argv):
    version, rest = argv[0], argv[1:]
    split = rest.index("--")
    crd_files, manifests = rest[:split], rest[split + 1:]
    used_version, defs = definitions(version)
    schemas = {}
    groups = set()
    for path in crd_files:
        with open(path) as f:
            for crd in yaml.safe_load_all(f):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                spec = crd["spec"]
                groups.add(spec["group"])
                for served in spec["versions"]:
                    if not served.get("served", True):
                        continue
                    api_version = "%s/%s" % (spec["group"], served["name"])
                    schema = strict(copy.deepcopy(served["schema"]["openAPIV3Schema"]))
                    props = schema.setdefault("properties", {})
                    props["apiVersion"] = {"type": "string", "enum": [api_version]}
                    props["kind"] = {"type": "string", "enum": [spec["names"]["kind"]]}
                    props["metadata"] = {"$ref": OBJECT_META}
                    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
                    schema["additionalProperties"] = False
                    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
                    schema["$id"] = "https://kubernetes.io/api/%s/%s.json" % (api_version, spec["names"]["kind"])
                    schemas[(api_version, spec["names"]["kind"])] = schema
    registry = Resource.from_contents(defs) @ Registry()
    failed = 0
    for path in manifests:
        with open(path) as f:
            resources = [r for r in yaml.safe_load_all(f) if r]
        for resource in resources:
            api_version = resource.get("apiVersion", "")
            if api_version.split("/")[0] not in groups:
                continue
            kind = resource.get("kind", "")
            name = "%s/%s" % (kind.lower(), resource.get("metadata", {}).get("name"))
            schema = schemas.get((api_version, kind))
            if schema is None:
                print("ERROR %s: %s has no served version %s in the CRDs" % (path, name, api_version))
                failed += 1
                continue
            validator = jsonschema.validators.Draft202012Validator(schema, registry=registry)
            errors = sorted(validator.iter_errors(resource), key=lambda e: list(e.path))
            if errors:
                failed += 1
                for error in errors:
                    where = ".".join(str(p) for p in error.path)
                    print("ERROR %s did not validate for resource %s against version %s: %s: %s"
                          % (path, name, used_version, where, error.message))
            else:
                print("INFO %s passed for resource %s against version %s" % (path, name, used_version))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
